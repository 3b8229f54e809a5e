//! The root context: configuration, stats, the tick (shaping and leases), lease callouts, and
//! a stream context per request.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};
use sluice_core::deny_cache::fingerprint;
use sluice_core::policy::Policy;
use sluice_core::wire::{LEASE_PATH, LeaseRequest, holder_name, holder_secret};
use sluice_filter_logic::cas;
use sluice_filter_logic::lease::{Holder, Leases, grants};
use sluice_filter_logic::shared_data::SharedData;

use crate::answer;
use crate::cache::DenyCache;
use crate::callout;
use crate::configured::{Configured, now_us};
use crate::held::{Held, SharedHeld};
use crate::shared_data::HostSharedData;
use crate::stats::Stats;
use crate::stream::Stream;
use crate::ticker::Ticker;
use crate::warnings::{Warning, Warnings};

/// The plugin's root context.
pub struct Root {
    shared: Option<Rc<Configured>>,
    held: SharedHeld,
    ticker: Rc<Ticker>,
    /// The host's shared data, for every configuration.
    data: Rc<dyn SharedData>,
    /// Lease callouts in flight: their requests, to read the answers against.
    lease_calls: RefCell<Vec<(u32, LeaseRequest)>>,
}

impl Default for Root {
    fn default() -> Root {
        Root::new()
    }
}

impl Root {
    /// A root context with no configuration yet.
    pub fn new() -> Root {
        let ticker = Rc::new(Ticker::default());
        Root {
            shared: None,
            held: Rc::new(RefCell::new(Held::new(Rc::clone(&ticker)))),
            ticker,
            data: Rc::new(HostSharedData),
            lease_calls: RefCell::new(Vec::new()),
        }
    }

    /// Sends what the leases' tick has to say, from the root context so that its answer comes
    /// back here whatever became of the streams that asked.
    fn send_lease_call(&self, shared: &Configured, now: u64) {
        let Some((request, sent)) = shared.leases.on_tick(&shared.policy.rules, now) else {
            return;
        };
        match callout::post(self, &shared.policy.service, LEASE_PATH, &request.to_json()) {
            Ok(token) => {
                shared.stats.lease_call();
                shared.leases.sent(token.into(), sent);
                self.lease_calls.borrow_mut().push((token, request));
            }
            Err(reason) => {
                shared.warnings.warn(Warning::LeaseNotSent, now_us(), || {
                    format!("sluice: lease callout not sent: {reason}")
                });
                shared.stats.lease_failure();
                shared.leases.not_sent(sent);
            }
        }
    }
}

/// This Envoy as a lease holder, the same for all its workers: a name of Envoy's node id (or
/// `envoy`) and the time the first of its VMs took it, and a random secret that binds the name
/// in the ledgers; kept in shared data under `key` as "<name> <secret>".
fn holder(context: &dyn Context, key: &str) -> Holder {
    // The first holder written stays, whichever VM configures first.
    cas::update(
        &HostSharedData,
        key,
        2,
        |bytes| {
            let text = std::str::from_utf8(bytes).ok()?;
            let (name, secret) = text.split_once(' ')?;
            Some(Holder {
                name: name.to_owned(),
                secret: secret.to_owned(),
            })
        },
        |holder: &Holder| format!("{} {}", holder.name, holder.secret).into_bytes(),
        |taken| match taken {
            Some(holder) => (None, holder),
            None => {
                let holder = new_holder(context);
                (Some(holder.clone()), holder)
            }
        },
    )
    .unwrap_or_else(|| new_holder(context))
}

fn new_holder(context: &dyn Context) -> Holder {
    let node = hostcalls::get_property(vec!["node", "id"])
        .ok()
        .flatten()
        .unwrap_or_default();
    let started = context
        .get_current_time()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut random = [0u8; 16];
    let secret = match getrandom::fill(&mut random) {
        Ok(()) => holder_secret(random),
        Err(e) => {
            // Envoy's WASI always has random_get; without it the name alone is the holder.
            proxy_wasm::hostcalls::log(
                LogLevel::Warn,
                &format!("sluice: no random bytes for the lease holder's secret: {e}"),
            )
            .ok();
            String::new()
        }
    };
    Holder {
        name: holder_name(&node, started),
        secret,
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let request = {
            let mut calls = self.lease_calls.borrow_mut();
            let Some(at) = calls.iter().position(|(t, _)| *t == token) else {
                return;
            };
            calls.swap_remove(at).1
        };
        let answer = answer::read(self, num_headers, body_size, |body| grants(&request, body));
        if let Err(reason) = &answer {
            shared.warnings.warn(Warning::LeaseCall, now_us(), || {
                format!("sluice: lease call failed: {reason}; leases run on what they hold")
            });
        }
        shared.leases.answered(token.into(), answer, |rule, grant| {
            shared.stats.lease_answer(rule, grant);
        });
    }

    /// The VM is going away: what the counters kept goes to Envoy first.
    fn on_done(&mut self) -> bool {
        if let Some(shared) = &self.shared {
            shared.stats.flush();
        }
        true
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let configuration = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match Policy::from_json(&configuration) {
            Ok(policy) => {
                let fingerprint = fingerprint(&configuration);
                let stats = Stats::define(policy.rules.iter().map(|r| r.name.as_str()));
                self.ticker.set_counting(true);
                let cache = DenyCache::new(
                    Rc::clone(&self.data),
                    fingerprint.clone(),
                    policy.deny_cache_slots,
                );
                let holder = holder(self, &format!("sluice.{fingerprint}.holder"));
                let leases = Leases::new(
                    Rc::clone(&self.data),
                    fingerprint,
                    holder,
                    &policy.rules,
                    Rc::clone(&self.ticker),
                );
                self.shared = Some(Rc::new(Configured {
                    policy,
                    stats,
                    cache,
                    held: Rc::clone(&self.held),
                    leases,
                    warnings: Warnings::default(),
                }));
                true
            }
            Err(e) => {
                // Envoy refuses the configuration and shows this line.
                let _ = hostcalls::log(
                    LogLevel::Error,
                    &format!("sluice: invalid configuration: {e}"),
                );
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let now = now_us();
        self.held.borrow_mut().release_due(now / 1000);
        if let Some(shared) = self.shared.clone() {
            self.send_lease_call(&shared, now);
            shared.stats.flush();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(context_id, self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
