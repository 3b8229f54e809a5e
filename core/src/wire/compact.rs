//! The `/v1/decide` body written and its answer read without a general serializer, for the
//! filter's hot path. The bytes are exactly what serde writes for [`DecideRequest`] (the
//! tests compare them), and the reader takes only the answer's canonical form (the server's,
//! serde's compact output) and hands anything else to serde, so the wire is the one defined
//! by the types in [`super`], whichever path reads or writes it.

use super::{Check, DecideResponse, WireError};
use crate::key::{LimitKey, RuleName};
use crate::limit::Limit;
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
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    // An escaped key is printable ASCII; only `"` and `\` would need JSON's escapes.
    if s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Reads a `/v1/decide` answer that should hold `checks` verdicts.
pub fn read_decide_response(body: &[u8], checks: usize) -> Result<Vec<Verdict>, WireError> {
    let results = match read_canonical(body) {
        Some(results) => results,
        None => {
            serde_json::from_slice::<DecideResponse>(body)
                .map_err(|e| WireError(format!("response body: {e}")))?
                .results
        }
    };
    if results.len() != checks {
        return Err(WireError(format!(
            "response body: {} results for {checks} checks",
            results.len()
        )));
    }
    Ok(results)
}

/// The verdicts of an answer in serde's compact form with the fields in declaration order;
/// `None` for any other text, valid or not.
pub fn read_canonical(body: &[u8]) -> Option<Vec<Verdict>> {
    let mut r = Reader { bytes: body, at: 0 };
    r.literal(br#"{"results":["#)?;
    let mut results = Vec::with_capacity(4);
    if !r.eat(b']') {
        loop {
            results.push(r.verdict()?);
            if r.eat(b']') {
                break;
            }
            r.literal(b",")?;
        }
    }
    r.literal(b"}")?;
    (r.at == body.len()).then_some(results)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn literal(&mut self, expected: &[u8]) -> Option<()> {
        let end = self.at.checked_add(expected.len())?;
        (self.bytes.get(self.at..end)? == expected).then(|| self.at = end)
    }

    fn eat(&mut self, b: u8) -> bool {
        let found = self.bytes.get(self.at) == Some(&b);
        if found {
            self.at += 1;
        }
        found
    }

    fn number(&mut self) -> Option<u64> {
        let digits = self.bytes[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        // JSON has no leading zeros; serde writes none.
        // u64::MAX has 20 digits: anything longer is out of range.
        if digits == 0 || digits > 20 || (digits > 1 && self.bytes[self.at] == b'0') {
            return None;
        }
        let text = &self.bytes[self.at..self.at + digits];
        self.at += digits;
        // Up to 19 digits cannot overflow; only a 20-digit number needs checking.
        let fold = |digits: &[u8]| {
            digits
                .iter()
                .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'))
        };
        if digits < 20 {
            Some(fold(text))
        } else {
            let (head, last) = text.split_at(digits - 1);
            fold(head)
                .checked_mul(10)?
                .checked_add(u64::from(last[0] - b'0'))
        }
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
            read_decide_response(canonical, 3).unwrap_err().0,
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
