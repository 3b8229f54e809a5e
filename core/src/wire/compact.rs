//! The `/v1/decide` body and its answer written and read without a general serializer, on
//! both hot paths: the filter writes requests and reads answers, the server reads requests and
//! writes answers. What is written is exactly what serde writes for [`DecideRequest`] and
//! [`DecideResponse`] (the tests compare the bytes). A reader takes only the canonical form
//! (serde's compact output, fields in declaration order) and hands anything else to serde, so
//! the wire is the one defined by the types in [`super`], whichever path reads or writes it.

use super::{Check, DecideRequest, DecideResponse, WireError};
use crate::decimal;
use crate::duration::Millis;
use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, RawLimit};
use crate::verdict::Verdict;

/// A rule's part of every check it sends, encoded once: everything but the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTemplate {
    /// `{"rule":"NAME","key":`
    head: String,
    /// `,"limit":{...},"cost":N` and the flags that are set, then `}`.
    tail: String,
}

impl CheckTemplate {
    /// The template of a check of rule `rule` with these settings.
    pub fn new(
        rule: &RuleName,
        limit: &Limit,
        cost: u64,
        count_denied: bool,
        shadow: bool,
    ) -> CheckTemplate {
        let check = Check {
            rule: rule.clone(),
            key: LimitKey::from_parts([b"k".as_slice()]),
            limit: *limit,
            cost,
            count_denied,
            shadow,
        };
        // Split serde's own encoding around the key, so that the template cannot drift from
        // the wire type.
        // (A rule name has no `,` `:` or `"`: the key field is the first match.)
        let whole = serde_json::to_string(&check).unwrap_or_default();
        let (head, tail) = whole.split_once(r#","key":"k""#).unwrap_or((&whole, ""));
        CheckTemplate {
            head: format!(r#"{head},"key":"#),
            tail: tail.to_owned(),
        }
    }
}

/// Writes a `/v1/decide` body with a check per `(template, key)`, into `out`.
pub fn write_decide_request<'a>(
    out: &mut Vec<u8>,
    checks: impl IntoIterator<Item = (&'a CheckTemplate, &'a LimitKey)>,
) {
    out.extend_from_slice(br#"{"checks":["#);
    for (i, (template, key)) in checks.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(template.head.as_bytes());
        write_json_string(out, key.as_str());
        out.extend_from_slice(template.tail.as_bytes());
    }
    out.extend_from_slice(b"]}");
}

/// Writes `s` as a JSON string, as serde writes it.
// Inlined: the filter writes a key or two a request, most of them a few bytes long, where a
// call's own cost is a fair part of the work.
#[inline]
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    // An escaped key is printable ASCII; only `"` and `\` would need JSON's escapes.
    if needs_escape(s.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Writes the `/v1/decide` answer holding `results`, into `out`.
pub fn write_decide_response(out: &mut Vec<u8>, results: &[Verdict]) {
    out.extend_from_slice(br#"{"results":["#);
    for (i, v) in results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(if v.allowed {
            br#"{"allowed":true,"limit":"#.as_slice()
        } else {
            br#"{"allowed":false,"limit":"#.as_slice()
        });
        decimal::write(out, v.limit);
        out.extend_from_slice(br#","remaining":"#);
        decimal::write(out, v.remaining);
        out.extend_from_slice(br#","reset_ms":"#);
        decimal::write(out, v.reset_ms);
        out.extend_from_slice(br#","retry_after_ms":"#);
        match v.retry_after_ms {
            Some(ms) => decimal::write(out, ms),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","delay_ms":"#);
        decimal::write(out, v.delay_ms);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

/// Whether any byte is `"`, `\\` or a control character, eight bytes at a time (this runs on
/// every key the filter writes).
#[inline]
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    // Whether any byte of `v` is below `n` (n <= 128): the classic borrow test, exact about
    // whether there is one.
    let any_below = |v: u64, n: u8| v.wrapping_sub(ONES * u64::from(n)) & !v & HIGHS != 0;
    let any_equal = |v: u64, b: u8| any_below(v ^ (ONES * u64::from(b)), 1);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        if any_below(v, 0x20) || any_equal(v, b'"') || any_equal(v, b'\\') {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b == b'"' || b == b'\\' || b < 0x20)
}

/// Reads a `/v1/decide` answer that should hold `checks` verdicts.
pub fn read_decide_response(body: &[u8], checks: usize) -> Result<Vec<Verdict>, WireError> {
    let mut results = Vec::new();
    read_decide_response_into(body, checks, &mut results)?;
    Ok(results)
}

/// [`read_decide_response`] into `results`, in place of what it held: a filter keeps one list
/// for every answer it reads.
pub fn read_decide_response_into(
    body: &[u8],
    checks: usize,
    results: &mut Vec<Verdict>,
) -> Result<(), WireError> {
    if read_canonical_into(body, results).is_none() {
        *results = serde_json::from_slice::<DecideResponse>(body)
            .map_err(|e| WireError::at("response body", e.to_string()))?
            .results;
    }
    if results.len() != checks {
        return Err(WireError::at(
            "response body",
            format!("{} results for {checks} checks", results.len()),
        ));
    }
    Ok(())
}

/// The verdicts of an answer in serde's compact form with the fields in declaration order;
/// `None` for any other text, valid or not.
pub fn read_canonical(body: &[u8]) -> Option<Vec<Verdict>> {
    let mut results = Vec::new();
    read_canonical_into(body, &mut results)?;
    Some(results)
}

/// [`read_canonical`] into `results`, in place of what it held.
fn read_canonical_into(body: &[u8], results: &mut Vec<Verdict>) -> Option<()> {
    Reader::whole_into(body, br#"{"results":"#, Reader::verdict, results)
}

/// A `/v1/decide` body in serde's compact form with the fields in declaration order (what the
/// filter writes), not yet validated as a whole; `None` for any other text, valid or not.
/// Each name, key and limit is validated as serde would, and `None` where serde would refuse.
pub fn read_canonical_request(body: &[u8]) -> Option<DecideRequest> {
    let checks = Reader::whole(body, br#"{"checks":"#, Reader::check)?;
    Some(DecideRequest { checks })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// All of `body`: `head`, a list of items read by `item`, and the closing `}`.
    fn whole<T, const N: usize>(
        body: &'a [u8],
        head: &[u8; N],
        item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut items = Vec::with_capacity(4);
        Reader::whole_into(body, head, item, &mut items)?;
        Some(items)
    }

    /// [`Reader::whole`], the items in `items`, in place of what it held.
    fn whole_into<T, const N: usize>(
        body: &'a [u8],
        head: &[u8; N],
        item: impl FnMut(&mut Self) -> Option<T>,
        items: &mut Vec<T>,
    ) -> Option<()> {
        let mut r = Reader { bytes: body, at: 0 };
        r.literal(head)?;
        r.list(item, items)?;
        r.literal(b"}")?;
        (r.at == body.len()).then_some(())
    }

    /// `[item,item,...]`, into `items`, emptied first.
    fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Option<T>,
        items: &mut Vec<T>,
    ) -> Option<()> {
        items.clear();
        self.literal(b"[")?;
        if !self.eat(b']') {
            loop {
                items.push(item(self)?);
                if self.eat(b']') {
                    break;
                }
                self.literal(b",")?;
            }
        }
        Some(())
    }

    // Of a length known when compiled, and compared as an array: a few word loads with no
    // length compare (a loop reading the one-verdict answer, under callgrind, 479 -> 458
    // instructions an answer, which has a dozen literals).
    fn literal<const N: usize>(&mut self, expected: &[u8; N]) -> Option<()> {
        let end = self.at.checked_add(N)?;
        let found: &[u8; N] = self.bytes.get(self.at..end)?.try_into().ok()?;
        (found == expected).then(|| self.at = end)
    }

    fn eat(&mut self, b: u8) -> bool {
        let found = self.bytes.get(self.at) == Some(&b);
        if found {
            self.at += 1;
        }
        found
    }

    /// A string without escapes or control characters (serde refuses those raw, and unescapes
    /// the rest, which is left to it).
    fn string(&mut self) -> Option<&str> {
        self.literal(b"\"")?;
        let rest = self.bytes.get(self.at..)?;
        let len = rest.iter().position(|&b| b == b'"')?;
        let text = &rest[..len];
        if text.iter().any(|&b| b == b'\\' || b < 0x20) {
            return None;
        }
        self.at += len + 1;
        std::str::from_utf8(text).ok()
    }

    fn duration(&mut self) -> Option<Millis> {
        self.string()?.parse().ok()
    }

    fn check(&mut self) -> Option<Check> {
        self.literal(br#"{"rule":"#)?;
        let rule = RuleName::new(self.string()?).ok()?;
        self.literal(br#","key":"#)?;
        let key = LimitKey::parse(self.string()?).ok()?;
        self.literal(br#","limit":"#)?;
        let limit = self.limit()?;
        self.literal(br#","cost":"#)?;
        let cost = self.number()?;
        let count_denied = self.literal(br#","count_denied":true"#).is_some();
        let shadow = self.literal(br#","shadow":true"#).is_some();
        self.literal(b"}")?;
        Some(Check {
            rule,
            key,
            limit,
            cost,
            count_denied,
            shadow,
        })
    }

    /// A limit's fields in [`RawLimit`]'s order, each present only when set, as serde writes
    /// them; validated as serde validates them.
    fn limit(&mut self) -> Option<Limit> {
        self.literal(br#"{"algorithm":"#)?;
        let mut raw = RawLimit {
            algorithm: self.string()?.to_owned(),
            ..RawLimit::default()
        };
        if self.literal(br#","limit":"#).is_some() {
            raw.limit = Some(self.number()?);
        }
        if self.literal(br#","window":"#).is_some() {
            raw.window = Some(self.duration()?);
        }
        if self.literal(br#","rate":"#).is_some() {
            raw.rate = Some(self.number()?);
        }
        if self.literal(br#","per":"#).is_some() {
            raw.per = Some(self.duration()?);
        }
        if self.literal(br#","burst":"#).is_some() {
            raw.burst = Some(self.number()?);
        }
        if self.literal(br#","mode":"#).is_some() {
            raw.mode = Some(self.string()?.to_owned());
        }
        if self.literal(br#","max_wait":"#).is_some() {
            raw.max_wait = Some(self.duration()?);
        }
        self.literal(b"}")?;
        Limit::try_from(raw).ok()
    }

    fn number(&mut self) -> Option<u64> {
        let (value, digits) = decimal::leading(self.bytes.get(self.at..)?)?;
        self.at += digits;
        Some(value)
    }

    fn verdict(&mut self) -> Option<Verdict> {
        self.literal(br#"{"allowed":"#)?;
        let allowed = if self.literal(b"true").is_some() {
            true
        } else {
            self.literal(b"false")?;
            false
        };
        self.literal(br#","limit":"#)?;
        let limit = self.number()?;
        self.literal(br#","remaining":"#)?;
        let remaining = self.number()?;
        self.literal(br#","reset_ms":"#)?;
        let reset_ms = self.number()?;
        self.literal(br#","retry_after_ms":"#)?;
        let retry_after_ms = if self.literal(b"null").is_some() {
            None
        } else {
            Some(self.number()?)
        };
        self.literal(br#","delay_ms":"#)?;
        let delay_ms = self.number()?;
        self.literal(b"}")?;
        Some(Verdict {
            allowed,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            delay_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DecideRequest;

    #[test]
    fn a_character_json_escapes_is_found_wherever_it_is() {
        let plain = "abcdefghijklmnopqrstuvwxyz0123456789~!@$^&*()[]";
        assert!(!needs_escape(plain.as_bytes()));
        for special in [b'"', b'\\', b'\n', 0x00, 0x1f] {
            for at in 0..plain.len() {
                let mut text = plain.as_bytes().to_vec();
                text[at] = special;
                assert!(needs_escape(&text), "{special:#x} at {at}");
            }
        }
        // The bytes next to the ones looked for are not.
        assert!(!needs_escape(b" !#[]^`{|}~ !#[]^`{|}~"));
    }

    #[test]
    fn the_body_is_what_serde_writes() {
        let limit: Limit =
            serde_json::from_str(r#"{"algorithm":"gcra","rate":15,"per":"1s","burst":30}"#)
                .unwrap();
        let rules = [
            RuleName::new("per-ip").unwrap(),
            RuleName::new("b").unwrap(),
        ];
        let keys = [
            LimitKey::from_parts([b"198.51.100.1".as_slice()]),
            LimitKey::parse(r#"we"ird\key"#).unwrap(),
        ];
        let templates = [
            CheckTemplate::new(&rules[0], &limit, 1, false, false),
            CheckTemplate::new(&rules[1], &limit, 3, true, true),
        ];
        let mut body = Vec::new();
        write_decide_request(&mut body, templates.iter().zip(&keys));
        let expected = DecideRequest {
            checks: vec![
                Check {
                    rule: rules[0].clone(),
                    key: keys[0].clone(),
                    limit,
                    cost: 1,
                    count_denied: false,
                    shadow: false,
                },
                Check {
                    rule: rules[1].clone(),
                    key: keys[1].clone(),
                    limit,
                    cost: 3,
                    count_denied: true,
                    shadow: true,
                },
            ],
        };
        assert_eq!(
            String::from_utf8(body).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
    }

    #[test]
    fn other_forms_of_an_answer_go_to_serde() {
        let canonical = br#"{"results":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":100,"retry_after_ms":0,"delay_ms":0},{"allowed":false,"limit":1,"remaining":0,"reset_ms":5,"retry_after_ms":null,"delay_ms":0}]}"#;
        let verdicts = read_canonical(canonical).unwrap();
        assert_eq!(verdicts[1], Verdict::impossible(1, 0, 5));
        let spaced = br#"{ "results": [ {"limit":10,"allowed":true,"remaining":9,"reset_ms":100,"retry_after_ms":0} ] }"#;
        assert_eq!(read_canonical(spaced), None);
        assert_eq!(read_decide_response(spaced, 1).unwrap()[0], verdicts[0]);
        assert_eq!(
            read_decide_response(canonical, 3).unwrap_err().to_string(),
            "response body: 2 results for 3 checks"
        );
        for junk in [
            &br#"{"results":[{"allowed":true,"limit":01,"remaining":9,"reset_ms":100,"retry_after_ms":0,"delay_ms":0}]}"#[..],
            br#"{"results":[{"allowed":true,"limit":99999999999999999999,"remaining":9,"reset_ms":100,"retry_after_ms":0,"delay_ms":0}]}"#,
            br#"{"results":[]}x"#,
            br#"{"results":[{"allowed":true,"limit":184467440737095516150,"remaining":9,"reset_ms":100,"retry_after_ms":0,"delay_ms":0}]}"#,
        ] {
            assert_eq!(read_canonical(junk), None);
            assert!(read_decide_response(junk, 1).is_err());
        }
    }
}
