//! The module under load in a real Envoy: 8 workers, 100 leased keys, 1,000,000 requests over
//! 8 keep-alive connections at once. No key is admitted past its limit, nothing panics or
//! crashes, and Envoy's memory after the last request is what it was after the first 100,000.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{Backends, Plugin, Way, plugin_config, start_envoy};

use super::filter::settled_stat;

const WORKERS: usize = 8;
const KEYS: usize = 100;
const CONNECTIONS: usize = 8;
const REQUESTS: usize = 1_000_000;
/// Requests before memory is first measured: allowances, purses and connections made.
const WARM_UP: usize = 100_000;
/// Each key's limit an hour, and its burst: each key is offered twice as much.
const PER_KEY: u64 = 5_000;
/// How much Envoy's resident memory may grow over the 900,000 requests after the warm-up.
const MAX_GROWTH_KB: u64 = 16 * 1024;

/// Per key: answers 200, 429, and anything else.
#[derive(Default, Clone)]
struct Counts {
    allowed: Vec<u64>,
    denied: Vec<u64>,
    other: u64,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            allowed: vec![0; KEYS],
            denied: vec![0; KEYS],
            other: 0,
        }
    }

    fn add(&mut self, other: &Counts) {
        for k in 0..KEYS {
            self.allowed[k] += other.allowed[k];
            self.denied[k] += other.denied[k];
        }
        self.other += other.other;
    }
}

#[test]
fn the_module_under_a_million_leased_requests_keeps_its_bound_and_its_memory() {
    let backends = Backends::start(&[]);
    // A callout that timed out would be admitted by the failure mode, past any bound: on a
    // busy machine the test's own server, unoptimised, is given time.
    let policy = format!(
        r#"{{"cluster": "sluice", "timeout": "5s", "rules": [
            {{"name": "per-key", "key": [{{"header": "x-api-key"}}],
              "limit": {{"algorithm": "gcra", "rate": {PER_KEY}, "per": "1h", "burst": {PER_KEY}}},
              "lease": {{"horizon": "500ms"}}}}
        ]}}"#
    );
    let config = plugin_config(
        &Plugin::sluice(&policy).via(Way::Module),
        backends.server_addr(),
        backends.upstream.addr(),
    );
    let mut envoy = start_envoy(&config, WORKERS);
    let ingress = envoy.listener("ingress").expect("listener ingress");
    let pid = envoy.pid().expect("Envoy's pid");
    let started = Instant::now();

    let mut counts = send(ingress, 0..WARM_UP);
    let rss_before = rss_kb(pid);
    let mut sent = WARM_UP;
    while sent < REQUESTS {
        let next = (sent + 100_000).min(REQUESTS);
        counts.add(&send(ingress, sent..next));
        sent = next;
        eprintln!(
            "load: {sent} requests in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    let rss_after = rss_kb(pid);
    let elapsed = started.elapsed();

    let allowed: u64 = counts.allowed.iter().sum();
    let denied: u64 = counts.denied.iter().sum();
    // What a key may be admitted over the run: its burst and what the rate refills meanwhile.
    let bound = PER_KEY + (PER_KEY as f64 * elapsed.as_secs_f64() / 3600.0).ceil() as u64;
    let most = *counts.allowed.iter().max().unwrap_or(&0);
    let least = *counts.allowed.iter().min().unwrap_or(&0);
    let local = settled_stat(&envoy, Way::Module, "sluice.rule.per-key.local");
    eprintln!(
        "load: {REQUESTS} requests in {:.1} s ({:.0} a second): {allowed} allowed, {denied} denied, {} otherwise; {local} decided in Envoy; a key admitted {least} to {most} (bound {bound}); RSS {rss_before} kB after {WARM_UP}, {rss_after} kB after {REQUESTS}",
        elapsed.as_secs_f64(),
        REQUESTS as f64 / elapsed.as_secs_f64(),
        counts.other
    );
    assert_eq!(counts.other, 0, "every answer is 200 or 429");
    assert!(
        most <= bound,
        "a key admitted {most}, past its bound {bound}"
    );
    assert!(
        least >= PER_KEY * 9 / 10,
        "a key admitted only {least} of its {PER_KEY}"
    );
    assert!(
        local as f64 >= 0.9 * REQUESTS as f64,
        "only {local} of {REQUESTS} decided in Envoy"
    );
    assert!(envoy.is_running(), "Envoy is still up");
    assert_eq!(settled_stat(&envoy, Way::Module, "sluice.panics"), 0);
    assert_eq!(
        settled_stat(&envoy, Way::Module, "sluice.callout_failures"),
        0
    );
    assert!(
        rss_after <= rss_before + MAX_GROWTH_KB,
        "Envoy grew from {rss_before} kB to {rss_after} kB over {} requests",
        REQUESTS - WARM_UP
    );
}

/// Sends requests `range` (request `i` carrying key `i % KEYS`) over [`CONNECTIONS`]
/// keep-alive connections at once, each its share in turn; what came back, per key.
fn send(ingress: SocketAddr, range: std::ops::Range<usize>) -> Counts {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                let range = range.clone();
                scope.spawn(move || {
                    let stream = TcpStream::connect(ingress).expect("a connection to Envoy");
                    stream.set_nodelay(true).expect("nodelay");
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .expect("a timeout");
                    let mut writer = stream.try_clone().expect("a second handle");
                    let mut reader = BufReader::new(stream);
                    let mut counts = Counts::new();
                    for i in range.filter(|i| i % CONNECTIONS == c) {
                        let key = i % KEYS;
                        let request = format!(
                            "GET / HTTP/1.1\r\nhost: sluice\r\nx-api-key: key-{key}\r\n\r\n"
                        );
                        writer
                            .write_all(request.as_bytes())
                            .expect("a request sent");
                        match read_status(&mut reader) {
                            200 => counts.allowed[key] += 1,
                            429 => counts.denied[key] += 1,
                            _ => counts.other += 1,
                        }
                    }
                    counts
                })
            })
            .collect();
        let mut counts = Counts::new();
        for handle in handles {
            counts.add(&handle.join().expect("a sending thread"));
        }
        counts
    })
}

/// Reads one response on a keep-alive connection; its status.
fn read_status(reader: &mut BufReader<TcpStream>) -> u16 {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"));
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a header line");
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("a content-length");
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("the body");
    status
}

/// A process's resident memory, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
