//! Which requests a rule applies to.

use regex_lite::{Regex, RegexBuilder};

use super::error::{PolicyError, field};
use super::raw::{OneOrMany, RawHeaderMatch, RawMatch, RawStringMatch};
use super::request::HttpRequest;

/// Compiled regexes may use at most this much memory: the filter runs in a small VM.
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// A compiled way to match a value (bytes: header values need not be UTF-8).
///
/// Regexes are `regex-lite`'s: RE2's syntax, as Envoy's `safe_regex`, with `\d`, `\w` and `\s`
/// ASCII as in RE2, and without Unicode classes (`\p{..}`), which are refused when the policy is
/// loaded. The full `regex` crate's Unicode tables and lazy DFA were two thirds of the .wasm,
/// which V8 compiles on Envoy's main thread at every start.
#[derive(Debug, Clone)]
pub enum StringMatch {
    /// The whole value.
    Exact(Vec<u8>),
    /// A prefix.
    Prefix(Vec<u8>),
    /// A suffix.
    Suffix(Vec<u8>),
    /// A regex that must match the whole value.
    Regex(Regex),
}

impl StringMatch {
    /// Whether `value` matches.
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            StringMatch::Exact(v) => value == v.as_slice(),
            StringMatch::Prefix(p) => value.starts_with(p),
            StringMatch::Suffix(s) => value.ends_with(s),
            StringMatch::Regex(r) => match std::str::from_utf8(value) {
                Ok(text) => r.is_match(text),
                // Rare: bytes that are not UTF-8 are read as U+FFFD.
                Err(_) => r.is_match(&String::from_utf8_lossy(value)),
            },
        }
    }

    fn from_fields(
        path: &str,
        exact: Option<&String>,
        prefix: Option<&String>,
        suffix: Option<&String>,
        regex: Option<&String>,
    ) -> Result<Option<StringMatch>, PolicyError> {
        let given = [
            exact.is_some(),
            prefix.is_some(),
            suffix.is_some(),
            regex.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(PolicyError::new(
                path,
                "give only one of `exact`, `prefix`, `suffix`, `regex`",
            ));
        }
        Ok(if let Some(v) = exact {
            Some(StringMatch::Exact(v.clone().into_bytes()))
        } else if let Some(v) = prefix {
            Some(StringMatch::Prefix(v.clone().into_bytes()))
        } else if let Some(v) = suffix {
            Some(StringMatch::Suffix(v.clone().into_bytes()))
        } else if let Some(pattern) = regex {
            let anchored = format!(r"\A(?:{pattern})\z");
            let compiled = RegexBuilder::new(&anchored)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| {
                    PolicyError::new(&field(path, "regex"), format!("invalid regex: {e}"))
                })?;
            Some(StringMatch::Regex(compiled))
        } else {
            None
        })
    }

    pub(crate) fn from_raw(path: &str, raw: &RawStringMatch) -> Result<StringMatch, PolicyError> {
        StringMatch::from_fields(
            path,
            raw.exact.as_ref(),
            raw.prefix.as_ref(),
            raw.suffix.as_ref(),
            raw.regex.as_ref(),
        )?
        .ok_or_else(|| PolicyError::new(path, "give one of `exact`, `prefix`, `suffix`, `regex`"))
    }
}

/// A header condition.
#[derive(Debug, Clone)]
pub enum HeaderMatch {
    /// The header is there (`true`) or not (`false`).
    Present(String, bool),
    /// The header's first value matches.
    Value(String, StringMatch),
}

impl HeaderMatch {
    fn name(&self) -> &str {
        match self {
            HeaderMatch::Present(name, _) | HeaderMatch::Value(name, _) => name,
        }
    }

    fn matches(&self, request: &HttpRequest<'_>) -> bool {
        match self {
            HeaderMatch::Present(name, want) => request.header(name).is_some() == *want,
            HeaderMatch::Value(name, m) => request.header(name).is_some_and(|v| m.matches(v)),
        }
    }

    fn from_raw(path: &str, raw: &RawHeaderMatch) -> Result<HeaderMatch, PolicyError> {
        let name = raw.name.to_ascii_lowercase();
        if name.is_empty()
            || name
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(PolicyError::new(
                &field(path, "name"),
                format!("`{}` is not a header name", raw.name),
            ));
        }
        let value = StringMatch::from_fields(
            path,
            raw.exact.as_ref(),
            raw.prefix.as_ref(),
            raw.suffix.as_ref(),
            raw.regex.as_ref(),
        )?;
        match (raw.present, value) {
            (Some(present), None) => Ok(HeaderMatch::Present(name, present)),
            (None, Some(value)) => Ok(HeaderMatch::Value(name, value)),
            (None, None) => Err(PolicyError::new(
                path,
                "give `present`, or one of `exact`, `prefix`, `suffix`, `regex`",
            )),
            (Some(_), Some(_)) => Err(PolicyError::new(
                path,
                "`present` cannot be combined with a value match",
            )),
        }
    }
}

/// Conditions that must all hold; the empty match applies to every request.
#[derive(Debug, Clone, Default)]
pub struct RequestMatch {
    path: Option<StringMatch>,
    methods: Vec<Vec<u8>>,
    host: Option<StringMatch>,
    headers: Vec<HeaderMatch>,
}

impl RequestMatch {
    /// The headers this match reads.
    pub fn headers_read(&self) -> impl Iterator<Item = &str> {
        let path = self.path.as_ref().map(|_| ":path");
        let method = (!self.methods.is_empty()).then_some(":method");
        let host = self.host.iter().flat_map(|_| [":authority", "host"]);
        path.into_iter()
            .chain(method)
            .chain(host)
            .chain(self.headers.iter().map(HeaderMatch::name))
    }

    /// Whether `request` meets every condition.
    ///
    /// Most rules have none: that is seen here, inlined where a request is planned, without
    /// the call that weighs the conditions (some 30 instructions fewer a request in the
    /// native module, callgrind).
    #[inline]
    pub fn matches(&self, request: &HttpRequest<'_>) -> bool {
        // Every field named, none passed over with `..`: a condition added to the struct
        // does not compile until it is weighed here too.
        let RequestMatch {
            path,
            methods,
            host,
            headers,
        } = self;
        let unconditional =
            path.is_none() && methods.is_empty() && host.is_none() && headers.is_empty();
        unconditional || self.meets_every_condition(request)
    }

    fn meets_every_condition(&self, request: &HttpRequest<'_>) -> bool {
        self.path.as_ref().is_none_or(|m| m.matches(request.path()))
            && (self.methods.is_empty() || self.methods.iter().any(|m| m == request.method()))
            && self
                .host
                .as_ref()
                .is_none_or(|m| m.matches(&request.host()))
            && self.headers.iter().all(|h| h.matches(request))
    }

    pub(crate) fn from_raw(path: &str, raw: &RawMatch) -> Result<RequestMatch, PolicyError> {
        let methods = match &raw.method {
            None => Vec::new(),
            Some(OneOrMany::One(m)) => vec![m.clone()],
            Some(OneOrMany::Many(ms)) => ms.clone(),
        };
        let methods = methods
            .into_iter()
            .map(|m| {
                if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) {
                    Ok(m.into_bytes())
                } else {
                    Err(PolicyError::new(
                        &field(path, "method"),
                        format!("`{m}` is not a method: write it in capitals, as GET"),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let host = match &raw.host {
            None => None,
            Some(h) => {
                let lowered = RawStringMatch {
                    exact: h.exact.as_ref().map(|s| s.to_ascii_lowercase()),
                    prefix: h.prefix.as_ref().map(|s| s.to_ascii_lowercase()),
                    suffix: h.suffix.as_ref().map(|s| s.to_ascii_lowercase()),
                    regex: h.regex.clone(),
                };
                Some(StringMatch::from_raw(&field(path, "host"), &lowered)?)
            }
        };
        Ok(RequestMatch {
            path: raw
                .path
                .as_ref()
                .map(|p| StringMatch::from_raw(&field(path, "path"), p))
                .transpose()?,
            methods,
            host,
            headers: raw
                .headers
                .iter()
                .enumerate()
                .map(|(i, h)| HeaderMatch::from_raw(&format!("{path}.headers[{i}]"), h))
                .collect::<Result<_, _>>()?,
        })
    }
}
