//! A callout's answer, read without trusting it: a reset (no headers), a status other than
//! 200, or no body is an error that says what came back, never a panic.

use proxy_wasm::traits::Context;

/// The body of a 200 answer, or what went wrong.
pub fn read(
    context: &dyn Context,
    num_headers: usize,
    body_size: usize,
) -> Result<Vec<u8>, String> {
    if num_headers == 0 {
        // A reset or an oversized answer: Envoy delivers no headers, and reading them fails.
        return Err("the callout was reset".to_owned());
    }
    let status = context
        .get_http_call_response_header_bytes(":status")
        .unwrap_or_default();
    if status != b"200" {
        let body = context
            .get_http_call_response_body(0, body_size.min(512))
            .unwrap_or_default();
        return Err(format!(
            "sluice-server answered {}: {}",
            String::from_utf8_lossy(&status),
            String::from_utf8_lossy(&body).trim()
        ));
    }
    Ok(context
        .get_http_call_response_body(0, body_size)
        .unwrap_or_default())
}
