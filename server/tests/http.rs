//! sluice-server over HTTP, against a real redis-server: validation, auth, replay mode, HTTP/2,
//! health, metrics, and the outcomes of the checks of one request.

use std::time::Duration;

use crate::common;

use common::{Http, calls, one_check, server};
use sluice_harness::RedisServer;
use sluice_server::store::Topology;

/// Five requests, in a window long enough (the longest a limit may have) that no test here
/// sees it turn over and admit five more.
const LIMIT: &str = r#"{"algorithm":"fixed_window","limit":5,"window":"30d"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_naming_the_problem_and_never_reach_redis() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let check = |extra: &str| format!(r#"{{"rule":"r","key":"k","limit":{LIMIT}{extra}}}"#);
    let seventeen = vec![check(""); 17].join(",");
    let cases: Vec<(String, &str)> = vec![
        ("{".to_owned(), "body: EOF while parsing"),
        ("not json".to_owned(), "body: expected ident"),
        (r#"{"checks": 5}"#.to_owned(), "checks: invalid type: integer `5`, expected a sequence"),
        (r#"{"checks": []}"#.to_owned(), "checks: must hold at least one check"),
        (format!(r#"{{"checks":[{seventeen}]}}"#), "checks: at most 16 checks per request, not 17"),
        (r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"leaky","limit":1,"window":"1s"}}]}"#.to_owned(), "checks[0].limit: unknown algorithm `leaky`"),
        (r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":0,"per":"1s","burst":1}}]}"#.to_owned(), "checks[0].limit: `rate` must be between 1 and 1000000000, not 0"),
        (r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":"ten","per":"1s","burst":1}}]}"#.to_owned(), "checks[0].limit.rate: invalid type: string \"ten\""),
        (r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"fixed_window","limit":1,"window":"90d"}}]}"#.to_owned(), "checks[0].limit: `window` must be at most 30d"),
        (format!(r#"{{"checks":[{}]}}"#, check(r#","cost":-1"#)), "checks[0].cost: invalid value: integer `-1`"),
        (format!(r#"{{"checks":[{}]}}"#, check(r#","cost":1000000001"#)), "checks[0].cost: must be at most 1000000000"),
        (format!(r#"{{"checks":[{}]}}"#, check("").replace(r#""key":"k""#, r#""key":"a}b""#)), "checks[0].key: `a}b` is not an escaped limit key"),
        (format!(r#"{{"checks":[{}]}}"#, check("").replace(r#""key":"k""#, &format!(r#""key":"{}""#, "x".repeat(200)))), "checks[0].key:"),
        (format!(r#"{{"checks":[{}]}}"#, check("").replace(r#""rule":"r""#, r#""rule":"no spaces""#)), "checks[0].rule: `no spaces` is not a rule name"),
        (format!(r#"{{"checks":[{}],"now":1}}"#, check("")), "now: unknown field `now`"),
    ];
    let before = calls(&redis, "evalsha") + calls(&redis, "eval");
    for (body, expected) in &cases {
        let answer = http.decide(&server.url(), body, &[]).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(
            answer.content_type.starts_with("application/json"),
            "{}",
            answer.content_type
        );
        let message = answer.json()["error"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with(expected),
            "{body}\n  got:  {message}\n  want: {expected}"
        );
    }
    let huge = format!(
        r#"{{"checks":[{}]}}"#,
        check("").replace(
            r#""key":"k""#,
            &format!(r#""key":"{}""#, "x".repeat(70_000))
        )
    );
    let answer = http.decide(&server.url(), &huge, &[]).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(
        answer.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("body: larger than 65536 bytes")
    );
    assert_eq!(
        calls(&redis, "evalsha") + calls(&redis, "eval"),
        before,
        "a bad request must not reach Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_post_decides_and_unknown_paths_are_404() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let url = server.url();
    let body = one_check("r", "k", LIMIT);
    // The readiness checks the server answered already made calls of their own.
    let before = calls(&redis, "fcall");
    for method in ["GET", "PUT", "DELETE"] {
        let answer = http
            .send(method, &format!("{url}/v1/decide"), &[], body.clone())
            .await;
        assert_eq!(answer.status, 405, "{method}: {}", answer.body);
    }
    let answer = http
        .send("POST", &format!("{url}/v1/decide/more"), &[], body.clone())
        .await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    assert_eq!(answer.json()["error"], "no such endpoint");
    assert_eq!(calls(&redis, "fcall"), before, "nothing was decided");
    assert_eq!(http.decide(&url, &body, &[]).await.status, 200);
    assert_eq!(calls(&redis, "fcall"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_is_required_when_configured() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.token = Some("s3cret".into())
    })
    .await;
    let http = Http::http1();
    let body = one_check("r", "k", LIMIT);
    let missing = http.decide(&server.url(), &body, &[]).await;
    assert_eq!(
        (missing.status, missing.json()["error"].as_str().unwrap()),
        (401, "authorization: a bearer token is required")
    );
    let wrong = http
        .decide(&server.url(), &body, &[("authorization", "Bearer guess")])
        .await;
    assert_eq!(
        (wrong.status, wrong.json()["error"].as_str().unwrap()),
        (401, "authorization: wrong bearer token")
    );
    // RFC 9110: the scheme in any case; the space around a field value is not part of it.
    // Both protocols read one header alike (HTTP/1.1's parser trims it, HTTP/2's does not).
    let elsewhere = one_check("r", "other", LIMIT);
    for http in [Http::http1(), Http::h2c()] {
        for value in [
            "bearer s3cret",
            "BEARER s3cret",
            "Bearer s3cret ",
            "Bearer  s3cret",
        ] {
            let answer = http
                .decide(&server.url(), &elsewhere, &[("authorization", value)])
                .await;
            assert_eq!(answer.status, 200, "{value:?}: {}", answer.body);
        }
        let twice = http
            .decide(
                &server.url(),
                &body,
                &[
                    ("authorization", "Bearer s3cret"),
                    ("authorization", "Bearer guess"),
                ],
            )
            .await;
        assert_eq!(
            (twice.status, twice.json()["error"].as_str().unwrap()),
            (401, "authorization: more than one Authorization header")
        );
    }
    let right = http
        .decide(&server.url(), &body, &[("authorization", "Bearer s3cret")])
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
    assert_eq!(right.content_type, "application/json");
    let answer: sluice_core::wire::DecideResponse = serde_json::from_str(&right.body).unwrap();
    assert!(answer.results[0].allowed, "{}", right.body);
    // Health and metrics ask for no token unless told to (README, `--metrics-need-token`).
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = http.get(&format!("{}{path}", server.url())).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_ask_for_the_token_when_told_to_and_health_never_does() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.token = Some("s3cret".into());
        c.metrics_need_token = true;
    })
    .await;
    let http = Http::http1();
    let url = |path: &str| format!("{}{path}", server.url());
    let bare = http.get(&url("/metrics")).await;
    assert_eq!(
        (bare.status, bare.json()["error"].as_str().unwrap()),
        (401, "authorization: a bearer token is required")
    );
    assert!(!bare.body.contains("sluice_"), "{}", bare.body);
    let with = http
        .send(
            "GET",
            &url("/metrics"),
            &[("authorization", "Bearer s3cret")],
            "",
        )
        .await;
    assert_eq!(with.status, 200, "{}", with.body);
    assert!(
        with.body.contains("sluice_decision_duration_seconds_count"),
        "{}",
        with.body
    );
    for path in ["/healthz", "/readyz"] {
        assert_eq!(http.get(&url(path)).await.status, 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_supplied_time_is_refused_unless_the_server_replays() {
    let redis = RedisServer::start().unwrap();
    let http = Http::http1();
    let per_minute = r#"{"algorithm":"fixed_window","limit":5,"window":"1m"}"#;
    let body = one_check("r", "k", per_minute);
    let live = server(Topology::Standalone(redis.url()), |_| {}).await;
    let refused = http
        .decide(
            &live.url(),
            &body,
            &[("x-sluice-replay-time-us", "1700000000000000")],
        )
        .await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("x-sluice-replay-time-us: this server takes its time from Redis")
    );

    let replay = server(Topology::Standalone(redis.url()), |c| c.replay_time = true).await;
    let garbage = http
        .decide(
            &replay.url(),
            &body,
            &[("x-sluice-replay-time-us", "yesterday")],
        )
        .await;
    assert_eq!(garbage.status, 400);
    // Two windows a minute apart, in virtual time: each admits its five.
    for minute in [0, 1] {
        let t = (1_700_000_040_000_000i64 + minute * 60_000_000).to_string();
        let mut admitted = 0;
        for _ in 0..7 {
            let answer = http
                .decide(&replay.url(), &body, &[("x-sluice-replay-time-us", &t)])
                .await;
            admitted += usize::from(answer.json()["results"][0]["allowed"].as_bool().unwrap());
        }
        assert_eq!(admitted, 5, "minute {minute}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleartext_http2_is_served_like_http1() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let answer = Http::h2c()
        .decide(&server.url(), &one_check("r", "k", LIMIT), &[])
        .await;
    assert_eq!(answer.version, http::Version::HTTP_2);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["results"][0]["remaining"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_over_http2_is_framed_by_its_stream_and_over_http1_by_its_length() {
    // Each header of the answer is work for Envoy on every request; HTTP/2 needs no length.
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let body = one_check("r", "k", LIMIT);
    let h2 = Http::h2c().decide(&server.url(), &body, &[]).await;
    assert_eq!(h2.version, http::Version::HTTP_2);
    assert_eq!(h2.status, 200, "{}", h2.body);
    assert_eq!(h2.content_length, None);
    assert_eq!(h2.content_type, "application/json");
    assert_eq!(h2.json()["results"][0]["remaining"], 4);
    let h1 = Http::http1().decide(&server.url(), &body, &[]).await;
    assert_eq!(h1.version, http::Version::HTTP_11);
    assert_eq!(h1.content_length, Some(h1.body.len().to_string()));
    assert_eq!(h1.json()["results"][0]["remaining"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_content_type_is_read_as_json() {
    // The filters send none (filter-logic's `callout_headers`).
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    for http in [Http::http1(), Http::h2c()] {
        let answer = http
            .send(
                "POST",
                &format!("{}/v1/decide", server.url()),
                &[],
                one_check("r", "k", LIMIT),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(answer.json()["results"][0]["allowed"].as_bool().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let mut redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.redis_timeout = std::time::Duration::from_millis(200)
    })
    .await;
    let http = Http::http1();
    assert_eq!(
        http.get(&format!("{}/healthz", server.url())).await.status,
        200
    );
    assert_eq!(
        http.get(&format!("{}/readyz", server.url())).await.status,
        200
    );
    for _ in 0..7 {
        http.decide(
            &server.url(),
            &one_check("per-ip", "203.0.113.1", LIMIT),
            &[],
        )
        .await;
    }
    let metrics = http.get(&format!("{}/metrics", server.url())).await;
    assert_eq!(metrics.status, 200);
    for line in [
        r#"sluice_decisions_total{rule="per-ip",outcome="allowed"} 5"#,
        r#"sluice_decisions_total{rule="per-ip",outcome="denied"} 2"#,
        "sluice_decision_duration_seconds_count 7",
        "# TYPE sluice_decision_duration_seconds histogram",
        "sluice_redis_functions 1",
    ] {
        assert!(
            metrics.body.contains(line),
            "missing {line:?} in\n{}",
            metrics.body
        );
    }
    let uncertainty: f64 = metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix("sluice_redis_clock_uncertainty_seconds "))
        .expect("the clock's uncertainty is reported")
        .parse()
        .unwrap();
    assert!(
        (0.0..0.05).contains(&uncertainty),
        "Redis' clock carried within {uncertainty} s on loopback"
    );
    redis.kill();
    let not_ready = http.get(&format!("{}/readyz", server.url())).await;
    assert_eq!(not_ready.status, 503);
    assert!(
        not_ready.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("redis:")
    );
    let failed = http
        .decide(
            &server.url(),
            &one_check("per-ip", "203.0.113.1", LIMIT),
            &[],
        )
        .await;
    assert_eq!(failed.status, 503);
    let metrics = http.get(&format!("{}/metrics", server.url())).await;
    assert!(
        metrics.body.contains("sluice_redis_errors_total{kind="),
        "{}",
        metrics.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_counts_each_check_by_its_outcome() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let tight = r#"{"algorithm":"fixed_window","limit":1,"window":"30d"}"#;
    let loose = r#"{"algorithm":"fixed_window","limit":100,"window":"30d"}"#;
    let body = format!(
        r#"{{"checks":[{{"rule":"shadow","key":"c","limit":{tight},"shadow":true}},{{"rule":"per-ip","key":"c","limit":{tight}}},{{"rule":"per-route","key":"r","limit":{loose}}}]}}"#
    );
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let answer = http.decide(&server.url(), &body, &[]).await.json();
        remaining.push(answer["results"][2]["remaining"].as_u64().unwrap());
    }
    // The first request passes per-ip and consumes per-route; the three denied by per-ip
    // consume nothing from per-route (skipped), and the shadow rule would have denied them.
    assert_eq!(remaining, [99, 99, 99, 99]);
    let metrics = http.get(&format!("{}/metrics", server.url())).await.body;
    assert!(
        metrics.contains(r#"sluice_decisions_total{rule="per-route",outcome="skipped"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"sluice_decisions_total{rule="shadow",outcome="shadow_denied"} 3"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_writes_is_not_ready() {
    // Out of memory (noeviction), Redis still answers PING but refuses every script that
    // writes: no decision can succeed, so the server must not say it is ready.
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let ready = format!("{}/readyz", server.url());
    assert_eq!(http.get(&ready).await.status, 200);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let decided = http
        .decide(
            &server.url(),
            &one_check("per-ip", "203.0.113.1", LIMIT),
            &[],
        )
        .await;
    assert_eq!(decided.status, 503, "{}", decided.body);
    let not_ready = http.get(&ready).await;
    assert_eq!(not_ready.status, 503, "{}", not_ready.body);
    assert!(not_ready.body.contains("OOM"), "{}", not_ready.body);
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    assert_eq!(http.get(&ready).await.status, 200, "ready again");
    let metrics = http.get(&format!("{}/metrics", server.url())).await;
    assert!(
        !metrics.body.contains("sluice-server.readyz"),
        "the readiness check is counted as no rule's decision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_names_from_requests_cannot_grow_the_metrics_without_bound() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let names = sluice_server::label_budget::MAX_VALUES * 3;
    for i in 0..names {
        let answer = http
            .decide(
                &server.url(),
                &one_check(&format!("rule-{i}"), "k", LIMIT),
                &[],
            )
            .await;
        assert_eq!(answer.status, 200);
    }
    let metrics = http.get(&format!("{}/metrics", server.url())).await.body;
    let rules: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_decisions_total{"))
        .filter_map(|l| l.split("rule=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        rules.len(),
        sluice_server::label_budget::MAX_VALUES + 1,
        "the first names, then _overflow"
    );
    assert!(rules.contains(sluice_server::label_budget::OVERFLOW));
    let overflowed = names - sluice_server::label_budget::MAX_VALUES;
    assert!(
        metrics.contains(&format!(
            "sluice_label_overflow_total{{label=\"decision_rule\"}} {overflowed}"
        )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("overflow"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics.len() < 300_000,
        "/metrics is {} bytes",
        metrics.len()
    );
}

/// Three decisions on one kept-alive connection, `gap` apart: each answered 200.
async fn decides_on_a_kept_alive_connection(url: &str, gap: Duration) {
    let http = Http::http1();
    for _ in 0..3 {
        let answer = http.decide(url, &one_check("r", "k", LIMIT), &[]).await;
        assert_eq!(answer.status, 200);
        tokio::time::sleep(gap).await;
    }
}

/// Reads from `stream` until the server closes it or `within` passes; whether it closed.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_mid_request_or_after_the_http2_preface_is_closed() {
    use tokio::io::AsyncWriteExt;
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut half = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    half.write_all(b"POST /v1/decide HTTP/1.1\r\nhost: sluice\r\ncontent-le")
        .await
        .unwrap();
    let mut preface = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert!(
        closed_within(&mut half, Duration::from_secs(3)).await,
        "half a request"
    );
    assert!(
        closed_within(&mut preface, Duration::from_secs(3)).await,
        "the preface alone"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A connection in use is not idle.
    decides_on_a_kept_alive_connection(&server.url(), Duration::from_millis(150)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_until_one_closes() {
    use tokio::io::AsyncWriteExt;
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.max_connections = 3;
        c.idle_timeout = Duration::from_secs(30);
    })
    .await;
    // The test helper's readiness checks used a connection that may still be open: wait it out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: s\r\n\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    let http = Http::http1();
    let url = server.url();
    let waiting = tokio::spawn(async move {
        http.decide(&url, &one_check("r", "k", LIMIT), &[])
            .await
            .status
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a fourth connection was served past the cap of 3"
    );
    drop(held.pop());
    let status = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert_eq!(status, 200);
}

/// For each algorithm, a limit `A` and a changed one `B` of the same rule and key, deciding
/// side by side as during a rolling deploy that edits the limit (replay time, so the windows
/// are exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_limit_decides_on_state_of_its_own_beside_the_old_one() {
    use sluice_core::wire::REPLAY_TIME_HEADER;
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| c.replay_time = true).await;
    let http = Http::http1();
    let pairs = [
        (
            r#"{"algorithm":"fixed_window","limit":3,"window":"1h"}"#,
            r#"{"algorithm":"fixed_window","limit":5,"window":"1m"}"#,
        ),
        (
            r#"{"algorithm":"sliding_log","limit":3,"window":"1h"}"#,
            r#"{"algorithm":"sliding_log","limit":5,"window":"1s"}"#,
        ),
        (
            r#"{"algorithm":"sliding_window","limit":3,"window":"1h"}"#,
            r#"{"algorithm":"sliding_window","limit":5,"window":"1s"}"#,
        ),
        (
            r#"{"algorithm":"token_bucket","rate":1,"per":"1h","burst":3}"#,
            r#"{"algorithm":"token_bucket","rate":1,"per":"1s","burst":5}"#,
        ),
        (
            r#"{"algorithm":"leaky_bucket","rate":1,"per":"1h","burst":3}"#,
            r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":5}"#,
        ),
        (
            r#"{"algorithm":"gcra","rate":1,"per":"1h","burst":3}"#,
            r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":5}"#,
        ),
    ];
    let t0: i64 = 1_763_700_000_000_000;
    for (old, new) in pairs {
        let decide = |limit: &'static str, at: i64| {
            let http = &http;
            let url = server.url();
            async move {
                let answer = http
                    .decide(
                        &url,
                        &one_check("edited", "k", limit),
                        &[(REPLAY_TIME_HEADER, &at.to_string())],
                    )
                    .await;
                assert_eq!(answer.status, 200, "{}", answer.body);
                let result = answer.json()["results"][0].clone();
                (
                    result["allowed"].as_bool().unwrap(),
                    result["remaining"].as_u64().unwrap(),
                )
            }
        };
        for i in 0..3 {
            assert!(decide(old, t0 + i).await.0, "{old}: within its limit");
        }
        assert!(!decide(old, t0 + 10).await.0, "{old}: spent");
        // Two seconds on, the new limit's first decision: its own, full state.
        assert_eq!(decide(new, t0 + 2_000_000).await, (true, 4), "{new}: fresh");
        // The old limit's state is as it left it: neither trimmed nor reset by the new one.
        assert!(!decide(old, t0 + 3_000_000).await.0, "{old}: still spent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_limits_leases_come_from_a_ledger_of_its_own() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let ask = |limit: &str| {
        format!(
            r#"{{"holder":"envoy-a","asks":[{{"rule":"leased","key":"k","limit":{limit},"terms":{{"max_units":5,"max_outstanding":10,"ttl":"1m"}},"want":5,"held":0,"returning":0}}]}}"#
        )
    };
    for limit in [
        r#"{"algorithm":"gcra","rate":1,"per":"1m","burst":20}"#,
        r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":20}"#,
    ] {
        let answer = http
            .send(
                "POST",
                &format!("{}/v1/lease", server.url()),
                &[("content-type", "application/json")],
                ask(limit),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            answer.json()["grants"][0]["granted"],
            5,
            "{limit}: a full grant"
        );
    }
    // A gcra's ledger is kept in its key, after the time (lua/prelude.lua, cell()).
    let keys = redis
        .cli(&["--scan", "--pattern", "sluice:{leased:k}:*"])
        .unwrap();
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "sluice:{leased:k}:gc:1/1000/20",
            "sluice:{leased:k}:gc:1/60000/20"
        ]
    );
    for key in keys {
        let stored = redis.cli(&["GET", key]).unwrap();
        let ledger = stored.trim().split_once(' ').map(|(_, ledger)| ledger);
        assert!(
            ledger.is_some_and(|ledger| ledger.starts_with("envoy-a=5:")),
            "{key} holds {stored:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_request_is_cut_off() {
    use tokio::io::AsyncWriteExt;
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.idle_timeout = Duration::from_secs(5);
        c.request_timeout = Duration::from_millis(500);
    })
    .await;
    let mut slow = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let started = std::time::Instant::now();
    let request = b"POST /v1/decide HTTP/1.1\r\nhost: sluice\r\nx-padding: ";
    let mut cut = false;
    // A byte each 100 ms: never idle for the 5 s idle timeout.
    for byte in request.iter().chain(std::iter::repeat(&b'a')).take(60) {
        if slow.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cut || closed_within(&mut slow, Duration::from_millis(100)).await,
        "a request trickled over {:?} was not cut off",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // A whole request is answered well within the limit, on a connection kept alive.
    decides_on_a_kept_alive_connection(&server.url(), Duration::from_millis(300)).await;
}
