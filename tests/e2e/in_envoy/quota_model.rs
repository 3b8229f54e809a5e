//! The simulator's model of Envoy's quota filter held against two real Envoys 1.40: the same
//! requests, paced through the Envoys and replayed through the model in virtual time, each
//! against the real quota service, admitted alike per Envoy in every 5 s window.

use std::time::Duration;

use sluice_server::rlqs::config::WatchedConfig;
use sluice_sim::connect::Endpoint;
use sluice_sim::launch::{ServedConfigs, Services};
use sluice_sim::quota::QuotaConfig;
use sluice_sim::quota::replay::{QuotaSetup, replay};
use sluice_sim::trace::TraceRecord;

use super::native_model::grpc_filter_config;
use super::rlqs::{HOT, Sent, paced_load, shipped_rlqs_config, two_envoys};

/// The comparison's window: Envoy's report interval.
const WINDOW: Duration = Duration::from_secs(5);

/// How far one Envoy's admissions in a window may differ once its bucket is assigned: one
/// second of the limit's rate (20), the most a funding or a report that falls on the other side
/// of a window's edge can move.
const WINDOW_BOUND: u64 = 20;

/// How far they may differ in the first window, where `no_assignment_behavior` (ALLOW_ALL)
/// decides until the first assignment arrives: a millisecond into the model, later in Envoy
/// (docs/fidelity.md, "the first round trip"). The bound above, plus the second of traffic the
/// load offers the busier Envoy (30).
const FIRST_WINDOW_BOUND: u64 = WINDOW_BOUND + 30;

/// Per Envoy, admitted requests in each window.
fn windows(sent: &[Sent], passed: impl Fn(usize) -> bool, envoys: usize) -> Vec<Vec<u64>> {
    let count = sent
        .iter()
        .map(|s| s.at)
        .max()
        .map_or(0, |end| (end.as_micros() / WINDOW.as_micros()) as usize + 1);
    let mut per = vec![vec![0; count]; envoys];
    for (i, s) in sent.iter().enumerate() {
        if passed(i) {
            per[s.envoy][(s.at.as_micros() / WINDOW.as_micros()) as usize] += 1;
        }
    }
    per
}

#[test]
fn two_envoys_and_the_model_admit_alike_in_every_report_window() {
    let (dir, backends, a, b) = two_envoys(HOT);
    // 30/s at A and 15/s at B for 30 s, on a limit of 20/s: unequal demands over the limit.
    let mut sent = paced_load(&[&a, &b], "hot", Duration::from_secs(30), |_| [30.0, 15.0]);
    sent.sort_by_key(|s| s.at);
    let start_us: i64 = 1_800_000_000_000_000;
    let records: Vec<TraceRecord> = sent
        .iter()
        .map(|s| TraceRecord {
            line: 0,
            time_us: start_us + s.at.as_micros() as i64,
            client: "127.0.0.1".to_owned(),
            method: "GET".to_owned(),
            target: "/api/hot".to_owned(),
            host: None,
            status: 200,
            bytes: 0,
            headers: vec![("x-api-key".to_owned(), "hot".to_owned())],
        })
        .collect();
    let instance_of: Vec<usize> = sent.iter().map(|s| s.envoy).collect();
    let config = QuotaConfig::parse(&shipped_rlqs_config(&backends)).expect("the model takes it");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let watched = WatchedConfig::load(vec![dir.path().to_owned()]).expect("the limits");
    let limits = watched.current();
    let served = ServedConfigs {
        rls: None,
        rlqs: Some(watched),
    };
    let services = Services::start(&runtime, None, None, served).expect("a server and Redis");
    let Endpoint::InProcess(server) = services.endpoint() else {
        panic!("the server runs in this process");
    };
    let setup = QuotaSetup {
        config: &config,
        limits: &limits,
        instances: 2,
        latency: Duration::from_millis(1),
        instance_of: Some(&instance_of),
    };
    let mut simulated = vec![false; records.len()];
    let (stats, _) = replay(
        &setup,
        &records,
        &server,
        &runtime,
        &mut |d| simulated[d.index] = d.status == 200,
        &mut |_| {},
    );
    drop(server);
    services.stop(&runtime);
    assert!(stats.refused.is_empty(), "{:?}", stats.refused);
    let real = windows(&sent, |i| sent[i].passed, 2);
    let model = windows(&sent, |i| simulated[i], 2);
    let (mut first, mut widest) = (0, 0);
    for envoy in 0..2 {
        eprintln!(
            "Envoy {envoy}: real {:?}\n         model {:?}",
            real[envoy], model[envoy]
        );
        for (window, (r, m)) in real[envoy].iter().zip(&model[envoy]).enumerate() {
            if window == 0 {
                first = first.max(r.abs_diff(*m));
            } else {
                widest = widest.max(r.abs_diff(*m));
            }
        }
    }
    let total = |w: &[Vec<u64>]| w.iter().flatten().sum::<u64>();
    eprintln!(
        "admitted in 30 s: Envoys {}, model {}; the first window differs by {first} (bound {FIRST_WINDOW_BOUND}), the others by at most {widest} (bound {WINDOW_BOUND})",
        total(&real),
        total(&model)
    );
    assert!(
        first <= FIRST_WINDOW_BOUND,
        "the first window differs by {first}"
    );
    assert!(
        widest <= WINDOW_BOUND,
        "a window differs by {widest}, over {WINDOW_BOUND}"
    );
}

/// A quota filter (items of `http_filters`) whose bucket id is built from `x-tenant`, with no
/// predicate guarding it, and `DENY_ALL` before an assignment: a request that carries the
/// header is denied at once (its new bucket has no assignment yet); what happens to one
/// without it is what this holds.
const TENANT_FILTER: &str = r#"
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: edge
              rlqs_server: {envoy_grpc: {cluster_name: sluice_rlqs}}
              bucket_matchers:
                on_no_match:
                  action:
                    name: per-tenant
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                      bucket_id_builder:
                        bucket_id_builder:
                          name: {string_value: per-tenant}
                          tenant:
                            custom_value:
                              name: tenant
                              typed_config:
                                "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                header_name: x-tenant
                      reporting_interval: 5s
                      no_assignment_behavior:
                        fallback_rate_limit: {blanket_rule: DENY_ALL}"#;

#[test]
fn a_request_whose_bucket_id_cannot_be_built_is_decided_alike() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("edge.yaml"), HOT).expect("the configuration");
    let backends = super::rlqs::rlqs_backends(dir.path());
    let routes = r#"              routes: [{match: {prefix: "/"}, route: {cluster: upstream}}]"#;
    let config = grpc_filter_config("", routes, TENANT_FILTER, "sluice_rlqs", &backends);
    let envoy = sluice_harness::Envoy::start(&config, 1).expect("Envoy");
    let model = QuotaConfig::parse(&config).expect("the model takes it");
    for (headers, what) in [
        (
            vec![("x-tenant", "t1")],
            "with the header: a new bucket, DENY_ALL until assigned",
        ),
        (vec![], "without it"),
    ] {
        let real = sluice_e2e::real_envoy::get(&envoy, "/", &headers).status;
        let owned: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let request = model
            .addresses
            .downstream(&owned, "127.0.0.1".parse().expect("an address"));
        let simulated = match model.bucket(&request) {
            None => 200,
            Some((settings, _)) => match model.settings[settings].no_assignment {
                sluice_sim::quota::config::Blanket::AllowAll => 200,
                sluice_sim::quota::config::Blanket::DenyAll => {
                    model.settings[settings].denied_status
                }
            },
        };
        eprintln!("{what}: Envoy {real}, model {simulated}");
        assert_eq!(real, simulated, "{what}");
    }
}
