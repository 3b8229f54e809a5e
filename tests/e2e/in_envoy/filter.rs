//! sluice's wasm filter in a real Envoy with two workers, deciding per request through a real
//! sluice-server into Redis: limits, both header styles, several rules all or nothing, the deny
//! cache shared by the workers, shaping's hold, shadow mode.

use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{
    Backends, MutualTls, Plugin, Way, burst, count_status, eventually, get, plugin_config,
    start_envoy, try_start_envoy,
};
use sluice_harness::{Envoy, clear_of_window_end};

/// Workers per Envoy: more than one, so that they really run side by side.
pub const WORKERS: usize = 2;

/// What a test on a fixed one-minute window needs of its minute: Envoy's start and its
/// requests, with room to spare (one such test failed when its window turned over mid-test).
const MINUTE_WINDOW_TEST: Duration = Duration::from_secs(15);

/// The window of the fixed-window limits these tests count on.
const MINUTE: Duration = Duration::from_secs(60);

/// Runs each `fn name(way) { ... }` as two tests, `name::wasm` and `name::module`: the same
/// assertions for both builds of the filter.
macro_rules! both_ways {
    (fn $name:ident($way:ident) $body:block) => {
        mod $name {
            use super::*;

            fn run($way: Way) $body

            #[test]
            fn wasm() {
                run(Way::Wasm);
            }

            #[test]
            fn module() {
                run(Way::Module);
            }
        }
    };
}
pub(crate) use both_ways;

/// Starts an Envoy with the filter, built `way`, on `policy` in front of `backends`.
pub fn envoy_with(way: Way, backends: &Backends, policy: &str, failure_policy: &str) -> Envoy {
    let config = plugin_config(
        &Plugin::sluice(policy).via(way).failing(failure_policy),
        backends.server_addr(),
        backends.upstream.addr(),
    );
    start_envoy(&config, WORKERS)
}

/// A filter stat (without the prefix `way`'s counters have), once the workers have handed it
/// over: the .wasm's do so on their one-second tick, so this waits until it has stopped moving.
pub fn settled_stat(envoy: &Envoy, way: Way, name: &str) -> u64 {
    let name = format!("{}{name}", way.stat_prefix());
    let mut last = envoy.stat(&name).expect("stats");
    loop {
        std::thread::sleep(Duration::from_millis(1_200));
        let now = envoy.stat(&name).expect("stats");
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Connections each worker of `envoy` accepted on listener `ingress`.
fn connections_per_worker(envoy: &Envoy) -> Vec<u64> {
    let stats = envoy.admin_get("/stats").expect("stats");
    let mut per_worker: Vec<(String, u64)> = stats
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            let rest = name.strip_prefix("listener.127.0.0.1_")?;
            let (_, worker) = rest.split_once(".worker_")?;
            let worker = worker.strip_suffix(".downstream_cx_total")?;
            Some((worker.to_owned(), value.trim().parse().ok()?))
        })
        .collect();
    per_worker.sort();
    per_worker.into_iter().map(|(_, n)| n).collect()
}

both_ways! {
    fn a_limit_holds_across_two_workers_with_the_x_ratelimit_headers(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "deny_cache": false,
                "response": {"headers": "x-ratelimit", "on_allowed": true},
                "rules": [{"name": "per-ip", "key": ["client_ip"],
                           "limit": {"algorithm": "fixed_window", "limit": 10, "window": "1m"}}]}"#,
            "FAIL_CLOSED",
        );
        let answers = burst(&envoy, "/", &[], 40, 4);
        assert_eq!(count_status(&answers, 200), 10, "exactly the limit passes");
        assert_eq!(count_status(&answers, 429), 30);
        let workers = connections_per_worker(&envoy);
        assert!(
            workers.len() == WORKERS && workers.iter().all(|&n| n > 0),
            "both workers took connections: {workers:?}"
        );
        let denied = answers.iter().find(|a| a.status == 429).expect("a 429");
        assert_eq!(denied.header("x-ratelimit-limit"), Some("10"));
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        let retry: u64 = denied
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .expect("seconds");
        assert!((1..=60).contains(&retry), "Retry-After {retry}");
        let allowed = answers.iter().find(|a| a.status == 200).expect("a 200");
        assert_eq!(allowed.header("x-ratelimit-limit"), Some("10"));
        assert!(allowed.header("x-ratelimit-remaining").is_some());
        assert_eq!(allowed.text(), sluice_harness::UPSTREAM_BODY);
        // Once each: a local reply passes through the filter's own response hook too.
        for answer in [denied, allowed] {
            for name in ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"] {
                let times = answer.headers.iter().filter(|(k, _)| k == name).count();
                assert_eq!(times, 1, "{name} in a {} answer", answer.status);
            }
        }
        assert_eq!(settled_stat(&envoy, way, "sluice.rule.per-ip.allowed"), 10);
        assert_eq!(settled_stat(&envoy, way, "sluice.rule.per-ip.denied"), 30);
        assert_eq!(settled_stat(&envoy, way, "sluice.callouts"), 40);
    }
}

both_ways! {
    fn the_ietf_style_sends_ratelimit_policy_and_ratelimit_fields(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "deny_cache": false,
                "response": {"headers": "ietf", "on_allowed": true, "status": 420, "body": "calm down\n"},
                "rules": [{"name": "per-ip", "key": ["client_ip"],
                           "limit": {"algorithm": "fixed_window", "limit": 2, "window": "1m"}}]}"#,
            "FAIL_CLOSED",
        );
        let answers: Vec<_> = (0..3).map(|_| get(&envoy, "/", &[])).collect();
        assert_eq!(
            answers.iter().map(|a| a.status).collect::<Vec<_>>(),
            [200, 200, 420]
        );
        for answer in &answers {
            assert!(
                answer.header("x-ratelimit-limit").is_none(),
                "{:?}",
                answer.headers
            );
            let policy = answer.header("ratelimit-policy").expect("RateLimit-Policy");
            assert!(policy.contains("q=2"), "{policy}");
            assert!(policy.contains("w=60"), "{policy}");
            assert!(answer.header("ratelimit").is_some(), "{:?}", answer.headers);
        }
        let denied = &answers[2];
        assert_eq!(denied.text(), "calm down\n");
        assert!(
            denied
                .header("ratelimit")
                .expect("RateLimit")
                .contains("r=0")
        );
        assert!(denied.header("retry-after").is_some());
    }
}

both_ways! {
    fn several_rules_are_decided_in_one_callout_all_or_nothing(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "deny_cache": false, "rules": [
                {"name": "per-client", "key": [{"header": "x-client"}], "limit": {"algorithm": "fixed_window", "limit": 3, "window": "1m"}},
                {"name": "per-route", "key": ["method", "path"], "limit": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}
            ]}"#,
            "FAIL_CLOSED",
        );
        let mut statuses = Vec::new();
        for _ in 0..4 {
            for client in ["a", "b"] {
                statuses.push(get(&envoy, "/orders", &[("x-client", client)]).status);
            }
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
        eventually("eight access log lines", Duration::from_secs(3), || {
            envoy.access_log().len() == 8
        });
        let log = envoy.access_log();
        assert_eq!(log.len(), 8, "{log:?}");
        // The sixth would pass per-client (b's third) but the route is spent: per-client is
        // skipped, consuming nothing.
        assert_eq!(
            log[5],
            r#"429 [{"rule":"per-client","key":"b","outcome":"skipped"},{"rule":"per-route","key":"GET:/orders","outcome":"denied"}]"#
        );
        assert_eq!(
            log[6],
            r#"429 [{"rule":"per-client","key":"a","outcome":"denied"},{"rule":"per-route","key":"GET:/orders","outcome":"denied"}]"#
        );
        // b's third unit is still there: on another route it passes.
        assert_eq!(get(&envoy, "/other", &[("x-client", "b")]).status, 200);
        assert_eq!(get(&envoy, "/other", &[("x-client", "b")]).status, 429);
        assert_eq!(
            settled_stat(&envoy, way, "sluice.callouts"),
            10,
            "one callout a request"
        );
    }
}

both_ways! {
    fn the_deny_cache_is_shared_by_the_workers(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "deny_cache": true, "rules": [
                {"name": "per-ip", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 2, "window": "1m"}}
            ]}"#,
            "FAIL_CLOSED",
        );
        // Until the first denial, which the server decides and the cache learns.
        let mut sent = 0;
        while get(&envoy, "/", &[]).status == 200 {
            sent += 1;
            assert!(sent < 10, "never denied");
        }
        assert_eq!(sent, 2);
        let callouts = settled_stat(&envoy, way, "sluice.callouts");
        assert_eq!(callouts, 3);
        let before = connections_per_worker(&envoy);
        let answers = burst(&envoy, "/", &[], 40, 4);
        assert_eq!(count_status(&answers, 429), 40);
        let after = connections_per_worker(&envoy);
        assert!(
            before.iter().zip(&after).all(|(b, a)| a > b),
            "both workers answered some of the 40: {before:?} then {after:?}"
        );
        // Each of the 40 is either a cache hit or a callout, once both workers have handed their
        // counts over (on their one-second ticks).
        let stat = |name: &str| {
            envoy
                .stat(&format!("{}sluice.{name}", way.stat_prefix()))
                .expect("stats")
        };
        eventually("all 40 counted", Duration::from_secs(5), || {
            stat("rule.per-ip.cache_hits") + stat("callouts") - callouts == 40
        });
        assert_eq!(
            stat("callouts"),
            callouts,
            "no worker asked the server again: the denial one worker learnt, both knew ({})",
            envoy.admin_get("/stats?filter=sluice").unwrap_or_default()
        );
        let denied = answers.first().expect("an answer");
        assert!(
            denied.header("retry-after").is_some(),
            "{:?}",
            denied.headers
        );
    }
}

both_ways! {
    fn a_shaping_leaky_bucket_holds_requests_so_they_leave_at_its_rate(way) {
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "rules": [
                {"name": "smooth", "key": [{"const": "all"}],
                 "limit": {"algorithm": "leaky_bucket", "rate": 20, "per": "1s", "burst": 20,
                           "mode": "shaping", "max_wait": "2s"}}
            ]}"#,
            "FAIL_CLOSED",
        );
        // Ten at once: the bucket (room for 20 waiting) lets one through now and the others one
        // each 50 ms.
        let ingress = envoy.listener("ingress").expect("ingress");
        let started = Instant::now();
        let finished: Vec<(u16, Duration)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..10)
                .map(|_| {
                    scope.spawn(move || {
                        let answer = sluice_harness::http::get(ingress, "/", &[]).expect("an answer");
                        (answer.status, started.elapsed())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a thread"))
                .collect()
        });
        assert!(
            finished.iter().all(|(status, _)| *status == 200),
            "{finished:?}"
        );
        let last = finished.iter().map(|(_, at)| *at).max().expect("ten");
        let first = finished.iter().map(|(_, at)| *at).min().expect("ten");
        assert!(
            last - first >= Duration::from_millis(350),
            "held to 20 a second, the last left 9 x 50 ms after the first: {finished:?}"
        );
        assert!(settled_stat(&envoy, way, "sluice.rule.smooth.shaped") >= 8);
    }
}

both_ways! {
    fn a_shaped_request_that_would_wait_past_max_wait_is_denied(way) {
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "rules": [
                {"name": "smooth", "key": [{"const": "all"}],
                 "limit": {"algorithm": "leaky_bucket", "rate": 10, "per": "1s", "burst": 20,
                           "mode": "shaping", "max_wait": "300ms"}}
            ]}"#,
            "FAIL_CLOSED",
        );
        let started = Instant::now();
        let answers = burst(&envoy, "/", &[], 20, 20);
        let took = started.elapsed().as_secs_f64();
        let passed = count_status(&answers, 200);
        // Those that arrive together: one at once, then one each 100 ms up to the 300 ms wait.
        // Arrivals spread over the burst's time let a tenth of a second's worth more through.
        let bound = 4 + (10.0 * took).ceil() as usize;
        assert!(
            (4..=bound).contains(&passed),
            "{passed} passed in {took:.2}s"
        );
        assert_eq!(count_status(&answers, 429), 20 - passed);
    }
}

both_ways! {
    fn a_shadow_rule_decides_and_counts_in_envoy_but_never_denies(way) {
        let backends = Backends::start(&[]);
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "rules": [
                {"name": "would-limit", "key": ["client_ip"], "shadow": true,
                 "limit": {"algorithm": "gcra", "rate": 1, "per": "1m", "burst": 2}}
            ]}"#,
            "FAIL_CLOSED",
        );
        let answers = burst(&envoy, "/", &[], 10, 2);
        assert_eq!(count_status(&answers, 200), 10);
        assert_eq!(
            settled_stat(&envoy, way, "sluice.rule.would-limit.shadow_denied"),
            8
        );
        assert_eq!(settled_stat(&envoy, way, "sluice.rule.would-limit.allowed"), 2);
        assert_eq!(settled_stat(&envoy, way, "sluice.rule.would-limit.denied"), 0);
        eventually("ten access log lines", Duration::from_secs(3), || {
            envoy.access_log().len() == 10
        });
        let log = envoy.access_log();
        assert_eq!(
            log.iter()
                .filter(|l| l.contains(r#""outcome":"shadow_denied""#))
                .count(),
            8,
            "{log:?}"
        );
        eventually("the upstream saw all ten", Duration::from_secs(2), || {
            backends.upstream.served() == 10
        });
    }
}

both_ways! {
    fn the_filter_reaches_sluice_server_over_tls_with_a_client_certificate(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let tls = MutualTls::new();
        let server_args = tls.server_args();
        let args: Vec<&str> = server_args.iter().map(String::as_str).collect();
        let backends = Backends::start(&args);
        // TLS, not latency, is what this tests: the first callout opens the connection (a
        // handshake with a client certificate) and once, in a full run on two busy cores, took
        // longer than the default 100 ms (a 504 from Envoy, one callout failure).
        let config = plugin_config(
            &Plugin::sluice(
                r#"{"cluster": "sluice", "authority": "sluice-server", "timeout": "1s", "deny_cache": false, "failure_mode": "allow", "rules": [
                    {"name": "per-ip", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 3, "window": "1m"}}
                ]}"#,
            )
            .via(way),
            backends.server_addr(),
            backends.upstream.addr(),
        );
        let envoy = start_envoy(&tls.on_cluster(&config, "sluice"), WORKERS);
        let statuses: Vec<u16> = (0..4).map(|_| get(&envoy, "/", &[]).status).collect();
        // Failing open, a callout that failed over TLS would have let the fourth through.
        assert_eq!(
            statuses,
            [200, 200, 200, 429],
            "decided by the server, over TLS"
        );
        assert!(envoy.stat("cluster.sluice.ssl.handshake").expect("stats") >= 1);
        assert_eq!(settled_stat(&envoy, way, "sluice.callout_failures"), 0);
    }
}

both_ways! {
    fn a_forwarded_address_in_any_form_a_proxy_writes_is_limited_and_garbage_falls_back_to_the_peer(way) {
        clear_of_window_end(MINUTE, MINUTE_WINDOW_TEST);
        let backends = Backends::start(&[]);
        // Envoy appends the peer (use_remote_address), so the load balancer's entry is 2 hops in.
        let envoy = envoy_with(
            way,
            &backends,
            r#"{"cluster": "sluice", "trusted_hops": 2, "deny_cache": false, "rules": [
                {"name": "per-ip", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 3, "window": "1m"}}
            ]}"#,
            "FAIL_CLOSED",
        );
        let statuses = |xff: &str| -> Vec<u16> {
            (0..4)
                .map(|_| get(&envoy, "/", &[("x-forwarded-for", xff)]).status)
                .collect()
        };
        for xff in ["192.0.2.7:5555", "[2001:db8::7]:443", "fe80::7%eth0"] {
            assert_eq!(
                statuses(xff),
                [200, 200, 200, 429],
                "{xff}: limited by its address"
            );
        }
        // Not an address: the peer's key (127.0.0.1), shared by every such request, and counted.
        assert_eq!(statuses("unknown"), [200, 200, 200, 429]);
        assert_eq!(statuses("garbage!"), [429; 4], "the same key as unknown's");
        eventually("the access log", Duration::from_secs(3), || {
            envoy.access_log().len() == 20
        });
        let log = envoy.access_log();
        for (line, key) in [
            (0, "192.0.2.7"),
            // Keys escape the colons.
            (4, "2001%3Adb8%3A%3A7"),
            (8, "fe80%3A%3A7"),
            (12, "127.0.0.1"),
        ] {
            assert!(
                log[line].contains(&format!(r#""key":"{key}""#)),
                "{}",
                log[line]
            );
        }
        assert_eq!(settled_stat(&envoy, way, "sluice.client_ip_fallbacks"), 8);
    }
}

both_ways! {
    fn a_policy_envoy_refuses_stops_it_at_start_with_an_error_naming_the_field(way) {
        let backends = Backends::start(&[]);
        let config = plugin_config(
            &Plugin::sluice(
                r#"{"cluster": "sluice", "rules": [{"name": "per-ip", "key": ["client_ip"],
                    "limit": {"algorithm": "gcra", "rate": 10, "per": "1s"}}]}"#,
            )
            .via(way),
            backends.server_addr(),
            backends.upstream.addr(),
        );
        let Err(refused) = try_start_envoy(&config, WORKERS) else {
            panic!("Envoy started with a policy missing a field");
        };
        let refused = refused.to_string();
        assert!(
            refused.contains("sluice: invalid configuration: rules[0].limit: algorithm `gcra` needs `burst`"),
            "{refused}"
        );
    }
}
