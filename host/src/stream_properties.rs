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
