//! The certificate the listeners present, read again when its files change: certificates are
//! renewed well before they expire (cert-manager, a Kubernetes secret's files replaced in
//! place), and the reference service picks the new one up without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::flag_error::FlagError;
use crate::pem;

/// What tells that a file changed: when it was last written, and its length.
type Stamp = Option<(SystemTime, u64)>;

/// The last good certificate and key read from their files.
pub(crate) struct ReloadingCertificate {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' stamps when they were last read, good or not.
    read_at: Mutex<[Stamp; 2]>,
}

impl ReloadingCertificate {
    /// The certificate in `cert` and its key in `key`; errors name the flag and the file.
    pub(crate) fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<ReloadingCertificate, FlagError> {
        let stamps = [stamp(cert), stamp(key)];
        let current = certified_key(cert, key, &provider)?;
        Ok(ReloadingCertificate {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: RwLock::new(Arc::new(current)),
            read_at: Mutex::new(stamps),
        })
    }

    /// Reads the files again if either has changed since they were last read: whether a new
    /// certificate is now presented. One that does not load leaves the last good one in
    /// force; a file written after it (the key after the certificate) is read again then.
    pub(crate) fn reload_if_changed(&self) -> Result<bool, FlagError> {
        let stamps = [stamp(&self.cert), stamp(&self.key)];
        {
            let mut read_at = self.read_at.lock().unwrap_or_else(PoisonError::into_inner);
            if *read_at == stamps {
                return Ok(false);
            }
            *read_at = stamps;
        }
        let fresh = certified_key(&self.cert, &self.key, &self.provider)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(true)
    }
}

/// Written with the files' names alone, never the key.
impl std::fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCertificate")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

/// The chain in `cert` with the key in `key`, which must be its certificate's.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, FlagError> {
    let (_, chain) = pem::certificates("--tls-cert", cert)?;
    let (_, private_key) = pem::private_key("--tls-key", key)?;
    CertifiedKey::from_der(chain, private_key, provider).map_err(|e| {
        FlagError::new(
            "--tls-key",
            format!(
                "{}: not the key of --tls-cert's certificate ({e})",
                key.display()
            ),
        )
    })
}

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}
