//! Envoy's string, header and query parameter matchers, as its route table and rate limit
//! actions evaluate them (`envoy.type.matcher.v3.StringMatcher`,
//! `envoy.config.route.v3.HeaderMatcher`, `QueryParameterMatcher`).

use regex::Regex;

use super::node::{ConfigError, Node};
use super::request::Downstream;

/// `StringMatcher`.
#[derive(Debug, Clone)]
pub struct StringMatcher {
    pattern: Pattern,
    ignore_case: bool,
}

#[derive(Debug, Clone)]
enum Pattern {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    Regex(Regex),
}

impl StringMatcher {
    pub(crate) fn parse(node: &Node<'_>) -> Result<StringMatcher, ConfigError> {
        let ignore_case = node.bool("ignore_case")?.unwrap_or(false);
        let mut rest = node.value.clone();
        if let Some(object) = rest.as_object_mut() {
            object.remove("ignore_case");
        }
        let choice = Node {
            value: &rest,
            path: node.path.clone(),
        };
        let (kind, value) = choice.one_of(
            &["exact", "prefix", "suffix", "contains", "safe_regex"],
            "a string matcher",
        )?;
        let text = || -> Result<String, ConfigError> {
            let s = value
                .value
                .as_str()
                .ok_or_else(|| value.error("must be a string"))?;
            Ok(if ignore_case {
                s.to_lowercase()
            } else {
                s.to_owned()
            })
        };
        let pattern = match kind {
            "exact" => Pattern::Exact(text()?),
            "prefix" => Pattern::Prefix(text()?),
            "suffix" => Pattern::Suffix(text()?),
            "contains" => Pattern::Contains(text()?),
            _ => Pattern::Regex(safe_regex(&value, ignore_case)?),
        };
        Ok(StringMatcher {
            pattern,
            ignore_case,
        })
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        let folded;
        let value = if self.ignore_case && !matches!(self.pattern, Pattern::Regex(_)) {
            folded = value.to_lowercase();
            folded.as_str()
        } else {
            value
        };
        match &self.pattern {
            Pattern::Exact(s) => value == s,
            Pattern::Prefix(s) => value.starts_with(s.as_str()),
            Pattern::Suffix(s) => value.ends_with(s.as_str()),
            Pattern::Contains(s) => value.contains(s.as_str()),
            Pattern::Regex(r) => r.is_match(value),
        }
    }
}

/// A `RegexMatcher` (`{regex: ...}`), compiled to match the whole value as RE2 does in Envoy.
pub(crate) fn safe_regex(node: &Node<'_>, ignore_case: bool) -> Result<Regex, ConfigError> {
    node.only(&["regex", "google_re2"], "a regex matcher")?;
    let pattern = node
        .string("regex")?
        .ok_or_else(|| node.error("`regex` is required here"))?;
    let flags = if ignore_case { "(?i)" } else { "" };
    Regex::new(&format!("^{flags}(?:{pattern})$"))
        .map_err(|e| node.error(format!("the regex does not compile: {e}")))
}

/// `HeaderMatcher`.
#[derive(Debug, Clone)]
pub struct HeaderMatcher {
    name: String,
    test: HeaderTest,
    invert: bool,
    missing_as_empty: bool,
}

#[derive(Debug, Clone)]
enum HeaderTest {
    Present(bool),
    Range { start: i64, end: i64 },
    String(StringMatcher),
}

impl HeaderMatcher {
    pub(crate) fn parse(node: &Node<'_>) -> Result<HeaderMatcher, ConfigError> {
        const TESTS: &[&str] = &[
            "exact_match",
            "safe_regex_match",
            "range_match",
            "present_match",
            "prefix_match",
            "suffix_match",
            "contains_match",
            "string_match",
        ];
        let mut known = vec!["name", "invert_match", "treat_missing_header_as_empty"];
        known.extend_from_slice(TESTS);
        node.only(&known, "a header matcher")?;
        let name = node
            .string("name")?
            .ok_or_else(|| node.error("`name` is required here"))?
            .to_ascii_lowercase();
        let set: Vec<&str> = TESTS
            .iter()
            .copied()
            .filter(|t| node.field(t).is_some())
            .collect();
        let text = |field: &str| -> Result<String, ConfigError> {
            Ok(node.string(field)?.unwrap_or_default().to_owned())
        };
        let string = |pattern| {
            HeaderTest::String(StringMatcher {
                pattern,
                ignore_case: false,
            })
        };
        let test = match set.as_slice() {
            // No test: the header must be present (Envoy's empty `exact_match`).
            [] => HeaderTest::Present(true),
            ["exact_match"] => string(Pattern::Exact(text("exact_match")?)),
            ["prefix_match"] => string(Pattern::Prefix(text("prefix_match")?)),
            ["suffix_match"] => string(Pattern::Suffix(text("suffix_match")?)),
            ["contains_match"] => string(Pattern::Contains(text("contains_match")?)),
            ["safe_regex_match"] => string(Pattern::Regex(safe_regex(
                &node.required("safe_regex_match")?,
                false,
            )?)),
            ["present_match"] => HeaderTest::Present(node.bool("present_match")?.unwrap_or(true)),
            ["range_match"] => {
                let range = node.required("range_match")?;
                let bound = |f: &str| -> Result<i64, ConfigError> {
                    let field = range.required(f)?;
                    field
                        .value
                        .as_i64()
                        .or_else(|| field.value.as_str().and_then(|s| s.parse().ok()))
                        .ok_or_else(|| field.error("must be a whole number"))
                };
                HeaderTest::Range {
                    start: bound("start")?,
                    end: bound("end")?,
                }
            }
            ["string_match"] => {
                HeaderTest::String(StringMatcher::parse(&node.required("string_match")?)?)
            }
            _ => {
                return Err(node.error(format!(
                    "a header matcher takes one test, not {}",
                    set.join(" and ")
                )));
            }
        };
        Ok(HeaderMatcher {
            name,
            test,
            invert: node.bool("invert_match")?.unwrap_or(false),
            missing_as_empty: node.bool("treat_missing_header_as_empty")?.unwrap_or(false),
        })
    }

    /// Whether the request's headers match, as Envoy's `HeaderUtility::matchHeaders` decides:
    /// a header that is absent matches no test but `present_match: false` (whatever
    /// `invert_match` says), unless it is taken as empty; repeated headers are joined by `,`.
    pub fn matches(&self, request: &Downstream<'_>) -> bool {
        let value = request.header_joined(&self.name);
        let value = match (&self.test, value) {
            (HeaderTest::Present(present), value) => {
                return self.invert ^ (*present == value.is_some());
            }
            (_, Some(value)) => value,
            (_, None) if self.missing_as_empty => String::new(),
            (_, None) => return false,
        };
        let matched = match &self.test {
            HeaderTest::Range { start, end } => {
                value.parse::<i64>().is_ok_and(|n| *start <= n && n < *end)
            }
            HeaderTest::String(m) => m.matches(&value),
            HeaderTest::Present(_) => false,
        };
        self.invert ^ matched
    }
}

/// Whether every matcher matches (none matches every request).
pub fn all_headers_match(matchers: &[HeaderMatcher], request: &Downstream<'_>) -> bool {
    matchers.iter().all(|m| m.matches(request))
}

/// `QueryParameterMatcher`.
#[derive(Debug, Clone)]
pub struct QueryParameterMatcher {
    name: String,
    test: Option<QueryTest>,
}

#[derive(Debug, Clone)]
enum QueryTest {
    Present,
    String(StringMatcher),
}

impl QueryParameterMatcher {
    pub(crate) fn parse(node: &Node<'_>) -> Result<QueryParameterMatcher, ConfigError> {
        node.only(
            &["name", "string_match", "present_match"],
            "a query parameter matcher",
        )?;
        let name = node
            .string("name")?
            .ok_or_else(|| node.error("`name` is required here"))?
            .to_owned();
        let test = match (node.field("string_match"), node.bool("present_match")?) {
            (Some(m), None) => Some(QueryTest::String(StringMatcher::parse(&m)?)),
            (None, Some(true)) => Some(QueryTest::Present),
            (None, Some(false) | None) => None,
            (Some(_), Some(_)) => {
                return Err(node.error(
                    "a query parameter matcher takes `string_match` or `present_match`, not both",
                ));
            }
        };
        Ok(QueryParameterMatcher { name, test })
    }

    /// Whether the request's first value of the parameter matches; with no test, a parameter
    /// that is present with an empty value matches.
    pub fn matches(&self, request: &Downstream<'_>) -> bool {
        let Some(value) = request.query_parameter(&self.name) else {
            return false;
        };
        match &self.test {
            Some(QueryTest::Present) => true,
            Some(QueryTest::String(m)) => m.matches(&value),
            None => value.is_empty(),
        }
    }
}
