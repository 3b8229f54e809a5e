//! What a rule's key is built from.

use std::borrow::Cow;
use std::cell::OnceCell;

use super::error::{PolicyError, field};
use super::raw::{RawKeyPart, RawKeySource};
use super::request::{ClientIp, HttpRequest};
use crate::key::{KeyBuilder, LimitKey};

/// Where one part of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client's IP address (see [`HttpRequest::client_ip`]), in canonical form.
    ClientIp,
    /// The path, without the query string.
    Path,
    /// The method.
    Method,
    /// The host, lower-cased, without a port.
    Host,
    /// A header's first value; `default` when absent, else the rule does not apply.
    Header {
        /// Lower-case name.
        name: String,
        /// Used when the header is absent.
        default: Option<String>,
    },
    /// A query parameter's first value (as sent, still percent-encoded).
    Query {
        /// The parameter.
        name: String,
        /// Used when the parameter is absent.
        default: Option<String>,
    },
    /// A constant: a key shared by every request the rule matches.
    Const(String),
}

impl KeyPart {
    /// This part's value for the request, or `None` when the request lacks it.
    fn value<'a>(&'a self, source: &'a KeySource<'_, '_>) -> Option<Cow<'a, [u8]>> {
        let request = source.request;
        let or_default = |found: Option<&'a [u8]>, default: &'a Option<String>| {
            found
                .or(default.as_deref().map(str::as_bytes))
                .map(Cow::Borrowed)
        };
        match self {
            KeyPart::ClientIp => source.client_ip().map(|ip| Cow::Borrowed(ip.as_bytes())),
            KeyPart::Path => Some(Cow::Borrowed(request.path())),
            KeyPart::Method => Some(Cow::Borrowed(request.method())),
            KeyPart::Host => Some(Cow::Owned(request.host())),
            KeyPart::Header { name, default } => or_default(request.header(name), default),
            KeyPart::Query { name, default } => or_default(request.query_param(name), default),
            KeyPart::Const(value) => Some(Cow::Borrowed(value.as_bytes())),
        }
    }

    pub(crate) fn from_raw(path: &str, raw: &RawKeyPart) -> Result<KeyPart, PolicyError> {
        match raw {
            RawKeyPart::Name(name) => match name.as_str() {
                "client_ip" => Ok(KeyPart::ClientIp),
                "path" => Ok(KeyPart::Path),
                "method" => Ok(KeyPart::Method),
                "host" => Ok(KeyPart::Host),
                other => Err(PolicyError::new(
                    path,
                    format!(
                        "unknown key part `{other}`: expected client_ip, path, method, host, or an object with header, query or const"
                    ),
                )),
            },
            RawKeyPart::Source(source) => KeyPart::from_source(path, source),
        }
    }

    fn from_source(path: &str, s: &RawKeySource) -> Result<KeyPart, PolicyError> {
        let named = |what: &str, name: &String| {
            if name.is_empty() {
                Err(PolicyError::new(&field(path, what), "must not be empty"))
            } else {
                Ok(name.clone())
            }
        };
        match (&s.header, &s.query, &s.constant) {
            (Some(h), None, None) => Ok(KeyPart::Header {
                name: named("header", h)?.to_ascii_lowercase(),
                default: s.default.clone(),
            }),
            (None, Some(q), None) => Ok(KeyPart::Query {
                name: named("query", q)?,
                default: s.default.clone(),
            }),
            (None, None, Some(c)) if s.default.is_none() => Ok(KeyPart::Const(c.clone())),
            (None, None, Some(_)) => Err(PolicyError::new(
                &field(path, "default"),
                "a constant needs no default",
            )),
            _ => Err(PolicyError::new(
                path,
                "give exactly one of `header`, `query`, `const`",
            )),
        }
    }
}

/// One request, as the keys of every rule read it: its client address is worked out (parsed
/// and put in canonical form) once, however many rules key on it.
pub struct KeySource<'a, 'h> {
    request: &'a HttpRequest<'h>,
    trusted_hops: u32,
    client_ip: OnceCell<Option<ClientIp<'a>>>,
}

impl<'a, 'h> KeySource<'a, 'h> {
    /// `request`, behind `trusted_hops` proxies that append to `x-forwarded-for`.
    pub fn new(request: &'a HttpRequest<'h>, trusted_hops: u32) -> KeySource<'a, 'h> {
        KeySource {
            request,
            trusted_hops,
            client_ip: OnceCell::new(),
        }
    }

    fn client_ip(&self) -> Option<&str> {
        self.client_ip_read().map(|ip| ip.text.as_ref())
    }

    fn client_ip_read(&self) -> Option<&ClientIp<'a>> {
        self.client_ip
            .get_or_init(|| self.request.client_ip_text(self.trusted_hops))
            .as_ref()
    }

    /// Whether a key read the client's address and had to fall back to the peer's (see
    /// [`ClientIp::fallback`]).
    pub fn client_ip_fell_back(&self) -> bool {
        self.client_ip
            .get()
            .is_some_and(|ip| ip.as_ref().is_some_and(|ip| ip.fallback))
    }
}

/// The key for the request from `parts`, or `None` when a part is missing (the rule then does not
/// apply).
pub fn build_key(parts: &[KeyPart], source: &KeySource<'_, '_>) -> Option<LimitKey> {
    build_key_in(parts, source, KeyBuilder::default())
}

/// [`build_key`], written in `key`.
pub(super) fn build_key_in(
    parts: &[KeyPart],
    source: &KeySource<'_, '_>,
    mut key: KeyBuilder,
) -> Option<LimitKey> {
    for part in parts {
        key.part(&part.value(source)?);
    }
    Some(key.finish())
}
