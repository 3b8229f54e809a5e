//! When sluice-server fails, in a real Envoy: `failure_mode` allow and deny apply within the
//! callout's timeout, with the server stopped and with it frozen, every failure is counted, and
//! limits apply again once it is back. And when the VM itself fails (a trap): the plugin's
//! `FAIL_CLOSED` and `FAIL_RELOAD`, shown with the probe filter made to trap.

use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{Backends, Plugin, Way, eventually, get, plugin_config, start_envoy};
use sluice_harness::Envoy;
use sluice_harness::http::Answer;

use super::filter::{WORKERS, both_ways, envoy_with, settled_stat};

/// The callout timeout the policies below set.
const TIMEOUT: Duration = Duration::from_millis(100);

/// A failed callout must be over this soon: the timeout, plus room for a busy machine.
const WITHIN: Duration = Duration::from_millis(800);

/// How much sooner than [`TIMEOUT`] Envoy's timeout may fire as this process's clock sees it.
/// Envoy's timers run on libevent's coarse monotonic clock: under load, 99 ms were seen.
const TIMER_SLACK: Duration = Duration::from_millis(10);

fn policy(failure_mode: &str) -> String {
    format!(
        r#"{{"cluster": "sluice", "timeout": "100ms", "failure_mode": "{failure_mode}", "deny_cache": false,
            "rules": [{{"name": "per-ip", "key": ["client_ip"],
                        "limit": {{"algorithm": "gcra", "rate": 1, "per": "1h", "burst": 3}}}}]}}"#
    )
}

/// Sends `n` requests one after another; each answer and how long it took.
fn timed(envoy: &Envoy, n: usize) -> Vec<(Answer, Duration)> {
    (0..n)
        .map(|_| {
            let started = Instant::now();
            let answer = get(envoy, "/", &[]);
            (answer, started.elapsed())
        })
        .collect()
}

fn assert_all(answers: &[(Answer, Duration)], status: u16, what: &str) {
    for (answer, took) in answers {
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert!(
            *took < WITHIN,
            "{what}: an answer took {took:?}, the callout's timeout is {TIMEOUT:?}"
        );
    }
}

/// The limit is spent, then the server fails twice (stopped, then frozen): every request
/// gets `failed_status` within the timeout, and once the server is back the spent limit
/// denies again.
fn failure_mode_applies(way: Way, failure_mode: &str, failed_status: u16) {
    let mut backends = Backends::start(&[]);
    let envoy = envoy_with(way, &backends, &policy(failure_mode), "FAIL_CLOSED");
    let statuses: Vec<u16> = timed(&envoy, 4).iter().map(|(a, _)| a.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    backends.stop_server();
    assert_all(&timed(&envoy, 5), failed_status, "server stopped");
    backends.restart_server();
    eventually("the server decides again", Duration::from_secs(5), || {
        get(&envoy, "/", &[]).status == 429
    });

    backends.proxy.freeze();
    assert_all(&timed(&envoy, 5), failed_status, "server frozen");
    backends.proxy.thaw();
    eventually("the server decides again", Duration::from_secs(5), || {
        get(&envoy, "/", &[]).status == 429
    });

    let failures = settled_stat(&envoy, way, "sluice.callout_failures");
    assert!(failures >= 10, "the 10 failed callouts counted: {failures}");
    assert_eq!(
        settled_stat(&envoy, way, "sluice.rule.per-ip.failures"),
        failures
    );
}

both_ways! {
    fn failure_mode_allow_lets_requests_through_while_the_server_is_stopped_or_frozen(way) {
        failure_mode_applies(way, "allow", 200);
    }
}

both_ways! {
    fn failure_mode_deny_answers_503_while_the_server_is_stopped_or_frozen(way) {
        failure_mode_applies(way, "deny", 503);
    }
}

/// The probe filter, scripted to call out on each VM's first stream and trap on its second.
fn trapping_probe(backends: &Backends, failure_policy: &str) -> Envoy {
    let script = r#"{"on_request_headers": [{"op": "trap", "stream": 2}]}"#;
    let config = plugin_config(
        &Plugin::probe(script).failing(failure_policy),
        backends.server_addr(),
        backends.upstream.addr(),
    );
    Envoy::start(&config, WORKERS).expect("Envoy starts with the probe")
}

/// Sends a request each 50 ms for `span`; the statuses.
fn paced(envoy: &Envoy, span: Duration) -> Vec<u16> {
    let started = Instant::now();
    let mut statuses = Vec::new();
    while started.elapsed() < span {
        statuses.push(get(envoy, "/", &[]).status);
        std::thread::sleep(Duration::from_millis(50));
    }
    statuses
}

#[test]
fn fail_closed_answers_503_from_a_trapped_vm_for_good() {
    let backends = Backends::start(&[]);
    let envoy = trapping_probe(&backends, "FAIL_CLOSED");
    let statuses = paced(&envoy, Duration::from_millis(1_500));
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    // Each worker's VM passes its first stream and traps on its second; nothing after.
    assert!(passed <= WORKERS, "{statuses:?}");
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    assert!(
        statuses[statuses.len() - 5..].iter().all(|&s| s == 503),
        "{statuses:?}"
    );
    assert!(
        envoy.log().contains("wasm_fail_stream") || envoy.log().contains("unreachable"),
        "Envoy logged the trap"
    );
}

#[test]
fn fail_reload_gives_a_trapped_worker_a_new_vm_after_the_backoff() {
    let backends = Backends::start(&[]);
    let envoy = trapping_probe(&backends, "FAIL_RELOAD");
    let started = Instant::now();
    let statuses = paced(&envoy, Duration::from_millis(3_500));
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    // Each VM passes one stream; a trapped worker gets a new VM once the backoff (1 s by
    // default) has passed since its last load: more VMs than workers, as FAIL_CLOSED has.
    assert!(
        passed > WORKERS,
        "{statuses:?} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    let stats = envoy.admin_get("/stats").expect("stats");
    let reloads: u64 = stats
        .lines()
        .filter(|l| l.contains("vm_reload_success"))
        .filter_map(|l| l.split_once(": ")?.1.trim().parse::<u64>().ok())
        .sum();
    assert!(reloads >= 2, "Envoy counted the reloads: {stats}");
}

both_ways! {
    fn a_failing_server_is_warned_about_once_a_second_per_worker_not_per_request(way) {
        let mut backends = Backends::start(&[]);
        let envoy = envoy_with(way, &backends, &policy("allow"), "FAIL_CLOSED");
        backends.stop_server();
        let started = Instant::now();
        let answers = sluice_e2e::real_envoy::burst(&envoy, "/", &[], 300, 6);
        let took = started.elapsed().as_secs_f64();
        assert!(answers.iter().all(|a| a.status == 200), "failing open");
        std::thread::sleep(Duration::from_millis(300));
        let warnings: Vec<String> = envoy
            .log()
            .lines()
            .filter(|l| l.contains("failure mode applies"))
            .map(str::to_owned)
            .collect();
        // Each worker writes the first, then one a second.
        let most = WORKERS * (took.ceil() as usize + 1);
        assert!(
            !warnings.is_empty() && warnings.len() <= most,
            "{} warnings for 300 failed callouts in {took:.1}s, at most {most}: {warnings:#?}",
            warnings.len()
        );
        assert_eq!(
            settled_stat(&envoy, way, "sluice.callout_failures"),
            300,
            "all counted"
        );
    }
}

/// POSTs `body` through `envoy`'s listener `ingress` on a new connection; the answer's status.
fn post(envoy: &Envoy, body: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let ingress = envoy.listener("ingress").expect("listener ingress");
    let mut stream = std::net::TcpStream::connect(ingress).expect("a connection");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a timeout");
    let head = format!(
        "POST / HTTP/1.1\r\nhost: sluice\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("the head");
    stream.write_all(body).expect("the body");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("an answer");
    let status_line = String::from_utf8_lossy(&answer);
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {status_line:?}"))
}

both_ways! {
    fn a_request_with_a_body_waits_for_the_decision(way) {
        // A body arriving while the callout is out must not carry the request on to the
        // upstream: with the server frozen and failure_mode deny, the answer is the
        // failure's, and the upstream never sees the request.
        let backends = Backends::start(&[]);
        let envoy = envoy_with(way, &backends, &policy("deny"), "FAIL_CLOSED");
        backends.proxy.freeze();
        let body = vec![b'x'; 64 * 1024];
        let started = Instant::now();
        assert_eq!(post(&envoy, &body), 503);
        let took = started.elapsed();
        assert!(
            took >= TIMEOUT - TIMER_SLACK,
            "answered in {took:?}, before the callout timed out"
        );
        assert_eq!(backends.upstream.served(), 0, "the upstream saw the request");
        backends.proxy.thaw();
        eventually("the server decides again", Duration::from_secs(5), || {
            post(&envoy, &body) == 200
        });
        assert_eq!(backends.upstream.served(), 1);
    }
}

both_ways! {
    fn a_policy_naming_no_cluster_envoy_has_fails_by_its_mode_and_says_which(way) {
        // Neither build can ask Envoy at configuration whether a cluster exists: a policy
        // naming one Envoy lacks starts, and each request is then decided by the failure
        // mode, with a warning that names the cluster.
        let backends = Backends::start(&[]);
        let policy = policy("deny").replace(r#""cluster": "sluice""#, r#""cluster": "nowhere""#);
        let envoy = envoy_with(way, &backends, &policy, "FAIL_CLOSED");
        let answers = timed(&envoy, 5);
        assert_all(&answers, 503, "no such cluster, failure mode deny");
        assert_eq!(backends.upstream.served(), 0);
        eventually("the warning names the cluster", Duration::from_secs(5), || {
            envoy.log().contains("callout to cluster `nowhere`")
        });
        assert_eq!(settled_stat(&envoy, way, "sluice.callout_failures"), 5);
    }
}

both_ways! {
    fn a_cluster_with_no_healthy_host_fails_by_the_mode_at_once(way) {
        // Envoy fails a callout to a cluster with no healthy host before sending it, and its
        // async client answers it (a local 503) from within the call that posts it.
        let backends = Backends::start(&[]);
        let policy = policy("deny").replace(r#""cluster": "sluice""#, r#""cluster": "empty""#);
        let plugin = Plugin::sluice(&policy).via(way).failing("FAIL_CLOSED");
        let config = plugin_config(&plugin, backends.server_addr(), backends.upstream.addr())
            + r#"
  - name: empty
    type: STATIC
    connect_timeout: 0.25s
    load_assignment: {cluster_name: empty, endpoints: []}
"#;
        let envoy = start_envoy(&config, WORKERS);
        assert_all(&timed(&envoy, 5), 503, "no healthy host, failure mode deny");
        assert_eq!(backends.upstream.served(), 0);
        assert_eq!(settled_stat(&envoy, way, "sluice.callout_failures"), 5);
        assert_eq!(settled_stat(&envoy, way, "sluice.rule.per-ip.failures"), 5);
        eventually("the warning names the cluster", Duration::from_secs(5), || {
            envoy.log().contains("cluster `empty`")
        });
        assert_eq!(
            envoy.stat("cluster.empty.upstream_cx_none_healthy").expect("stats"),
            5,
            "each callout failed for want of a healthy host"
        );
    }
}
