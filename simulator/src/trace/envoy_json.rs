//! Envoy's JSON access logs (`json_format`), one object per line, as Envoy, Istio and Envoy
//! Gateway write them:
//!
//! ```text
//! {"start_time":"2024-05-01T12:00:00.250Z","method":"GET","path":"/api/items?page=2",
//!  "protocol":"HTTP/1.1","response_code":200,"bytes_sent":512,"authority":"api.example.com",
//!  "downstream_remote_address":"203.0.113.7:51234","x_forwarded_for":null,
//!  "user_agent":"curl/8.5.0","request_id":"5d1c..."}
//! ```
//!
//! Every deployment names its keys itself, so each field is looked for under the names the
//! common formats use (the first present wins). A value of `null` or `"-"` is absent, as Envoy
//! writes a missing value. Keys that mean nothing here are ignored.

use serde_json::{Map, Value};

use super::record::{
    TraceRecord, checked_method, checked_status, checked_target, time_from_rfc3339,
    time_from_seconds,
};

const TIME: &[&str] = &["start_time", "timestamp", "@timestamp", "time"];
const CLIENT: &[&str] = &[
    "downstream_remote_address",
    "downstream_direct_remote_address",
    "client_ip",
    "remote_address",
];
const METHOD: &[&str] = &["method", ":method", "request_method"];
const PATH: &[&str] = &[
    "path",
    ":path",
    "x-envoy-origin-path",
    "x_envoy_original_path",
    "x-envoy-original-path",
    "request_path",
];
const AUTHORITY: &[&str] = &["authority", ":authority", "host"];
const STATUS: &[&str] = &["response_code", "status", "status_code"];
const BYTES: &[&str] = &["bytes_sent", "response_size", "body_bytes_sent"];
/// Request headers a rule may key on, by the names formats log them under.
const HEADERS: &[(&str, &[&str])] = &[
    ("user-agent", &["user_agent", "user-agent", "useragent"]),
    ("referer", &["referer", "referrer"]),
    ("x-forwarded-for", &["x_forwarded_for", "x-forwarded-for"]),
    (
        "x-request-id",
        &["request_id", "x-request-id", "x_request_id"],
    ),
];

/// Whether a JSON object looks like an Envoy access log line rather than sluice's own format.
pub(super) fn looks_like(object: &Map<String, Value>) -> bool {
    !(object.contains_key("client") && object.contains_key("time"))
        && [TIME, CLIENT, PATH]
            .iter()
            .all(|names| names.iter().any(|n| object.contains_key(*n)))
}

/// The value under the first of `names` that is present and not `null` or `"-"`.
fn field<'a>(object: &'a Map<String, Value>, names: &[&str]) -> Option<&'a Value> {
    names.iter().find_map(|n| match object.get(*n) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "-" || s.is_empty() => None,
        Some(v) => Some(v),
    })
}

fn text(object: &Map<String, Value>, names: &[&str]) -> Option<String> {
    field(object, names).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

fn required(object: &Map<String, Value>, names: &[&str], what: &str) -> Result<String, String> {
    text(object, names).ok_or_else(|| format!("no {what}: expected one of {}", names.join(", ")))
}

fn number(object: &Map<String, Value>, names: &[&str], what: &str) -> Result<Option<u64>, String> {
    match field(object, names) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{what} {n} is not a whole number")),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| format!("{what} `{s}` is not a number")),
        Some(other) => Err(format!("{what} {other} is not a number")),
    }
}

/// The address without its port: `203.0.113.7:51234` → `203.0.113.7`, `[2001:db8::1]:443` →
/// `2001:db8::1`. A value that is not an address is kept as it is (an opaque client).
fn without_port(address: &str) -> String {
    if let Ok(socket) = address.parse::<std::net::SocketAddr>() {
        return socket.ip().to_string();
    }
    address.to_owned()
}

pub(super) fn parse_line(line: &str) -> Result<TraceRecord, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let Value::Object(object) = value else {
        return Err("not a JSON object".to_owned());
    };
    let time_us = match field(&object, TIME) {
        Some(Value::Number(n)) => time_from_seconds(n.as_f64().unwrap_or(f64::NAN))?,
        Some(Value::String(t)) => time_from_rfc3339(t)?,
        Some(other) => return Err(format!("time {other} is neither RFC 3339 nor seconds")),
        None => return Err(format!("no time: expected one of {}", TIME.join(", "))),
    };
    let client = without_port(&required(&object, CLIENT, "client address")?);
    let target = checked_target(required(&object, PATH, "path")?)?;
    let method = match text(&object, METHOD) {
        Some(m) => checked_method(m)?,
        None => "GET".to_owned(),
    };
    let status = match number(&object, STATUS, "response code")? {
        None => 200,
        // Envoy logs 0 for a request that never got a response (a reset).
        Some(0) => 0,
        Some(s) => checked_status(&s.to_string(), "response code")?,
    };
    let bytes = number(&object, BYTES, "bytes sent")?.unwrap_or(0);
    let headers = HEADERS
        .iter()
        .filter_map(|(header, names)| Some(((*header).to_owned(), text(&object, names)?)))
        .collect();
    Ok(TraceRecord {
        line: 0,
        time_us,
        client,
        method,
        target,
        host: text(&object, AUTHORITY),
        status,
        bytes,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_envoys_default_json_keys() {
        let r = parse_line(r#"{"start_time":"2024-05-01T12:00:00.250Z","method":"POST","path":"/api/items?page=2","protocol":"HTTP/1.1","response_code":201,"response_flags":"-","bytes_sent":512,"authority":"api.example.com","downstream_remote_address":"203.0.113.7:51234","x_forwarded_for":null,"user_agent":"curl/8.5.0","request_id":"abc"}"#).unwrap();
        assert_eq!(r.time_us, 1_714_564_800_250_000);
        assert_eq!(
            (r.client.as_str(), r.method.as_str(), r.target.as_str()),
            ("203.0.113.7", "POST", "/api/items?page=2")
        );
        assert_eq!((r.status, r.bytes), (201, 512));
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(
            r.headers,
            [
                ("user-agent".to_owned(), "curl/8.5.0".to_owned()),
                ("x-request-id".to_owned(), "abc".to_owned())
            ]
        );
    }

    #[test]
    fn reads_envoy_gateway_keys_and_ipv6_peers() {
        let r = parse_line(r#"{"start_time":"2024-05-01T12:00:00Z",":authority":"a.example","x-envoy-origin-path":"/x","method":"GET","response_code":"200","downstream_remote_address":"[2001:db8::1]:443","x-forwarded-for":"198.51.100.1"}"#).unwrap();
        assert_eq!(r.client, "2001:db8::1");
        assert_eq!(r.target, "/x");
        assert_eq!(r.host.as_deref(), Some("a.example"));
        assert_eq!(
            r.headers,
            [("x-forwarded-for".to_owned(), "198.51.100.1".to_owned())]
        );
    }

    #[test]
    fn errors_name_the_missing_field() {
        for (line, expected) in [
            (
                r#"{"start_time":"2024-05-01T12:00:00Z","path":"/"}"#,
                "no client address: expected one of downstream_remote_address",
            ),
            (
                r#"{"start_time":"2024-05-01T12:00:00Z","downstream_remote_address":"1.2.3.4:1"}"#,
                "no path",
            ),
            (
                r#"{"start_time":"soon","downstream_remote_address":"1.2.3.4:1","path":"/"}"#,
                "time `soon`",
            ),
            (
                r#"{"start_time":"2024-05-01T12:00:00Z","downstream_remote_address":"1.2.3.4:1","path":"/","response_code":"OK"}"#,
                "response code `OK`",
            ),
            ("[1, 2]", "not a JSON object"),
        ] {
            let err = parse_line(line).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }
}
