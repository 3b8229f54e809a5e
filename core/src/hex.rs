//! Bytes as lowercase hexadecimal: digests in keys, fingerprints and file names, random names.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex, two digits a byte.
pub fn lower_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_lower_hex(&mut out, bytes);
    out
}

/// Appends `bytes` to `out` as lowercase hex, two digits a byte.
pub fn push_lower_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_two_lowercase_digits() {
        assert_eq!(lower_hex(&[0x00, 0x0f, 0xa0, 0xff, 0x12]), "000fa0ff12");
        assert_eq!(lower_hex(&[]), "");
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(lower_hex(&all), expected);
    }
}
