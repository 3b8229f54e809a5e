//! What the rounds measure: the traffic, the limit the ways in are held to, and what a run and
//! the rounds record.

use std::time::Duration;

use super::setup::Setup;
use crate::load::Measured;

/// Envoy's worker threads.
pub const WORKERS: usize = 1;
/// Load on a listener before each of its turns: its connections opened, its filters' code
/// and state warm after the other setups' turns. A lease on 1,000 keys needs about a second
/// to be held again (its leases lapse between turns): after 250 ms its turn asked sluice-server
/// 48 times a 1,000 requests, after 1 s 2.
pub const TURN_WARMUP: Duration = Duration::from_secs(1);
/// Turns each setup takes in a round, together its `seconds`.
pub const TURNS: usize = 6;
/// Envoy's starts with each setup's filters alone, a round.
pub const START_UPS_A_ROUND: usize = 2;
/// Keep-alive connections of the load generator.
pub const CONNECTIONS: usize = 16;

/// How many distinct `x-api-key` values the traffic cycles through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// 10 hot keys.
    Hot,
    /// 1,000 keys.
    Many,
}

impl Keys {
    /// Distinct keys.
    pub fn count(self) -> usize {
        match self {
            Keys::Hot => 10,
            Keys::Many => 1000,
        }
    }
}

/// One setup measured in one round: the sum of its turns.
#[derive(Debug, Clone)]
pub struct Run {
    /// What the load generator saw.
    pub measured: Measured,
    /// CPU seconds over the measured span: Envoy, sluice-server (both), Redis.
    pub cpu_s: [f64; 3],
    /// Requests Envoy sent to sluice-server (HTTP and gRPC) over the measured span.
    pub calls: u64,
}

impl Run {
    /// CPU microseconds a request answered: Envoy, sluice-server, Redis.
    pub fn cpu_us_per_request(&self) -> [f64; 3] {
        let answered = self.measured.answered().max(1) as f64;
        self.cpu_s.map(|s| s * 1e6 / answered)
    }

    /// Calls to sluice-server per 1,000 requests answered.
    pub fn calls_per_1000(&self) -> f64 {
        self.calls as f64 * 1000.0 / self.measured.answered().max(1) as f64
    }

    /// Adds `turn` to this run, as one run measured over both spans.
    pub fn absorb(&mut self, turn: Run) {
        self.measured.absorb(turn.measured);
        for (sum, cpu_s) in self.cpu_s.iter_mut().zip(turn.cpu_s) {
            *sum += cpu_s;
        }
        self.calls += turn.calls;
    }
}

/// What the rounds measured: for each key spread and setup, one run a round.
pub struct Results {
    /// Seconds each run was measured for.
    pub seconds: u64,
    /// Turns each setup took in a round, each `seconds / turns` long.
    pub turns: usize,
    /// `(keys, setup, runs)`.
    pub runs: Vec<(Keys, Setup, Vec<Run>)>,
    /// From Envoy's start to its `/ready`, with each setup's filters alone,
    /// [`START_UPS_A_ROUND`] times a round.
    pub start_ups: Vec<(Setup, Vec<Duration>)>,
    /// Each way in over [`limit`], on the same traffic.
    pub over_limit: Vec<OverLimit>,
    /// Envoy's instructions a request, where they were counted.
    pub counts: Vec<Count>,
}

/// One way in on the hot keys, each offered far more than [`limit`] allows, from Envoy's
/// first request on.
#[derive(Debug, Clone)]
pub struct OverLimit {
    /// The way in.
    pub setup: Setup,
    /// Seconds of traffic.
    pub seconds: f64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Messages Envoy sent sluice-server: lease asks, `ShouldRateLimit` calls, or usage reports.
    pub messages: u64,
    /// What the algorithm alone admits at most: for every key, its burst and its rate over
    /// the span.
    pub exact: u64,
    /// The bound the way in states.
    pub bound: u64,
}

impl OverLimit {
    /// Requests answered a second.
    pub fn rate(&self) -> f64 {
        (self.admitted + self.denied) as f64 / self.seconds
    }

    /// Messages to sluice-server per 1,000 requests.
    pub fn messages_per_1000(&self) -> f64 {
        self.messages as f64 * 1000.0 / (self.admitted + self.denied).max(1) as f64
    }
}

/// The ways in measured over a limit, on the same traffic.
pub const OVER_LIMIT: [Setup; 4] = [
    Setup::SluiceLeaseLimited,
    Setup::SluiceModuleLeaseLimited,
    Setup::NativeGrpcLimited,
    Setup::RlqsLimited,
];

/// The rate (a second) and burst of the limit the ways in are measured over: far below what
/// the hot keys are offered.
pub const LIMIT_RATE: u32 = 200;
/// See [`LIMIT_RATE`].
pub const LIMIT_BURST: u32 = 200;

/// That limit, as a rule's `limit`.
pub fn limit() -> String {
    format!(r#"{{"algorithm": "gcra", "rate": {LIMIT_RATE}, "per": "1s", "burst": {LIMIT_BURST}}}"#)
}

/// One setup's count under callgrind: Envoy's instructions a request, on its worker thread
/// (what a request costs) and on its main thread (work by the second: stats, the module's lease
/// tick and calls).
#[derive(Debug, Clone, Copy)]
pub struct Count {
    /// The setup counted.
    pub setup: Setup,
    /// In which round of counts (see `instructions::ROUNDS`).
    pub round: usize,
    /// How many keys the requests cycled through: 1, or the hot keys' [`Keys::Hot`].
    pub keys: usize,
    /// On the worker.
    pub worker: u64,
    /// On the main thread.
    pub main: u64,
}
