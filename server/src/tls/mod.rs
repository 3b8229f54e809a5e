//! TLS on the server's own listeners, as envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS` and its
//! `GRPC_CLIENT_TLS_CACERT` / `GRPC_CLIENT_TLS_SAN` give it: a certificate to present, read
//! again when its files change, and optionally clients required to present one signed by given
//! authorities, and naming a given host. Both HTTP/2 (gRPC) and HTTP/1.1 are offered by ALPN.

mod certificate;
pub(crate) mod listener;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::flag_error::FlagError;
use crate::pem;
use certificate::ReloadingCertificate;

/// How often the certificate's files are looked at for a new one, unless said otherwise.
pub const CHECK_FILES_EVERY: Duration = Duration::from_secs(10);

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
    certificate: Arc<ReloadingCertificate>,
    /// Which listeners it is on.
    pub on: TlsFor,
    /// How often the certificate's files are looked at for a new one.
    pub check_files_every: Duration,
}

/// Written without the key: configurations are logged.
impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls").field("on", &self.on).finish()
    }
}

impl ListenerTls {
    /// Reads and checks `files`; every error names the flag and the file.
    pub fn from_files(files: TlsFiles<'_>, on: TlsFor) -> Result<ListenerTls, FlagError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certificate = Arc::new(ReloadingCertificate::load(
            files.cert,
            files.key,
            Arc::clone(&provider),
        )?);
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| FlagError::new("--tls-cert", e.to_string()))?;
        let builder = match files.client_ca {
            Some(client_ca) => {
                let verifier = client_verifier(client_ca, files.client_san, provider)?;
                builder.with_client_cert_verifier(verifier)
            }
            None if files.client_san.is_some() => {
                return Err(FlagError::new("--tls-client-san", "needs --tls-client-ca"));
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&certificate) as _);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ListenerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            certificate,
            on,
            check_files_every: CHECK_FILES_EVERY,
        })
    }

    /// Looks at the certificate's files every [`ListenerTls::check_files_every`], and presents
    /// a new certificate from the next handshake on once they hold one.
    pub(crate) fn keep_reloading(&self) -> JoinHandle<()> {
        let certificate = Arc::clone(&self.certificate);
        let every = self.check_files_every;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match certificate.reload_if_changed() {
                    Ok(true) => tracing::info!("the listeners' TLS certificate was read anew"),
                    Ok(false) => {}
                    Err(e) => tracing::error!(
                        error = %e,
                        "the listeners' TLS certificate was not read anew; the previous one stays in force"
                    ),
                }
            }
        })
    }
}

/// Requires a client certificate signed by the authorities in `client_ca`, and holding
/// `client_san` if one is given.
fn client_verifier(
    client_ca: &Path,
    client_san: Option<&str>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, FlagError> {
    let (_, authorities) = pem::certificates("--tls-client-ca", client_ca)?;
    let mut roots = RootCertStore::empty();
    for authority in authorities {
        roots.add(authority).map_err(|e| {
            FlagError::new("--tls-client-ca", format!("{}: {e}", client_ca.display()))
        })?;
    }
    let signed = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| FlagError::new("--tls-client-ca", format!("{}: {e}", client_ca.display())))?;
    let Some(san) = client_san else {
        return Ok(signed);
    };
    let name = ServerName::try_from(san.to_owned()).map_err(|e| {
        FlagError::new(
            "--tls-client-san",
            format!("`{san}` is neither a DNS name nor an IP address ({e})"),
        )
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
