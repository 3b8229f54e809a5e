//! What a stream's properties answer that its headers do not.

use std::net::IpAddr;

/// What a stream's properties answer that its headers do not.
#[derive(Debug, Clone)]
pub struct StreamProperties {
    /// The downstream peer.
    pub source_ip: IpAddr,
    /// Its port.
    pub source_port: u16,
    /// The listener's address.
    pub destination_ip: IpAddr,
    /// The listener's port.
    pub destination_port: u16,
    /// When the request started, ns since the epoch.
    pub request_time_ns: i64,
    /// `x-request-id`.
    pub request_id: String,
    /// `HTTP/1.1`, `HTTP/2`.
    pub protocol: String,
    /// The route's name.
    pub route_name: String,
    /// The upstream cluster's name.
    pub cluster_name: String,
    /// The downstream connection's id.
    pub connection_id: u64,
    /// The response code, once there is a response.
    pub response_code: Option<u16>,
}

/// `ip:port`, or `[ip]:port` for IPv6.
pub fn address(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => {
            // Without `format!`: filters read this on every request.
            let mut text = sluice_core::key::dotted_quad(v4);
            text.push(':');
            text.push_str(&port.to_string());
            text
        }
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}
