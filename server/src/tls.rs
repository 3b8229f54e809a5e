//! TLS on the server's own listeners, as envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS` and its
//! `GRPC_CLIENT_TLS_CACERT` / `GRPC_CLIENT_TLS_SAN` give it: a certificate to present, and
//! optionally clients required to present one signed by given authorities, and naming a given
//! host. Both HTTP/2 (gRPC) and HTTP/1.1 are offered by ALPN.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::log_throttle::LogThrottle;
use crate::pem;

/// How long a client may take over its handshake before its connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often, at most, a failed handshake is logged: a scanner, or a client with the wrong
/// certificate, fails one a connection.
const HANDSHAKE_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Which listeners TLS is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TlsFor {
    /// Every listener: `--listen` and `--grpc-listen`.
    #[default]
    All,
    /// The gRPC API's own listener (`--grpc-listen`) alone, as the reference service's TLS is
    /// on its gRPC port: `--listen` stays cleartext for probes, metrics and `/v1/decide`.
    Grpc,
}

/// Where the listeners' certificate, key and client authorities are, as given.
#[derive(Debug, Clone, Copy)]
pub struct TlsFiles<'a> {
    /// The certificate chain to present (`--tls-cert`).
    pub cert: &'a Path,
    /// Its private key (`--tls-key`).
    pub key: &'a Path,
    /// Authorities a client's certificate must be signed by (`--tls-client-ca`); none: clients
    /// present no certificate.
    pub client_ca: Option<&'a Path>,
    /// A name (DNS name or IP address) a client's certificate must hold (`--tls-client-san`).
    pub client_san: Option<&'a str>,
}

/// TLS for the listeners, checked and built once when the server starts.
#[derive(Clone)]
pub struct ListenerTls {
    acceptor: TlsAcceptor,
    /// Which listeners it is on.
    pub on: TlsFor,
}

/// Written without the key: configurations are logged.
impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls").field("on", &self.on).finish()
    }
}

impl ListenerTls {
    /// Reads and checks `files`; every error names the flag and the file.
    pub fn from_files(files: TlsFiles<'_>, on: TlsFor) -> Result<ListenerTls, String> {
        let (_, chain) = pem::certificates("--tls-cert", files.cert)?;
        let (_, key) = pem::private_key("--tls-key", files.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("--tls-cert: {e}"))?;
        let builder = match files.client_ca {
            Some(client_ca) => {
                let verifier = client_verifier(client_ca, files.client_san, provider)?;
                builder.with_client_cert_verifier(verifier)
            }
            None if files.client_san.is_some() => {
                return Err("--tls-client-san: needs --tls-client-ca".to_owned());
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            format!(
                "--tls-key: {}: not the key of --tls-cert's certificate ({e})",
                files.key.display()
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ListenerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            on,
        })
    }
}

/// Requires a client certificate signed by the authorities in `client_ca`, and holding
/// `client_san` if one is given.
fn client_verifier(
    client_ca: &Path,
    client_san: Option<&str>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let (_, authorities) = pem::certificates("--tls-client-ca", client_ca)?;
    let mut roots = RootCertStore::empty();
    for authority in authorities {
        roots
            .add(authority)
            .map_err(|e| format!("--tls-client-ca: {}: {e}", client_ca.display()))?;
    }
    let signed = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("--tls-client-ca: {}: {e}", client_ca.display()))?;
    let Some(san) = client_san else {
        return Ok(signed);
    };
    let name = ServerName::try_from(san.to_owned()).map_err(|e| {
        format!("--tls-client-san: `{san}` is neither a DNS name nor an IP address ({e})")
    })?;
    Ok(Arc::new(NamedClient { signed, name }))
}

/// A client certificate signed as `signed` requires, and valid for `name` (a DNS name it
/// holds, a wildcard covering it, or an IP address).
#[derive(Debug)]
struct NamedClient {
    signed: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.signed.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .signed
            .verify_client_cert(end_entity, intermediates, now)?;
        webpki::EndEntityCert::try_from(end_entity)
            .and_then(|cert| cert.verify_is_valid_for_subject_name(&self.name))
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signed.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signed.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signed.supported_verify_schemes()
    }
}

/// A listener, with TLS or without.
pub(crate) enum Listening {
    Cleartext(TcpListener),
    Tls {
        listener: tls_listener::TlsListener<TcpListener, TlsAcceptor>,
        failures: LogThrottle,
    },
}

impl Listening {
    /// `listener`, with `tls` on it if given.
    pub(crate) fn new(listener: TcpListener, tls: Option<&ListenerTls>) -> Listening {
        match tls {
            None => Listening::Cleartext(listener),
            Some(tls) => Listening::Tls {
                listener: tls_listener::builder(tls.acceptor.clone())
                    .handshake_timeout(HANDSHAKE_TIMEOUT)
                    .listen(listener),
                failures: LogThrottle::new(HANDSHAKE_WARNING_INTERVAL),
            },
        }
    }
}

impl axum::serve::Listener for Listening {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        match self {
            Listening::Cleartext(listener) => {
                let (stream, addr) = axum::serve::Listener::accept(listener).await;
                // Answers are small and latency is the product: no Nagle delay.
                let _ = stream.set_nodelay(true);
                (Connection::Cleartext(stream), addr)
            }
            Listening::Tls { listener, failures } => loop {
                match listener.accept().await {
                    Ok((stream, addr)) => {
                        let _ = stream.get_ref().0.set_nodelay(true);
                        return (Connection::Tls(Box::new(stream)), addr);
                    }
                    // What the plain listener does with these, as axum has it: a connection
                    // reset before it was taken is nothing; anything else (out of file
                    // descriptors) is worth a pause.
                    Err(tls_listener::Error::ListenerError(e)) => {
                        if !matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                        ) {
                            tracing::error!(error = %e, "accepting a connection failed");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    Err(e) => {
                        if let Some(left_out) = failures.due(Instant::now()) {
                            let peer = e.peer_addr().map(ToString::to_string);
                            tracing::warn!(error = %e, peer, left_out, "a TLS handshake failed");
                        }
                    }
                }
            },
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listening::Cleartext(listener) => listener.local_addr(),
            Listening::Tls { listener, .. } => listener.local_addr(),
        }
    }
}

/// An accepted connection, with TLS or without.
pub(crate) enum Connection {
    Cleartext(TcpStream),
    // Boxed: a TLS session's state is some hundreds of bytes beside a socket's few.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_read(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_write(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Cleartext(stream) => stream.is_write_vectored(),
            Connection::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_flush(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_shutdown(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
