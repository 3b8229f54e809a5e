//! Whole numbers as text, written and read without the formatting machinery: the filter
//! writes and reads several a request (callout bodies, answers, shared-data slots), and in
//! wasm `format!` and `str::parse` cost several times as much.

/// Writes `n` in decimal.
pub fn write(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The number `bytes` starts with, and how many bytes it takes: one or more digits and no
/// leading zero, as [`write`](fn@write) and JSON write them; `None` for no digit, a leading zero, or more
/// than a `u64` holds.
pub fn leading(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    let mut digits = 0;
    for &b in bytes {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        if digits == 1 && value == 0 {
            return None;
        }
        // Up to 19 digits cannot overflow; checking every one would multiply in 128 bits (a
        // library call in wasm).
        value = if digits < 19 {
            value * 10 + u64::from(digit)
        } else {
            value.checked_mul(10)?.checked_add(u64::from(digit))?
        };
        digits += 1;
    }
    (digits > 0).then_some((value, digits))
}

/// `bytes` as a whole number, as [`leading`] reads one; `None` if anything else is there.
pub fn parse(bytes: &[u8]) -> Option<u64> {
    match leading(bytes)? {
        (value, digits) if digits == bytes.len() => Some(value),
        _ => None,
    }
}

/// `bytes` as a signed whole number, as Lua's `%d` writes one: an optional minus sign, then a
/// number as [`parse`] reads it; `None` if it is not one or an `i64` cannot hold it. (The
/// server reads script replies with it: `str::parse` and its UTF-8 check cost twice as much.)
pub fn parse_signed(bytes: &[u8]) -> Option<i64> {
    match bytes {
        [b'-', digits @ ..] => {
            let magnitude = parse(digits)?;
            0i64.checked_sub_unsigned(magnitude)
        }
        digits => i64::try_from(parse(digits)?).ok(),
    }
}

/// `numbers`, then `text`, separated by `|`: how a shared-data slot holds a record (the text
/// last, since it may hold any printable character).
pub fn write_record(numbers: &[u64], text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(numbers.len() * 14 + text.len());
    for &n in numbers {
        write(&mut out, n);
        out.push(b'|');
    }
    out.extend_from_slice(text.as_bytes());
    out
}

/// The `N` numbers and the text of a record [`write_record`] wrote; `None` for anything else.
pub fn read_record<const N: usize>(bytes: &[u8]) -> Option<([u64; N], &str)> {
    let mut fields = bytes.splitn(N + 1, |&b| b == b'|');
    let mut numbers = [0u64; N];
    for n in &mut numbers {
        *n = parse(fields.next()?)?;
    }
    Some((numbers, std::str::from_utf8(fields.next()?).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_numbers_read_as_lua_writes_them() {
        assert_eq!(parse_signed(b"42"), Some(42));
        assert_eq!(parse_signed(b"-7"), Some(-7));
        assert_eq!(parse_signed(b"0"), Some(0));
        assert_eq!(parse_signed(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_signed(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"1.5",
            b"+1",
            b" 1",
            b"07",
        ] {
            assert_eq!(parse_signed(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_written_number_reads_back_and_nothing_else_does() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            1_000_000,
            u64::MAX / 10,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut text = Vec::new();
            write(&mut text, n);
            assert_eq!(text, n.to_string().into_bytes());
            assert_eq!(parse(&text), Some(n));
            text.push(b'|');
            assert_eq!(leading(&text), Some((n, text.len() - 1)));
        }
        for bad in [
            "",
            "01",
            "00",
            "+1",
            "-1",
            "1 ",
            " 1",
            "1.0",
            "18446744073709551616",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_record_reads_back_whatever_its_text_holds() {
        let record = write_record(&[0, 17, u64::MAX], "a|b c");
        assert_eq!(record, b"0|17|18446744073709551615|a|b c");
        assert_eq!(
            read_record::<3>(&record),
            Some(([0, 17, u64::MAX], "a|b c"))
        );
        assert_eq!(
            read_record::<3>(b"0|17|18446744073709551615|"),
            Some(([0, 17, u64::MAX], ""))
        );
        for bad in [&b"0|17|x|id"[..], b"0|17", b"0|17|5", b"0|17|5|\xff"] {
            assert_eq!(
                read_record::<3>(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
