//! The filter's cost per request inside wasmtime, beside a no-op proxy-wasm filter.
//!
//! Both run in the simulator's host (the one `sluice-sim` replays with), one worker, the same
//! requests. sluice's filter has a realistic policy of three rules. Its callouts are answered
//! by the real server and Redis in a first pass and recorded; the measured passes hand the
//! recorded answers back in the same order, so that what is measured is the host and the
//! filter alone: the request-headers callback up to the callout, and the answer's delivery up
//! to the response. The no-op filter lets every request through at once; what it costs is
//! what any filter costs in this host, so the ratio is sluice's own work.
//!
//! Time is noisy here; instructions are not. `valgrind --tool=callgrind` counts the
//! instructions of the measured passes only (`--toggle-collect` on [`measured_requests`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sluice_host::Host;
use sluice_host::envoy::{Envoy, EnvoyConfig, Output, Request};
use sluice_host::header_map::HeaderMap;
use sluice_host::state::{CalloutReply, OutgoingCallout};
use sluice_sim::launch::{ServedConfigs, Services};
use sluice_sim::transport::Transport;

/// Three rules as a platform team runs them: per client address, per API key on the API, and
/// a tighter limit on search by method and path.
pub const POLICY: &str = r#"{
  "cluster": "sluice",
  "response": {"headers": "x-ratelimit", "on_allowed": true},
  "rules": [
    {"name": "per-ip", "key": ["client_ip"],
     "limit": {"algorithm": "gcra", "rate": 15, "per": "1s", "burst": 30}},
    {"name": "per-key", "match": {"path": {"prefix": "/api/"}},
     "key": [{"header": "x-api-key", "default": "anonymous"}],
     "limit": {"algorithm": "sliding_window", "limit": 3000, "window": "1m"}},
    {"name": "search", "match": {"path": {"exact": "/api/search"}, "method": "GET"},
     "key": ["method", "path"],
     "limit": {"algorithm": "token_bucket", "rate": 200, "per": "1s", "burst": 400}}
  ]
}"#;

/// The no-op filter's configuration (it reads none).
const NOOP_POLICY: &str = "{}";

/// Requests per measured pass.
pub const REQUESTS: usize = 10_000;
/// Virtual time between requests.
const SPACING_NS: u64 = 1_000_000;
/// How long a callout takes, in virtual time.
const CALLOUT_NS: u64 = 1_000_000;
/// 2024-01-01T00:00:00Z.
const START_NS: u64 = 1_704_067_200_000_000_000;

/// The `i`th request: 50 clients, 10 API keys, API calls, searches and pages.
fn request(i: usize) -> Request {
    let client = (i * 7919) % 50;
    let path = match i % 10 {
        0..=4 => format!("/api/items/{}", i % 100),
        5 | 6 => "/api/search".to_owned(),
        _ => format!("/products/{}", i % 30),
    };
    let mut headers = vec![
        (":method".to_owned(), b"GET".to_vec()),
        (":path".to_owned(), path.into_bytes()),
        (":authority".to_owned(), b"shop.example".to_vec()),
        (":scheme".to_owned(), b"http".to_vec()),
        (
            "user-agent".to_owned(),
            b"Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0".to_vec(),
        ),
        ("accept".to_owned(), b"application/json".to_vec()),
    ];
    if !i.is_multiple_of(3) {
        headers.push((
            "x-api-key".to_owned(),
            format!("key-{:02}", i % 10).into_bytes(),
        ));
    }
    Request {
        id: i as u64,
        headers,
        peer: (
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1 + client as u8)),
            40_000 + (i % 20_000) as u16,
        ),
        upstream_status: 200,
        upstream_bytes: 512,
    }
}

/// A callout answer as recorded: headers and body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordedAnswer {
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl RecordedAnswer {
    fn from_reply(reply: &CalloutReply) -> anyhow::Result<RecordedAnswer> {
        let (Some(headers), Some(body)) = (&reply.headers, &reply.body) else {
            bail!("the server reset a callout while recording");
        };
        if headers.get(":status") != Some(b"200".as_slice()) {
            bail!(
                "the server answered a recorded callout with {}: {}",
                String::from_utf8_lossy(headers.get(":status").unwrap_or_default()),
                String::from_utf8_lossy(body)
            );
        }
        Ok(RecordedAnswer {
            headers: headers.pairs().to_vec(),
            body: body.clone(),
        })
    }

    fn reply(&self) -> CalloutReply {
        CalloutReply {
            headers: Some(HeaderMap::from_pairs(self.headers.iter().cloned())),
            body: Some(self.body.clone()),
            trailers: HeaderMap::default(),
        }
    }
}

/// Which filter to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// sluice's filter with [`POLICY`].
    Sluice,
    /// The no-op filter.
    Noop,
}

/// The built modules.
pub struct Modules {
    /// sluice's filter.
    pub sluice: PathBuf,
    /// The no-op filter.
    pub noop: PathBuf,
}

impl Modules {
    /// Where `make wasm` puts them.
    pub fn built() -> Modules {
        let dir = Path::new("target/wasm32-wasip1/wasm");
        Modules {
            sluice: dir.join("sluice_filter.wasm"),
            noop: dir.join("sluice_noop_filter.wasm"),
        }
    }

    fn path(&self, which: Which) -> &Path {
        match which {
            Which::Sluice => &self.sluice,
            Which::Noop => &self.noop,
        }
    }
}

fn start(host: &Host, modules: &Modules, which: Which) -> anyhow::Result<Envoy> {
    let path = modules.path(which);
    let wasm = std::fs::read(path)
        .with_context(|| format!("reading {} (run `make wasm`)", path.display()))?;
    let policy = match which {
        Which::Sluice => POLICY,
        Which::Noop => NOOP_POLICY,
    };
    let config = EnvoyConfig::new(policy, ["sluice".to_owned()]);
    Envoy::start_with(host, &wasm, config, START_NS)
}

/// Where each callout's answer comes from.
trait Answers {
    fn answer(
        &mut self,
        index: usize,
        callout: &OutgoingCallout,
        now_ns: u64,
    ) -> anyhow::Result<CalloutReply>;
}

/// What a pass saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassCounts {
    /// Callouts made.
    pub callouts: usize,
    /// Responses 200.
    pub allowed: usize,
    /// Responses 429.
    pub denied: usize,
}

/// Runs `requests` requests through `envoy`; the time spent in the host's calls into the VM
/// (answers are fetched outside it).
#[inline(never)]
fn measured_requests(
    envoy: &mut Envoy,
    requests: usize,
    answers: &mut dyn Answers,
) -> anyhow::Result<(Duration, PassCounts)> {
    let mut spent = Duration::ZERO;
    let mut counts = PassCounts::default();
    let count = |outputs: &[Output], counts: &mut PassCounts| {
        for output in outputs {
            if let Output::Completed(done) = output {
                match done.status {
                    200 => counts.allowed += 1,
                    429 => counts.denied += 1,
                    _ => {}
                }
            }
        }
    };
    // The worker's tick fires on time, and its work is the filter's (sluice hands its
    // counters to Envoy there).
    let mut next_tick = None;
    for i in 0..requests {
        let now = START_NS + i as u64 * SPACING_NS;
        let started = Instant::now();
        let period_ns = u64::from(envoy.tick_period_ms(0)) * 1_000_000;
        if period_ns == 0 {
            next_tick = None;
        } else if now >= *next_tick.get_or_insert(now + period_ns) {
            envoy.tick(0, now);
            next_tick = Some(now + period_ns);
        }
        let outputs = envoy.begin(0, request(i), now);
        spent += started.elapsed();
        count(&outputs, &mut counts);
        for output in outputs {
            if let Output::Callout { callout, .. } = output {
                let reply = answers.answer(counts.callouts, &callout, now)?;
                counts.callouts += 1;
                let started = Instant::now();
                let delivered = envoy.deliver(0, callout.token, reply, now + CALLOUT_NS);
                spent += started.elapsed();
                count(&delivered, &mut counts);
            }
        }
    }
    Ok((spent, counts))
}

/// Answers from the real server and Redis, remembered.
struct Live<'a> {
    runtime: &'a tokio::runtime::Runtime,
    transport: Transport,
    recorded: Vec<RecordedAnswer>,
}

impl Answers for Live<'_> {
    fn answer(
        &mut self,
        _: usize,
        callout: &OutgoingCallout,
        now_ns: u64,
    ) -> anyhow::Result<CalloutReply> {
        let delivered = self.runtime.block_on(
            self.transport
                .send(callout.clone(), Some((now_ns / 1000) as i64)),
        );
        self.recorded
            .push(RecordedAnswer::from_reply(&delivered.reply)?);
        Ok(delivered.reply)
    }
}

/// The recorded answers, in order, built before the measured pass so that building them is
/// not counted as the filter's work.
struct Recorded(Vec<Option<CalloutReply>>);

impl Recorded {
    fn new(answers: &[RecordedAnswer]) -> Recorded {
        Recorded(answers.iter().map(|a| Some(a.reply())).collect())
    }
}

impl Answers for Recorded {
    fn answer(
        &mut self,
        index: usize,
        _: &OutgoingCallout,
        _: u64,
    ) -> anyhow::Result<CalloutReply> {
        self.0
            .get_mut(index)
            .and_then(Option::take)
            .context("the filter made more callouts than when the answers were recorded")
    }
}

/// None: the no-op filter never calls out.
struct NoAnswers;

impl Answers for NoAnswers {
    fn answer(&mut self, _: usize, _: &OutgoingCallout, _: u64) -> anyhow::Result<CalloutReply> {
        bail!("the no-op filter made a callout")
    }
}

/// Records the answers sluice's filter gets for [`REQUESTS`] requests from a real server and
/// Redis, started as a replay starts them.
pub fn record(modules: &Modules) -> anyhow::Result<Vec<RecordedAnswer>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let services = Services::start(&runtime, None, None, ServedConfigs::default())?;
    let transport = Transport::new(HashMap::from([("sluice".to_owned(), services.endpoint())]));
    let host = Host::new().map_err(|e| anyhow::anyhow!("starting wasmtime: {e}"))?;
    let mut envoy = start(&host, modules, Which::Sluice)?;
    let mut live = Live {
        runtime: &runtime,
        transport,
        recorded: Vec::new(),
    };
    let measured = measured_requests(&mut envoy, REQUESTS, &mut live);
    let Live { recorded, .. } = live;
    services.stop(&runtime);
    measured?;
    Ok(recorded)
}

/// One measured pass of `which` on a fresh Envoy: time per request and what happened.
pub fn pass(
    host: &Host,
    modules: &Modules,
    which: Which,
    answers: &[RecordedAnswer],
    requests: usize,
) -> anyhow::Result<(Duration, PassCounts)> {
    let mut envoy = start(host, modules, which)?;
    let (spent, counts) = match which {
        Which::Sluice => measured_requests(&mut envoy, requests, &mut Recorded::new(answers))?,
        Which::Noop => measured_requests(&mut envoy, requests, &mut NoAnswers)?,
    };
    Ok((spent / requests.max(1) as u32, counts))
}

/// The measured figures.
pub struct FilterFigures {
    /// sluice's time per request, the median of the passes.
    pub sluice: Duration,
    /// The no-op filter's.
    pub noop: Duration,
    /// What sluice's passes saw.
    pub counts: PassCounts,
    /// Instructions per request (sluice, no-op), if valgrind ran.
    pub instructions: Option<(f64, f64)>,
    /// Why instructions are missing, if they are.
    pub instructions_note: Option<String>,
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Measures both filters: `rounds` timed passes each, alternating, then callgrind.
pub fn run(
    modules: &Modules,
    rounds: usize,
    bench_binary: &Path,
    profiles: Option<&Path>,
) -> anyhow::Result<FilterFigures> {
    let answers = record(modules)?;
    let host = Host::new().map_err(|e| anyhow::anyhow!("starting wasmtime: {e}"))?;
    let (mut sluice, mut noop) = (Vec::new(), Vec::new());
    let mut counts = PassCounts::default();
    // A first pass of each warms caches and the allocator; it is not counted.
    for round in 0..=rounds {
        let (s, c) = pass(&host, modules, Which::Sluice, &answers, REQUESTS)?;
        let (n, _) = pass(&host, modules, Which::Noop, &answers, REQUESTS)?;
        if round > 0 {
            sluice.push(s);
            noop.push(n);
            counts = c;
        }
    }
    let (instructions, instructions_note) = match callgrind(bench_binary, &answers, profiles) {
        Ok(i) => (Some(i), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    Ok(FilterFigures {
        sluice: median(sluice),
        noop: median(noop),
        counts,
        instructions,
        instructions_note,
    })
}

/// Requests per pass under callgrind (about 50 times slower than native).
pub const CALLGRIND_REQUESTS: usize = 2_000;

/// Instructions per request for (sluice, no-op), counted by callgrind in
/// [`measured_requests`] only. The profiles are kept in `profiles` if given.
fn callgrind(
    bench_binary: &Path,
    answers: &[RecordedAnswer],
    profiles: Option<&Path>,
) -> anyhow::Result<(f64, f64)> {
    let dir = profiles.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::temp_dir().join(format!("sluice-bench-callgrind-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let answers_path = dir.join("answers.json");
    std::fs::write(&answers_path, serde_json::to_vec(answers)?)?;
    let count = |which: &str| -> anyhow::Result<f64> {
        let output = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--collect-atstart=no")
            .arg("--toggle-collect=*measured_requests*")
            .arg(format!(
                "--callgrind-out-file={}",
                dir.join(format!("{which}.out")).display()
            ))
            .arg(bench_binary)
            .args(["filter-pass", "--filter", which, "--requests"])
            .arg(CALLGRIND_REQUESTS.to_string())
            .arg("--answers")
            .arg(&answers_path)
            .output()
            .context("running valgrind (apt-get install valgrind)")?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!("valgrind failed for the {which} filter: {}", stderr.trim());
        }
        let collected = stderr
            .lines()
            .find_map(|l| {
                l.split_once("Collected :")
                    .map(|(_, n)| n.trim().to_owned())
            })
            .and_then(|n| n.parse::<f64>().ok())
            .with_context(|| format!("no `Collected :` line in callgrind's output: {stderr}"))?;
        Ok(collected / CALLGRIND_REQUESTS as f64)
    };
    let figures = (count("sluice")?, count("noop")?);
    if profiles.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(figures)
}

/// What `sluice-bench filter-pass` runs under callgrind: one pass with recorded answers.
pub fn pass_from_file(which: Which, requests: usize, answers: &Path) -> anyhow::Result<PassCounts> {
    let answers: Vec<RecordedAnswer> = serde_json::from_slice(
        &std::fs::read(answers).with_context(|| format!("reading {}", answers.display()))?,
    )
    .with_context(|| format!("{}: not recorded answers", answers.display()))?;
    let host = Host::new().map_err(|e| anyhow::anyhow!("starting wasmtime: {e}"))?;
    let (_, counts) = pass(&host, &Modules::built(), which, &answers, requests)?;
    Ok(counts)
}
