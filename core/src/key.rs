//! Rule names, limit keys, and the Redis key they make.
//!
//! A [`LimitKey`] is built from values a client controls (addresses, header values, paths), so
//! it is escaped before it goes anywhere: every byte outside printable ASCII, and each of
//! `% { } : #`, becomes `%XX`. An escaped key therefore cannot contain the `}` that would end
//! its Redis Cluster hash tag, nor the `:` that separates it from the rule's name, so no value
//! can collide with another rule's key. Keys longer than [`MAX_KEY_LEN`] once escaped are
//! replaced by `#` and a SHA-256 prefix, so a client cannot grow them without bound.
//!
//! ```
//! use sluice_core::key::{LimitKey, RuleName};
//! let key = LimitKey::from_parts([b"tenant{a}".as_slice(), b"/api:v1"]);
//! assert_eq!(key.as_str(), "tenant%7Ba%7D:/api%3Av1");
//! let rule = RuleName::new("per-tenant").unwrap();
//! let limit: sluice_core::limit::Limit =
//!     serde_json::from_str(r#"{"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 20}"#).unwrap();
//! assert_eq!(
//!     sluice_core::key::redis_key("sluice", &rule, &key, &limit),
//!     "sluice:{per-tenant:tenant%7Ba%7D:/api%3Av1}:gc:10/1000/20",
//! );
//! ```

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::limit::Limit;

/// The longest escaped key kept as it is; longer ones are hashed.
pub const MAX_KEY_LEN: usize = 128;
/// The longest rule name.
pub const MAX_RULE_NAME_LEN: usize = 64;
/// The separator between the parts of a key.
pub const PART_SEPARATOR: char = ':';

/// `ip` as `Display` writes it, without the formatting machinery (this runs per request).
pub fn dotted_quad(ip: Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

/// A rule's name: 1 to 64 of `A-Z a-z 0-9 _ . -`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RuleName(String);

/// Why a rule name or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Empty, too long, or with a character outside the allowed set.
    #[error("`{0}` is not a rule name: use 1 to 64 of A-Z a-z 0-9 _ . -")]
    BadRuleName(String),
    /// Not the escaped form this module produces.
    #[error(
        "`{0}` is not an escaped limit key: at most 128 printable ASCII characters without {{ }} # % unless escaped, or # and 32 hex digits"
    )]
    BadKey(String),
}

impl RuleName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<RuleName, NameError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= MAX_RULE_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if valid {
            Ok(RuleName(name))
        } else {
            Err(NameError::BadRuleName(name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A rule name made from any text, for names chosen elsewhere (the rate limit service's
    /// descriptor paths): each character a rule name may not hold becomes `_`, and a name too
    /// long keeps its end, where such paths differ. Distinct texts may share a name.
    pub fn lossy(text: &str) -> RuleName {
        let mut name: String = text
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if name.is_empty() {
            name.push('_');
        }
        // Every character is ASCII now, so any byte offset is a character boundary.
        let start = name.len().saturating_sub(MAX_RULE_NAME_LEN);
        RuleName(name.split_off(start))
    }
}

impl TryFrom<String> for RuleName {
    type Error = NameError;
    fn try_from(name: String) -> Result<RuleName, NameError> {
        RuleName::new(name)
    }
}

impl From<RuleName> for String {
    fn from(name: RuleName) -> String {
        name.0
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An escaped key: safe in a Redis key, a hash tag, a log line and a JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LimitKey(String);

/// The bytes a key escapes: outside printable ASCII, and `% { } : #`. A table, because this
/// is asked of every byte of every key part.
const ESCAPED: [bool; 256] = {
    let mut table = [true; 256];
    let mut b = 0x21;
    while b <= 0x7e {
        table[b] = matches!(b as u8, b'%' | b'{' | b'}' | b':' | b'#');
        b += 1;
    }
    table
};

fn needs_escape(b: u8) -> bool {
    ESCAPED[usize::from(b)]
}

/// Parts this short or shorter are escaped in one pass, byte by byte, even when nothing in
/// them needs it: for the few bytes of an API key or an address, a pass to look for what
/// needs escaping and then a copy cost more (callgrind, the native module, a five-byte key:
/// 161 instructions a request for the part that way, 149 in one pass), and `from_utf8`
/// alone costs more than the copy.
const SHORT_PART: usize = 16;

fn escape_into(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if bytes.len() > SHORT_PART && !bytes.iter().any(|&b| needs_escape(b)) {
        // Checked above: every byte is printable ASCII.
        out.push_str(std::str::from_utf8(bytes).unwrap_or_default());
        return;
    }
    out.reserve(bytes.len());
    for &b in bytes {
        // `is_ascii` follows from the table, but said here it lets the compiler push a byte
        // (not a char's UTF-8 encoding, with its length checks): 30 instructions fewer for
        // a five-byte part (callgrind, the native module).
        if needs_escape(b) || !b.is_ascii() {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push(char::from(b));
        }
    }
}

/// A key being built, one part at a time (see [`LimitKey::from_parts`]).
#[derive(Debug)]
pub struct KeyBuilder {
    key: String,
    parts: usize,
}

impl Default for KeyBuilder {
    fn default() -> KeyBuilder {
        // Room for most keys, so that a key of several parts is not reallocated part by part.
        KeyBuilder {
            key: String::with_capacity(32),
            parts: 0,
        }
    }
}

impl KeyBuilder {
    /// A key built in `buffer`, emptied first: a filter hands back the string of the key it
    /// built for the last request, so that building the next allocates nothing.
    pub fn in_buffer(mut buffer: String) -> KeyBuilder {
        buffer.clear();
        KeyBuilder {
            key: buffer,
            parts: 0,
        }
    }

    /// Escapes `part` and appends it.
    pub fn part(&mut self, part: &[u8]) {
        if self.parts > 0 {
            self.key.push(PART_SEPARATOR);
        }
        self.parts += 1;
        escape_into(&mut self.key, part);
    }

    /// The key; hashed if too long (in the same string).
    ///
    /// Inlined, the hashing apart: nearly every key is short, and is done with here.
    #[inline]
    pub fn finish(self) -> LimitKey {
        if self.key.len() <= MAX_KEY_LEN {
            return LimitKey(self.key);
        }
        Self::hashed(self.key)
    }

    fn hashed(mut key: String) -> LimitKey {
        let digest = Sha256::digest(key.as_bytes());
        key.clear();
        key.push('#');
        crate::hex::push_lower_hex(&mut key, &digest[..16]);
        LimitKey(key)
    }
}

impl LimitKey {
    /// An empty key to build part by part.
    pub fn builder() -> KeyBuilder {
        KeyBuilder::default()
    }

    /// Escapes each part and joins them with `:`; hashes the result if it is too long.
    pub fn from_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> LimitKey {
        let mut key = KeyBuilder::default();
        for part in parts {
            key.part(part);
        }
        key.finish()
    }

    /// Validates a key that claims to be escaped already (as received on the wire).
    pub fn parse(key: impl Into<String>) -> Result<LimitKey, NameError> {
        let key = key.into();
        let hashed = key.len() == 33
            && key.starts_with('#')
            && key[1..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        let bytes = key.as_bytes();
        // Empty is a key: the one a present but empty header or query value builds.
        let escaped = key.len() <= MAX_KEY_LEN
            && bytes.iter().enumerate().all(|(i, &b)| match b {
                b'%' => {
                    bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                        && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
                }
                b':' => true,
                b => !needs_escape(b),
            });
        if hashed || escaped {
            Ok(LimitKey(key))
        } else {
            Err(NameError::BadKey(key))
        }
    }

    /// The escaped key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for LimitKey {
    type Error = NameError;
    fn try_from(key: String) -> Result<LimitKey, NameError> {
        LimitKey::parse(key)
    }
}

impl Default for LimitKey {
    /// The empty key: what a present but empty header value builds.
    fn default() -> LimitKey {
        LimitKey(String::new())
    }
}

impl From<LimitKey> for String {
    fn from(key: LimitKey) -> String {
        key.0
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The Redis key holding a rule's state for one limit key under one limit:
/// `<prefix>:{<rule>:<key>}:<layout>:<parameters>`. Everything a script touches for one check
/// shares the hash tag, so it lives on one Redis Cluster node. The layout code
/// ([`crate::limit::Algorithm::storage_code`]) keeps a rule that changes algorithm, or a server that changes
/// how an algorithm stores its state, from reading state of another shape; the parameters
/// ([`Limit::state_code`]) keep a rule whose limit changes from reading state another limit
/// wrote (a 1 h log trimmed by a 1 s window, a counter of one window read as another's). While
/// Envoys with the old and the new limit run side by side, each limit decides on its own state.
pub fn redis_key(prefix: &str, rule: &RuleName, key: &LimitKey, limit: &Limit) -> String {
    // Pieces pushed rather than `format!`ed: the server builds one for every check.
    let code = limit.algorithm().storage_code();
    // Three numbers of up to 20 digits and their two slashes.
    let mut out =
        String::with_capacity(prefix.len() + rule.0.len() + key.0.len() + code.len() + 6 + 62);
    for piece in [prefix, ":{", &rule.0, ":", &key.0, "}:", code, ":"] {
        out.push_str(piece);
    }
    limit.write_state_code(&mut out);
    out
}

/// The Redis key of the ledger of a key's leases, beside its state ([`redis_key`]), in the
/// same hash tag. (A bucket algorithm's ledger is kept in its state's key instead: the lease
/// scripts read and write that one, `cell()` in `lua/prelude.lua`.)
pub fn ledger_key(state_key: &str) -> String {
    format!("{state_key}:ledger")
}

/// Redis Cluster's hash slots.
pub const CLUSTER_SLOTS: u16 = 16384;

/// The Redis Cluster hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of its hash tag,
/// the bytes between its first `{` and the next `}` when there are any, else of the whole key.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % CLUSTER_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_key_names_the_algorithm_and_every_parameter_its_state_depends_on() {
        let key_of = |limit: &str| {
            let limit: Limit = serde_json::from_str(limit).unwrap();
            let rule = RuleName::new("r").unwrap();
            redis_key("p", &rule, &LimitKey::from_parts([b"k".as_slice()]), &limit)
        };
        assert_eq!(
            key_of(r#"{"algorithm": "fixed_window", "limit": 100, "window": "1m"}"#),
            "p:{r:k}:fw:100/60000"
        );
        assert_eq!(
            key_of(
                r#"{"algorithm": "leaky_bucket", "rate": 5000, "per": "2s", "burst": 1000000000}"#
            ),
            "p:{r:k}:lb:5000/2000/1000000000"
        );
    }

    #[test]
    fn cluster_slots_are_redis_own() {
        // `CLUSTER KEYSLOT` of Redis 7.0; the cases of the cluster specification.
        for (key, slot) in [
            ("123456789", 12739),
            ("foo", 12182),
            ("{user1000}.following", 3443),
            ("user1000", 3443),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("sluice:{r:k}:fw", 507),
        ] {
            assert_eq!(cluster_slot(key.as_bytes()), slot, "{key}");
        }
    }

    #[test]
    fn dotted_quads_are_written_as_display_writes_them() {
        for n in (0..=u32::MAX)
            .step_by(65_521)
            .chain([0, u32::MAX, 0x0a00_6409])
        {
            let ip = Ipv4Addr::from(n);
            assert_eq!(dotted_quad(ip), ip.to_string());
        }
    }

    #[test]
    fn escaping_keeps_values_apart_and_inside_the_hash_tag() {
        let a = LimitKey::from_parts([b"a:b".as_slice()]);
        let b = LimitKey::from_parts([b"a".as_slice(), b"b"]);
        assert_ne!(
            a, b,
            "a part containing the separator must not equal two parts"
        );
        let sneaky = LimitKey::from_parts([b"x}:{other".as_slice()]);
        assert!(!sneaky.as_str().contains(['{', '}']), "{sneaky}");
        let bytes = LimitKey::from_parts([[0xff_u8, b' ', b'\n'].as_slice()]);
        assert_eq!(bytes.as_str(), "%FF%20%0A");
    }

    #[test]
    fn a_part_that_needs_no_escape_is_kept_as_it_is_short_or_long() {
        for part in [
            "k",
            "key-0",
            "exactly-16-bytes",
            "seventeen-bytes!!",
            &"x".repeat(128),
        ] {
            assert_eq!(LimitKey::from_parts([part.as_bytes()]).as_str(), part);
        }
        let key = LimitKey::from_parts([b"203.0.113.7".as_slice(), b"GET", &[b'p'; 40]]);
        assert_eq!(key.as_str(), format!("203.0.113.7:GET:{}", "p".repeat(40)));
    }

    #[test]
    fn long_keys_are_hashed_to_a_fixed_length() {
        let long = vec![b'a'; 10_000];
        let key = LimitKey::from_parts([long.as_slice()]);
        assert_eq!(key.as_str().len(), 33);
        assert!(key.as_str().starts_with('#'));
        assert_eq!(LimitKey::parse(key.as_str()), Ok(key));
    }

    #[test]
    fn every_built_key_parses_and_nothing_else_does() {
        for parts in [
            vec![&b"1.2.3.4"[..]],
            vec![b"GET", b"/a b"],
            vec![b"%", b"#"],
            vec![b""],
        ] {
            let key = LimitKey::from_parts(parts);
            assert_eq!(LimitKey::parse(key.as_str()), Ok(key.clone()));
        }
        for bad in ["a}b", "a{b", "50%", "%zz", "a b", "#abc", "é"] {
            assert!(LimitKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rule_names_are_restricted() {
        assert!(RuleName::new("per-ip_v2.1").is_ok());
        for bad in ["", "a b", "a:b", "a{b", &"x".repeat(65)] {
            assert!(RuleName::new(bad).is_err(), "{bad:?}");
        }
    }
}
