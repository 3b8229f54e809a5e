//! PEM files named by flags, read and checked when the server starts: each error names the flag
//! and the file.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::flag_error::FlagError;

/// The file `flag` names, whole.
pub(crate) fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, FlagError> {
    std::fs::read(path).map_err(|e| FlagError::new(flag, format!("{}: {e}", path.display())))
}

/// The certificates in the PEM file `flag` names (at least one), with the file's text.
pub(crate) fn certificates(
    flag: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), FlagError> {
    let pem = read(flag, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FlagError::new(flag, format!("{}: {e}", path.display())))?;
    if certificates.is_empty() {
        return Err(FlagError::new(
            flag,
            format!("{}: no PEM certificate in it", path.display()),
        ));
    }
    Ok((pem, certificates))
}

/// The private key in the PEM file `flag` names, with the file's text.
pub(crate) fn private_key(
    flag: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, PrivateKeyDer<'static>), FlagError> {
    let pem = read(flag, path)?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| FlagError::new(flag, format!("{}: {e}", path.display())))?;
    Ok((pem, key))
}
