//! The root context: configuration, stats, the shaping tick, and a stream context per request.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};
use sluice_core::deny_cache::fingerprint;
use sluice_core::policy::Policy;

use crate::cache::DenyCache;
use crate::held::{Held, SharedHeld};
use crate::stats::Stats;
use crate::stream::Stream;

/// What every stream of a configured root context shares.
pub struct Shared {
    /// The validated configuration.
    pub policy: Policy,
    /// The counters.
    pub stats: Stats,
    /// The deny cache.
    pub cache: DenyCache,
    /// Streams held for shaping.
    pub held: SharedHeld,
}

/// The plugin's root context.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<Shared>>,
    held: SharedHeld,
}

impl Root {
    /// A root context with no configuration yet.
    pub fn new() -> Root {
        Root {
            shared: None,
            held: Rc::new(RefCell::new(Held::default())),
        }
    }
}

/// Host time in milliseconds since the epoch.
pub fn now_ms(context: &dyn Context) -> u64 {
    context
        .get_current_time()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let configuration = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match Policy::from_json(&configuration) {
            Ok(policy) => {
                let stats = Stats::define(policy.rules.iter().map(|r| r.name.as_str()));
                let cache = DenyCache::new(fingerprint(&configuration), policy.deny_cache_slots);
                self.shared = Some(Rc::new(Shared {
                    policy,
                    stats,
                    cache,
                    held: Rc::clone(&self.held),
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
        let now = now_ms(self);
        self.held.borrow_mut().release_due(now);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(context_id, self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
