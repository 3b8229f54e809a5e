//! PEM files for a Redis that speaks TLS, and the flags that hand them to it.

use std::path::PathBuf;

/// PEM files for a Redis over TLS: its certificate and key (presented to clients, and to other
/// nodes as a client), and the authority it trusts for its clients' certificates.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The authority's certificate.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// `redis-server`'s flags for them.
    pub fn server_args(&self) -> Vec<String> {
        flags([
            ("--tls-cert-file", &self.cert),
            ("--tls-key-file", &self.key),
            ("--tls-ca-cert-file", &self.ca),
        ])
    }

    /// `redis-cli`'s flags for them, the certificate presented as a client's.
    pub(crate) fn client_args(&self) -> Vec<String> {
        flags([
            ("--cert", &self.cert),
            ("--key", &self.key),
            ("--cacert", &self.ca),
        ])
    }
}

fn flags(named: [(&str, &PathBuf); 3]) -> Vec<String> {
    named
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect()
}
