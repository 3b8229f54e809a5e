//! A plain HTTP/1.1 client for tests: one request per connection (`Connection: close`), so
//! that an Envoy with several workers spreads a test's requests over all of them, as the
//! kernel spreads connections.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::HarnessError;

/// How long a request may take before the client gives up.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What came back.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The header fields, names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// GETs `path` from `addr` with `headers` (besides `Host` and `Connection: close`).
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Answer, HarnessError> {
    request(addr, "GET", path, headers)
}

/// The sum of the samples of metric `name` (whatever their labels) on `addr`'s `/metrics`
/// (Prometheus text); 0 when it has none.
pub fn metric(addr: SocketAddr, name: &str) -> Result<f64, HarnessError> {
    let page = get(addr, "/metrics", &[])?.text();
    Ok(page
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// As [`get`], from the local address `source` (on loopback, any of 127.0.0.0/8): a client of
/// its own to an Envoy that tells clients apart by address.
pub fn get_from(
    source: IpAddr,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, HarnessError> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&addr.into(), TIMEOUT)?;
    exchange(socket.into(), addr, "GET", path, headers)
}

/// Sends one request without a body and reads the whole answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, HarnessError> {
    exchange(
        TcpStream::connect_timeout(&addr, TIMEOUT)?,
        addr,
        method,
        path,
        headers,
    )
}

fn exchange(
    mut stream: TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, HarnessError> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("connection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    let raw = read_answer(&mut stream)?;
    parse(&raw).ok_or_else(|| {
        HarnessError::Envoy(format!(
            "{method} {path} at {addr}: not an HTTP/1.1 answer: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        ))
    })
}

/// Reads one answer: to the end of its body as its framing says (Content-Length, or the last
/// chunk), else to the end of the connection. Not waiting for the close matters: Envoy closes
/// a `connection: close` exchange only after its delayed-close timeout (1 s) for some answers.
fn read_answer(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if let Some(end) = complete_length(&raw) {
            raw.truncate(end);
            return Ok(raw);
        }
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buffer[..n]);
    }
}

/// Where the answer in `raw` ends, once all of it has arrived and its framing says so.
fn complete_length(raw: &[u8]) -> Option<usize> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&raw[..head_end])
        .ok()?
        .to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    if let Some(length) = field("content-length").and_then(|v| v.parse::<usize>().ok()) {
        return (raw.len() >= head_end + length).then_some(head_end + length);
    }
    if field("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let body = &raw[head_end..];
        return body
            .windows(5)
            .position(|w| w == b"0\r\n\r\n")
            .filter(|&at| at == 0 || body[..at].ends_with(b"\r\n"))
            .map(|at| head_end + at + 5);
    }
    None
}

fn parse(raw: &[u8]) -> Option<Answer> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Some(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}
