//! A callout's answer, read without trusting it: a reset (no headers), a status other than
//! 200, or a body that is not the answer asked for is an error that says what came back,
//! never a panic.
//!
//! The body is read and parsed first, and the status only when the body is not an answer:
//! reading `:status` is a host call that calls back into the module to allocate its copy,
//! about 10,600 of Envoy's instructions a request under callgrind (5.8 % of a per-request
//! decision's cost in Envoy). A body that is a well-formed answer to this very call, one
//! verdict or grant per check asked, is only ever written by sluice-server, with a 200.

use proxy_wasm::traits::Context;
use sluice_filter_logic::answer::refused;

/// What `parse` makes of the body of a 200 answer, or what went wrong.
pub fn read<T>(
    context: &dyn Context,
    num_headers: usize,
    body_size: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, String> {
    if num_headers == 0 {
        // A reset or an oversized answer: Envoy delivers no headers, and reading them fails.
        return Err("the callout was reset".to_owned());
    }
    let body = context
        .get_http_call_response_body(0, body_size)
        .unwrap_or_default();
    parse(&body).map_err(|reason| {
        let status = context
            .get_http_call_response_header_bytes(":status")
            .unwrap_or_default();
        refused(&status, &body, reason)
    })
}
