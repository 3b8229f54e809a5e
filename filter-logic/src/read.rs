//! What a filter reads of a request and writes on a callout, whatever its host.

use std::borrow::Cow;

use sluice_core::policy::{HttpRequest, Policy, Service};

/// The parts of the request `policy` reads: only the headers its rules name, when it can say
/// which (`header` reads one, the first of its values, borrowed from the host where it lends
/// it); else every header (`all_headers`; a header map read whole costs an allocation per
/// header); and the peer's address (`source_address`, `ip:port`) only when a key uses the
/// client's address.
pub fn read_request<'a>(
    policy: &'a Policy,
    header: impl Fn(&str) -> Option<Cow<'a, [u8]>>,
    all_headers: impl FnOnce() -> Vec<(String, Vec<u8>)>,
    source_address: impl FnOnce() -> Option<String>,
) -> HttpRequest<'a> {
    let mut request = HttpRequest::default();
    read_request_into(policy, header, all_headers, source_address, &mut request);
    request
}

/// [`read_request`] into `request`, which must be empty: natively its header list is held
/// inline, some 200 bytes that a request returned by value is copied whole for, twice on the
/// module's way from Envoy's headers to the plan.
pub fn read_request_into<'a>(
    policy: &'a Policy,
    header: impl Fn(&str) -> Option<Cow<'a, [u8]>>,
    all_headers: impl FnOnce() -> Vec<(String, Vec<u8>)>,
    source_address: impl FnOnce() -> Option<String>,
    request: &mut HttpRequest<'a>,
) {
    if policy.reads_source_address {
        request.source_address = source_address();
    }
    match &policy.headers_read {
        Some(names) => request.headers.extend(
            names
                .iter()
                .filter_map(|name| Some((Cow::Borrowed(name.as_str()), header(name)?))),
        ),
        None => request.headers.extend(
            all_headers()
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name), Cow::Owned(value))),
        ),
    }
}

/// The headers of a `POST` of JSON to `path` of sluice-server: the same for decisions and
/// leases, from every host.
///
/// No `content-type`: a `/v1` body is JSON whatever the header says, and the server reads it
/// without one (`core::wire`). Each header of a callout is Envoy's work on every request: a
/// copy into the callout's header map, its HTTP/2 encoding, the server's decoding. Without
/// this one, a per-request decision cost Envoy 2,500 instructions fewer (callgrind, one
/// worker: 112,495 over no filter, then 109,954).
pub fn callout_headers<'a>(
    service: &'a Service,
    path: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str)> + Clone {
    [
        (":method", "POST"),
        (":path", path),
        (":authority", service.authority.as_str()),
    ]
    .into_iter()
    .chain(
        service
            .authorization
            .as_deref()
            .map(|authorization| ("authorization", authorization)),
    )
}
