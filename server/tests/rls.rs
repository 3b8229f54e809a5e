//! Envoy's gRPC rate limit API against a real redis-server, through the client stubs
//! `envoy-types` generates from Envoy's protos: the same decisions as `/v1/decide` for every
//! algorithm, reloads, refusals, health, the local over-limit cache and the reference's stats.
//! (The reference service's documented examples run through Envoy's Python stubs:
//! tests/e2e/rls_reference.rs.)

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Http, calls, server};
use sluice_core::rls::answer::RlsHeaders;
use sluice_core::wire::REPLAY_TIME_HEADER;
use sluice_harness::RedisServer;
use sluice_server::RunningServer;
use sluice_server::envoy_api::protobuf::UInt64Value;
use sluice_server::envoy_api::ratelimit::{
    Code, DescriptorEntry, RateLimitClient, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, SHOULD_RATE_LIMIT,
};
use sluice_server::rls::RlsState;
use sluice_server::rls::config::WatchedConfig;
use sluice_server::rls::unary;
use sluice_server::store::Topology;
use tonic::transport::Channel;

/// The six algorithms, each as a sluice extension whose steady rate is 5 per second.
const ALGORITHMS: [(&str, &str); 6] = [
    (
        "fixed_window",
        r#"{"algorithm":"fixed_window","limit":5,"window":"1s"}"#,
    ),
    (
        "sliding_window",
        r#"{"algorithm":"sliding_window","limit":5,"window":"1s"}"#,
    ),
    (
        "sliding_log",
        r#"{"algorithm":"sliding_log","limit":5,"window":"1s"}"#,
    ),
    (
        "token_bucket",
        r#"{"algorithm":"token_bucket","rate":5,"per":"1s","burst":8}"#,
    ),
    (
        "leaky_bucket",
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":8}"#,
    ),
    (
        "gcra",
        r#"{"algorithm":"gcra","rate":5,"per":"1s","burst":8}"#,
    ),
];

fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn rls_state(dir: &Path, cache: usize, headers: RlsHeaders) -> Arc<RlsState> {
    let config = WatchedConfig::load(vec![dir.to_path_buf()]).unwrap();
    Arc::new(RlsState::new(
        config,
        cache,
        headers,
        Duration::from_millis(50),
    ))
}

async fn rls_server(
    redis: &RedisServer,
    rls: Option<Arc<RlsState>>,
    replay_time: bool,
) -> RunningServer {
    server(Topology::Standalone(redis.url()), |c| {
        c.rls = rls;
        c.replay_time = replay_time;
    })
    .await
}

/// A configuration directory holding `files`, a Redis, and a server serving them.
async fn start(
    files: &[(&str, &str)],
    cache: usize,
    replay_time: bool,
) -> (tempfile::TempDir, RedisServer, RunningServer) {
    let dir = config_dir(files);
    let redis = RedisServer::start().unwrap();
    let rls = rls_state(dir.path(), cache, RlsHeaders::None);
    let server = rls_server(&redis, Some(rls), replay_time).await;
    (dir, redis, server)
}

async fn client(server: &RunningServer) -> RateLimitClient {
    RateLimitClient::connect(server.url()).await.unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| DescriptorEntry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitClient,
    request: RateLimitRequest,
    at_us: Option<i64>,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut request = tonic::Request::new(request);
    if let Some(at) = at_us {
        request
            .metadata_mut()
            .insert(REPLAY_TIME_HEADER, at.to_string().parse().unwrap());
    }
    client
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner())
}

/// A replay-mode server whose domain `domain` has a descriptor (`algorithm`, name) for each of
/// [`ALGORITHMS`]; its configuration's directory and its Redis, to keep.
async fn every_algorithm_server(domain: &str) -> (tempfile::TempDir, RedisServer, RunningServer) {
    let yaml: String = ALGORITHMS
        .iter()
        .map(|(name, limit)| {
            format!(
                "  - key: algorithm\n    value: {name}\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      sluice: {limit}\n"
            )
        })
        .collect();
    let file = format!("{domain}.yaml");
    let dir = config_dir(&[(&file, &format!("domain: {domain}\ndescriptors:\n{yaml}"))]);
    let redis = RedisServer::start().unwrap();
    let server = rls_server(
        &redis,
        Some(rls_state(dir.path(), 0, RlsHeaders::None)),
        true,
    )
    .await;
    (dir, redis, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_framed_by_its_stream_without_a_content_length() {
    // A header Envoy's gRPC client would decode and check on every answer, for nothing the
    // stream's end does not say.
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
    let (_dir, _redis, server) = start(&[("d.yaml", yaml)], 0, false).await;
    let message = prost::Message::encode_to_vec(&request("d", vec![descriptor(&[("k", "v")])]));
    let answer = Http::h2c()
        .send(
            "POST",
            &format!("{}{SHOULD_RATE_LIMIT}", server.url()),
            &[("content-type", "application/grpc"), ("te", "trailers")],
            unary::framed(&message),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.content_type, "application/grpc");
    assert_eq!(answer.content_length, None);
    // The prefix's length is the whole rest of the body.
    let reply = unary::message(&answer.body_bytes).unwrap();
    let reply: RateLimitResponse = prost::Message::decode(reply).unwrap();
    assert_eq!(reply.overall_code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_api_and_v1_decide_reach_the_same_decisions_for_every_algorithm() {
    let (_dir, _redis, server) = every_algorithm_server("same").await;
    let mut grpc = client(&server).await;
    let http = Http::http1();
    // Bursts and pauses, with costs of 0 (asking), 1, 2 and 3.
    let steps: Vec<(i64, u64)> = (0..40)
        .map(|i: i64| {
            let at = 1_700_000_000_000_000 + i * 37_000 + (i / 10) * 450_000;
            (at, [1, 1, 2, 0, 1, 3, 1][usize::try_from(i % 7).unwrap()])
        })
        .collect();
    for (name, limit) in ALGORITHMS {
        let (mut by_grpc, mut by_http) = (Vec::new(), Vec::new());
        for &(at, cost) in &steps {
            let mut d = descriptor(&[("algorithm", name)]);
            d.hits_addend = Some(UInt64Value { value: cost });
            let answer = ask(&mut grpc, request("same", vec![d]), Some(at))
                .await
                .unwrap();
            let status = &answer.statuses[0];
            by_grpc.push((status.code == Code::Ok as i32, status.limit_remaining));

            let body = format!(
                r#"{{"checks":[{{"rule":"http","key":"{name}","limit":{limit},"cost":{cost}}}]}}"#
            );
            let answer = http
                .decide(
                    &server.url(),
                    &body,
                    &[(REPLAY_TIME_HEADER, &at.to_string())],
                )
                .await
                .json();
            let verdict = &answer["results"][0];
            let allowed = verdict["allowed"].as_bool().unwrap();
            let remaining = if allowed {
                u32::try_from(verdict["remaining"].as_u64().unwrap()).unwrap()
            } else {
                0
            };
            by_http.push((allowed, remaining));
        }
        assert_eq!(by_grpc, by_http, "{name}");
        let denials = by_grpc.iter().filter(|(allowed, _)| !allowed).count();
        assert!(
            denials > 0 && denials < steps.len(),
            "{name}: the sequence must both admit and deny ({denials} denials)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_written_or_vanished_file_never_lifts_a_limit() {
    let full = "domain: shop\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
    // A writer cut off before the limited descriptor: valid YAML, with the domain unlimited.
    let cut = &full[..full.find("  - key: user").unwrap()];
    let (dir, _redis, server) = start(&[("shop.yaml", full)], 0, true).await;
    let mut grpc = client(&server).await;
    let at = Some(1_700_000_040_000_000); // 40 s into a minute, in replay time.
    let code = |grpc: &mut RateLimitClient| {
        let mut grpc = grpc.clone();
        async move {
            let request = request("shop", vec![descriptor(&[("user", "a")])]);
            match ask(&mut grpc, request, at).await {
                Ok(answer) => answer.overall_code,
                Err(status) => panic!("{status}"),
            }
        }
    };
    for _ in 0..3 {
        assert_eq!(code(&mut grpc).await, Code::Ok as i32);
    }
    assert_eq!(code(&mut grpc).await, Code::OverLimit as i32);
    let load_errors = || async {
        let text = Http::http1()
            .get(&format!("{}/metrics", server.url()))
            .await
            .body;
        text.lines()
            .find_map(|l| l.strip_prefix("ratelimit_service_config_load_error "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Left cut off, then deleted: each change is looked at a few times (every 50 ms here),
    // refused and counted, and the limit holds throughout.
    std::fs::write(dir.path().join("shop.yaml"), cut).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(code(&mut grpc).await, Code::OverLimit as i32);
    assert_eq!(load_errors().await, 1, "the cut-off file was refused");
    std::fs::remove_file(dir.path().join("shop.yaml")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(code(&mut grpc).await, Code::OverLimit as i32);
    assert_eq!(load_errors().await, 2, "the vanished domain was refused");

    // Restored whole, by renaming a complete file over it, with room for two more.
    let staged = dir.path().join(".shop.yaml.new");
    std::fs::write(
        &staged,
        full.replace("requests_per_unit: 3", "requests_per_unit: 5"),
    )
    .unwrap();
    std::fs::rename(&staged, dir.path().join("shop.yaml")).unwrap();
    let mut admitted = false;
    for _ in 0..100 {
        if code(&mut grpc).await == Code::Ok as i32 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted, "the restored file never loaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_configuration_applies_to_the_next_request_and_a_broken_one_keeps_the_last() {
    let file = |n: u32| {
        format!(
            "domain: reload\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
        )
    };
    let dir = config_dir(&[("reload.yaml", &file(1))]);
    let redis = RedisServer::start().unwrap();
    let server = rls_server(
        &redis,
        Some(rls_state(dir.path(), 0, RlsHeaders::None)),
        false,
    )
    .await;
    let mut grpc = client(&server).await;
    let limit_now = |grpc: &mut RateLimitClient| {
        let mut grpc = grpc.clone();
        async move {
            let answer = ask(
                &mut grpc,
                request("reload", vec![descriptor(&[("user", "a")])]),
                None,
            )
            .await
            .unwrap();
            answer.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit
        }
    };
    assert_eq!(limit_now(&mut grpc).await, 1);
    std::fs::write(dir.path().join("reload.yaml"), file(100)).unwrap();
    let mut reloaded = false;
    for _ in 0..100 {
        if limit_now(&mut grpc).await == 100 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reloaded, "the new limit never applied");

    std::fs::write(
        dir.path().join("reload.yaml"),
        "domain: reload\ndescriptors: [{key: user, rate_limit: {unit: fortnight}}]\n",
    )
    .unwrap();
    let metrics = Http::http1();
    let mut counted = false;
    for _ in 0..100 {
        let text = metrics.get(&format!("{}/metrics", server.url())).await.body;
        if text.contains("ratelimit_service_config_load_error 1") {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(counted, "the failed reload was not counted");
    assert_eq!(
        limit_now(&mut grpc).await,
        100,
        "the last good configuration stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_naming_the_field_and_never_reach_redis() {
    let (_dir, redis, server) = start(&[(
        "d.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    )], 0, false).await;
    let mut grpc = client(&server).await;
    let mut negative = descriptor(&[("k", "v")]);
    negative.is_negative_hits = true;
    let mut huge = descriptor(&[("k", "v")]);
    huge.hits_addend = Some(UInt64Value {
        value: 2_000_000_000,
    });
    let mut bad_unit = descriptor(&[("k", "v")]);
    bad_unit.limit = Some(sluice_server::envoy_api::ratelimit::RateLimitOverride {
        requests_per_unit: 3,
        unit: 0,
    });
    let cases = [
        (
            request("", vec![descriptor(&[("k", "v")])]),
            "domain: rate limit domain must not be empty",
        ),
        (
            request("d", vec![]),
            "descriptors: rate limit descriptor list must not be empty",
        ),
        (
            request("d", vec![descriptor(&[("k", "v")]); 17]),
            "descriptors: at most 16 descriptors per request, not 17",
        ),
        (
            request("d", vec![negative]),
            "descriptors[0].is_negative_hits: refunding hits is not supported",
        ),
        (
            request("d", vec![huge]),
            "descriptors[0].hits_addend: must be at most 1000000000",
        ),
        (
            request("d", vec![bad_unit]),
            "descriptors[0].limit.unit: unit 0 is not one of",
        ),
    ];
    let before = calls(&redis, "evalsha");
    for (request, expected) in cases {
        let status = ask(&mut grpc, request, None).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{expected}");
        assert!(
            status.message().starts_with(expected),
            "{}",
            status.message()
        );
    }
    assert_eq!(
        calls(&redis, "evalsha"),
        before,
        "a refused request reached Redis"
    );

    // Replay time only when the server takes it.
    let status = ask(
        &mut grpc,
        request("d", vec![descriptor(&[("k", "v")])]),
        Some(1),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("x-sluice-replay-time-us"),
        "{}",
        status.message()
    );

    // A server without a rate limit configuration says how to get one.
    let plain = rls_server(&redis, None, false).await;
    let status = ask(
        &mut client(&plain).await,
        request("d", vec![descriptor(&[("k", "v")])]),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert!(
        status.message().contains("--rls-config"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_guards_the_grpc_api_as_it_guards_v1() {
    let dir = config_dir(&[("d.yaml", "domain: d\ndescriptors: []\n")]);
    let redis = RedisServer::start().unwrap();
    let rls = rls_state(dir.path(), 0, RlsHeaders::None);
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.rls = Some(rls);
        c.token = Some("s3cret".to_owned());
    })
    .await;
    let mut grpc = client(&server).await;
    let status = ask(
        &mut grpc,
        request("d", vec![descriptor(&[("k", "v")])]),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let mut with_token = tonic::Request::new(request("d", vec![descriptor(&[("k", "v")])]));
    with_token
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    let answer = grpc
        .should_rate_limit(with_token)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_says_serving_while_redis_answers_and_not_serving_when_it_stops() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let (_dir, redis, server) =
        start(&[("d.yaml", "domain: d\ndescriptors: []\n")], 0, false).await;
    let channel = Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let status_of = |health: &mut HealthClient<Channel>, service: &str| {
        let mut health = health.clone();
        let service = service.to_owned();
        async move {
            health
                .check(HealthCheckRequest { service })
                .await
                .map(|r| r.into_inner().status)
        }
    };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    // One readiness: the moment /readyz says ready, so does gRPC health, with no warm-up.
    let ready = common::Http::http1()
        .get(&format!("{}/readyz", server.url()))
        .await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        status_of(&mut health, "envoy.service.ratelimit.v3.RateLimitService")
            .await
            .ok(),
        Some(serving)
    );
    assert_eq!(status_of(&mut health, "").await.ok(), Some(serving));
    drop(redis);
    let mut stopped = false;
    for _ in 0..100 {
        if status_of(&mut health, "").await.ok() != Some(serving) {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stopped, "still serving with Redis gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_counter_is_answered_from_the_local_cache_without_redis_until_it_may_pass() {
    let (_dir, redis, server) = start(&[(
        "c.yaml",
        "domain: c\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )], 1000, true).await;
    let mut grpc = client(&server).await;
    let at = 1_700_000_080_000_000; // 40 s into a minute.
    let code = |answer: &RateLimitResponse| answer.overall_code;
    for _ in 0..2 {
        let answer = ask(
            &mut grpc,
            request("c", vec![descriptor(&[("user", "a")])]),
            Some(at),
        )
        .await
        .unwrap();
        assert_eq!(code(&answer), Code::Ok as i32);
    }
    let denied = ask(
        &mut grpc,
        request("c", vec![descriptor(&[("user", "a")])]),
        Some(at),
    )
    .await
    .unwrap();
    assert_eq!(code(&denied), Code::OverLimit as i32);
    let before = calls(&redis, "evalsha");
    for i in 1..=5 {
        let answer = ask(
            &mut grpc,
            request("c", vec![descriptor(&[("user", "a")])]),
            Some(at + i * 1_000_000),
        )
        .await
        .unwrap();
        assert_eq!(code(&answer), Code::OverLimit as i32);
        let reset = answer.statuses[0].duration_until_reset.unwrap();
        assert_eq!(reset.seconds, 20 - i, "until the minute ends");
    }
    assert_eq!(
        calls(&redis, "evalsha"),
        before,
        "cached denials reached Redis"
    );
    let other = ask(
        &mut grpc,
        request("c", vec![descriptor(&[("user", "b")])]),
        Some(at),
    )
    .await
    .unwrap();
    assert_eq!(
        code(&other),
        Code::Ok as i32,
        "another user's counter is its own"
    );
    let next_minute = ask(
        &mut grpc,
        request("c", vec![descriptor(&[("user", "a")])]),
        Some(at + 20_000_000),
    )
    .await
    .unwrap();
    assert_eq!(
        code(&next_minute),
        Code::Ok as i32,
        "the cache lets it pass when Redis would"
    );
    let text = Http::http1()
        .get(&format!("{}/metrics", server.url()))
        .await
        .body;
    assert!(
        text.contains(
            "ratelimit_service_rate_limit_over_limit_with_local_cache{domain=\"c\",key1=\"user\",key2=\"\"} 5"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"c\",key1=\"user\",key2=\"\"} 10"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_descriptor_twice_counts_each_and_a_denied_request_consumes_nothing() {
    let (_dir, _redis, server) = every_algorithm_server("twice").await;
    let mut grpc = client(&server).await;
    // One instant throughout: nothing refills between the requests.
    let at = Some(1_700_000_000_000_000);
    for (name, limit) in ALGORITHMS {
        let limit: serde_json::Value = serde_json::from_str(limit).unwrap();
        let capacity = limit["burst"].as_u64().or(limit["limit"].as_u64()).unwrap();
        let one = || descriptor(&[("algorithm", name)]);
        let mut all_but_one = one();
        all_but_one.hits_addend = Some(UInt64Value {
            value: capacity - 1,
        });
        let spent = ask(&mut grpc, request("twice", vec![all_but_one]), at)
            .await
            .unwrap();
        assert_eq!(
            spent.overall_code,
            Code::Ok as i32,
            "{name}: all but one spent"
        );
        // One unit left, asked for twice: the first fits, the second goes over, and the
        // request, denied, consumes nothing.
        let twice = ask(&mut grpc, request("twice", vec![one(), one()]), at)
            .await
            .unwrap();
        let codes: Vec<i32> = twice.statuses.iter().map(|s| s.code).collect();
        assert_eq!(
            (twice.overall_code, codes),
            (
                Code::OverLimit as i32,
                vec![Code::Ok as i32, Code::OverLimit as i32]
            ),
            "{name}"
        );
        let last = ask(&mut grpc, request("twice", vec![one()]), at)
            .await
            .unwrap();
        assert_eq!(
            last.overall_code,
            Code::Ok as i32,
            "{name}: the last unit is still there"
        );
        let none = ask(&mut grpc, request("twice", vec![one()]), at)
            .await
            .unwrap();
        assert_eq!(
            none.overall_code,
            Code::OverLimit as i32,
            "{name}: now spent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_values_in_stats_keys_are_cut_and_bounded() {
    let dir = config_dir(&[(
        "big.yaml",
        "domain: big\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1000}\n",
    )]);
    let redis = RedisServer::start().unwrap();
    let server = rls_server(
        &redis,
        Some(rls_state(dir.path(), 0, RlsHeaders::None)),
        false,
    )
    .await;
    let mut grpc = client(&server).await;
    // Three values of 1 MB each, then many short ones.
    for i in 0..3 {
        let value = format!("{i}{}", "x".repeat(1 << 20));
        let answer = ask(
            &mut grpc,
            request("big", vec![descriptor(&[("user", &value)])]),
            None,
        )
        .await
        .unwrap();
        assert_eq!(answer.overall_code, Code::Ok as i32);
    }
    for i in 0..(sluice_server::label_budget::MAX_VALUES + 500) {
        ask(
            &mut grpc,
            request("big", vec![descriptor(&[("user", &format!("u{i}"))])]),
            None,
        )
        .await
        .unwrap();
    }
    let metrics = Http::http1()
        .get(&format!("{}/metrics", server.url()))
        .await
        .body;
    let keys: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .filter_map(|l| l.split("key1=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(keys.len(), sluice_server::label_budget::MAX_VALUES + 1);
    assert!(
        keys.iter()
            .all(|k| k.len() <= sluice_server::label_budget::MAX_BYTES)
    );
    assert!(
        metrics.len() < 2_000_000,
        "/metrics is {} bytes",
        metrics.len()
    );
}
