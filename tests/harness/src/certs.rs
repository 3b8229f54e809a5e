//! Certificates for the TLS tests, made on the spot.

// Test support: certificates that cannot be made are a failed test.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// Writes, in `dir`, an authority's certificate as `<authority>.crt`, and for each of `issued`,
/// `(name, names it holds)`, a certificate it signs as `<name>.crt` and its key as `<name>.key`.
pub fn make_certificates(dir: &Path, authority: &str, issued: &[(&str, &[&str])]) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Each its own name: OpenSSL takes a certificate named as its issuer for self-signed.
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("sluice test authority {authority}"),
    );
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join(authority).with_extension("crt"), ca.pem()).unwrap();
    for (name, names) in issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, *name);
        let certificate = params.signed_by(&key, &ca).unwrap();
        let path = dir.join(name);
        std::fs::write(path.with_extension("crt"), certificate.pem()).unwrap();
        std::fs::write(path.with_extension("key"), key.serialize_pem()).unwrap();
    }
}
