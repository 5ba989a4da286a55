//! TLS pieces shared by the clients that pin or skip certificate checks (the LXD broker's, the
//! PostgreSQL store's): rustls with the provider passed explicitly.

/// A `ServerCertVerifier`'s handshake-signature methods, checked with the algorithms in the
/// verifier's field `$algorithms` (`rustls::crypto::WebPkiSupportedAlgorithms`): a verifier that
/// decides which certificate to take (exactly the pinned one; any) still makes the peer prove
/// it holds that certificate's key.
macro_rules! signatures_by {
    ($algorithms:ident) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.$algorithms)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.$algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.$algorithms.supported_schemes()
        }
    };
}
pub(crate) use signatures_by;
