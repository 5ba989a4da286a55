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
    /// The certificates cannot make a verifier (none usable as a trust anchor).
    #[error("CA certificate {} cannot be used to verify servers: {source}", path.display())]
    Verifier {
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::client::VerifierBuilderError,
    },
    /// rustls refused the protocol versions (not expected with its defaults).
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
}

/// The provider every TLS configuration of the service uses (ring, passed explicitly).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
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

/// The client side: trust exactly the certificates in `ca`: as authorities (a CA that signed
/// the server's certificate), and as pinned certificates (a server that presents exactly one of
/// them is trusted, whatever its basic constraints: the usual self-signed certificate made by
/// `openssl req -x509` is marked CA:TRUE, which the chain rules refuse as a server's own).
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .dangerous()
        .with_custom_certificate_verifier(ca_verifier(ca)?)
        .with_no_client_auth())
}

/// The verifier of [`client_config`]: a server whose certificate is signed by one of the
/// certificates in `ca`, or is exactly one of them (the PostgreSQL store's `sslrootcert` too).
pub(crate) fn ca_verifier(ca: &Path) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsError> {
    let pinned = certificates("CA certificate", ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in &pinned {
        roots.add(c.clone()).map_err(|source| TlsError::Anchor { path: ca.to_owned(), source })?;
    }
    let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|source| TlsError::Verifier { path: ca.to_owned(), source })?;
    Ok(Arc::new(PinnedOrSigned { chain, pinned, algorithms: provider().signature_verification_algorithms }))
}

/// Trusts a server whose certificate is signed by one of the file's certificates (rustls's
/// checks, unchanged), or is exactly one of them: then its names must still hold the server's
/// name, and its validity period is still checked; only the chain rules (a CA certificate
/// used as a server's) are not applied to a certificate the user pinned byte for byte.
#[derive(Debug)]
struct PinnedOrSigned {
    chain: Arc<rustls::client::WebPkiServerVerifier>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
    pinned: Vec<CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedOrSigned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        let refused = match self.chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Ok(verified) => return Ok(verified),
            Err(e) => e,
        };
        let time = matches!(
            &refused,
            rustls::Error::InvalidCertificate(
                C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. }
            )
        );
        if time || !self.pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) {
            return Err(refused);
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    crate::adapters::tls::signatures_by!(algorithms);
}

/// The TLS error inside a client's error (its sources, and the I/O errors that carry it), if
/// the failure was TLS's.
pub fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    std::iter::successors(Some(e), |e| e.source()).find_map(|e| {
        e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })
}

/// What a TLS failure of the client means and what to do about it, in one sentence (after
/// "cannot reach the provisioner service at URL: "); `ca` is the `--ca-cert` file, if one was
/// given.
pub fn explain(e: &rustls::Error, ca: Option<&Path>) -> String {
    use rustls::CertificateError as C;
    let get = "the service's certificate is its --tls-cert file";
    let untrusted = || match ca {
        None => format!(
            "its TLS certificate is not trusted (not signed by an authority this client knows): pass --ca-cert FILE \
             (or set PROVISIONER_CA_CERT) with the service's certificate or the CA that signed it ({get})"
        ),
        Some(f) => format!(
            "its TLS certificate is not trusted: it is neither the certificate in --ca-cert {} nor signed by it \
             ({e}); pass the certificate this service presents, or the CA that signed it ({get})",
            f.display()
        ),
    };
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                let names = match c {
                    C::NotValidForNameContext { expected, presented } => format!(
                        " {} (it names {})",
                        expected.to_str(),
                        if presented.is_empty() { "nothing".to_owned() } else { presented.join(", ") }
                    ),
                    _ => String::new(),
                };
                format!(
                    "its TLS certificate is not valid for the host name of --server{names}: use a name the \
                     certificate holds in --server, or reissue the certificate with that name in its subjectAltName"
                )
            }
            C::Expired | C::ExpiredContext { .. } => format!(
                "its TLS certificate has expired ({e}): renew the service's certificate (its --tls-cert file) and \
                 restart it{}",
                if ca.is_some() {
                    ", then pass the new certificate with --ca-cert if you pinned the old one"
                } else {
                    ""
                }
            ),
            C::NotValidYet | C::NotValidYetContext { .. } => format!(
                "its TLS certificate is not valid yet ({e}): check this machine's clock and the service's, or \
                 reissue the certificate"
            ),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => format!(
                "its TLS certificate is not one for a TLS server ({e}): reissue it with extendedKeyUsage \
                 serverAuth (or with no extended key usage)"
            ),
            C::Revoked => format!("its TLS certificate was revoked ({e}): the service needs a new certificate"),
            _ => untrusted(),
        },
        rustls::Error::NoCertificatesPresented => {
            "the service presented no TLS certificate: check its --tls-cert file".to_owned()
        }
        other => format!(
            "the TLS handshake failed ({other}): check that the service serves https on this address \
             (use http:// for a service without --tls-cert)"
        ),
    }
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
    fn every_tls_failure_says_what_is_wrong_and_what_to_do() {
        use rustls::CertificateError as C;
        let ca = Path::new("/etc/pinned.pem");
        let unknown = rustls::Error::InvalidCertificate(C::UnknownIssuer);
        let e = explain(&unknown, None);
        assert!(e.contains("not trusted") && e.contains("--ca-cert FILE"), "{e}");
        // Given --ca-cert, never "pass --ca-cert" as if it were not: the file is named.
        let e = explain(&unknown, Some(ca));
        assert!(e.contains("neither the certificate in --ca-cert /etc/pinned.pem nor signed by it"), "{e}");
        assert!(!e.contains("--ca-cert FILE"), "{e}");
        let name = rustls::Error::InvalidCertificate(C::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("10.0.0.1").unwrap(),
            presented: vec!["DnsName(\"localhost\")".into()],
        });
        let e = explain(&name, Some(ca));
        assert!(e.contains("not valid for the host name") && e.contains("10.0.0.1") && e.contains("localhost"), "{e}");
        assert!(e.contains("subjectAltName"), "{e}");
        let e = explain(&rustls::Error::InvalidCertificate(C::Expired), Some(ca));
        assert!(e.contains("expired") && e.contains("renew"), "{e}");
        let e = explain(&rustls::Error::InvalidCertificate(C::NotValidYet), None);
        assert!(e.contains("not valid yet") && e.contains("clock"), "{e}");
        let e = explain(&rustls::Error::InvalidCertificate(C::InvalidPurpose), None);
        assert!(e.contains("serverAuth"), "{e}");
        let e = explain(&rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType), None);
        assert!(e.contains("serves https") && e.contains("http://"), "{e}");
        // Found inside the I/O error a TLS stream answers with.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown.clone());
        assert_eq!(tls_error(&io), Some(&unknown));
        assert_eq!(tls_error(&std::io::Error::other("no TLS here")), None);
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
