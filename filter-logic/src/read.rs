//! What a filter reads of a request and writes on a callout, whatever its host.

use std::borrow::Cow;

use sluice_core::policy::{HttpRequest, Policy, Service};

/// The parts of the request `policy` reads: only the headers its rules name, when it can say
/// which (`header` reads one, the first of its values); else every header (`all_headers`; a
/// header map read whole costs an allocation per header); and the peer's address
/// (`source_address`, `ip:port`) only when a key uses the client's address.
pub fn read_request<'p>(
    policy: &'p Policy,
    header: impl Fn(&str) -> Option<Vec<u8>>,
    all_headers: impl FnOnce() -> Vec<(String, Vec<u8>)>,
    source_address: impl FnOnce() -> Option<String>,
) -> HttpRequest<'p> {
    let source_address = if policy.reads_source_address {
        source_address()
    } else {
        None
    };
    let headers = match &policy.headers_read {
        Some(names) => names
            .iter()
            .filter_map(|name| Some((Cow::Borrowed(name.as_str()), header(name)?)))
            .collect(),
        None => all_headers()
            .into_iter()
            .map(|(name, value)| (Cow::Owned(name), value))
            .collect(),
    };
    HttpRequest {
        headers,
        source_address,
    }
}

/// The headers of a `POST` of JSON to `path` of sluice-server: the same for decisions and
/// leases, from every host.
pub fn callout_headers<'a>(service: &'a Service, path: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", service.authority.as_str()),
        ("content-type", "application/json"),
    ];
    if let Some(authorization) = &service.authorization {
        headers.push(("authorization", authorization.as_str()));
    }
    headers
}
