//! A trace request as Envoy's connection manager hands it to the filters: headers with the
//! pseudo-headers, and the downstream address it settled on from the peer and
//! `x-forwarded-for`.

use std::net::IpAddr;

/// How the connection manager finds the client's address
/// (`use_remote_address`, `xff_num_trusted_hops`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Take the connection's peer as the client, not `x-forwarded-for`.
    pub use_remote_address: bool,
    /// Proxies in front of Envoy whose `x-forwarded-for` entries are trusted.
    pub xff_num_trusted_hops: u32,
}

impl AddressPolicy {
    /// The downstream remote address of a request from `peer` carrying `xff` (every
    /// `x-forwarded-for` value joined by `,`), as Envoy's connection manager settles it: with
    /// `use_remote_address`, the peer, or with N trusted hops the Nth entry from the right of
    /// `x-forwarded-for`; without, the (N+1)th entry from the right. An entry that is missing
    /// or not an address leaves the peer.
    pub fn remote_address(self, peer: IpAddr, xff: Option<&str>) -> IpAddr {
        let from_right = match (self.use_remote_address, self.xff_num_trusted_hops) {
            (true, 0) => return peer,
            (true, n) => n as usize,
            (false, n) => n as usize + 1,
        };
        let Some(xff) = xff else {
            return peer;
        };
        let entries: Vec<&str> = xff.split(',').map(str::trim).collect();
        entries
            .len()
            .checked_sub(from_right)
            .and_then(|i| entries[i].parse().ok())
            .unwrap_or(peer)
    }
}

impl AddressPolicy {
    /// A request with `headers` from `peer`, with the client address this policy settles on.
    pub fn downstream(self, headers: &[(String, String)], peer: IpAddr) -> Downstream<'_> {
        let xff = Downstream {
            headers,
            remote: peer,
        }
        .header_joined("x-forwarded-for");
        Downstream {
            headers,
            remote: self.remote_address(peer, xff.as_deref()),
        }
    }
}

/// One request, as the filters see it.
#[derive(Debug, Clone)]
pub struct Downstream<'a> {
    /// Lower-cased names, pseudo-headers (`:authority`, `:path`, `:method`) included.
    pub headers: &'a [(String, String)],
    /// The address the connection manager settled on.
    pub remote: IpAddr,
}

impl Downstream<'_> {
    /// Every value of header `name`, joined by `,` as Envoy joins them for a matcher.
    pub fn header_joined(&self, name: &str) -> Option<String> {
        let mut values = self
            .headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str());
        let first = values.next()?;
        Some(values.fold(first.to_owned(), |mut all, v| {
            all.push(',');
            all.push_str(v);
            all
        }))
    }

    /// The first value of header `name`, as a rate limit action reads it.
    pub fn header_first(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query and fragment, as routes match it.
    pub fn path(&self) -> &str {
        let target = self.header_first(":path").unwrap_or("/");
        let end = target.find(['?', '#']).unwrap_or(target.len());
        &target[..end]
    }

    /// The host, lower-cased, as virtual hosts match it.
    pub fn host(&self) -> String {
        self.header_first(":authority")
            .unwrap_or_default()
            .to_ascii_lowercase()
    }

    /// The first value of query parameter `name`, percent-decoded.
    pub fn query_parameter(&self, name: &str) -> Option<String> {
        let target = self.header_first(":path")?;
        let query = target.split_once('?')?.1;
        let query = query.split('#').next().unwrap_or_default();
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key) == name).then(|| percent_decode(value))
        })
    }
}

/// `%XX` decoded; anything that is not a whole escape is kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_client_address_follows_the_connection_managers_rules() {
        let peer = ip("198.51.100.1");
        let xff = Some("192.0.2.10, 203.0.113.1");
        let policy = |use_remote_address, hops| AddressPolicy {
            use_remote_address,
            xff_num_trusted_hops: hops,
        };
        assert_eq!(policy(true, 0).remote_address(peer, xff), peer);
        assert_eq!(policy(true, 1).remote_address(peer, xff), ip("203.0.113.1"));
        assert_eq!(policy(true, 2).remote_address(peer, xff), ip("192.0.2.10"));
        assert_eq!(policy(true, 3).remote_address(peer, xff), peer);
        assert_eq!(
            policy(false, 0).remote_address(peer, xff),
            ip("203.0.113.1")
        );
        assert_eq!(policy(false, 1).remote_address(peer, xff), ip("192.0.2.10"));
        assert_eq!(policy(false, 0).remote_address(peer, None), peer);
        assert_eq!(policy(false, 0).remote_address(peer, Some("unknown")), peer);
    }

    #[test]
    fn query_parameters_are_read_decoded_and_first_wins() {
        let headers = vec![(":path".to_owned(), "/a?x=1&k=a%20b&k=2#frag".to_owned())];
        let request = Downstream {
            headers: &headers,
            remote: ip("192.0.2.1"),
        };
        assert_eq!(request.query_parameter("k").as_deref(), Some("a b"));
        assert_eq!(request.query_parameter("x").as_deref(), Some("1"));
        assert_eq!(request.query_parameter("y"), None);
        assert_eq!(request.path(), "/a");
    }
}
