//! From the server's verdicts to what the filter does with the request, and the headers that
//! tell the client about it.
//!
//! - Denied when any enforced (non-shadow) check is denied. The binding denial is the one that
//!   lasts longest: its rule's numbers go in the headers, and `Retry-After` says when the
//!   request could pass (absent when it never can).
//! - No header tells a client to wait longer than the rule's limit ever asks
//!   ([`Limit::longest_wait_ms`]), whatever the answer said: a wrong answer cannot send
//!   clients away for days.
//! - Otherwise allowed; a shaping leaky bucket may ask to hold the request first (the longest
//!   such delay wins). With `on_allowed`, the response carries the headers of the most
//!   constrained enforced rule (least remaining).

use crate::limit::Limit;
use crate::policy::{HeaderStyle, Policy, ResponseConfig};
use crate::verdict::Verdict;

/// What the filter does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let it go on, after `delay_ms`, adding `headers` to its response.
    Allow {
        /// How long to hold it first (shaping).
        delay_ms: u64,
        /// Headers for the upstream response (empty unless `on_allowed`).
        headers: Vec<(String, String)>,
    },
    /// Answer it locally.
    Deny(Denial),
}

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: String,
    /// Headers, lower-case names.
    pub headers: Vec<(String, String)>,
}

/// One enforced or shadow rule's verdict, as the filter hands it over.
#[derive(Debug, Clone, Copy)]
pub struct RuleVerdict<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// Its limit.
    pub limit: &'a Limit,
    /// Whether it is a shadow rule.
    pub shadow: bool,
    /// The server's answer.
    pub verdict: &'a Verdict,
}

/// Decides the request from the verdicts of the checks it needed, in one pass over
/// `verdicts` (the filter hands them over without gathering them in a list, and decides a
/// request from a lease in a few thousand instructions, where each pass counts).
pub fn decide<'a, I>(response: &ResponseConfig, verdicts: I) -> Decision
where
    I: IntoIterator<Item = RuleVerdict<'a>>,
{
    // The binding denial with how long it lasts; the longest delay asked; the enforced
    // verdict with the least remaining (the first of equals).
    let mut binding: Option<(u64, RuleVerdict<'a>)> = None;
    let mut delay_ms = 0;
    let mut tightest: Option<RuleVerdict<'a>> = None;
    for v in verdicts.into_iter().filter(|v| !v.shadow) {
        if !v.verdict.allowed {
            let lasts = v.verdict.retry_after_ms.unwrap_or(u64::MAX);
            // Of denials that last as long, the last binds.
            if binding.is_none_or(|(longest, _)| lasts >= longest) {
                binding = Some((lasts, v));
            }
            continue;
        }
        delay_ms = delay_ms.max(v.verdict.delay_ms);
        let least = (v.verdict.remaining, v.verdict.limit);
        if tightest.is_none_or(|t| least < (t.verdict.remaining, t.verdict.limit)) {
            tightest = Some(v);
        }
    }
    if let Some((_, denial)) = binding {
        let mut headers = Vec::new();
        if let Some(retry_ms) = denial.verdict.retry_after_ms {
            let retry_ms = retry_ms.min(denial.limit.longest_wait_ms());
            headers.push(("retry-after".to_owned(), seconds(retry_ms).to_string()));
        }
        headers.extend(rate_limit_headers(response.headers, &denial));
        return Decision::Deny(Denial {
            status: response.status,
            body: response.body.clone(),
            headers,
        });
    }
    let headers = match tightest {
        Some(v) if response.on_allowed => rate_limit_headers(response.headers, &v),
        _ => Vec::new(),
    };
    Decision::Allow { delay_ms, headers }
}

/// Whole seconds, rounded up: clients must not come back early.
pub fn seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The rate-limit headers for one rule's verdict, in the chosen style.
pub fn rate_limit_headers(style: HeaderStyle, v: &RuleVerdict<'_>) -> Vec<(String, String)> {
    let reset = seconds(v.verdict.reset_ms.min(v.limit.longest_wait_ms()));
    match style {
        HeaderStyle::None => Vec::new(),
        HeaderStyle::XRateLimit => vec![
            ("x-ratelimit-limit".to_owned(), v.verdict.limit.to_string()),
            (
                "x-ratelimit-remaining".to_owned(),
                v.verdict.remaining.to_string(),
            ),
            ("x-ratelimit-reset".to_owned(), reset.to_string()),
        ],
        HeaderStyle::Ietf => {
            // draft-ietf-httpapi-ratelimit-headers: a quota policy named by the rule, its quota
            // (q) and window (w, seconds); the remaining units (r) and seconds to reset (t).
            let (_, per) = v.limit.nominal_rate();
            let window = seconds(per.as_millis()).max(1);
            vec![
                (
                    "ratelimit-policy".to_owned(),
                    format!("\"{}\";q={};w={}", v.rule, v.verdict.limit, window),
                ),
                (
                    "ratelimit".to_owned(),
                    format!("\"{}\";r={};t={}", v.rule, v.verdict.remaining, reset),
                ),
            ]
        }
    }
}

impl Policy {
    /// The reply when sluice-server cannot answer and the failure mode is `deny`.
    pub fn failure_denial(&self) -> Denial {
        Denial {
            status: 503,
            body: "rate limit service unavailable\n".to_owned(),
            headers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit() -> Limit {
        serde_json::from_str(r#"{"algorithm":"fixed_window","limit":10,"window":"1m"}"#).unwrap()
    }

    fn verdict(allowed: bool, remaining: u64, retry: Option<u64>) -> Verdict {
        Verdict {
            allowed,
            limit: 10,
            remaining,
            reset_ms: 30_500,
            retry_after_ms: retry,
            delay_ms: 0,
        }
    }

    /// An enforced rule's verdict.
    fn enforced<'a>(rule: &'a str, limit: &'a Limit, verdict: &'a Verdict) -> RuleVerdict<'a> {
        RuleVerdict {
            rule,
            limit,
            shadow: false,
            verdict,
        }
    }

    fn config(headers: HeaderStyle, on_allowed: bool) -> ResponseConfig {
        ResponseConfig {
            status: 429,
            body: "slow down".into(),
            headers,
            on_allowed,
        }
    }

    #[test]
    fn a_denial_carries_retry_after_and_the_binding_rules_headers() {
        let l = limit();
        let short = verdict(false, 0, Some(1_200));
        let long = verdict(false, 0, Some(7_001));
        let vs = [enforced("a", &l, &short), enforced("b", &l, &long)];
        let Decision::Deny(d) = decide(&config(HeaderStyle::XRateLimit, false), vs.iter().copied())
        else {
            panic!()
        };
        assert_eq!(d.status, 429);
        assert_eq!(
            d.headers,
            [
                ("retry-after".to_owned(), "8".to_owned()),
                ("x-ratelimit-limit".to_owned(), "10".to_owned()),
                ("x-ratelimit-remaining".to_owned(), "0".to_owned()),
                ("x-ratelimit-reset".to_owned(), "31".to_owned()),
            ]
        );
    }

    #[test]
    fn ties_go_as_they_always_have_a_denial_to_the_last_headers_to_the_first() {
        let l = limit();
        let never = verdict(false, 0, None);
        let soon = verdict(false, 0, Some(2_000));
        let soon_too = verdict(false, 0, Some(2_000));
        let deny = |vs: &[RuleVerdict<'_>]| match decide(
            &config(HeaderStyle::Ietf, false),
            vs.iter().copied(),
        ) {
            Decision::Deny(d) => d.headers[1].1.clone(),
            Decision::Allow { .. } => panic!("denied by enforced checks"),
        };
        // A denial that never ends binds; of denials as long, the last one.
        let binding = deny(&[enforced("never", &l, &never), enforced("soon", &l, &soon)]);
        assert!(binding.starts_with("\"never\""), "{binding}");
        let binding = deny(&[enforced("a", &l, &soon), enforced("b", &l, &soon_too)]);
        assert!(binding.starts_with("\"b\""), "{binding}");

        let held = |delay_ms, remaining| Verdict {
            delay_ms,
            ..verdict(true, remaining, Some(0))
        };
        let (three, one, one_too, shadow) = (held(40, 3), held(90, 1), held(10, 1), held(500, 0));
        let vs = [
            enforced("three", &l, &three),
            enforced("one", &l, &one),
            enforced("one-too", &l, &one_too),
            RuleVerdict {
                shadow: true,
                ..enforced("shadow", &l, &shadow)
            },
        ];
        // The longest enforced delay holds it; the least remaining (the first of equals)
        // speaks for it; a shadow rule does neither.
        let Decision::Allow { delay_ms, headers } =
            decide(&config(HeaderStyle::Ietf, true), vs.iter().copied())
        else {
            panic!("every enforced check allowed")
        };
        assert_eq!(delay_ms, 90);
        assert_eq!(headers[1].1, "\"one\";r=1;t=31");
    }

    #[test]
    fn no_header_asks_a_client_to_wait_longer_than_the_limit_ever_does() {
        let l = limit(); // a fixed window of 1m: no wait is longer than 2m
        let absurd = Verdict {
            reset_ms: 1_000_000_000,
            ..verdict(false, 0, Some(1_000_000_000))
        };
        let vs = [enforced("a", &l, &absurd)];
        let Decision::Deny(d) = decide(&config(HeaderStyle::XRateLimit, false), vs.iter().copied())
        else {
            panic!()
        };
        let header = |name: &str| {
            d.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("retry-after"), Some("120"));
        assert_eq!(header("x-ratelimit-reset"), Some("120"));
    }

    #[test]
    fn shadow_denials_do_not_deny() {
        let l = limit();
        let denied = verdict(false, 0, Some(1_000));
        let vs = [RuleVerdict {
            shadow: true,
            ..enforced("s", &l, &denied)
        }];
        assert_eq!(
            decide(&config(HeaderStyle::XRateLimit, true), vs.iter().copied()),
            Decision::Allow {
                delay_ms: 0,
                headers: vec![]
            }
        );
    }

    #[test]
    fn ietf_headers_name_the_policy() {
        let l = limit();
        let a = verdict(true, 3, Some(0));
        let b = verdict(true, 7, Some(0));
        let vs = [enforced("tight", &l, &a), enforced("loose", &l, &b)];
        let Decision::Allow { headers, .. } =
            decide(&config(HeaderStyle::Ietf, true), vs.iter().copied())
        else {
            panic!()
        };
        assert_eq!(
            headers,
            [
                (
                    "ratelimit-policy".to_owned(),
                    "\"tight\";q=10;w=60".to_owned()
                ),
                ("ratelimit".to_owned(), "\"tight\";r=3;t=31".to_owned()),
            ]
        );
    }

    #[test]
    fn a_request_that_can_never_pass_gets_no_retry_after() {
        let l = limit();
        let never = verdict(false, 10, None);
        let vs = [enforced("a", &l, &never)];
        let Decision::Deny(d) = decide(&config(HeaderStyle::None, false), vs.iter().copied())
        else {
            panic!()
        };
        assert!(d.headers.is_empty());
    }
}
