//! Every check of one request, decided together: all or nothing.
//!
//! A request is denied when any enforced (non-shadow) check denies it, and a denied request
//! consumes nothing from any rule: not from the rules that denied it (unless they count
//! denials), and not from the rules that would have admitted it. So a client that a per-route
//! rule keeps out does not drain its own per-client quota meanwhile.
//!
//! - Every check is first asked at its cost without consuming. If no enforced check denies,
//!   every check consumes its cost (a shadow check that denies consumes as a denial does:
//!   only with `count_denied`).
//! - If an enforced check denies, each check that denies is decided as a denial (counted with
//!   `count_denied`), and each check that would admit is asked at cost 0: it consumes nothing,
//!   and its answer tells the state it is in.
//!
//! `lua/batch.lua` does exactly this in one script; on a Redis Cluster, where a request's keys
//! live on several nodes, sluice-server does it in two phases (see `docs/algorithms.md`).

use super::model::{Outcome, Request};
use super::state::State;
use crate::limit::Limit;

/// One check of a request, with its key's state.
#[derive(Debug, Clone, Copy)]
pub struct CheckInput<'a> {
    /// The check's limit.
    pub limit: &'a Limit,
    /// Its key's stored state.
    pub state: Option<&'a State>,
    /// The units it asks for.
    pub cost: u64,
    /// Whether its denials consume.
    pub count_denied: bool,
    /// Whether it is a shadow check (decided and counted, never denying the request).
    pub shadow: bool,
}

/// Decides every check of one request at `now_us`; the outcomes are in check order. Keys
/// must be distinct (each check its own state).
pub fn decide_all(checks: &[CheckInput<'_>], now_us: i64) -> Vec<Outcome<State>> {
    let ask = |c: &CheckInput<'_>, cost: u64| {
        c.limit.decide(
            c.state,
            Request {
                now_us,
                cost,
                count_denied: c.count_denied,
            },
        )
    };
    let asked: Vec<Outcome<State>> = checks.iter().map(|c| ask(c, c.cost)).collect();
    let blocked = checks
        .iter()
        .zip(&asked)
        .any(|(c, out)| !c.shadow && !out.verdict.allowed);
    checks
        .iter()
        .zip(asked)
        .map(|(c, out)| {
            if blocked && out.verdict.allowed {
                ask(c, 0)
            } else {
                out
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Update;

    fn limit(json: &str) -> Limit {
        serde_json::from_str(json).unwrap()
    }

    fn apply(state: &mut Option<State>, out: &Outcome<State>) {
        if let Update::Write { state: s, .. } = &out.update {
            *state = Some(s.clone());
        }
    }

    /// Rule `a` (5 a minute) and rule `b` (1 a minute) on every request.
    fn run(b_count_denied: bool, b_shadow: bool, requests: usize) -> (Vec<bool>, Vec<u64>) {
        let a = limit(r#"{"algorithm":"fixed_window","limit":5,"window":"1m"}"#);
        let b = limit(r#"{"algorithm":"fixed_window","limit":1,"window":"1m"}"#);
        let (mut sa, mut sb) = (None, None);
        let mut remaining_a = Vec::new();
        let mut request_allowed = Vec::new();
        for i in 0..requests {
            let checks = [
                CheckInput {
                    limit: &a,
                    state: sa.as_ref(),
                    cost: 1,
                    count_denied: false,
                    shadow: false,
                },
                CheckInput {
                    limit: &b,
                    state: sb.as_ref(),
                    cost: 1,
                    count_denied: b_count_denied,
                    shadow: b_shadow,
                },
            ];
            let out = decide_all(&checks, 1_000 + i as i64);
            apply(&mut sa, &out[0]);
            apply(&mut sb, &out[1]);
            remaining_a.push(out[0].verdict.remaining);
            request_allowed.push(out[0].verdict.allowed && (b_shadow || out[1].verdict.allowed));
        }
        (request_allowed, remaining_a)
    }

    #[test]
    fn a_request_denied_by_one_rule_consumes_nothing_from_another() {
        let (allowed, remaining_a) = run(false, false, 8);
        assert_eq!(
            allowed,
            [true, false, false, false, false, false, false, false]
        );
        assert_eq!(remaining_a, [4; 8]);
    }

    #[test]
    fn a_shadow_rule_never_blocks_the_others() {
        let (allowed, remaining_a) = run(false, true, 6);
        assert_eq!(allowed, [true, true, true, true, true, false]);
        assert_eq!(remaining_a, [4, 3, 2, 1, 0, 0]);
    }
}
