//! sluice-e2e: what the end-to-end tests share.
//!
//! A [`Stack`] is the whole path of production, each part real: a `redis-server` on a free
//! port, a sluice-server (in replay mode, so the test controls time), and the filter's .wasm
//! hosted by the simulator as Envoy hosts it. [`Stack::replay`] sends requests through it and
//! returns what each client got.

#![deny(missing_docs)]
#![allow(clippy::disallowed_methods)]
// test support: waits for Envoy on the wall clock
// Test support: a stack that cannot start is a failed test, said as plainly as possible.
#![allow(clippy::expect_used)]

pub mod misbehaving;
pub mod probe;
pub mod real_envoy;

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_harness::RedisServer;
use sluice_host::envoy::{Completed, Envoy};
use sluice_server::RunningServer;
use sluice_sim::connect::Endpoint;
use sluice_sim::replay::Observer;
use sluice_sim::trace::TraceRecord;
use sluice_sim::{Run, Simulation, Topology};

/// The Python of the virtualenv `scripts/setup.sh` makes, with Envoy's API (`xds-protos`) and
/// its gRPC stubs (or `SLUICE_PYTHON`).
pub fn venv_python() -> PathBuf {
    let python = std::env::var_os("SLUICE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run `bash scripts/setup.sh` (it makes the virtualenv with xds-protos)",
        python.display()
    );
    python
}

/// Runs the Python client `script` (with Envoy's stubs, [`venv_python`]) against `server`'s
/// gRPC API (`--grpc HOST:PORT --metrics URL`), prints what it printed, and gives it back; the
/// test fails, with its output, if the script does.
pub async fn run_stub_client(script: &Path, server: &RunningServer) -> String {
    let mut command = Command::new(venv_python());
    command
        .arg(script)
        .args(["--grpc", &server.addr().to_string()])
        .args(["--metrics", &format!("{}/metrics", server.url())]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the client's thread")
        .expect("the client runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    print!("{stdout}");
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The filter built by `make wasm` (or `SLUICE_WASM`).
pub fn filter_wasm() -> Vec<u8> {
    built_wasm("sluice_filter", "SLUICE_WASM")
}

/// Where [`filter_wasm`] reads the filter from, for a real Envoy to load.
pub fn filter_wasm_path() -> PathBuf {
    built_wasm_path("sluice_filter", "SLUICE_WASM")
}

/// A module `make wasm` builds, or the file the environment variable `override_var` names.
pub fn built_wasm(name: &str, override_var: &str) -> Vec<u8> {
    let path = built_wasm_path(name, override_var);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{name} is not built at {} ({e}): run `make wasm` (make test does it)",
            path.display()
        )
    })
}

/// Where [`built_wasm`] finds the module `name` (which may not be built).
pub fn built_wasm_path(name: &str, override_var: &str) -> PathBuf {
    std::env::var_os(override_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../target/wasm32-wasip1/wasm/{name}.wasm"))
        })
}

/// A runtime for servers that run beside a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Redis, the server and the simulated Envoy(s), each started for one test.
pub struct Stack {
    /// The redis-server.
    pub redis: RedisServer,
    server: Option<RunningServer>,
    server_url: String,
    /// The runtime the server and the callouts run on.
    pub runtime: tokio::runtime::Runtime,
    simulation: Simulation,
}

/// Collects every completed request.
#[derive(Default)]
pub struct Collected {
    /// In completion order.
    pub completed: Vec<Completed>,
}

impl Observer for Collected {
    fn completed(&mut self, _instance: usize, done: Completed, _record: &TraceRecord) {
        self.completed.push(done);
    }
}

impl Stack {
    /// Starts Redis and a replay-mode server, and loads the filter with `policy`.
    pub fn start(policy: &str) -> Stack {
        let redis = RedisServer::start().expect("redis-server must be installed");
        let runtime = runtime();
        let config = sluice_sim::launch::replay_server_config(redis.url());
        let server = runtime
            .block_on(sluice_server::spawn(config, ([127, 0, 0, 1], 0).into()))
            .expect("sluice-server");
        let server_url = server.url();
        runtime
            .block_on(sluice_sim::launch::wait_ready(&Endpoint::from_url(
                &server_url,
            )))
            .expect("sluice-server becomes ready");
        let simulation =
            Simulation::new(&filter_wasm(), policy.as_bytes()).expect("the filter loads");
        Stack {
            redis,
            server: Some(server),
            server_url,
            runtime,
            simulation,
        }
    }

    /// Replays `records` through `topology`, calling out to `server_url` (the stack's own
    /// server, or a deliberately misbehaving one); every request's outcome in completion order,
    /// and the run (its Envoys' stats and logs).
    pub fn run_via(
        &self,
        server_url: &str,
        records: &[TraceRecord],
        topology: &Topology,
    ) -> (Vec<Completed>, Run) {
        let mut collected = Collected::default();
        let run = self
            .simulation
            .run(
                records,
                topology,
                Endpoint::from_url(server_url),
                &self.runtime,
                &mut collected,
            )
            .expect("replay");
        (collected.completed, run)
    }

    /// Replays `records` through `topology` against the stack's server.
    pub fn run(&self, records: &[TraceRecord], topology: &Topology) -> (Vec<Completed>, Run) {
        self.run_via(&self.server_url, records, topology)
    }

    /// Replays `records` through `topology` against the stack's server, telling `observer`
    /// of each request as it completes (which may act on the stack meanwhile).
    pub fn run_observed(
        &self,
        records: &[TraceRecord],
        topology: &Topology,
        observer: &mut dyn Observer,
    ) -> Run {
        self.simulation
            .run(
                records,
                topology,
                Endpoint::from_url(&self.server_url),
                &self.runtime,
                observer,
            )
            .expect("replay")
    }

    /// Replays `records` through `topology`; every request's outcome, in completion order.
    pub fn replay_with(&self, records: &[TraceRecord], topology: &Topology) -> Vec<Completed> {
        self.run(records, topology).0
    }

    /// Replays `records` through one Envoy with one worker.
    pub fn replay(&self, records: &[TraceRecord]) -> Vec<Completed> {
        self.replay_with(records, &Topology::default())
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = self.runtime.block_on(server.stop());
        }
    }
}

/// A session set-up replaying through the built filter with `policy`, starting its own Redis
/// and server, in virtual time.
pub fn session_setup(policy: &str) -> sluice_sim::session::Setup {
    sluice_sim::session::Setup {
        wasm: filter_wasm(),
        policy: policy.as_bytes().to_vec(),
        policy_name: "test policy".to_owned(),
        topology: Topology::default(),
        redis: None,
        server: None,
        top: 10,
    }
}

/// A trace from `../shared/traces`, or `None` (with a note on stderr) in a clone without it.
pub fn shared_trace(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is absent (the shared traces sit beside the project on its build machines only)",
            path.display()
        );
        None
    }
}

/// A GET of `path` from `client` at `time_ms` (virtual milliseconds since the epoch).
pub fn request(time_ms: i64, client: &str, path: &str) -> TraceRecord {
    TraceRecord {
        line: 0,
        time_us: time_ms * 1000,
        client: client.to_owned(),
        method: "GET".to_owned(),
        target: path.to_owned(),
        host: Some("api.example".to_owned()),
        status: 200,
        bytes: 100,
        headers: Vec::new(),
    }
}

/// A response header's value, as text.
pub fn header<'a>(done: &'a Completed, name: &str) -> Option<&'a str> {
    done.headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// The decision record the filter left in a request's filter state, as JSON text.
pub fn decision_record(done: &Completed) -> Option<String> {
    done.filter_state
        .iter()
        .find(|(k, _)| k.as_slice() == b"wasm.sluice.decision")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// A stat's value, summed over the run's Envoys (name without Envoy's `wasmcustom.` prefix).
pub fn stat(run: &Run, name: &str) -> i64 {
    run.envoys.iter().map(|e| envoy_stat(e, name)).sum()
}

/// A stat's value in one Envoy, 0 while nothing has been counted.
pub fn envoy_stat(envoy: &Envoy, name: &str) -> i64 {
    envoy.metrics().number(name).unwrap_or(0)
}
