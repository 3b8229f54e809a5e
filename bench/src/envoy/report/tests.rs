//! The section's tables and bars for runs that measured some setups, or all.

use std::time::Duration;

use super::*;

/// Results of a run `--only` no filter and the no-op module: started, never measured over
/// a limit.
fn partial() -> Results {
    Results {
        seconds: 6,
        turns: 6,
        runs: Vec::new(),
        start_ups: vec![
            (Setup::NoFilter, vec![Duration::from_millis(80); 2]),
            (Setup::NoopModule, vec![Duration::from_millis(70); 2]),
        ],
        over_limit: Vec::new(),
        counts: Vec::new(),
    }
}

#[test]
fn a_partial_run_lists_the_start_ups_of_the_setups_it_started_and_no_others() {
    let mut out = String::new();
    start_up(&mut out, &partial()).unwrap();
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(
        rows,
        [
            "| setup | start to ready ms |",
            "| no filter | 80 |",
            "| no-op dynamic module | 70 |",
        ]
    );
}

/// The bars written for `results`.
fn bars_of(results: &Results) -> String {
    let wasm = tempfile::NamedTempFile::new().unwrap();
    let mut out = String::new();
    bars(&mut out, results, wasm.path()).unwrap();
    out
}

/// One round of `setup` on both key spreads: 10,000 requests in a second, Envoy taking
/// `envoy_us` of CPU a request, and `calls` calls to sluice-server.
fn one_round(setup: Setup, envoy_us: f64, calls: u64) -> [(Keys, Setup, Vec<Run>); 2] {
    let run = Run {
        measured: crate::load::Measured {
            requests: 10_000,
            limited: 0,
            errors: 0,
            elapsed: Duration::from_secs(1),
            latencies_us: vec![700; 10_000],
        },
        cpu_s: [envoy_us * 1e-2, 0.0, 0.0],
        calls,
    };
    [Keys::Hot, Keys::Many].map(|keys| (keys, setup, vec![run.clone()]))
}

#[test]
fn a_partial_run_judges_the_bars_it_measured_and_names_the_setups_it_left_out() {
    let mut results = partial();
    for setup in [
        one_round(Setup::NoFilter, 45.0, 0),
        one_round(Setup::NoopModule, 47.0, 0),
        one_round(Setup::SluiceModuleLease, 49.0, 20),
    ] {
        results.runs.extend(setup);
    }
    let out = bars_of(&results);
    assert!(!out.contains("NaN"), "{out}");
    assert!(
        out.contains("- Module lease mode on 1,000 keys, at most 10 calls per 1,000 requests: 2.0 — **met** in every round"),
        "the calls bar needs only the lease's runs: {out}"
    );
    assert!(
        !out.contains("Module lease mode on hot keys"),
        "its CPU bar needs the floor module and `local_ratelimit`: {out}"
    );
    let left_out = out
        .lines()
        .find(|l| l.starts_with("- Not judged: "))
        .unwrap_or_else(|| panic!("no line for the bars left out: {out}"));
    assert!(left_out.contains(&Setup::FloorModule.name()), "{left_out}");
    assert!(left_out.contains(&Setup::NativeGrpc.name()), "{left_out}");
    assert!(!left_out.contains(&Setup::NoopModule.name()), "{left_out}");
}

#[test]
fn a_full_set_of_runs_leaves_no_bar_out() {
    let mut results = partial();
    for setup in Setup::COMPARED {
        results.runs.extend(one_round(setup, 50.0, 0));
    }
    results.start_ups = [
        Setup::NoFilter,
        Setup::Noop,
        Setup::Sluice,
        Setup::NoopModule,
        Setup::SluiceModule,
    ]
    .map(|setup| (setup, vec![Duration::from_millis(80)]))
    .to_vec();
    let out = bars_of(&results);
    assert!(!out.contains("Not judged"), "{out}");
    assert!(
        out.contains("Envoy's start to ready with sluice's module"),
        "{out}"
    );
}

#[test]
fn a_run_measuring_no_way_in_over_a_limit_writes_no_table_for_it() {
    let mut out = String::new();
    over_limit(&mut out, &partial()).unwrap();
    assert_eq!(out, "");
}
