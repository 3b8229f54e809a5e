//! The parts of an HTTP request that rules look at, as the filter reads them from Envoy.

use std::borrow::Cow;
use std::net::IpAddr;

/// One header: its lower-case name and its raw value.
pub type Header<'a> = (Cow<'a, str>, Cow<'a, [u8]>);

/// A request's header list. Natively, the few headers a policy names are held inline: the
/// native module reads them in place, per request, and allocates nothing for them. In the
/// .wasm a `Vec`: there an allocation is a small part of a host call, and the inline list's
/// code would cost the module's size more.
#[cfg(not(target_arch = "wasm32"))]
pub type Headers<'a> = smallvec::SmallVec<[Header<'a>; 4]>;
/// See the native definition.
#[cfg(target_arch = "wasm32")]
pub type Headers<'a> = Vec<Header<'a>>;

/// A request's headers (lower-case names, raw byte values, pseudo-headers included) and the
/// address of the peer that sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRequest<'a> {
    /// Header pairs in arrival order; a name may repeat. A name can borrow the policy's own
    /// copy when the filter reads only the headers the policy names, and a value the host's
    /// header map, where the host lends it for as long as the request is read.
    pub headers: Headers<'a>,
    /// Envoy's `source.address` property: `ip:port`, or `[v6]:port`.
    pub source_address: Option<String>,
}

impl HttpRequest<'_> {
    /// The first value of header `name` (lower-case), as Envoy's header map returns it.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// Every value of header `name`, in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// `:method`.
    pub fn method(&self) -> &[u8] {
        self.header(":method").unwrap_or_default()
    }

    /// `:path` without its query string.
    pub fn path(&self) -> &[u8] {
        let full = self.header(":path").unwrap_or_default();
        match full.iter().position(|&b| b == b'?') {
            Some(q) => &full[..q],
            None => full,
        }
    }

    /// The query string of `:path`, without the `?`.
    pub fn query(&self) -> &[u8] {
        let full = self.header(":path").unwrap_or_default();
        match full.iter().position(|&b| b == b'?') {
            Some(q) => &full[q + 1..],
            None => &[],
        }
    }

    /// The first value of query parameter `name`, still percent-encoded as sent.
    pub fn query_param(&self, name: &str) -> Option<&[u8]> {
        self.query().split(|&b| b == b'&').find_map(|pair| {
            let (k, v) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &pair[pair.len()..]),
            };
            (k == name.as_bytes()).then_some(v)
        })
    }

    /// `:authority` (or `host`), lower-cased, without a port.
    pub fn host(&self) -> Vec<u8> {
        let raw = self
            .header(":authority")
            .or_else(|| self.header("host"))
            .unwrap_or_default();
        let without_port = if raw.first() == Some(&b'[') {
            // [v6]:port
            match raw.iter().position(|&b| b == b']') {
                Some(end) => &raw[..=end],
                None => raw,
            }
        } else {
            match raw.iter().rposition(|&b| b == b':') {
                Some(colon) => &raw[..colon],
                None => raw,
            }
        };
        without_port.to_ascii_lowercase()
    }

    /// `source.address` without its port (and an IPv6 address without its brackets).
    fn peer_host(&self) -> Option<&str> {
        let address = self.source_address.as_deref()?;
        if let Some(rest) = address.strip_prefix('[') {
            return rest.split(']').next();
        }
        Some(address.rsplit_once(':').map_or(address, |(ip, _port)| ip))
    }

    /// The client's IP address: the peer's, unless `trusted_hops` proxies in front of Envoy
    /// append to `x-forwarded-for`; then the entry the outermost trusted proxy appended.
    /// Entries a client wrote itself sit further left and are never read. A request with fewer
    /// entries than trusted hops did not come through those proxies: its peer is the client.
    /// An entry is read as an address alone, with a port (`192.0.2.1:5555`), bracketed
    /// (`[2001:db8::1]`, `[2001:db8::1]:443`) or with an IPv6 zone (`fe80::1%eth0`, the zone
    /// dropped). An entry that is none of these (a proxy's `unknown`, garbage) falls back to
    /// the peer, as [`ClientIp::fallback`] says: the request is limited by the peer's key, never
    /// let through unlimited.
    pub fn client_ip(&self, trusted_hops: u32) -> Option<IpAddr> {
        let ClientAddress { text, .. } = self.client_address(trusted_hops)?;
        text.parse().ok()
    }

    /// The client's IP address (see [`HttpRequest::client_ip`]) in canonical text, as keys hold
    /// it: borrowed from the request when it already writes it so (Envoy's `source.address`
    /// does, and proxies' `x-forwarded-for` entries mostly do), parsed and written again
    /// otherwise.
    pub fn client_ip_text(&self, trusted_hops: u32) -> Option<ClientIp<'_>> {
        let ClientAddress { text, fallback } = self.client_address(trusted_hops)?;
        let text = if is_canonical_ipv4(text.as_bytes()) {
            Cow::Borrowed(text)
        } else {
            Cow::Owned(match text.parse().ok()? {
                IpAddr::V4(v4) => crate::key::dotted_quad(v4),
                IpAddr::V6(v6) => v6.to_string(),
            })
        };
        Some(ClientIp { text, fallback })
    }

    /// The text the client's IP address is read from: the host of `source.address` or the
    /// address in one `x-forwarded-for` entry, not yet parsed.
    fn client_address(&self, trusted_hops: u32) -> Option<ClientAddress<'_>> {
        let peer = || {
            Some(ClientAddress {
                text: self.peer_host()?,
                fallback: false,
            })
        };
        if trusted_hops == 0 {
            return peer();
        }
        let entries: Vec<&[u8]> = self
            .header_values("x-forwarded-for")
            .flat_map(|v| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        let hops = trusted_hops as usize;
        if entries.len() < hops {
            return peer();
        }
        match std::str::from_utf8(entries[entries.len() - hops])
            .ok()
            .and_then(forwarded_address)
        {
            Some(text) => Some(ClientAddress {
                text,
                fallback: false,
            }),
            None => Some(ClientAddress {
                text: self.peer_host()?,
                fallback: true,
            }),
        }
    }
}

/// The client's address in canonical text, and whether it is the peer's for want of a
/// readable `x-forwarded-for` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp<'a> {
    /// The address, as keys hold it.
    pub text: Cow<'a, str>,
    /// The trusted `x-forwarded-for` entry could not be read as an address: this is the
    /// peer's.
    pub fallback: bool,
}

/// [`ClientIp`] before it is parsed.
struct ClientAddress<'a> {
    text: &'a str,
    fallback: bool,
}

/// The address in one `x-forwarded-for` entry, in the forms proxies write: `ip`, `ipv4:port`,
/// `[ipv6]`, `[ipv6]:port`, `ipv6%zone`; `None` for anything else.
fn forwarded_address(entry: &str) -> Option<&str> {
    let address = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside
    } else if entry.matches(':').count() == 1 {
        let (host, port) = entry.split_once(':')?;
        if !is_port(port) {
            return None;
        }
        host
    } else {
        entry
    };
    let address = address.split_once('%').map_or(address, |(ip, _zone)| ip);
    address.parse::<IpAddr>().is_ok().then_some(address)
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is an IPv4 address exactly as `Ipv4Addr`'s `Display` writes it: four
/// decimal octets of at most 255, without leading zeros, joined by dots.
fn is_canonical_ipv4(text: &[u8]) -> bool {
    let mut octets = 0;
    for octet in text.split(|&b| b == b'.') {
        octets += 1;
        let canonical = match *octet {
            [d] => d.is_ascii_digit(),
            [b'1'..=b'9', d] => d.is_ascii_digit(),
            [b'1', d, e] => d.is_ascii_digit() && e.is_ascii_digit(),
            [b'2', b'0'..=b'4', e] => e.is_ascii_digit(),
            [b'2', b'5', b'0'..=b'5'] => true,
            _ => false,
        };
        if !canonical || octets > 4 {
            return false;
        }
    }
    octets == 4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)], source: &str) -> HttpRequest<'static> {
        HttpRequest {
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string().into(), v.as_bytes().to_vec().into()))
                .collect(),
            source_address: Some(source.to_owned()),
        }
    }

    #[test]
    fn splits_path_query_and_host() {
        let r = request(
            &[
                (":path", "/a/b?x=1&tenant=acme&y"),
                (":authority", "API.example.com:8443"),
            ],
            "10.0.0.1:5000",
        );
        assert_eq!(r.path(), b"/a/b");
        assert_eq!(r.query_param("tenant"), Some(&b"acme"[..]));
        assert_eq!(r.query_param("y"), Some(&b""[..]));
        assert_eq!(r.query_param("z"), None);
        assert_eq!(r.host(), b"api.example.com");
    }

    #[test]
    fn peer_addresses_lose_their_port() {
        assert_eq!(
            request(&[], "192.0.2.1:443").client_ip(0),
            Some("192.0.2.1".parse().unwrap())
        );
        assert_eq!(
            request(&[], "[2001:db8::1]:443").client_ip(0),
            Some("2001:db8::1".parse().unwrap())
        );
    }

    /// The peer's address as a key holds it, when borrowed from `source.address`.
    fn borrowed_peer<'r>(r: &'r HttpRequest<'_>) -> Option<&'r str> {
        match r.client_ip_text(0)?.text {
            Cow::Borrowed(ip) => Some(ip),
            Cow::Owned(_) => None,
        }
    }

    #[test]
    fn only_canonical_ipv4_peers_are_borrowed() {
        let peer = |address: &str| borrowed_peer(&request(&[], address)).map(str::to_owned);
        assert_eq!(peer("192.0.2.1:443").as_deref(), Some("192.0.2.1"));
        assert_eq!(peer("0.0.0.0").as_deref(), Some("0.0.0.0"));
        assert_eq!(
            peer("255.255.255.255:1").as_deref(),
            Some("255.255.255.255")
        );
        for odd in [
            "192.0.2.01:443",
            "256.0.0.1:1",
            "1.2.3:1",
            "1.2.3.4.5:1",
            "1..2.3:1",
            "[2001:db8::1]:443",
            "1.2.3.4 :1",
            "",
        ] {
            assert_eq!(peer(odd), None, "{odd}");
        }
    }

    proptest::proptest! {
        /// Borrowed exactly when parsing and writing the address again gives the same text:
        /// a key never differs by which path built it.
        #[test]
        fn the_borrowed_peer_is_the_parsed_one_written_again(
            address in "(0?[0-9]{1,3}[.]){3}0?[0-9]{1,3}(:[0-9]{0,5})?|[0-9.:]{0,20}",
            octets in proptest::array::uniform4(0u8..),
            port in 0u16..,
        ) {
            let dotted = std::net::Ipv4Addr::from(octets).to_string();
            let r = request(&[], &format!("{dotted}:{port}"));
            proptest::prop_assert_eq!(borrowed_peer(&r), Some(dotted.as_str()));
            let r = request(&[], &address);
            let rewritten = match r.client_ip(0) {
                Some(IpAddr::V4(v4)) => Some(v4.to_string()),
                _ => None,
            };
            let ip = address.rsplit_once(':').map_or(address.as_str(), |(ip, _)| ip);
            let expected = rewritten.filter(|text| text == ip);
            proptest::prop_assert_eq!(borrowed_peer(&r), expected.as_deref());
        }
    }

    #[test]
    fn trusted_hops_read_the_entry_the_outermost_trusted_proxy_wrote() {
        let r = request(
            &[
                ("x-forwarded-for", "6.6.6.6, 203.0.113.9"),
                ("x-forwarded-for", "198.51.100.2"),
            ],
            "10.0.0.1:1",
        );
        assert_eq!(r.client_ip(0), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.client_ip(1), Some("198.51.100.2".parse().unwrap()));
        assert_eq!(r.client_ip(2), Some("203.0.113.9".parse().unwrap()));
        assert_eq!(
            r.client_ip(4),
            Some("10.0.0.1".parse().unwrap()),
            "too few entries: the peer"
        );
    }
}

#[cfg(test)]
mod forwarded_tests {
    use super::*;

    fn behind_one_proxy(xff: &str) -> Option<ClientIp<'static>> {
        let request = HttpRequest {
            headers: [("x-forwarded-for".into(), xff.as_bytes().to_vec().into())]
                .into_iter()
                .collect(),
            source_address: Some("10.0.0.1:5000".to_owned()),
        };
        request.client_ip_text(1).map(|ip| ClientIp {
            text: Cow::Owned(ip.text.into_owned()),
            fallback: ip.fallback,
        })
    }

    fn read(text: &str) -> Option<ClientIp<'static>> {
        Some(ClientIp {
            text: Cow::Owned(text.to_owned()),
            fallback: false,
        })
    }

    #[test]
    fn the_forms_proxies_write_are_read() {
        assert_eq!(behind_one_proxy("1.2.3.4"), read("1.2.3.4"));
        assert_eq!(behind_one_proxy("1.2.3.4:5555"), read("1.2.3.4"));
        assert_eq!(behind_one_proxy("[2001:db8::1]"), read("2001:db8::1"));
        assert_eq!(behind_one_proxy("[2001:db8::1]:443"), read("2001:db8::1"));
        assert_eq!(behind_one_proxy("2001:db8::1"), read("2001:db8::1"));
        assert_eq!(behind_one_proxy("fe80::1%eth0"), read("fe80::1"));
        assert_eq!(behind_one_proxy("x, 1.2.3.4:5555"), read("1.2.3.4"));
    }

    #[test]
    fn an_unreadable_entry_falls_back_to_the_peer_and_says_so() {
        for garbage in [
            "unknown",
            "1.2.3.4:port",
            "[::1",
            "1.2.3.4:123456",
            "",
            "_hidden",
        ] {
            assert_eq!(
                behind_one_proxy(garbage),
                Some(ClientIp {
                    text: Cow::Owned("10.0.0.1".to_owned()),
                    fallback: true
                }),
                "{garbage:?}"
            );
        }
    }
}
