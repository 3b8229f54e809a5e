//! The replay: trace requests into simulated Envoys, on a virtual or a paced real clock.
//!
//! A discrete-event loop. Events at the same instant run in this order: every request that
//! arrives at that instant, then callout answers, ticks and timeouts in the order they were
//! scheduled.
//!
//! In virtual time ([`Clock::Virtual`]) a callout's answer comes back a fixed modelled latency
//! after the callout (default 1 ms, as from a service in the same data centre): requests that
//! arrive meanwhile are in flight together, as in a real proxy, and cannot yet see that answer
//! (or the deny-cache entry it leaves); requests that arrive later do. The real server and
//! Redis decide every callout, at its virtual time, and their answers are waited for. Nothing
//! depends on how fast the machine is, so the same inputs give the same results.
//!
//! In real time ([`Clock::RealTime`]) each event waits for the wall clock (`speed` trace
//! seconds per wall second) and answers are delivered when they arrive, so the callout
//! latencies the report gives are the ones measured. The filter and the server still see the
//! trace's time (advanced by the wall clock), so a limit of 10 per second means 10 per trace
//! second at any speed.

pub mod clock;
mod event;
mod pace;
mod queue;

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::trace::{ClientAddresses, TraceRecord};
use crate::transport::{Delivered, Dispatcher, upstream_timeout};
use sluice_host::envoy::{Completed, Envoy, Output, Request};
use sluice_host::state::CalloutReply;

pub use self::clock::{Clock, DEFAULT_CALLOUT_LATENCY};
use self::event::{ARRIVAL, Answer, Event, LATER};
use self::pace::{Answered, Pace, spin_until_done};
pub(crate) use self::queue::EventQueue;

/// How long Envoy lets a paused stream wait (its default `stream_idle_timeout`).
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The host requests are for when the trace does not say.
pub(crate) const DEFAULT_AUTHORITY: &str = "shop.example";

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
    queue: EventQueue<Event>,
    tick_generation: HashMap<(usize, usize), u64>,
    /// Which instance an arrival goes to (round robin, as a load balancer in front).
    next_instance: usize,
    callouts: u64,
    clock: Clock,
    pace: Option<Pace>,
    /// The latest time events ran at: the clock never goes back.
    now_ns: u64,
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
            queue: EventQueue::default(),
            tick_generation: HashMap::new(),
            next_instance: 0,
            callouts: 0,
            clock: Clock::default(),
            pace: None,
            now_ns: 0,
            pending: 0,
        }
    }

    /// Runs on `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Replay<'a> {
        self.clock = clock;
        self
    }

    fn schedule(&mut self, at_ns: u64, class: u8, event: Event) {
        if matches!(event, Event::Arrival(_) | Event::Callout { .. }) {
            self.pending += 1;
        }
        if matches!(event, Event::IdleTimeout { .. }) {
            // Always STREAM_IDLE_TIMEOUT after a clock that never goes back: in order.
            self.queue.push_in_order(at_ns, class, event);
        } else {
            self.queue.push(at_ns, class, event);
        }
    }

    /// An idle timeout for a stream that has already ended: nothing to run or wait for.
    fn is_stale(&self, event: &Event) -> bool {
        matches!(event, Event::IdleTimeout { instance, worker, context }
            if !self.envoys[*instance].is_open(*worker, *context))
    }

    fn time_ns(record: &TraceRecord) -> u64 {
        u64::try_from(record.time_us)
            .unwrap_or(0)
            .saturating_mul(1000)
    }

    /// The next event and its time: the queue's next in virtual time; in real time, whichever
    /// comes first of the queue's next (when the wall clock reaches it) and an answer.
    fn next_event(&mut self) -> Option<(u64, Event)> {
        while self.queue.peek().is_some_and(|(_, e)| self.is_stale(e)) {
            self.queue.pop();
        }
        let Some(pace) = &mut self.pace else {
            return self.queue.pop();
        };
        let next_at = self.queue.peek().map(|(at, _)| at);
        if next_at.is_none() && pace.in_flight == 0 {
            return None;
        }
        let deadline = next_at.map(|at| pace.wall_at(at));
        let rx = &mut pace.answers_rx;
        let answered = self.runtime.block_on(async {
            match deadline {
                Some(deadline) => tokio::select! {
                    biased;
                    answered = rx.recv() => answered,
                    () = tokio::time::sleep_until(deadline.into()) => None,
                },
                None => rx.recv().await,
            }
        });
        match answered {
            Some(a) => {
                pace.in_flight -= 1;
                let now = pace.trace_now();
                let event = Event::Callout {
                    instance: a.instance,
                    worker: a.worker,
                    token: a.token,
                    answer: Answer::Ready(a.delivered),
                };
                Some((now, event))
            }
            None => self.queue.pop(),
        }
    }

    /// Runs to the end; every completed request goes to `observer`.
    pub fn run(mut self, observer: &mut dyn Observer) -> (RunStats, Vec<Envoy>, ClientAddresses) {
        let started = crate::replay::clock::wall_now();
        self.begin(observer);
        let mut arrived = 0usize;
        while let Some((at, event)) = self.next_event() {
            let now = at.max(self.now_ns);
            self.now_ns = now;
            let (instance, outputs) = match event {
                Event::Arrival(index) => {
                    self.pending -= 1;
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
                    let reply = self.answer_of(answer, observer);
                    (
                        instance,
                        self.envoys[instance].deliver(worker, token, reply, now),
                    )
                }
                Event::Tick {
                    instance,
                    worker,
                    generation,
                } => {
                    self.tick(instance, worker, generation, now, observer);
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

    /// Sets the clock to the first request, starts every Envoy and schedules the first arrival.
    fn begin(&mut self, observer: &mut dyn Observer) {
        let Some(first) = self.records.first() else {
            return;
        };
        let start = Self::time_ns(first);
        self.now_ns = start;
        if let Clock::RealTime { speed } = self.clock {
            let (answers_tx, answers_rx) = mpsc::unbounded_channel();
            self.pace = Some(Pace {
                speed: speed.max(1e-6),
                wall_start: crate::replay::clock::wall_now(),
                trace_start_ns: start,
                answers_tx,
                answers_rx,
                in_flight: 0,
            });
        }
        for instance in 0..self.envoys.len() {
            let outputs = self.envoys[instance].started();
            self.handle(instance, outputs, start, observer);
        }
        self.schedule(start, ARRIVAL, Event::Arrival(0));
    }

    /// What a callout's answer delivers to the module: the server's reply, or Envoy's reply
    /// to a callout that timed out or whose task died.
    fn answer_of(&mut self, answer: Answer, observer: &mut dyn Observer) -> CalloutReply {
        let timed_out = matches!(answer, Answer::TimedOut(_));
        let mut delivered = match answer {
            Answer::Ready(delivered) => delivered,
            Answer::Pending(handle) | Answer::TimedOut(handle) => {
                self.pending -= 1;
                self.runtime
                    .block_on(spin_until_done(handle))
                    .unwrap_or_else(|e| {
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
                    })
            }
        };
        if timed_out {
            delivered.reply = upstream_timeout();
        }
        observer.callout(delivered.latency);
        delivered.reply
    }

    /// A worker's tick of `generation`, if its period has not changed since, and the next one
    /// while its period stays the same and anything is left to happen.
    fn tick(
        &mut self,
        instance: usize,
        worker: usize,
        generation: u64,
        now: u64,
        observer: &mut dyn Observer,
    ) {
        if self.tick_generation.get(&(instance, worker)) != Some(&generation) {
            return;
        }
        let outputs = self.envoys[instance].tick(worker, now);
        self.handle(instance, outputs, now, observer);
        let period = self.envoys[instance].tick_period_ms(worker);
        let in_flight = self.pace.as_ref().map_or(0, |p| p.in_flight);
        let work_left =
            self.pending + in_flight > 0 || self.envoys.iter().any(Envoy::has_open_streams);
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
        if !outputs.iter().any(|o| matches!(o, Output::Callout { .. })) {
            self.apply_outputs(instance, outputs, now, observer);
            return;
        }
        // Callouts are spawned from inside the runtime (outside, each spawn would wake its
        // driver through a syscall) and put on the wire now, as Envoy does, instead of when
        // they are due: Redis then works on them while the replay goes on, and their answers
        // are waiting when the replay reaches them. (Order is kept per key by the dispatcher,
        // and the server decides at the time each callout carries.)
        let runtime = self.runtime;
        runtime.block_on(async {
            self.apply_outputs(instance, outputs, now, observer);
            tokio::task::yield_now().await;
        });
    }

    fn apply_outputs(
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
                    let timeout = Duration::from_millis(u64::from(callout.timeout_ms));
                    let handle = self.dispatcher.dispatch(callout, Some((now / 1000) as i64));
                    match (&mut self.pace, self.clock) {
                        (Some(pace), _) => {
                            pace.in_flight += 1;
                            let tx = pace.answers_tx.clone();
                            self.runtime.spawn(async move {
                                if let Ok(delivered) = handle.await {
                                    let _ = tx.send(Answered {
                                        instance,
                                        worker,
                                        token,
                                        delivered,
                                    });
                                }
                            });
                        }
                        (None, clock) => {
                            let latency = match clock {
                                Clock::Virtual { callout_latency } => callout_latency,
                                Clock::RealTime { .. } => Duration::ZERO,
                            };
                            // Envoy's timeout (0: none) answers first when the answer would
                            // come at it or later.
                            let (after, answer) = if !timeout.is_zero() && latency >= timeout {
                                (timeout, Answer::TimedOut(handle))
                            } else {
                                (latency, Answer::Pending(handle))
                            };
                            self.schedule(
                                now + after.as_nanos() as u64,
                                LATER,
                                Event::Callout {
                                    instance,
                                    worker,
                                    token,
                                    answer,
                                },
                            );
                        }
                    }
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
