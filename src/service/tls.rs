//! TLS from PEM files, with rustls and its `ring` provider (passed explicitly, never the
//! process default, so a build that also links another provider behaves the same):
//! [`server_config`] for `serve --tls-cert FILE --tls-key FILE`, [`client_config`] for the
//! client commands' `--ca-cert FILE`. Every error names the file it is about; all are bad
//! input (the binary exits 2).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// Why a TLS configuration cannot be built from the files given.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file is missing or unreadable, or is not PEM of the expected kind.
    #[error("cannot use {what} {}: {source}", path.display())]
    Pem {
        /// `TLS certificate`, `TLS key` or `CA certificate`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why (an I/O error is kept inside the PEM error).
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A file holds no certificate (or no key).
    #[error("{what} {} holds no PEM {expected}", path.display())]
    Empty {
        /// `TLS certificate`, `TLS key` or `CA certificate`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// `CERTIFICATE` or `PRIVATE KEY`.
        expected: &'static str,
    },
    /// The key does not belong to the certificate, or rustls refuses the pair.
    #[error("TLS key {} does not match TLS certificate {} (or is not usable): {source}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// A CA certificate cannot be trusted as a root.
    #[error("CA certificate {} cannot be used as a trust anchor: {source}", path.display())]
    Anchor {
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the protocol versions (not expected with its defaults).
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem { what, path: path.to_owned(), source };
    let certs = CertificateDer::pem_file_iter(path).map_err(pem)?.collect::<Result<Vec<_>, _>>().map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, path: path.to_owned(), expected: "CERTIFICATE" });
    }
    Ok(certs)
}

/// The server side: the certificate chain in `cert` (PEM, leaf first) and its private key in
/// `key` (PEM: PKCS#8, PKCS#1 or SEC1), checked to belong together.
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let chain = certificates("TLS certificate", cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what: "TLS key", path: key.to_owned(), expected: "PRIVATE KEY" }
        }
        source => TlsError::Pem { what: "TLS key", path: key.to_owned(), source },
    })?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|source| TlsError::Mismatch { cert: cert.to_owned(), key: key.to_owned(), source })
}

/// The client side: trust exactly the certificates in `ca` (a CA, or the server's own
/// self-signed certificate).
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates("CA certificate", ca)? {
        roots.add(c).map_err(|source| TlsError::Anchor { path: ca.to_owned(), source })?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("provisioner-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn missing_and_empty_files_are_named() {
        let e = server_config(Path::new("/nonexistent/c.pem"), Path::new("/nonexistent/k.pem")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/c.pem"), "{e}");
        let empty = file("empty.pem", "not pem\n");
        let e = client_config(&empty).unwrap_err();
        assert!(matches!(e, TlsError::Empty { .. }) && e.to_string().contains("empty.pem"), "{e}");
    }
}
