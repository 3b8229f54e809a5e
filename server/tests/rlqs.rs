//! Envoy's Rate Limit Quota Service against a real redis-server, through the client stubs
//! `envoy-types` generates from Envoy's protos: shares funded from the limit, blanket quotas,
//! abandonment, refusals and health. (Envoy itself drives it in tests/e2e/in_envoy/rlqs.rs.)

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::server;
use futures::channel::mpsc;
use sluice_core::rlqs::bucket::SILENT_AFTER_MS;
use sluice_harness::{RedisCluster, RedisServer};
use sluice_server::RunningServer;
use sluice_server::envoy_api::protobuf::Duration as ProtoDuration;
use sluice_server::envoy_api::quota::{
    Action, BlanketRule, BucketId, BucketQuotaUsage, RateLimitQuotaClient, RateLimitQuotaResponse,
    RateLimitQuotaUsageReports, Strategy,
};
use sluice_server::rlqs::RlqsState;
use sluice_server::rlqs::config::WatchedConfig;
use sluice_server::store::Topology;
use tonic::{Code, Streaming};

const SHOP: &str = "domain: shop\n\
buckets:\n\
\x20 - match: {name: open}\n\
\x20   allow: all\n\
\x20 - match: {name: per-key, key: \"*\"}\n\
\x20   name: per-key\n\
\x20   limit: {algorithm: gcra, rate: 20, per: 1s, burst: 20}\n\
default: {deny: all}\n";

async fn start(
    config: &str,
    tune: impl FnOnce(&mut sluice_server::ServerConfig),
) -> (tempfile::TempDir, RedisServer, RunningServer) {
    let redis = RedisServer::start().unwrap();
    let (dir, server) = start_on(Topology::Standalone(redis.url()), config, tune).await;
    (dir, redis, server)
}

/// A server for `topology` serving the quota configuration `config`, with `tune` applied.
async fn start_on(
    topology: Topology,
    config: &str,
    tune: impl FnOnce(&mut sluice_server::ServerConfig),
) -> (tempfile::TempDir, RunningServer) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shop.yaml"), config).unwrap();
    let rlqs = Arc::new(RlqsState::new(
        WatchedConfig::load(vec![dir.path().to_owned()]).unwrap(),
        Duration::from_millis(50),
    ));
    let server = server(topology, |c| {
        c.rlqs = Some(rlqs);
        tune(c);
    })
    .await;
    (dir, server)
}

/// One Envoy's side of a quota stream.
struct Envoy {
    reports: mpsc::UnboundedSender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

type Id<'a> = &'a [(&'a str, &'a str)];

fn id(entries: Id) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

impl Envoy {
    async fn connect(server: &RunningServer) -> Result<Envoy, tonic::Status> {
        Envoy::connect_with(server, None).await
    }

    async fn connect_with(
        server: &RunningServer,
        token: Option<&str>,
    ) -> Result<Envoy, tonic::Status> {
        let mut client = RateLimitQuotaClient::connect(server.url()).await.unwrap();
        let (reports, inbound) = mpsc::unbounded();
        let mut request = tonic::Request::new(inbound);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let answers = client.stream_rate_limit_quotas(request).await?.into_inner();
        Ok(Envoy { reports, answers })
    }

    /// Reports each bucket's (allowed, denied) over `elapsed_s`.
    fn report(&self, domain: &str, elapsed_s: i64, usages: &[(Id, u64, u64)]) {
        let message = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages
                .iter()
                .map(|(bucket, allowed, denied)| BucketQuotaUsage {
                    bucket_id: Some(id(bucket)),
                    time_elapsed: Some(ProtoDuration {
                        seconds: elapsed_s,
                        nanos: 0,
                    }),
                    num_requests_allowed: *allowed,
                    num_requests_denied: *denied,
                })
                .collect(),
        };
        self.reports.unbounded_send(message).unwrap();
    }

    /// The actions for `bucket` that arrive within `within`, in order.
    async fn actions_for(&mut self, bucket: Id<'_>, within: Duration) -> Vec<Action> {
        let wanted = id(bucket);
        self.actions(within)
            .await
            .into_iter()
            .filter(|(id, _)| *id == wanted)
            .map(|(_, action)| action)
            .collect()
    }

    /// Every action that arrives within `within`, in order.
    async fn actions(&mut self, within: Duration) -> Vec<(BucketId, Action)> {
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(within, async {
            while let Some(response) = self.answers.message().await.unwrap() {
                seen.extend(
                    response
                        .bucket_action
                        .into_iter()
                        .map(|a| (a.bucket_id.unwrap(), a.bucket_action.unwrap())),
                );
            }
        })
        .await;
        seen
    }

    /// The first action for `bucket`, waiting up to 5 s.
    async fn first_for(&mut self, bucket: Id<'_>) -> Action {
        self.first_within(bucket, Duration::from_secs(5)).await
    }

    /// The first action for `bucket`, waiting up to `within`.
    async fn first_within(&mut self, bucket: Id<'_>, within: Duration) -> Action {
        let wanted = id(bucket);
        tokio::time::timeout(within, async {
            loop {
                let response = self
                    .answers
                    .message()
                    .await
                    .unwrap()
                    .expect("the stream ended");
                if let Some(action) = response
                    .bucket_action
                    .into_iter()
                    .find(|a| a.bucket_id.as_ref() == Some(&wanted))
                {
                    return action.bucket_action.unwrap();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no action for the bucket within {within:?}"))
    }

    /// The status that ended the stream, waiting up to 5 s.
    async fn ended_with(&mut self) -> tonic::Status {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Err(status) = self.answers.message().await {
                    return status;
                }
            }
        })
        .await
        .expect("the stream did not end")
    }
}

/// The strategy an action assigns, with its time to live in seconds.
fn strategy(action: &Action) -> (Strategy, i64) {
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("not an assignment: {action:?}");
    };
    let ttl = assignment.assignment_time_to_live.unwrap().seconds;
    (
        assignment.rate_limit_strategy.unwrap().strategy.unwrap(),
        ttl,
    )
}

/// Requests a second a token bucket assignment refills.
fn rate(action: &Action) -> f64 {
    match strategy(action).0 {
        Strategy::TokenBucket(b) => {
            f64::from(b.tokens_per_fill.unwrap().value) / b.fill_interval.unwrap().seconds as f64
        }
        Strategy::BlanketRule(rule) if rule == BlanketRule::DenyAll as i32 => 0.0,
        other => panic!("not a limit: {other:?}"),
    }
}

const K1: Id = &[("name", "per-key"), ("key", "k1")];

/// The keys `k0` to `k{n - 1}`, whose per-key bucket ids [`ids_of`] makes.
fn per_key(n: usize) -> Vec<String> {
    keys_named("k", n)
}

/// The keys `{prefix}0` to `{prefix}{n - 1}`, whose per-key bucket ids [`ids_of`] makes.
fn keys_named(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|k| format!("{prefix}{k}")).collect()
}

/// A first report of the buckets `ids`: a request each, over no time.
fn new_buckets<'a>(ids: &'a [[(&'a str, &'a str); 2]]) -> Vec<(Id<'a>, u64, u64)> {
    ids.iter().map(|id| (&id[..], 1, 0)).collect()
}

fn ids_of(keys: &[String]) -> Vec<[(&str, &str); 2]> {
    keys.iter()
        .map(|k| [("name", "per-key"), ("key", k.as_str())])
        .collect()
}
const K2: Id = &[("name", "per-key"), ("key", "k2")];

#[tokio::test]
async fn a_new_bucket_is_funded_and_assigned_at_once_with_a_time_to_live() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    envoy.report("shop", 0, &[(K1, 1, 0)]);
    let action = envoy.first_for(K1).await;
    let (Strategy::TokenBucket(bucket), ttl) = strategy(&action) else {
        panic!("not a token bucket: {action:?}");
    };
    assert_eq!(
        ttl, 10,
        "Envoy ignores an assignment without a time to live"
    );
    assert_eq!(
        (
            bucket.max_tokens,
            bucket.tokens_per_fill.unwrap().value,
            bucket.fill_interval.unwrap().seconds
        ),
        (20, 20, 1),
        "alone, the Envoy is funded the whole rate, a second at a time"
    );
}

#[tokio::test]
async fn two_envoys_share_a_limit_by_what_each_is_offered_and_never_more_than_it() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut a = Envoy::connect(&server).await.unwrap();
    let mut b = Envoy::connect(&server).await.unwrap();
    a.report("shop", 0, &[(K1, 1, 0)]);
    a.first_for(K1).await;
    b.report("shop", 0, &[(K1, 1, 0)]);
    b.first_for(K1).await;
    // Offered 100/s at A and 5/s at B: B gets its 5 and its 5 % headroom, A the 14.75 left.
    a.report("shop", 5, &[(K1, 100, 400)]);
    b.report("shop", 5, &[(K1, 25, 0)]);
    let settle = Duration::from_millis(3500);
    let (a_seen, b_seen) = tokio::join!(a.actions_for(K1, settle), b.actions_for(K1, settle));
    let (a_rate, b_rate) = (rate(a_seen.last().unwrap()), rate(b_seen.last().unwrap()));
    assert_share(b_rate, 5.25, "B's demand met in full");
    assert_share(a_rate, 14.75, "A gets what is left");
    assert!(a_rate + b_rate <= 20.0);
    // The traffic moves to B: the shares follow at the next reports.
    a.report("shop", 5, &[(K1, 10, 0)]);
    b.report("shop", 5, &[(K1, 25, 475)]);
    let (a_seen, b_seen) = tokio::join!(a.actions_for(K1, settle), b.actions_for(K1, settle));
    let (a_rate, b_rate) = (rate(a_seen.last().unwrap()), rate(b_seen.last().unwrap()));
    assert_share(a_rate, 2.1, "A's demand met in full");
    assert_share(b_rate, 17.9, "B gets what is left");
}

/// An assigned rate is the share, or up to a token less: a funding short of the share (the
/// algorithm had no more) is assigned what was granted.
fn assert_share(rate: f64, share: f64, what: &str) {
    assert!(
        (share - 1.0..=share).contains(&rate),
        "{what}: {rate}/s assigned, a share of {share}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_each_bucket_is_funded_on_its_own_node() {
    let cluster = RedisCluster::start().unwrap();
    let (_dir, server) = start_on(Topology::Cluster(cluster.urls()), SHOP, |_| {}).await;
    let (mut a, mut b) = (
        Envoy::connect(&server).await.unwrap(),
        Envoy::connect(&server).await.unwrap(),
    );
    // Keys on several nodes, funded in one step: each ask is its own call there.
    let keys = per_key(6);
    let ids = ids_of(&keys);
    let first = new_buckets(&ids);
    a.report("shop", 0, &first);
    let seen = a.actions(Duration::from_millis(500)).await;
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(seen.iter().all(|(_, action)| rate(action) == 20.0));
    // A second Envoy on one key: the two, offered alike, share its 20/s.
    b.report("shop", 0, &[(&ids[0][..], 1, 0)]);
    a.report("shop", 5, &[(&ids[0][..], 100, 0)]);
    b.report("shop", 5, &[(&ids[0][..], 100, 0)]);
    let settle = Duration::from_millis(3500);
    let (a_seen, b_seen) = tokio::join!(
        a.actions_for(&ids[0], settle),
        b.actions_for(&ids[0], settle)
    );
    let (a_rate, b_rate) = (rate(a_seen.last().unwrap()), rate(b_seen.last().unwrap()));
    assert_share(a_rate, 10.0, "A, offered as B is");
    assert_share(b_rate, 10.0, "B, offered as A is");
}

#[tokio::test]
async fn each_client_of_a_per_client_rule_has_a_limit_of_its_own() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    const K2: Id = &[("name", "per-key"), ("key", "k2")];
    envoy.report("shop", 0, &[(K1, 1, 0), (K2, 1, 0)]);
    let seen = envoy.actions(Duration::from_millis(500)).await;
    let rate_of = |bucket: Id| {
        let wanted = id(bucket);
        let (_, action) = seen.iter().find(|(id, _)| *id == wanted).unwrap();
        rate(action)
    };
    assert_eq!(
        (rate_of(K1), rate_of(K2)),
        (20.0, 20.0),
        "each key funded the whole rate: k1's use is not k2's"
    );
}

#[tokio::test]
async fn unlimited_and_unlisted_buckets_get_blanket_rules_and_idle_ones_are_abandoned() {
    let (_dir, _redis, server) = start(&format!("{SHOP}idle_after: 2s\n"), |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    const OPEN: Id = &[("name", "open")];
    const OTHER: Id = &[("name", "other")];
    envoy.report("shop", 0, &[(OPEN, 1, 0), (OTHER, 1, 0)]);
    let seen = envoy.actions(Duration::from_millis(500)).await;
    let strategy_of = |bucket: Id| {
        let wanted = id(bucket);
        let (_, action) = seen.iter().find(|(id, _)| *id == wanted).unwrap();
        strategy(action).0
    };
    let allow = BlanketRule::AllowAll as i32;
    let deny = BlanketRule::DenyAll as i32;
    assert_eq!(strategy_of(OPEN), Strategy::BlanketRule(allow));
    assert_eq!(
        strategy_of(OTHER),
        Strategy::BlanketRule(deny),
        "the default"
    );
    // Reported with no request for the domain's idle_after (2 s): abandoned, while OTHER,
    // which a report shows in use (a denied request is a use) every second, is not.
    let abandoned = Action::AbandonAction(Default::default());
    let mut seen = Vec::new();
    let started = std::time::Instant::now();
    while !seen.contains(&(id(OPEN), abandoned)) {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "OPEN never abandoned: {seen:?}"
        );
        envoy.report("shop", 1, &[(OPEN, 0, 0), (OTHER, 0, 1)]);
        seen.extend(envoy.actions(Duration::from_secs(1)).await);
    }
    assert!(!seen.contains(&(id(OTHER), abandoned)), "{seen:?}");
}

#[tokio::test]
async fn a_malformed_report_ends_its_stream_with_the_field_named_and_no_other() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut good = Envoy::connect(&server).await.unwrap();
    let mut bad = Envoy::connect(&server).await.unwrap();
    good.report("shop", 0, &[(K1, 1, 0)]);
    good.first_for(K1).await;
    bad.report("shop", 0, &[(&[("name", "")], 1, 0)]);
    let status = bad.ended_with().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "bucket_quota_usages[0].bucket_id.bucket: `name`: keys and values must not be empty"
    );
    let mut elsewhere = Envoy::connect(&server).await.unwrap();
    elsewhere.report("elsewhere", 0, &[(K1, 1, 0)]);
    let status = elsewhere.ended_with().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("domain: `elsewhere`"),
        "{status:?}"
    );
    // The good stream goes on: its assignment is renewed (every 3.3 s, at a step a second;
    // a loaded machine's steps come late).
    good.first_within(K1, Duration::from_secs(8)).await;
}

#[tokio::test]
async fn the_token_guards_the_quota_stream_and_a_server_without_a_configuration_says_so() {
    let (_dir, _redis, server) = start(SHOP, |c| c.token = Some("s3cret".into())).await;
    let mut refused = Envoy::connect(&server).await.map(drop).err();
    if refused.is_none() {
        let mut envoy = Envoy::connect(&server).await.unwrap();
        envoy.report("shop", 0, &[(K1, 1, 0)]);
        refused = Some(envoy.ended_with().await);
    }
    assert_eq!(refused.unwrap().code(), Code::Unauthenticated);
    let mut envoy = Envoy::connect_with(&server, Some("s3cret")).await.unwrap();
    envoy.report("shop", 0, &[(K1, 1, 0)]);
    envoy.first_for(K1).await;

    let redis = RedisServer::start().unwrap();
    let bare = server_without_quotas(&redis).await;
    let status = Envoy::connect(&bare).await.map(drop).unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(status.message().contains("--rlqs-config"));
}

async fn server_without_quotas(redis: &RedisServer) -> RunningServer {
    server(Topology::Standalone(redis.url()), |_| {}).await
}

#[tokio::test]
async fn grpc_health_says_the_quota_service_serves_when_configured() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let service = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService".to_owned();
    let mut status = None;
    for _ in 0..100 {
        status = health
            .check(HealthCheckRequest {
                service: service.clone(),
            })
            .await
            .ok()
            .map(|r| r.into_inner().status);
        if status == Some(ServingStatus::Serving as i32) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, Some(ServingStatus::Serving as i32));
}

#[tokio::test]
async fn a_server_shutting_down_ends_its_streams_so_envoys_resubscribe_elsewhere() {
    let (_dir, _redis, server) = start(SHOP, |c| c.shutdown_grace = Duration::from_secs(30)).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    envoy.report("shop", 0, &[(K1, 1, 0)]);
    envoy.first_for(K1).await;
    let started = std::time::Instant::now();
    let stopping = tokio::spawn(server.stop());
    let status = envoy.ended_with().await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    stopping.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stream held the shutdown for {:?} of its 30 s grace",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_reloaded_configuration_takes_effect_at_each_envoys_next_report() {
    let (dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    envoy.report("shop", 0, &[(K1, 1, 0)]);
    assert_eq!(rate(&envoy.first_for(K1).await), 20.0);
    std::fs::write(
        dir.path().join("shop.yaml"),
        SHOP.replace("rate: 20, per: 1s, burst: 20", "rate: 5, per: 1s, burst: 5"),
    )
    .unwrap();
    // The server looks every 50 ms here; the stream takes the new rule at the next report.
    tokio::time::sleep(Duration::from_millis(300)).await;
    envoy.report("shop", 5, &[(K1, 10, 0)]);
    let seen = envoy.actions_for(K1, Duration::from_millis(1500)).await;
    assert_eq!(seen.last().map(rate), Some(5.0), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_file_keeps_its_domain_and_every_stream_on_it() {
    let (dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    envoy.report("shop", 0, &[(K1, 1, 0)]);
    assert_eq!(rate(&envoy.first_for(K1).await), 20.0);
    // Deleted, as a careless `rm` then `cp` would: the reload that would drop `shop` is
    // refused, so its reports are still served (they were refused and their streams ended).
    std::fs::remove_file(dir.path().join("shop.yaml")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    envoy.report("shop", 5, &[(K1, 10, 0), (K2, 1, 0)]);
    let seen = envoy.actions_for(K2, Duration::from_millis(1500)).await;
    assert_eq!(seen.last().map(rate), Some(20.0), "{seen:?}");
}

/// The value of the line of `/metrics` that starts with `series`, if any.
async fn metric_line(server: &RunningServer, series: &str) -> Option<String> {
    let page = common::Http::http1()
        .get(&format!("{}/metrics", server.url()))
        .await
        .body;
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_past_a_stream_or_server_cap_get_no_assignment_and_are_counted() {
    let (_dir, _redis, server) = start(SHOP, |c| {
        let rlqs = Arc::get_mut(c.rlqs.as_mut().unwrap()).unwrap();
        rlqs.max_buckets_per_stream = 3;
        rlqs.max_buckets = 4;
    })
    .await;
    let keys = per_key(5);
    let ids = ids_of(&keys);
    let first = new_buckets(&ids);
    // The buckets an Envoy is sent actions for within 1.5 s.
    let assigned = |seen: Vec<(BucketId, Action)>| {
        let keys: std::collections::BTreeSet<String> = seen
            .into_iter()
            .map(|(id, _)| id.bucket["key"].clone())
            .collect();
        keys.into_iter().collect::<Vec<_>>()
    };
    let within = Duration::from_millis(1500);
    let mut a = Envoy::connect(&server).await.unwrap();
    a.report("shop", 0, &first);
    assert_eq!(
        assigned(a.actions(within).await),
        ["k0", "k1", "k2"],
        "the stream's cap"
    );
    let mut b = Envoy::connect(&server).await.unwrap();
    b.report("shop", 0, &first[3..]);
    assert_eq!(
        assigned(b.actions(within).await),
        ["k3"],
        "the server's cap, of which a holds 3"
    );
    assert_eq!(
        metric_line(
            &server,
            r#"sluice_rlqs_refused_buckets_total{cap="stream_cap"}"#
        )
        .await,
        Some("2".to_owned())
    );
    assert_eq!(
        metric_line(
            &server,
            r#"sluice_rlqs_refused_buckets_total{cap="server_cap"}"#
        )
        .await,
        Some("1".to_owned())
    );
    // A stream's places come back when it ends.
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.report("shop", 5, &first[3..]);
    let seen = b.actions(Duration::from_millis(1500)).await;
    assert!(
        seen.iter().any(|(id, _)| id.bucket["key"] == "k4"),
        "k4 assigned once a's places came back: {seen:?}"
    );
}

#[tokio::test]
async fn a_report_whose_fundings_time_out_is_funded_again_before_its_step_ends() {
    let (_dir, redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    // Eight lease calls, four in flight. Redis paused for 150 ms: the first four wait past the
    // 100 ms timeout and fail; the next four, sent as those fail, are answered. Unless a
    // failed call is asked again within the step, its buckets wait for the next tick and the
    // step's one response assigns half of the report. (On a machine too slow to send the first
    // calls within 50 ms of the pause, none fails, and all are assigned alike.)
    let keys = per_key(8 * 64);
    let ids = ids_of(&keys);
    let first = new_buckets(&ids);
    redis.cli(&["CLIENT", "PAUSE", "150", "ALL"]).unwrap();
    envoy.report("shop", 0, &first);
    let response = tokio::time::timeout(Duration::from_secs(5), envoy.answers.message())
        .await
        .expect("no response within 5 s")
        .unwrap()
        .expect("the stream ended");
    let failures = metric_line(&server, "sluice_rlqs_funding_failures_total").await;
    eprintln!("lease calls failed: {failures:?}");
    assert_eq!(
        response.bucket_action.len(),
        keys.len(),
        "every bucket of the report assigned in the step's response ({failures:?} failed)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_envoys_share_goes_to_the_others_at_their_next_funding() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut a = Envoy::connect(&server).await.unwrap();
    let b = Envoy::connect(&server).await.unwrap();
    a.report("shop", 0, &[(K1, 1, 0)]);
    a.first_for(K1).await;
    b.report("shop", 0, &[(K1, 1, 0)]);
    a.report("shop", 5, &[(K1, 100, 0)]);
    b.report("shop", 5, &[(K1, 100, 0)]);
    let seen = a.actions_for(K1, Duration::from_millis(3500)).await;
    assert_share(rate(seen.last().unwrap()), 10.0, "a, offered as b is");
    // b goes: its claim leaves the ledger at once, not a ledger TTL (10 s) later.
    drop(b);
    let seen = a.actions_for(K1, Duration::from_millis(2500)).await;
    assert_share(
        rate(seen.last().unwrap()),
        20.0,
        "a alone, within two fundings",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stops_reporting_stops_costing_redis() {
    let (_dir, redis, server) = start(SHOP, |_| {}).await;
    let envoy = Envoy::connect(&server).await.unwrap();
    let keys = per_key(20);
    let ids = ids_of(&keys);
    let once = new_buckets(&ids);
    // Reported once, then never again, with the stream left open: no Envoy does that.
    envoy.report("shop", 0, &once);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Each funding call reads its buckets' ledgers with one MGET (only the lease script does).
    let funding = common::calls(&redis, "mget");
    assert!(funding >= 2, "funded while reported: {funding} lease calls");
    tokio::time::sleep(Duration::from_millis(SILENT_AFTER_MS)).await;
    let before = common::calls(&redis, "mget");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        common::calls(&redis, "mget"),
        before,
        "still funding buckets no report has named for {SILENT_AFTER_MS} ms"
    );
    drop(envoy);
}

#[tokio::test]
async fn request_counts_from_reports_saturate_and_never_wrap() {
    let (_dir, _redis, server) = start(SHOP, |_| {}).await;
    let mut envoy = Envoy::connect(&server).await.unwrap();
    envoy.report("shop", 0, &[(K1, u64::MAX, 0)]);
    envoy.first_for(K1).await;
    envoy.report("shop", 5, &[(K1, 300, 0)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        metric_line(
            &server,
            r#"sluice_rlqs_requests_total{domain="shop",rule="per-key",outcome="allowed"}"#
        )
        .await,
        Some(u64::MAX.to_string()),
        "a wrapped counter reads as a reset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_shared_by_as_many_streams_as_allowed_gets_no_assignment_on_another() {
    let (_dir, _redis, server) = start(SHOP, |c| {
        let rlqs = Arc::get_mut(c.rlqs.as_mut().unwrap()).unwrap();
        rlqs.max_holders_per_bucket = 2;
    })
    .await;
    let mut a = Envoy::connect(&server).await.unwrap();
    let mut b = Envoy::connect(&server).await.unwrap();
    let mut c = Envoy::connect(&server).await.unwrap();
    a.report("shop", 0, &[(K1, 1, 0)]);
    a.first_for(K1).await;
    b.report("shop", 0, &[(K1, 1, 0)]);
    b.first_for(K1).await;
    c.report("shop", 0, &[(K1, 1, 0)]);
    let seen = c.actions_for(K1, Duration::from_millis(1500)).await;
    assert!(
        seen.is_empty(),
        "a third stream on a bucket capped at two: {seen:?}"
    );
    let refused = metric_line(
        &server,
        r#"sluice_rlqs_refused_buckets_total{cap="holder_cap"}"#,
    )
    .await;
    assert_eq!(refused.as_deref(), Some("1"), "one refusal, not one a tick");
    // a leaves: its claim is withdrawn at once, and c gets its place at its next try.
    drop(a);
    let seen = c.actions_for(K1, Duration::from_millis(6500)).await;
    assert_share(
        rate(seen.last().expect("c assigned once a left")),
        10.0,
        "c beside b",
    );
}

/// A quota stream driven by a replay (`sluice-sim`'s model of Envoy's quota filter): it goes by
/// the time it is told at each report and step, not by the wall clock. Over 30 virtual seconds,
/// run in however long Redis takes: a new bucket is assigned at its first report, a busy one
/// keeps being funded at its limit's rate, and one reported idle is abandoned once its
/// `idle_after` (10 s) of replay time has passed, not before.
#[tokio::test]
async fn a_replay_stream_goes_by_the_time_it_is_told_not_the_wall_clock() {
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("shop.yaml"),
        format!("{SHOP}idle_after: 10s\n"),
    )
    .unwrap();
    let mut config = sluice_server::ServerConfig::standalone(redis.url());
    config.replay_time = true;
    config.rlqs = Some(Arc::new(RlqsState::new(
        WatchedConfig::load(vec![dir.path().to_owned()]).unwrap(),
        Duration::from_secs(3600),
    )));
    let server = sluice_server::in_process(config);
    for _ in 0..200 {
        let ready = http::Request::get("/readyz")
            .body(axum::body::Body::empty())
            .unwrap();
        if server.call(ready).await.status() == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let actions = |responses: Vec<RateLimitQuotaResponse>| -> Vec<(BucketId, Action)> {
        responses
            .into_iter()
            .flat_map(|r| r.bucket_action)
            .map(|a| (a.bucket_id.unwrap(), a.bucket_action.unwrap()))
            .collect()
    };
    let report = |usages: &[(Id, u64, i64)]| RateLimitQuotaUsageReports {
        domain: "shop".to_owned(),
        bucket_quota_usages: usages
            .iter()
            .map(|(bucket, allowed, elapsed)| BucketQuotaUsage {
                bucket_id: Some(id(bucket)),
                time_elapsed: Some(ProtoDuration {
                    seconds: *elapsed,
                    nanos: 0,
                }),
                num_requests_allowed: *allowed,
                num_requests_denied: 0,
            })
            .collect(),
    };
    let t0: i64 = 1_800_000_000_000_000;
    let second = 1_000_000;
    let mut stream = server.quota_stream(t0).expect("a quota configuration");
    let first = actions(
        stream
            .report(report(&[(K1, 1, 0), (K2, 1, 0)]), t0)
            .await
            .unwrap(),
    );
    for bucket in [K1, K2] {
        let (_, action) = first
            .iter()
            .find(|(b, _)| *b == id(bucket))
            .expect("assigned at once");
        assert!(rate(action) > 0.0, "{action:?}");
    }
    let abandoned = Action::AbandonAction(Default::default());
    let mut k1_assignments = 0;
    for s in 1..=30 {
        let now = t0 + s * second;
        let mut seen = Vec::new();
        if s % 5 == 0 {
            // K1 busy at its limit's rate (20/s), K2 unused since its first request.
            let reported = stream
                .report(report(&[(K1, 100, 5), (K2, 0, 5)]), now)
                .await;
            seen.extend(actions(reported.unwrap()));
        }
        seen.extend(actions(stream.step(now).await));
        for (_, action) in seen.iter().filter(|(b, _)| *b == id(K1)) {
            assert!(rate(action) > 0.0, "K1 at {s} s: {action:?}");
            k1_assignments += 1;
        }
        assert!(!seen.contains(&(id(K1), abandoned)), "K1 is busy: {seen:?}");
        let k2_abandoned = seen.contains(&(id(K2), abandoned));
        if k2_abandoned {
            assert!(
                (10..=12).contains(&s),
                "K2 abandoned after {s} virtual seconds, its idle_after being 10"
            );
            stream.close(now).await;
            // Renewed at fundings 3.3 s or more apart.
            assert!(k1_assignments >= 2, "K1 renewed: {k1_assignments}");
            return;
        }
    }
    panic!("K2 was never abandoned in 30 virtual seconds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_reports_first_is_funded_first_whatever_reports_behind_it() {
    // Redis paused long, but within the timeout: no call fails.
    let (_dir, redis, server) = start(SHOP, |c| c.redis_timeout = Duration::from_secs(5)).await;
    let mut first = Envoy::connect(&server).await.unwrap();
    let mut second = Envoy::connect(&server).await.unwrap();
    // Every command in the order Redis ran it, the scripts' own among them: a funding's name
    // its buckets' keys.
    redis
        .cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
        .unwrap();
    redis
        .cli(&["CONFIG", "SET", "slowlog-max-len", "100000"])
        .unwrap();
    let first_keys = keys_named("first-stream-", 16 * 64);
    let second_keys = keys_named("second-stream-", 64);
    let first_ids = ids_of(&first_keys);
    let second_ids = ids_of(&second_keys);
    redis.cli(&["SLOWLOG", "RESET"]).unwrap();
    // The first stream's report (sixteen lease calls) is taken, and its first calls wait in
    // paused Redis, the rest in the server; the second's one call comes while they do. Left
    // to each stream, it would go to Redis behind the first stream's calls then in Redis,
    // ahead of the rest of them.
    redis.cli(&["CLIENT", "PAUSE", "800", "ALL"]).unwrap();
    first.report("shop", 0, &new_buckets(&first_ids));
    tokio::time::sleep(Duration::from_millis(400)).await;
    second.report("shop", 0, &new_buckets(&second_ids));
    for (envoy, n) in [(&mut first, first_keys.len()), (&mut second, 64)] {
        let mut seen = 0;
        while seen < n {
            seen += tokio::time::timeout(Duration::from_secs(10), envoy.answers.message())
                .await
                .expect("every bucket assigned within 10 s")
                .unwrap()
                .expect("the stream ended")
                .bucket_action
                .len();
        }
    }
    // Oldest last.
    let log = redis.cli(&["SLOWLOG", "GET", "100000"]).unwrap();
    let mut streams: Vec<&str> = log
        .lines()
        .filter_map(|line| {
            ["first-stream-", "second-stream-"]
                .into_iter()
                .find(|name| line.contains(name))
        })
        .collect();
    streams.reverse();
    streams.dedup();
    assert_eq!(
        streams,
        ["first-stream-", "second-stream-"],
        "the streams' calls in Redis' order (each run of one stream's calls once)"
    );
}
