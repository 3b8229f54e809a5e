//! Calls to sluice-server: a JSON `POST` through the configured Envoy cluster, the same
//! headers, token and timeout for decisions and leases alike.

use std::time::Duration;

use proxy_wasm::traits::Context;
use sluice_core::policy::Service;
use sluice_filter_logic::callout_headers;

/// Sends `body` to `path` of sluice-server; the callout's token, or why the host refused it.
pub fn post(
    context: &dyn Context,
    service: &Service,
    path: &str,
    body: &[u8],
) -> Result<u32, String> {
    let headers = callout_headers(service, path).collect();
    let timeout = Duration::from_millis(service.timeout.as_millis());
    context
        .dispatch_http_call(&service.cluster, headers, Some(body), vec![], timeout)
        .map_err(|status| {
            format!(
                "the host refused the callout to cluster `{}`: {status:?}",
                service.cluster
            )
        })
}
