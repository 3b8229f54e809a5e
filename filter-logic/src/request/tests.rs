//! The request's logic against a glue of plain memory and a clock the test sets: the deny
//! cache, leases' reservations and the failure mode, as both filters rely on them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use sluice_core::deny_cache::{Entry, EntryId};
use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{HttpRequest, Policy, Rule};
use sluice_core::record::RuleOutcome;
use sluice_core::verdict::Verdict;
use sluice_core::wire::write_decide_response;

use super::{Act, Repeats, Request, Start};
use crate::glue::{Glue, Local};

/// A glue whose deny cache is a map, whose lease on rule `leased` holds `units`, and which
/// keeps what it was told.
struct Memory {
    policy: Policy,
    now_us: Cell<u64>,
    cache: RefCell<HashMap<String, Entry>>,
    units: Cell<u64>,
    /// What the server had left at the lease's last grant, as the allowance reports it; by
    /// default, the units it still holds.
    granted_remaining: Cell<Option<u64>>,
    given_back: Cell<u64>,
    outcomes: RefCell<Vec<(usize, RuleOutcome)>>,
    records: RefCell<Vec<Vec<u8>>>,
    failures: Cell<u32>,
}

fn memory(policy: &str) -> Memory {
    Memory {
        policy: Policy::from_json(policy.as_bytes()).unwrap(),
        now_us: Cell::new(1_000_000_000),
        cache: RefCell::new(HashMap::new()),
        units: Cell::new(0),
        granted_remaining: Cell::new(None),
        given_back: Cell::new(0),
        outcomes: RefCell::new(Vec::new()),
        records: RefCell::new(Vec::new()),
        failures: Cell::new(0),
    }
}

impl Glue for Memory {
    type Reservation = u64;

    fn policy(&self) -> &Policy {
        &self.policy
    }
    fn now_us(&self) -> u64 {
        self.now_us.get()
    }
    fn record(&self, decision: &[u8]) {
        self.records.borrow_mut().push(decision.to_vec());
    }
    fn count_outcome(&self, rule: usize, outcome: RuleOutcome, _delayed: bool, _local: bool) {
        self.outcomes.borrow_mut().push((rule, outcome));
    }
    fn count_callout(&self, _rules: impl Iterator<Item = usize>) {}
    fn callout_failed(&self, _now_us: u64, _reason: &str) {
        self.failures.set(self.failures.get() + 1);
    }
    fn count_client_ip_fallback(&self) {}
    fn cache_enabled(&self) -> bool {
        true
    }
    fn cache_lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        let cache = self.cache.borrow();
        let entry = cache.get(&id.to_owned_id())?;
        (entry.until_ms > now_ms).then(|| entry.clone())
    }
    fn cache_remember(&self, entry: &Entry, _now_ms: u64) {
        self.cache
            .borrow_mut()
            .insert(entry.id.clone(), entry.clone());
    }
    fn take_lease(
        &self,
        _rule_index: usize,
        _rule: &Rule,
        _config: &LeaseConfig,
        _key: &LimitKey,
        _now_us: u64,
    ) -> Local<u64> {
        match self.units.get() {
            0 => Local::NotHeld,
            n => {
                self.units.set(n - 1);
                Local::Taken {
                    reservation: 1,
                    limit: 100,
                    remaining: self.granted_remaining.get().unwrap_or(n - 1),
                }
            }
        }
    }
    fn give_back(&self, reservation: &u64, _rule: usize, _key: &LimitKey, _now_us: u64) {
        self.given_back.set(self.given_back.get() + reservation);
    }
}

const PER_CLIENT: &str = r#"{"cluster": "sluice", "failure_mode": "deny", "rules": [
    {"name": "per-client", "key": [{"header": "x-client"}],
     "limit": {"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 1}}]}"#;

const LEASED_AND_PER_CLIENT: &str = r#"{"cluster": "sluice", "rules": [
    {"name": "leased", "key": [{"header": "x-client"}],
     "limit": {"algorithm": "gcra", "rate": 100, "per": "1s", "burst": 100}, "lease": {"horizon": "1s"}},
    {"name": "per-client", "key": [{"header": "x-client"}],
     "limit": {"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 1}}]}"#;

fn client(name: &str) -> HttpRequest<'static> {
    HttpRequest {
        headers: [("x-client".into(), name.as_bytes().to_vec().into())]
            .into_iter()
            .collect(),
        source_address: None,
    }
}

/// The server's answer: `verdicts`, as sluice-server writes them.
fn answer(verdicts: &[Verdict]) -> Vec<u8> {
    let mut body = Vec::new();
    write_decide_response(&mut body, verdicts);
    body
}

fn denied(retry_after_ms: u64) -> Verdict {
    Verdict {
        allowed: false,
        limit: 1,
        remaining: 0,
        reset_ms: retry_after_ms,
        retry_after_ms: Some(retry_after_ms),
        delay_ms: 0,
    }
}

/// Starts a request for `name` that must go to the server, and answers it with `verdicts`.
fn ask(glue: &Memory, name: &str, verdicts: &[Verdict]) -> Act {
    let mut request = Request::default();
    let Start::Callout = request.start(glue, &client(name)) else {
        panic!("a request for {name} was decided without the server");
    };
    request.sent(glue);
    let remote = request.read_answer(glue, &answer(verdicts)).unwrap();
    request.answered(glue, &remote)
}

#[test]
fn a_denial_is_remembered_and_answers_the_next_request_without_a_callout() {
    let glue = memory(PER_CLIENT);
    assert!(matches!(ask(&glue, "a", &[denied(700)]), Act::Reply(_)));
    glue.now_us.set(glue.now_us.get() + 500_000);
    let mut request: Request<u64> = Request::default();
    let Start::Decided(Act::Reply(denial)) = request.start(&glue, &client("a")) else {
        panic!("the cached denial did not answer");
    };
    assert_eq!(denial.status, 429);
    let retry = denial
        .headers
        .iter()
        .find(|(n, _)| n == "retry-after")
        .unwrap();
    // 700 ms after the first request's start, 500 ms of them gone: a second, rounded up.
    assert_eq!(retry.1, "1");
    assert_eq!(
        glue.outcomes.borrow().last(),
        Some(&(0, RuleOutcome::CachedDeny))
    );
    // Another client is not denied by it.
    assert!(matches!(request_for(&glue, "b"), Start::Callout));
    // Once it lapses, the key goes to the server again.
    glue.now_us.set(glue.now_us.get() + 200_000);
    assert!(matches!(request_for(&glue, "a"), Start::Callout));
}

fn request_for(glue: &Memory, name: &str) -> Start {
    Request::<u64>::default().start(glue, &client(name))
}

#[test]
fn a_cached_denial_lasts_no_longer_than_the_limits_longest_wait() {
    let glue = memory(PER_CLIENT);
    // A server claiming an hour, for a limit of one a second with a burst of one.
    ask(&glue, "a", &[denied(3_600_000)]);
    let entry = glue.cache.borrow().values().next().cloned().unwrap();
    let longest = glue.policy.rules[0].limit.longest_wait_ms();
    assert!(longest < 3_600_000);
    assert_eq!(entry.until_ms, glue.now_us.get() / 1000 + longest);
}

#[test]
fn the_failure_mode_decides_when_the_server_gives_no_answer() {
    let deny = memory(PER_CLIENT);
    let mut request: Request<u64> = Request::default();
    let Start::Callout = request.start(&deny, &client("a")) else {
        panic!("decided without the server");
    };
    let Act::Reply(denial) = request.fail(&deny, "the callout was reset") else {
        panic!("failure_mode deny admitted");
    };
    assert_eq!(denial.status, deny.policy.failure_denial().status);
    assert_eq!(deny.failures.get(), 1);
    assert_eq!(
        deny.outcomes.borrow().as_slice(),
        &[(0, RuleOutcome::Failed)]
    );

    let allow = memory(&PER_CLIENT.replace("\"deny\"", "\"allow\""));
    let mut request: Request<u64> = Request::default();
    request.start(&allow, &client("a"));
    assert!(matches!(request.fail(&allow, "timeout"), Act::Continue));
}

#[test]
fn a_request_denied_by_one_rule_gives_back_the_units_another_took_from_its_lease() {
    let glue = memory(LEASED_AND_PER_CLIENT);
    glue.units.set(10);
    // The leased rule is decided here; only the other goes to the server, which denies.
    let act = ask(&glue, "a", &[denied(1000)]);
    assert!(matches!(act, Act::Reply(_)));
    assert_eq!(glue.units.get(), 9);
    assert_eq!(
        glue.given_back.get(),
        1,
        "the denied request kept its leased unit"
    );
    // Admitted, it keeps it.
    let allowed = Verdict {
        allowed: true,
        remaining: 0,
        retry_after_ms: None,
        ..denied(0)
    };
    assert!(matches!(ask(&glue, "b", &[allowed]), Act::Continue));
    assert_eq!(glue.given_back.get(), 1);
}

#[test]
fn an_answer_of_the_wrong_length_or_impossible_for_the_limit_is_refused() {
    let glue = memory(PER_CLIENT);
    let mut request: Request<u64> = Request::default();
    request.start(&glue, &client("a"));
    request.sent(&glue);
    assert!(request.read_answer(&glue, &answer(&[])).is_err());
    let impossible = Verdict {
        remaining: 50,
        ..denied(10)
    };
    let error = request
        .read_answer(&glue, &answer(&[impossible]))
        .unwrap_err();
    assert!(error.contains("results[0]"), "{error}");
}

/// What one request did: its start's callout body or act, and the act its answer led to.
fn decided(glue: &Memory, request: &mut Request<u64>, name: &str) -> Vec<String> {
    decided_repeating(glue, request, name, None)
}

/// [`decided`], with the worker's decisions to repeat of the policy known by the id given.
fn decided_repeating(
    glue: &Memory,
    request: &mut Request<u64>,
    name: &str,
    repeats: Option<(&mut Repeats, u64)>,
) -> Vec<String> {
    let start = match repeats {
        Some((repeats, policy)) => request.start_repeating(glue, &client(name), repeats.of(policy)),
        None => request.start(glue, &client(name)),
    };
    match start {
        Start::Decided(act) => vec![format!("{act:?}")],
        Start::Callout => {
            let body = String::from_utf8_lossy(request.callout_body()).into_owned();
            request.sent(glue);
            // The server denies the clients named `deny*` and admits the others.
            let verdicts: Vec<Verdict> = request
                .planned
                .iter()
                .zip(&request.local)
                .filter(|(_, local)| local.is_none())
                .map(|(p, _)| {
                    let limit = glue.policy.rules[p.rule].limit.capacity();
                    match name.starts_with("deny") {
                        true => Verdict {
                            limit,
                            ..denied(900)
                        },
                        false => Verdict {
                            allowed: true,
                            limit,
                            remaining: 0,
                            retry_after_ms: None,
                            ..denied(0)
                        },
                    }
                })
                .collect();
            let remote = request.read_answer(glue, &answer(&verdicts)).unwrap();
            vec![body, format!("{:?}", request.answered(glue, &remote))]
        }
    }
}

#[test]
fn a_request_started_again_decides_as_a_new_one_would() {
    // Leases that run out midway, a denial and the cached denial it leaves, a key longer
    // than any before it, and a request with no check: each from a new `Request`, then all
    // carried in one.
    let long = "a-client-name-longer-than-any-key-this-request-built-before";
    let names = [
        "a", "b", "deny-1", long, "deny-1", "c", "", "a", "deny-2", "b",
    ];
    let run = |carried: bool| {
        // Allowed responses carry headers too: a request's must never reach the next's.
        let glue = memory(
            &LEASED_AND_PER_CLIENT
                .replace(r#""rules""#, r#""response": {"on_allowed": true}, "rules""#),
        );
        glue.units.set(4);
        let mut kept = Request::default();
        let mut acts = Vec::new();
        for name in names {
            let mut new = Request::default();
            let request = if carried { &mut kept } else { &mut new };
            let mut done = decided(&glue, request, name);
            done.push(format!("{:?}", request.response_headers()));
            acts.push(done);
            glue.now_us.set(glue.now_us.get() + 100_000);
        }
        (
            acts,
            glue.records.take(),
            glue.outcomes.take(),
            glue.units.get(),
            glue.given_back.get(),
        )
    };
    let (new, carried) = (run(false), run(true));
    assert!(
        new.0.iter().any(|acts| acts[0].contains("Reply")),
        "a cached denial answered"
    );
    assert!(new.4 > 0, "a denied request gave units back");
    assert_eq!(carried, new);
}

const LEASED: &str = r#"{"cluster": "sluice", "response": {"on_allowed": true}, "rules": [
    {"name": "leased", "key": [{"header": "x-client"}],
     "limit": {"algorithm": "gcra", "rate": 100, "per": "1s", "burst": 100},
     "lease": {"horizon": "1s"}},
    {"name": "watched", "shadow": true, "key": [{"header": "x-client"}],
     "limit": {"algorithm": "gcra", "rate": 100, "per": "1s", "burst": 100},
     "lease": {"horizon": "1s"}}]}"#;

#[test]
fn a_request_that_repeats_a_kept_decision_decides_as_a_new_one_would() {
    // A hot key's allowances say the same request after request until its lease is renewed
    // (what the server had left at the grant): such a request repeats the decision kept for
    // its key, its record and its headers, whichever keys came between. Between the repeats:
    // a renewal, and allowances run dry (a callout).
    let steps = [
        ("hot", Some(40)),
        ("warm", Some(40)),
        ("hot", Some(40)),
        ("warm", Some(40)),
        ("cold", Some(40)),
        ("hot", Some(40)),
        ("hot", Some(39)),
        ("warm", Some(39)),
        ("hot", Some(39)),
        ("hot", None),
        ("hot", Some(39)),
        ("warm", Some(39)),
    ];
    let run = |repeating: bool| {
        let glue = memory(LEASED);
        let mut repeats = Repeats::default();
        let mut acts = Vec::new();
        for (name, granted_remaining) in steps {
            // `None`: both allowances dry.
            glue.units
                .set(if granted_remaining.is_some() { 100 } else { 0 });
            glue.granted_remaining.set(granted_remaining);
            // A stream of its own for each request, as a worker's requests have.
            let mut request = Request::default();
            let kept = repeating.then_some((&mut repeats, 1));
            let mut done = decided_repeating(&glue, &mut request, name, kept);
            done.push(format!("{:?}", request.response_headers()));
            acts.push(done);
        }
        let outcomes = glue.outcomes.take();
        (acts, glue.records.take(), outcomes, repeats.hits)
    };
    let (new, repeated) = (run(false), run(true));
    assert_eq!(
        new.2.len(),
        2 * steps.len(),
        "each request counted once a rule"
    );
    assert!(
        new.0[1][1].contains("x-ratelimit-remaining"),
        "{:?}",
        new.0[1]
    );
    assert_eq!(repeated.0, new.0);
    assert_eq!(repeated.1, new.1);
    assert_eq!(repeated.2, new.2);
    // At 40: the second and third hot, the second warm; at 39: the second hot, the hot after
    // the dry one, the second warm (the run without repeats keeps none, so its count says
    // nothing).
    assert_eq!(repeated.3, 6, "requests that repeated a kept decision");
}

#[test]
fn a_request_of_another_policy_does_not_repeat_a_kept_decision() {
    // The same rule's index and the same key, renamed: a new configuration, maybe at the
    // address of the one it replaced.
    let first = memory(LEASED);
    let renamed = memory(&LEASED.replace(r#""leased""#, r#""renamed""#));
    for glue in [&first, &renamed] {
        glue.units.set(10);
        glue.granted_remaining.set(Some(5));
    }
    let mut repeats = Repeats::default();
    for _ in 0..2 {
        let _ = decided_repeating(
            &first,
            &mut Request::default(),
            "a",
            Some((&mut repeats, 1)),
        );
    }
    assert_eq!(repeats.hits, 1);
    let _ = decided_repeating(
        &renamed,
        &mut Request::default(),
        "a",
        Some((&mut repeats, 2)),
    );
    assert_eq!(repeats.hits, 1, "another policy's decision is not repeated");
    let record = String::from_utf8(renamed.records.take().concat()).unwrap();
    assert!(record.contains(r#""rule":"renamed""#), "{record}");
}
