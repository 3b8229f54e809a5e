//! Tab-separated access logs with a header row naming the columns, as the NASA-HTTP trace
//! is published:
//!
//! ```text
//! host<TAB>logname<TAB>time<TAB>method<TAB>url<TAB>response<TAB>bytes<TAB>referer<TAB>useragent
//! pppa006.compuserve.com<TAB>-<TAB>807256800<TAB>GET<TAB>/images/launch-logo.gif<TAB>200<TAB>1713<TAB><TAB>
//! ```
//!
//! Columns are found by name (common spellings accepted); `time` is seconds since the epoch
//! (fractions allowed) or RFC 3339. Columns nobody needs are ignored.

use super::record::{
    TraceRecord, checked_method, checked_status, checked_target, time_from_rfc3339,
    time_from_seconds,
};

const CLIENT: &[&str] = &["host", "client", "client_ip", "ip", "remote_addr"];
const TIME: &[&str] = &["time", "timestamp", "start_time"];
const METHOD: &[&str] = &["method", "request_method"];
const PATH: &[&str] = &["url", "path", "uri", "request_uri"];
const STATUS: &[&str] = &["response", "status", "response_code"];
const BYTES: &[&str] = &["bytes", "size", "bytes_sent"];
const REFERER: &[&str] = &["referer", "referrer"];
const USER_AGENT: &[&str] = &["useragent", "user_agent", "user-agent"];

/// Which column holds what, read from the header row.
#[derive(Debug, Clone)]
pub(super) struct Columns {
    client: usize,
    time: usize,
    path: usize,
    method: Option<usize>,
    status: Option<usize>,
    bytes: Option<usize>,
    referer: Option<usize>,
    user_agent: Option<usize>,
}

fn find(names: &[String], wanted: &[&str]) -> Option<usize> {
    names
        .iter()
        .position(|n| wanted.iter().any(|w| n.eq_ignore_ascii_case(w)))
}

/// Whether `line` is a header row this reader understands.
pub(super) fn looks_like_header(line: &str) -> bool {
    line.contains('\t') && Columns::from_header(line).is_ok()
}

impl Columns {
    /// The columns a header row names; an error says which needed column is missing.
    pub(super) fn from_header(line: &str) -> Result<Columns, String> {
        let names: Vec<String> = line.split('\t').map(|n| n.trim().to_owned()).collect();
        let needed = |wanted: &[&str], what: &str| {
            find(&names, wanted).ok_or_else(|| {
                format!(
                    "the header row has no {what} column (one of {}); it has {}",
                    wanted.join(", "),
                    names.join(", ")
                )
            })
        };
        Ok(Columns {
            client: needed(CLIENT, "client")?,
            time: needed(TIME, "time")?,
            path: needed(PATH, "path")?,
            method: find(&names, METHOD),
            status: find(&names, STATUS),
            bytes: find(&names, BYTES),
            referer: find(&names, REFERER),
            user_agent: find(&names, USER_AGENT),
        })
    }

    pub(super) fn parse_line(&self, line: &str) -> Result<TraceRecord, String> {
        let cells: Vec<&str> = line.split('\t').collect();
        let cell = |i: usize| {
            cells
                .get(i)
                .map(|c| c.trim())
                .filter(|c| !c.is_empty() && *c != "-")
        };
        let needed =
            |i: usize, what: &str| cell(i).ok_or_else(|| format!("no {what} (column {})", i + 1));
        let time_text = needed(self.time, "time")?;
        let time_us = match time_text.parse::<f64>() {
            Ok(seconds) => time_from_seconds(seconds)?,
            Err(_) => time_from_rfc3339(time_text)?,
        };
        let status = match self.status.and_then(cell) {
            None => 200,
            Some(s) => checked_status(s, "response")?,
        };
        let bytes = match self.bytes.and_then(cell) {
            None => 0,
            Some(b) => b
                .parse()
                .map_err(|_| format!("bytes `{b}` is not a number"))?,
        };
        let mut headers = Vec::new();
        if let Some(referer) = self.referer.and_then(cell) {
            headers.push(("referer".to_owned(), referer.to_owned()));
        }
        if let Some(agent) = self.user_agent.and_then(cell) {
            headers.push(("user-agent".to_owned(), agent.to_owned()));
        }
        Ok(TraceRecord {
            line: 0,
            time_us,
            client: needed(self.client, "client")?.to_owned(),
            method: match self.method.and_then(cell) {
                Some(m) => checked_method(m.to_owned())?,
                None => "GET".to_owned(),
            },
            target: checked_target(needed(self.path, "path")?.to_owned())?,
            host: None,
            status,
            bytes,
            headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "host\tlogname\ttime\tmethod\turl\tresponse\tbytes\treferer\tuseragent";

    #[test]
    fn reads_the_nasa_layout() {
        let columns = Columns::from_header(HEADER).unwrap();
        let r = columns
            .parse_line(
                "pppa006.compuserve.com\t-\t807256800\tGET\t/images/launch-logo.gif\t200\t1713\t\t",
            )
            .unwrap();
        assert_eq!(r.client, "pppa006.compuserve.com");
        assert_eq!(r.time_us, 807_256_800_000_000);
        assert_eq!(
            (r.method.as_str(), r.target.as_str()),
            ("GET", "/images/launch-logo.gif")
        );
        assert_eq!((r.status, r.bytes), (200, 1713));
        assert!(r.headers.is_empty());
    }

    #[test]
    fn errors_name_the_column() {
        let err = Columns::from_header("host\tmethod\turl").unwrap_err();
        assert!(err.contains("no time column"), "{err}");
        let columns = Columns::from_header(HEADER).unwrap();
        for (line, expected) in [
            ("h\t-\tlater\tGET\t/\t200\t1", "time `later`"),
            ("h\t-\t807256800\tGET\t/\tok\t1", "response `ok`"),
            ("h\t-\t807256800\tGET", "no path (column 5)"),
            ("h\t-\t807256800\tget\t/\t200\t1", "method `get`"),
        ] {
            let err = columns.parse_line(line).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }
}
