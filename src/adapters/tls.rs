//! TLS pieces shared by the clients that pin or skip certificate checks (the LXD broker's, the
//! PostgreSQL store's): rustls with the provider passed explicitly.

use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Takes a server whose certificate is byte for byte one of the pinned ones (LXD's daemon: its
/// certificate is self-signed and names no useful host), or, made with [`Pinned::any`], any
/// certificate (PostgreSQL's `sslmode=prefer`/`require` without a root); names and chains are not
/// checked. The handshake's signatures are: the peer holds the key of the certificate it shows.
#[derive(Debug)]
pub(crate) struct Pinned {
    pinned: Option<Vec<CertificateDer<'static>>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl Pinned {
    /// Exactly these certificates.
    pub(crate) fn to(
        certificates: Vec<CertificateDer<'static>>,
        algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
    ) -> Self {
        Self { pinned: Some(certificates), algorithms }
    }

    /// Any certificate.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn any(algorithms: rustls::crypto::WebPkiSupportedAlgorithms) -> Self {
        Self { pinned: None, algorithms }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.pinned {
            Some(pinned) if !pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) => {
                Err(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    signatures_by!(algorithms);
}

/// A `ServerCertVerifier`'s handshake-signature methods, checked with the algorithms in the
/// verifier's field `$algorithms` (`rustls::crypto::WebPkiSupportedAlgorithms`): a verifier that
/// decides which certificate to take (exactly the pinned one; any) still makes the peer prove
/// it holds that certificate's key.
macro_rules! signatures_by {
    ($algorithms:ident) => {
        $crate::adapters::tls::signatures_by!(@ $algorithms verify_tls12_signature);
        $crate::adapters::tls::signatures_by!(@ $algorithms verify_tls13_signature);
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.$algorithms.supported_schemes()
        }
    };
    (@ $algorithms:ident $verify:ident) => {
        fn $verify(
            &self, message: &[u8], cert: &rustls::pki_types::CertificateDer<'_>, dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::$verify(message, cert, dss, &self.$algorithms)
        }
    };
}
pub(crate) use signatures_by;
