//! nginx/Apache "combined" access logs:
//!
//! ```text
//! 203.0.113.7 - - [22/Jan/2019:03:56:14 +0330] "GET /a?b=1 HTTP/1.1" 200 30577 "-" "curl/8" "-"
//! ```
//!
//! Fields after the user agent are optional and may be many; the first one, when it is an
//! address list, is taken as `X-Forwarded-For` (as in nginx configurations that log it).

use super::record::{TraceRecord, checked_method, checked_status, checked_target};

struct Fields<'a> {
    rest: &'a str,
}

impl<'a> Fields<'a> {
    fn skip_spaces(&mut self) {
        self.rest = self.rest.trim_start_matches(' ');
    }

    fn word(&mut self, what: &str) -> Result<&'a str, String> {
        self.skip_spaces();
        let end = self.rest.find(' ').unwrap_or(self.rest.len());
        let (word, rest) = self.rest.split_at(end);
        if word.is_empty() {
            return Err(format!("missing {what}"));
        }
        self.rest = rest;
        Ok(word)
    }

    fn delimited(&mut self, open: char, close: char, what: &str) -> Result<String, String> {
        self.skip_spaces();
        let mut chars = self.rest.char_indices();
        match chars.next() {
            Some((_, c)) if c == open => {}
            _ => return Err(format!("expected {what} in {open}{close}")),
        }
        let mut value = String::new();
        let mut escaped = false;
        for (i, c) in chars {
            if escaped {
                value.push(c);
                escaped = false;
            } else if c == '\\' && open == '"' {
                escaped = true;
            } else if c == close {
                self.rest = &self.rest[i + c.len_utf8()..];
                return Ok(value);
            } else {
                value.push(c);
            }
        }
        Err(format!("unterminated {what}"))
    }

    fn at_end(&mut self) -> bool {
        self.skip_spaces();
        self.rest.is_empty()
    }
}

pub(super) fn parse_line(line: &str) -> Result<TraceRecord, String> {
    let mut f = Fields {
        rest: line.trim_end(),
    };
    let client = f.word("client address")?.to_owned();
    f.word("identity")?;
    f.word("user")?;
    let time_text = f.delimited('[', ']', "time")?;
    let time = chrono::DateTime::parse_from_str(&time_text, "%d/%b/%Y:%H:%M:%S %z")
        .map_err(|e| format!("time `{time_text}`: {e} (expected 22/Jan/2019:03:56:14 +0330)"))?;
    let request = f.delimited('"', '"', "request line")?;
    let mut parts = request.splitn(3, ' ');
    let checked = match (parts.next(), parts.next()) {
        (Some(m), Some(t)) => checked_method(m.to_owned())
            .ok()
            .zip(checked_target(t.to_owned()).ok()),
        _ => None,
    };
    let Some((method, target)) = checked else {
        return Err(format!(
            "request line `{request}` is not `METHOD /path PROTOCOL`"
        ));
    };
    let status_text = f.word("status")?;
    let status = checked_status(status_text, "status")?;
    let bytes_text = f.word("size")?;
    let bytes = if bytes_text == "-" {
        0
    } else {
        bytes_text
            .parse()
            .map_err(|_| format!("size `{bytes_text}` is not a number"))?
    };
    let mut headers = Vec::new();
    if !f.at_end() {
        let referer = f.delimited('"', '"', "referer")?;
        let agent = f.delimited('"', '"', "user agent")?;
        if referer != "-" {
            headers.push(("referer".to_owned(), referer));
        }
        if agent != "-" {
            headers.push(("user-agent".to_owned(), agent));
        }
        if !f.at_end() {
            let forwarded = f.delimited('"', '"', "extra field")?;
            if forwarded != "-"
                && forwarded
                    .split(',')
                    .all(|a| a.trim().parse::<std::net::IpAddr>().is_ok())
            {
                headers.push(("x-forwarded-for".to_owned(), forwarded));
            }
        }
    }
    Ok(TraceRecord {
        line: 0,
        time_us: time.timestamp_micros(),
        client,
        method,
        target,
        host: None,
        status,
        bytes,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_combined_lines_with_extra_fields() {
        let r = parse_line(r#"54.36.149.41 - - [22/Jan/2019:03:56:14 +0330] "GET /filter/a%20b?x=1 HTTP/1.1" 200 30577 "-" "Mozilla/5.0 (compatible; \"Bot\")" "1.2.3.4, 5.6.7.8""#).unwrap();
        assert_eq!(r.client, "54.36.149.41");
        assert_eq!(r.time_us, 1_548_116_774_000_000);
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.status, r.bytes),
            ("GET", "/filter/a%20b?x=1", 200, 30577)
        );
        assert_eq!(
            r.headers,
            [
                (
                    "user-agent".to_owned(),
                    "Mozilla/5.0 (compatible; \"Bot\")".to_owned()
                ),
                ("x-forwarded-for".to_owned(), "1.2.3.4, 5.6.7.8".to_owned()),
            ]
        );
    }

    #[test]
    fn reads_common_log_lines_without_referer_and_agent() {
        let r = parse_line(
            r#"host.example - - [01/Aug/1995:00:00:01 -0400] "GET /images/a.gif HTTP/1.0" 304 -"#,
        )
        .unwrap();
        assert_eq!((r.status, r.bytes), (304, 0));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("", "missing client address"),
            (
                r#"1.2.3.4 - - 22/Jan/2019 "GET / HTTP/1.1" 200 1"#,
                "expected time in []",
            ),
            (
                r#"1.2.3.4 - - [22/Jan/2019:03:56:14] "GET / HTTP/1.1" 200 1"#,
                "time `22/Jan/2019:03:56:14`",
            ),
            (
                r#"1.2.3.4 - - [22/Jan/2019:03:56:14 +0000] "\x16\x03" 400 1"#,
                "is not `METHOD /path PROTOCOL`",
            ),
            (
                r#"1.2.3.4 - - [22/Jan/2019:03:56:14 +0000] "GET / HTTP/1.1" OK 1"#,
                "status `OK`",
            ),
            (
                r#"1.2.3.4 - - [22/Jan/2019:03:56:14 +0000] "GET / HTTP/1.1" 200 1 "-" "unterminated"#,
                "unterminated user agent",
            ),
        ];
        for (line, expected) in cases {
            let err = parse_line(line).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }
}
