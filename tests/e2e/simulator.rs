//! sluice-sim end to end: real traces read and replayed, reports that are the same every
//! time, several Envoys on one limit, real-time pacing, the comparison of algorithms.
//!
//! Tests on the shared traces skip, saying so, in a clone without `../shared`.

use sluice_e2e::{request, session_setup, shared_trace};
use sluice_harness::RedisServer;
use sluice_server::config::DEFAULT_KEY_PREFIX;
use sluice_sim::compare::{self, Comparison, Nominal};
use sluice_sim::redis_memory;
use sluice_sim::replay::Clock;
use sluice_sim::report::{self, Report, html};
use sluice_sim::session::{self, Outcome};
use sluice_sim::trace::synthetic::{self, GenOptions, Kind};
use sluice_sim::trace::timing::{Resolution, Spread};
use sluice_sim::trace::{self, ReadOptions, Trace};
use sluice_sim::{EXAMPLE_POLICY, Topology};

fn read(path: &std::path::Path, options: ReadOptions) -> Trace {
    trace::read_file(path, options).expect("the trace reads")
}

fn run(policy: &str, trace: &Trace, topology: Topology) -> Outcome {
    let mut setup = session_setup(policy);
    setup.topology = topology;
    session::run(&setup, trace, &mut |_| {}).expect("the replay runs")
}

fn rule<'a>(report: &'a Report, name: &str) -> &'a report::RuleReport {
    report
        .rules
        .iter()
        .find(|r| r.rule == name)
        .unwrap_or_else(|| panic!("no rule {name}"))
}

fn synthetic_trace(kind: Kind, seconds: u64) -> Trace {
    Trace {
        source: format!("synthetic {kind:?}"),
        records: synthetic::generate(GenOptions {
            kind,
            seconds,
            seed: 7,
            max_requests: 0,
            rate_scale: 1.0,
        }),
        ..Trace::default()
    }
}

#[test]
fn zanbil_burst_clients_are_limited_and_quiet_clients_are_not() {
    let Some(path) = shared_trace("zanbil_access_10k.log") else {
        return;
    };
    let trace = read(&path, ReadOptions::default());
    assert_eq!(trace.records.len(), 10_000);
    assert_eq!(trace.timing.resolution, Resolution::Second);
    let outcome = run(EXAMPLE_POLICY, &trace, Topology::default());
    let report = &outcome.report;
    let per_client = rule(report, "per-client");
    assert!(
        report
            .top_limited
            .iter()
            .any(|k| k.key == "194.94.127.7" && k.counts.denied > 0),
        "the 44-in-a-second client is limited: {:?}",
        report.top_limited
    );
    assert!(
        report.limited_keys * 100 <= per_client.keys,
        "{} of {} clients limited: quiet clients must pass",
        report.limited_keys,
        per_client.keys
    );
    let accuracy = per_client.accuracy.as_ref().unwrap();
    assert_eq!(
        accuracy.over_bound, 0,
        "gcra never admits over its own bound"
    );
    let memory = per_client.memory.as_ref().expect("memory measured");
    assert_eq!(memory.keys, per_client.keys, "one Redis key per client");
}

#[test]
fn the_nasa_trace_reads_by_its_header_row_and_a_sensible_limit_denies_nothing() {
    let Some(path) = shared_trace("nasa_19950801.tsv") else {
        return;
    };
    let trace = read(&path, ReadOptions::default());
    assert_eq!(trace.records.len(), 30_969);
    assert_eq!(trace.format.map(|f| f.to_string()).as_deref(), Some("tsv"));
    assert_eq!(trace.timing.resolution, Resolution::Second);
    let outcome = run(EXAMPLE_POLICY, &trace, Topology::default());
    let per_client = rule(&outcome.report, "per-client");
    assert_eq!(per_client.counts.offered, 30_969);
    assert_eq!(per_client.counts.limited(), 0, "NASA is a quiet baseline");
    assert!(
        per_client.keys > 2_000,
        "host names are clients: {}",
        per_client.keys
    );
}

#[test]
fn the_elastic_trace_is_never_replayed_as_logged() {
    let Some(path) = shared_trace("elastic_apache_logs.log") else {
        return;
    };
    // A truncated line is an error naming its place...
    let err = trace::read_file(&path, ReadOptions::default()).unwrap_err();
    assert_eq!(err.line, 8899, "{err}");
    assert!(err.to_string().contains("unterminated user agent"), "{err}");
    assert!(
        err.to_string().contains("--skip-bad"),
        "says how to go on: {err}"
    );
    // ... and, taken as logged (no spreading), its disorder is refused unless sorting is asked.
    let as_logged = ReadOptions {
        skip_bad: true,
        spread: Spread::Off,
        ..ReadOptions::default()
    };
    let err = trace::read_file(&path, as_logged).unwrap_err();
    assert!(err.to_string().contains("goes back in time"), "{err}");
    assert!(err.to_string().contains("--sort"), "{err}");
    assert!(err.to_string().contains("only the hour is real"), "{err}");
    // By default only its hours are trusted: spread within each hour, with a warning.
    let trace = read(
        &path,
        ReadOptions {
            skip_bad: true,
            ..ReadOptions::default()
        },
    );
    assert_eq!((trace.records.len(), trace.skipped), (9_999, 1));
    assert_eq!(trace.timing.resolution, Resolution::Hour);
    assert!(trace.timing.spread);
    assert!(
        trace.reordered > 1000,
        "{} lines out of order",
        trace.reordered
    );
    assert!(
        trace
            .records
            .windows(2)
            .all(|w| w[0].time_us <= w[1].time_us),
        "replayed in time order"
    );
    let outcome = run(EXAMPLE_POLICY, &trace, Topology::default());
    let text = outcome.report.render();
    assert!(text.contains("warning: 9,"), "{text}");
    assert!(text.contains("timing finer than 1 h is not real"), "{text}");
    assert_eq!(
        outcome.report.timeline.step_ms, 3_600_000,
        "charts never show what the trace does not know"
    );
}

#[test]
fn compare_on_zanbil_shows_the_fixed_window_over_the_exact_limit_and_the_sliding_log_never() {
    let Some(path) = shared_trace("zanbil_access_10k.log") else {
        return;
    };
    let trace = read(
        &path,
        ReadOptions {
            spread: Spread::Even,
            ..ReadOptions::default()
        },
    );
    let nominal: Nominal = "10/1s".parse().unwrap();
    let policy = compare::policy(
        nominal,
        &serde_json::json!(["client_ip"]),
        "sluice",
        Some("200ms".parse().unwrap()),
    );
    let outcome = run(&policy, &trace, Topology::default());
    let comparison = Comparison::build(nominal, &outcome.report, &outcome.recorder);
    let row = |name: &str| {
        comparison
            .rows
            .iter()
            .find(|r| r.algorithm == name)
            .map(|r| r.accuracy.clone())
            .unwrap()
    };
    assert_eq!(comparison.rows.len(), 6);
    let fixed = row("fixed_window");
    assert!(fixed.over_exact > 0, "{fixed:?}");
    assert!(fixed.peak.as_ref().unwrap().admitted > 10);
    let log = row("sliding_log");
    assert_eq!(log.over_exact, 0);
    let exact = log.exact.unwrap();
    assert_eq!(
        (
            exact.denied_but_exact_admits,
            exact.admitted_but_exact_denies
        ),
        (0, 0),
        "the sliding log is the exact limit"
    );
    for r in &comparison.rows {
        assert_eq!(
            r.accuracy.over_bound, 0,
            "{} over its own bound",
            r.algorithm
        );
        assert_eq!(
            r.accuracy.decided, 10_000,
            "{} saw every request",
            r.algorithm
        );
        let leased = r.leased.as_ref().expect("a lease column");
        assert_eq!(
            leased.accuracy.over_bound, 0,
            "{} leased, over its bound",
            r.algorithm
        );
        assert!(leased.accuracy.lease_allowance > 0);
        assert_eq!(leased.accuracy.decided, 10_000, "{} leased", r.algorithm);
    }
    let focus = comparison
        .focus
        .as_ref()
        .expect("the boundary burst is charted");
    assert_eq!(focus.series.len(), 6);
    let page = comparison.html();
    assert!(page.contains("fixed_window") && page.matches("<svg").count() == 2);
}

#[test]
fn a_virtual_time_replay_gives_byte_identical_json_reports() {
    let trace = synthetic_trace(Kind::Demo, 120);
    let topology = || Topology {
        instances: 2,
        workers: 2,
        ..Topology::default()
    };
    let first = run(EXAMPLE_POLICY, &trace, topology());
    let second = run(EXAMPLE_POLICY, &trace, topology());
    assert!(first.report.limited_keys > 0, "a replay worth comparing");
    let a = serde_json::to_vec_pretty(&first.report).unwrap();
    let b = serde_json::to_vec_pretty(&second.report).unwrap();
    assert!(a == b, "the reports differ:\n{}", first_difference(&a, &b));
    assert_eq!(html::page(&first.report), html::page(&second.report));
}

#[test]
fn the_memory_report_gives_what_keys_named_as_in_production_take() {
    let trace = synthetic_trace(Kind::Demo, 60);
    // A replay in a Redis of its own names its keys as the server does by default.
    let own = run(EXAMPLE_POLICY, &trace, Topology::default());
    assert_eq!(own.report.memory_caveat(), None);
    // One in a Redis the user gives names them apart, and says so.
    let shared = RedisServer::start().expect("redis-server starts");
    let mut setup = session_setup(EXAMPLE_POLICY);
    setup.redis = Some(shared.url());
    let apart = session::run(&setup, &trace, &mut |_| {}).expect("the replay runs");
    let prefix = apart
        .report
        .memory_key_prefix
        .clone()
        .expect("a prefix of its own");
    let caveat = apart
        .report
        .memory_caveat()
        .expect("the longer names are told");
    assert!(
        caveat.contains(&prefix) && caveat.contains(&format!("\"{DEFAULT_KEY_PREFIX}\"")),
        "{caveat}"
    );
    // The same keys renamed as production names them take what the first replay reported.
    let keys = shared
        .cli(&["--scan", "--pattern", &format!("{prefix}:*")])
        .unwrap();
    let mut renamed = 0;
    for key in keys.lines() {
        let production = key.replacen(prefix.as_str(), DEFAULT_KEY_PREFIX, 1);
        shared.cli(&["RENAME", key, &production]).unwrap();
        renamed += 1;
    }
    assert!(renamed > 0, "the replay left its keys");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let production = runtime
        .block_on(redis_memory::measure(&shared.url(), DEFAULT_KEY_PREFIX))
        .unwrap();
    for rule in &own.report.rules {
        let (reported, renamed) = (rule.memory.clone().unwrap(), &production[&rule.rule]);
        assert_eq!(&reported, renamed, "rule {}", rule.rule);
        let longer = apart
            .report
            .rules
            .iter()
            .find(|r| r.rule == rule.rule)
            .unwrap();
        assert!(
            longer.memory.as_ref().unwrap().bytes > reported.bytes,
            "rule {}: longer names cost more",
            rule.rule
        );
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let (a, b) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    a.lines()
        .zip(b.lines())
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| format!("line {}: {x}\n     vs: {y}", i + 1))
        .unwrap_or_else(|| "lengths differ".to_owned())
}

#[test]
fn with_several_envoys_the_limit_holds_globally_and_per_instance_limits_would_admit_more() {
    let policy = r#"{"cluster": "sluice", "rules": [{"name": "per-ip", "key": ["client_ip"],
        "limit": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}}]}"#;
    let t = 1_763_700_000_000;
    let trace = Trace {
        source: "60 requests at one instant".to_owned(),
        records: (0..60).map(|_| request(t, "203.0.113.5", "/")).collect(),
        ..Trace::default()
    };
    let outcome = run(
        policy,
        &trace,
        Topology {
            instances: 3,
            ..Topology::default()
        },
    );
    let per_ip = rule(&outcome.report, "per-ip");
    assert_eq!(per_ip.counts.allowed, 10, "one limit across three Envoys");
    let accuracy = per_ip.accuracy.as_ref().unwrap();
    let local = accuracy.per_instance.as_ref().unwrap();
    assert_eq!((local.instances, local.admitted), (3, 30));
}

#[test]
fn a_real_time_replay_is_paced_and_reports_callout_latency() {
    let t = 1_763_700_000_000;
    let trace = Trace {
        source: "20 requests over two seconds".to_owned(),
        records: (0..20)
            .map(|i| request(t + i * 100, "203.0.113.5", "/"))
            .collect(),
        ..Trace::default()
    };
    let outcome = run(
        EXAMPLE_POLICY,
        &trace,
        Topology {
            clock: Clock::RealTime { speed: 4.0 },
            ..Topology::default()
        },
    );
    let report = &outcome.report;
    assert_eq!(report.trace.requests, 20);
    assert!(matches!(report.run.clock, report::Clock::RealTime { speed } if speed == 4.0));
    let latency = report.latency.as_ref().expect("measured in real time");
    assert_eq!(latency.samples, 20, "one callout per request");
    assert!(
        latency.p50_ms > 0.0
            && latency.p50_ms <= latency.p99_ms
            && latency.p99_ms <= latency.max_ms
    );
    assert!(report.render().contains("callout latency: p50"));
}

#[test]
fn the_html_report_is_one_self_contained_page_with_charts() {
    let trace = synthetic_trace(Kind::Demo, 60);
    let outcome = run(EXAMPLE_POLICY, &trace, Topology::default());
    let page = html::page(&outcome.report);
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("<link"));
    let charts = page.matches("<svg").count();
    let expected = outcome.report.timeline.rules.len() + 1 + outcome.report.timeline.keys.len();
    assert_eq!(
        charts, expected,
        "a chart per rule, the accuracy chart, one per top key"
    );
    for rule in &outcome.report.rules {
        assert!(page.contains(&rule.rule));
    }
}

/// `make demo RLS=1`'s replay, on a clone without `../shared`: the synthetic demo trace through
/// the shipped native-filter configuration and its limits, reported per descriptor, the same
/// way twice.
/// The shipped native-filter configuration and its limits, as a user's clone has them.
fn shipped_native_session() -> sluice_sim::native::session::NativeSession {
    let root = sluice_e2e::real_envoy::repo_root();
    let text =
        std::fs::read_to_string(root.join("envoy/envoy-ratelimit.yaml")).expect("the config");
    sluice_sim::native::session::NativeSession {
        config: sluice_sim::native::NativeConfig::parse(&text)
            .expect("the model takes the shipped config"),
        config_name: "envoy/envoy-ratelimit.yaml".to_owned(),
        rls_config: vec![root.join("envoy/ratelimit")],
        instances: 1,
        callout_latency: std::time::Duration::from_millis(1),
        redis: None,
        top: 5,
    }
}

/// `make demo RLS=1`'s replay, on a clone without `../shared`: the synthetic demo trace through
/// the shipped native-filter configuration and its limits, reported per descriptor, the same
/// way twice.
#[test]
fn the_shipped_ratelimit_configuration_replays_and_reports_per_descriptor() {
    use sluice_sim::native::session::run;
    let session = shipped_native_session();
    let trace = synthetic_trace(Kind::Demo, 120);
    let outcome = run(&session, &trace, &mut |_| {}).expect("the replay runs");
    let report = &outcome.report;
    assert!(report.run.failures.is_empty(), "{:?}", report.run.failures);
    let address = rule(report, "edge.remote_address");
    assert_eq!(
        address.counts.offered,
        trace.records.len() as u64,
        "every request sends its address"
    );
    assert!(
        address.counts.denied > 0,
        "the crawlers go over 10 a second"
    );
    assert_eq!(address.accuracy.as_ref().map(|a| a.over_bound), Some(0));
    assert!(
        report.rules.iter().any(|r| r.rule == "edge.api_key"),
        "every configured descriptor is listed"
    );
    let again = run(&session, &trace, &mut |_| {}).expect("the replay runs again");
    assert_eq!(
        serde_json::to_value(&again.report.rules).expect("JSON"),
        serde_json::to_value(&report.rules).expect("JSON"),
        "virtual time: the same report every time"
    );
}

/// The migration preview: the YAML as written, then each algorithm at the same rate; the
/// sliding log is the exact limit, so it is never over it nor under it.
#[test]
fn the_migration_preview_sets_every_algorithm_beside_the_yaml_as_written() {
    let trace = synthetic_trace(Kind::Demo, 120);
    let preview = sluice_sim::native::compare::run(&shipped_native_session(), &trace, &mut |_| {})
        .expect("the preview runs");
    let path = preview
        .paths
        .iter()
        .find(|p| p.path == "edge.remote_address")
        .expect("the address path");
    assert_eq!(path.nominal, "10/1s");
    let names: Vec<&str> = path.rows.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(
        names,
        [
            "as written",
            "fixed_window",
            "sliding_window",
            "sliding_log",
            "token_bucket",
            "leaky_bucket",
            "gcra"
        ]
    );
    assert_eq!(
        path.rows[0].algorithm, "gcra",
        "edge.yaml picks GCRA with a burst of 20"
    );
    let log = &path.rows[3];
    assert_eq!(
        (
            log.over_exact,
            log.denied_exact_admits,
            log.admitted_exact_denies
        ),
        (0, 0, 0),
        "{log:?}"
    );
    assert!(log.denied > 0 && log.most_limited.is_some(), "{log:?}");
    for row in &path.rows {
        assert_eq!(row.offered, trace.records.len() as u64, "{row:?}");
        assert_eq!(row.admitted + row.denied, row.offered, "{row:?}");
    }
    let rendered = preview.render();
    assert!(
        rendered.contains("edge.remote_address at 10/1s"),
        "{rendered}"
    );
}

/// The quota filter's model with the shipped `envoy/envoy-rlqs.yaml` and `envoy/rlqs/`, as a
/// user's clone has them: API keys over their 10 a second are held to it across one and two
/// Envoys (within docs/rlqs.md's bound: the algorithm's, plus two fill intervals, one refill
/// per Envoy, and the first round trip's `ALLOW_ALL`), the limit is used, not left idle, and
/// keys under it are not denied at one Envoy, and at most 2 % at two.
#[test]
fn the_quota_filter_holds_each_api_key_to_its_limit_across_envoys() {
    use sluice_sim::quota::QuotaConfig;
    use sluice_sim::quota::session::{QuotaSession, run};
    let root = sluice_e2e::real_envoy::repo_root();
    let text = std::fs::read_to_string(root.join("envoy/envoy-rlqs.yaml")).expect("the config");
    let trace = Trace {
        source: "synthetic hot tenants".to_owned(),
        records: synthetic::generate(GenOptions {
            kind: Kind::HotTenants,
            seconds: 60,
            seed: 1,
            max_requests: 0,
            rate_scale: 0.01,
        }),
        ..Trace::default()
    };
    for instances in [1, 2] {
        let session = QuotaSession {
            config: QuotaConfig::parse(&text).expect("the model takes the shipped config"),
            config_name: "envoy/envoy-rlqs.yaml".to_owned(),
            rlqs_config: vec![root.join("envoy/rlqs")],
            instances,
            latency: std::time::Duration::from_millis(1),
            redis: None,
            top: 10,
        };
        let outcome = run(&session, &trace, &mut |_| {}).expect("the replay runs");
        assert!(
            outcome.report.run.failures.is_empty(),
            "{:?}",
            outcome.report.run.failures
        );
        // hot-0 and hot-1 are offered 24 and 12 a second, hot-2 and hot-3 6 and 3.
        for (key, over) in [
            ("hot-0", true),
            ("hot-1", true),
            ("hot-2", false),
            ("hot-3", false),
        ] {
            let id = format!("key={key},name=per-key");
            let admitted = outcome.recorder.admitted_times("per-key", &id).len() as u64;
            let offered = trace
                .records
                .iter()
                .filter(|r| r.headers.iter().any(|(k, v)| k == "x-api-key" && v == key))
                .count() as u64;
            eprintln!("{instances} Envoy(s): {key} offered {offered}, admitted {admitted}");
            if over {
                let bound = 60 * 10 + 20 + 2 * 10 + 10 * instances as u64 + 2;
                assert!(
                    admitted <= bound,
                    "{key} with {instances}: {admitted} over {bound}"
                );
                assert!(
                    admitted >= 540,
                    "{key} with {instances}: only {admitted} of 600 used"
                );
            } else if instances == 1 {
                assert_eq!(admitted, offered, "{key}: under its limit, one Envoy");
            } else {
                // Each Envoy's bucket holds about a second of its share, so a burst of this
                // Poisson traffic past one Envoy's share can be denied while the limit has
                // room (docs/algorithms.md, what may be wrongly denied): a few, not more.
                assert!(
                    offered - admitted <= offered / 50,
                    "{key} with {instances}: {admitted} of {offered}"
                );
            }
        }
    }
}
