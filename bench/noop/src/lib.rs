//! sluice-noop-filter: what any proxy-wasm HTTP filter costs in the host before it does
//! anything. It has a root context and a stream context per request, as sluice's filter does,
//! and lets every request through at once; `make bench` sets sluice's per-request cost beside
//! it.

#![deny(missing_docs)]

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream;

impl Context for Stream {}

// Every callback keeps the SDK's default: continue.
impl HttpContext for Stream {}

#[allow(missing_docs, unsafe_code)]
mod entry {
    use super::*;

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Info);
        proxy_wasm::set_root_context(|_context_id| -> Box<dyn RootContext> { Box::new(Root) });
    }}
}
