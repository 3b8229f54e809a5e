//! The replay: trace requests into simulated Envoys, in virtual time.
//!
//! A discrete-event loop over virtual time. Events at the same instant run in this order:
//! every request that arrives at that instant, then callout answers, ticks and timeouts in the
//! order they were scheduled. A callout's answer comes back a fixed modelled latency after the
//! callout (default 1 ms, as from a service in the same data centre): requests that arrive
//! meanwhile are in flight together, as in a real proxy, and cannot yet see that answer (or
//! the deny-cache entry it leaves); requests that arrive later do. The real server and Redis
//! decide every callout, at its virtual time, and their answers are waited for. Nothing depends
//! on how fast the machine is, so the same inputs give the same results.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::envoy::{Completed, Envoy, Output, Request};
use crate::host::state::CalloutReply;
use crate::trace::{ClientAddresses, TraceRecord};
use crate::transport::{Delivered, Dispatcher};

/// How long Envoy lets a paused stream wait (its default `stream_idle_timeout`).
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The modelled time from a callout to its answer.
pub const DEFAULT_CALLOUT_LATENCY: Duration = Duration::from_millis(1);

/// The host requests are for when the trace does not say.
const DEFAULT_AUTHORITY: &str = "shop.example";

enum Event {
    Arrival(usize),
    Callout {
        instance: usize,
        worker: usize,
        token: u32,
        answer: JoinHandle<Delivered>,
    },
    Tick {
        instance: usize,
        worker: usize,
        generation: u64,
    },
    IdleTimeout {
        instance: usize,
        worker: usize,
        context: u32,
    },
}

/// Arrivals first among events of one instant.
const ARRIVAL: u8 = 0;
const LATER: u8 = 1;

/// What the replay hands its observer.
pub trait Observer {
    /// A request is done.
    fn completed(&mut self, instance: usize, done: Completed, record: &TraceRecord);
    /// A callout was answered after `latency` of wall time.
    fn callout(&mut self, _latency: Duration) {}
    /// `processed` of the trace's requests have arrived.
    fn progress(&mut self, _processed: usize) {}
}

/// Totals of a run.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Requests replayed.
    pub requests: usize,
    /// Callouts made.
    pub callouts: u64,
    /// Requests still open when the trace ended (hung streams).
    pub open_at_end: usize,
    /// Wall time.
    pub wall: Duration,
}

/// A replay over one trace.
pub struct Replay<'a> {
    envoys: Vec<Envoy>,
    dispatcher: Dispatcher,
    runtime: &'a tokio::runtime::Runtime,
    records: &'a [TraceRecord],
    clients: ClientAddresses,
    queue: BinaryHeap<Reverse<(u64, u8, u64)>>,
    events: HashMap<u64, Event>,
    seq: u64,
    tick_generation: HashMap<(usize, usize), u64>,
    /// Which instance an arrival goes to (round robin, as a load balancer in front).
    next_instance: usize,
    callouts: u64,
    callout_latency_ns: u64,
    /// Arrivals and callout answers still to come: while there are none and no stream is open,
    /// ticks stop (a module's timer would otherwise keep the replay going for ever).
    pending: usize,
}

impl<'a> Replay<'a> {
    /// A replay of `records` through `envoys`, sending callouts with `dispatcher`.
    pub fn new(
        envoys: Vec<Envoy>,
        dispatcher: Dispatcher,
        runtime: &'a tokio::runtime::Runtime,
        records: &'a [TraceRecord],
    ) -> Replay<'a> {
        Replay {
            envoys,
            dispatcher,
            runtime,
            records,
            clients: ClientAddresses::default(),
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            tick_generation: HashMap::new(),
            next_instance: 0,
            callouts: 0,
            callout_latency_ns: DEFAULT_CALLOUT_LATENCY.as_nanos() as u64,
            pending: 0,
        }
    }

    /// Answers come back `latency` after their callout (virtual time).
    pub fn with_callout_latency(mut self, latency: Duration) -> Replay<'a> {
        self.callout_latency_ns = latency.as_nanos() as u64;
        self
    }

    fn schedule(&mut self, at_ns: u64, class: u8, event: Event) {
        if matches!(event, Event::Arrival(_) | Event::Callout { .. }) {
            self.pending += 1;
        }
        self.seq += 1;
        self.events.insert(self.seq, event);
        self.queue.push(Reverse((at_ns, class, self.seq)));
    }

    fn time_ns(record: &TraceRecord) -> u64 {
        u64::try_from(record.time_us)
            .unwrap_or(0)
            .saturating_mul(1000)
    }

    /// Runs to the end; every completed request goes to `observer`.
    pub fn run(mut self, observer: &mut dyn Observer) -> (RunStats, Vec<Envoy>, ClientAddresses) {
        let started = Instant::now();
        if let Some(first) = self.records.first() {
            let start = Self::time_ns(first);
            for instance in 0..self.envoys.len() {
                let outputs = self.envoys[instance].started();
                self.handle(instance, outputs, start, observer);
            }
            self.schedule(start, ARRIVAL, Event::Arrival(0));
        }
        let mut arrived = 0usize;
        while let Some(Reverse((now, _, seq))) = self.queue.pop() {
            let Some(event) = self.events.remove(&seq) else {
                continue;
            };
            if matches!(event, Event::Arrival(_) | Event::Callout { .. }) {
                self.pending -= 1;
            }
            let (instance, outputs) = match event {
                Event::Arrival(index) => {
                    arrived = index + 1;
                    if let Some(next) = self.records.get(index + 1) {
                        self.schedule(
                            Self::time_ns(next).max(now),
                            ARRIVAL,
                            Event::Arrival(index + 1),
                        );
                    }
                    if arrived.is_multiple_of(1024) {
                        observer.progress(arrived);
                    }
                    self.arrive(index, now)
                }
                Event::Callout {
                    instance,
                    worker,
                    token,
                    answer,
                } => {
                    let delivered = self.runtime.block_on(answer).unwrap_or_else(|e| {
                        // The sending task died: the module sees a reset, as from Envoy.
                        tracing::warn!(error = %e, "a callout task failed; delivering a reset");
                        Delivered {
                            reply: CalloutReply {
                                headers: None,
                                body: None,
                                trailers: Default::default(),
                            },
                            latency: Duration::ZERO,
                        }
                    });
                    observer.callout(delivered.latency);
                    (
                        instance,
                        self.envoys[instance].deliver(worker, token, delivered.reply, now),
                    )
                }
                Event::Tick {
                    instance,
                    worker,
                    generation,
                } => {
                    if self.tick_generation.get(&(instance, worker)) != Some(&generation) {
                        continue;
                    }
                    let outputs = self.envoys[instance].tick(worker, now);
                    self.handle(instance, outputs, now, observer);
                    // The tick fires again while its period stays the same, as long as there
                    // is anything left to happen.
                    let period = self.envoys[instance].tick_period_ms(worker);
                    let work_left =
                        self.pending > 0 || self.envoys.iter().any(Envoy::has_open_streams);
                    if period > 0
                        && work_left
                        && self.tick_generation.get(&(instance, worker)) == Some(&generation)
                    {
                        self.schedule(
                            now + u64::from(period) * 1_000_000,
                            LATER,
                            Event::Tick {
                                instance,
                                worker,
                                generation,
                            },
                        );
                    }
                    continue;
                }
                Event::IdleTimeout {
                    instance,
                    worker,
                    context,
                } => (
                    instance,
                    self.envoys[instance].idle_timeout(worker, context, now),
                ),
            };
            self.handle(instance, outputs, now, observer);
        }
        observer.progress(arrived);
        let open_at_end = self.envoys.iter().map(|e| e.open_streams().len()).sum();
        let stats = RunStats {
            requests: arrived,
            callouts: self.callouts,
            open_at_end,
            wall: started.elapsed(),
        };
        (stats, self.envoys, self.clients)
    }

    fn arrive(&mut self, index: usize, now: u64) -> (usize, Vec<Output>) {
        let record = &self.records[index];
        let instance = self.next_instance;
        self.next_instance = (self.next_instance + 1) % self.envoys.len();
        let peer_ip: IpAddr = self.clients.address(&record.client);
        let port = 1024 + (index % 60_000) as u16;
        let mut headers = vec![
            (
                ":authority".to_owned(),
                record
                    .host
                    .as_deref()
                    .unwrap_or(DEFAULT_AUTHORITY)
                    .as_bytes()
                    .to_vec(),
            ),
            (":path".to_owned(), record.target.as_bytes().to_vec()),
            (":method".to_owned(), record.method.as_bytes().to_vec()),
            (":scheme".to_owned(), b"http".to_vec()),
        ];
        headers.extend(
            record
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.as_bytes().to_vec())),
        );
        let request = Request {
            id: index as u64,
            headers,
            peer: (peer_ip, port),
            upstream_status: record.status,
            upstream_bytes: record.bytes,
        };
        let worker = self.envoys[instance].worker_for(&peer_ip);
        (instance, self.envoys[instance].begin(worker, request, now))
    }

    fn handle(
        &mut self,
        instance: usize,
        outputs: Vec<Output>,
        now: u64,
        observer: &mut dyn Observer,
    ) {
        for output in outputs {
            match output {
                Output::Callout { worker, callout } => {
                    self.callouts += 1;
                    let token = callout.token;
                    let answer = self.dispatcher.dispatch(callout, Some((now / 1000) as i64));
                    self.schedule(
                        now + self.callout_latency_ns,
                        LATER,
                        Event::Callout {
                            instance,
                            worker,
                            token,
                            answer,
                        },
                    );
                }
                Output::TickPeriod { worker, period_ms } => {
                    let generation = self.tick_generation.entry((instance, worker)).or_default();
                    *generation += 1;
                    let generation = *generation;
                    if period_ms > 0 {
                        self.schedule(
                            now + u64::from(period_ms) * 1_000_000,
                            LATER,
                            Event::Tick {
                                instance,
                                worker,
                                generation,
                            },
                        );
                    }
                }
                Output::Paused { worker, context } => {
                    let at = now + STREAM_IDLE_TIMEOUT.as_nanos() as u64;
                    self.schedule(
                        at,
                        LATER,
                        Event::IdleTimeout {
                            instance,
                            worker,
                            context,
                        },
                    );
                }
                Output::Completed(done) => {
                    let record = &self.records[done.id as usize];
                    observer.completed(instance, done, record);
                }
            }
        }
    }
}
