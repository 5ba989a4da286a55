//! TLS to PostgreSQL (feature `postgres`): the store URL's `sslmode` and `sslrootcert`, with
//! libpq's meaning, for every connection the service makes (the store's, the lease's, the
//! listener's, the models' directory and schemas'), through one [`PgTls`] built from the URL.
//!
//! | `sslmode`     | TLS                          | the server's certificate                      |
//! |---------------|------------------------------|-----------------------------------------------|
//! | `disable`     | never                        | -                                             |
//! | `prefer` (default) | if the server offers it | not checked                                   |
//! | `require`     | always                       | not checked, unless `sslrootcert` is given: then as `verify-ca` |
//! | `verify-ca`   | always                       | signed by `sslrootcert` (default `~/.postgresql/root.crt`) |
//! | `verify-full` | always                       | as `verify-ca`, and valid for the URL's host name |
//!
//! `tokio-postgres` knows `disable`, `prefer` and `require` only, and no `sslrootcert`: both
//! are taken out of the URL (`postgres://...?sslmode=verify-full&sslrootcert=/path`, or a
//! `key=value` string) before the rest is handed to it, and the certificate is checked here
//! (rustls with its `ring` provider, as in [`tls`](crate::service::tls)). `sslrootcert` is read
//! once, when the URL is parsed: a file that cannot be used fails the start, naming it.
//!
//! The same [`PgTls`] serves `tokio-postgres` (the store) and the blocking `postgres` crate
//! (the lease, the members, the listener, the models' connections): both take a
//! [`MakeTlsConnect`].

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode as WireMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::service::tls::TlsError;

/// The URL's `sslmode` (libpq's values; `allow` is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, its certificate not checked (libpq's default).
    Prefer,
    /// TLS, its certificate not checked (unless `sslrootcert` is given).
    Require,
    /// TLS, the certificate signed by `sslrootcert`.
    VerifyCa,
    /// TLS, the certificate signed by `sslrootcert` and valid for the host name.
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Self, PgUrlError> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(PgUrlError::Mode(other.to_owned())),
        })
    }

    /// What `tokio-postgres` is told (it knows no verification: that is done here).
    fn wire(self) -> WireMode {
        match self {
            Self::Disable => WireMode::Disable,
            Self::Prefer => WireMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => WireMode::Require,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// Why a store URL's TLS settings cannot be used.
#[derive(Debug, Error)]
pub enum PgUrlError {
    /// `sslmode` has a value this build does not know.
    #[error("sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    Mode(String),
    /// A verifying mode without `sslrootcert`, and no home directory to find the default in.
    #[error(
        "sslmode={0} needs the CA that signed the database's certificate: add sslrootcert=FILE (PEM) to the \
         store URL (the default, ~/.postgresql/root.crt, cannot be found: HOME is not set)"
    )]
    NoRoot(&'static str),
    /// `sslrootcert` cannot be read or used.
    #[error("sslrootcert {} cannot be read or used: {source}; give sslrootcert the PEM file of the CA that signed the database's certificate", path.display())]
    Root {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<TlsError>,
    },
    /// rustls refused the configuration (not expected with its defaults).
    #[error("TLS setup for the database: {0}")]
    Setup(#[source] rustls::Error),
    /// The rest of the URL is not one `tokio-postgres` accepts.
    #[error("{}", describe(.0))]
    Parse(#[source] tokio_postgres::Error),
}

/// Why a TLS connection to the database failed.
#[derive(Debug, Error)]
pub(crate) enum PgTlsError {
    /// `sslmode=verify-full` and no host name to check the certificate against.
    #[error("sslmode=verify-full needs a host name to check the database's certificate against, and the URL's host {0:?} is none: give the host by name (or use sslmode=verify-ca)")]
    NoHostName(String),
    /// The certificate is not signed by `sslrootcert` (and is not the one in it).
    #[error("the database's certificate is not signed by the CA in {} (sslrootcert): {source}; give sslrootcert the CA that signed it (or the database's own certificate)", root.display())]
    Untrusted {
        /// The `sslrootcert` file.
        root: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// The certificate is signed by the CA but names another host.
    #[error("the database's certificate is not valid for host {host:?} (sslmode=verify-full): {source}; connect by a name the certificate holds, or reissue it with this name in its subjectAltName")]
    WrongHost {
        /// The URL's host.
        host: String,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// The certificate is refused for another reason (expired, not yet valid, not a server's).
    #[error(
        "the database's certificate is refused: {0}; check its validity dates and this machine's clock, or reissue it"
    )]
    Refused(#[source] rustls::Error),
    /// The handshake failed otherwise (the server's TLS, the network).
    #[error("the TLS handshake with the database failed: {0}")]
    Handshake(#[source] io::Error),
    /// TLS was asked for with `sslmode=disable` (not expected: the client does not ask then).
    #[error("TLS is disabled (sslmode=disable)")]
    Disabled,
}

/// The TLS settings of one store URL, for every connection made to it: a [`MakeTlsConnect`]
/// for `tokio-postgres` and for the blocking `postgres` crate alike. Cheap to clone.
#[derive(Clone)]
pub(crate) struct PgTls {
    mode: Mode,
    /// The `sslrootcert` the certificate is checked against (verifying modes).
    root: Option<PathBuf>,
    /// rustls's client configuration (`None` with `disable`).
    config: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls").field("mode", &self.mode).field("root", &self.root).finish_non_exhaustive()
    }
}

impl PgTls {
    /// No TLS (tests, and connections that cannot have any).
    pub(crate) fn disabled() -> Self {
        Self { mode: Mode::Disable, root: None, config: None }
    }

    /// The mode in force.
    #[cfg(test)]
    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// The settings for `mode` and `sslrootcert` (read now).
    pub(crate) fn new(mode: Mode, sslrootcert: Option<&Path>) -> Result<Self, PgUrlError> {
        let root = match (mode, sslrootcert) {
            (Mode::Disable, _) => return Ok(Self::disabled()),
            (Mode::Prefer, _) | (Mode::Require, None) => None,
            (Mode::Require | Mode::VerifyCa | Mode::VerifyFull, Some(given)) => Some(given.to_owned()),
            (Mode::VerifyCa | Mode::VerifyFull, None) => {
                let home = std::env::var_os("HOME").ok_or(PgUrlError::NoRoot(mode.as_str()))?;
                Some(Path::new(&home).join(".postgresql").join("root.crt"))
            }
        };
        let provider = crate::service::tls::provider();
        let verifier: Arc<dyn ServerCertVerifier> = match &root {
            // `prefer`, and `require` without `sslrootcert`: any certificate (the handshake's
            // signatures are still checked, so the peer holds the key of the certificate it shows).
            None => Arc::new(crate::adapters::tls::Pinned::any(provider.signature_verification_algorithms)),
            Some(path) => {
                let chain = crate::service::tls::ca_verifier(path)
                    .map_err(|source| PgUrlError::Root { path: path.clone(), source: Box::new(source) })?;
                if mode == Mode::VerifyFull {
                    chain
                } else {
                    Arc::new(ChainOnly { chain, algorithms: provider.signature_verification_algorithms })
                }
            }
        };
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(PgUrlError::Setup)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // What libpq offers (PostgreSQL 17 checks it when given; older servers ignore it).
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Self { mode, root, config: Some(Arc::new(config)) })
    }
}

/// A client error with its cause (`tokio-postgres` shows only its kind, `error performing TLS
/// handshake`, and keeps what went wrong as its source): for messages that are logged or
/// answered as text. A server's error is its own message.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => db.to_string(),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

/// Parses a store URL (`postgres://...` or `key=value ...`): its TLS settings, and the rest as
/// `tokio-postgres`'s configuration with the matching `sslmode`.
pub(crate) fn parse(url: &str) -> Result<(tokio_postgres::Config, PgTls), PgUrlError> {
    let (rest, mode, root) = take_tls_params(url);
    let mode = match mode {
        Some(m) => Mode::parse(&m)?,
        None => Mode::Prefer,
    };
    let tls = PgTls::new(mode, root.as_deref().map(Path::new))?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(PgUrlError::Parse)?;
    config.ssl_mode(mode.wire());
    Ok((config, tls))
}

/// Takes `sslmode` and `sslrootcert` out of a connection string: the rest, and their values
/// (the last one given of each, as libpq).
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            mode = Some(value);
            true
        }
        "sslrootcert" => {
            root = Some(value);
            true
        }
        _ => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(&percent_decode(k), percent_decode(v))
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut rest = String::new();
        for (span, key, value) in key_values(url) {
            if !take(&key, value) {
                if !rest.is_empty() {
                    rest.push(' ');
                }
                rest.push_str(&url[span]);
            }
        }
        rest
    };
    (rest, mode, root)
}

/// `%XX` decoded (a malformed escape is kept as it is).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let hex = |b: u8| (b as char).to_digit(16);
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pairs of a `key=value` connection string: each pair's span in the string, its key and
/// its value (single quotes and backslash escapes undone, as libpq reads them). A malformed
/// tail is kept as one span with an empty key, for `tokio-postgres` to refuse.
fn key_values(s: &str) -> Vec<(std::ops::Range<usize>, String, String)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= b.len() {
            return out;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_owned();
        i = skip_ws(i);
        if i >= b.len() || b[i] != b'=' {
            out.push((start..s.len(), String::new(), String::new()));
            return out;
        }
        i = skip_ws(i + 1);
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
            i = (i + 1).min(b.len());
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
        }
        out.push((start..i, key, String::from_utf8_lossy(&value).into_owned()));
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = PgTlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, PgTlsError> {
        let name = ServerName::try_from(domain.to_owned()).ok();
        if self.mode == Mode::VerifyFull && name.is_none() {
            return Err(PgTlsError::NoHostName(domain.to_owned()));
        }
        Ok(PgTlsConnect { tls: self.clone(), host: domain.to_owned(), name })
    }
}

/// One connection's TLS handshake ([`PgTls`]'s, for one host).
pub(crate) struct PgTlsConnect {
    tls: PgTls,
    host: String,
    name: Option<ServerName<'static>>,
}

impl PgTlsConnect {
    /// What a failed handshake means, from rustls's own error.
    fn explain(&self, e: io::Error) -> PgTlsError {
        use rustls::CertificateError as C;
        let Some(rustls::Error::InvalidCertificate(c)) = crate::service::tls::tls_error(&e) else {
            return PgTlsError::Handshake(e);
        };
        let source = rustls::Error::InvalidCertificate(c.clone());
        match (c, &self.tls.root) {
            (C::NotValidForName | C::NotValidForNameContext { .. }, _) => {
                PgTlsError::WrongHost { host: self.host.clone(), source }
            }
            (
                C::UnknownIssuer
                | C::BadSignature
                | C::UnsupportedSignatureAlgorithmContext { .. }
                | C::InvalidPurpose
                | C::InvalidPurposeContext { .. }
                | C::Other(_),
                Some(root),
            ) => PgTlsError::Untrusted { root: root.clone(), source },
            _ => PgTlsError::Refused(source),
        }
    }
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = PgTlsError;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, PgTlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let Some(config) = self.tls.config.clone() else {
                return Err(PgTlsError::Disabled);
            };
            // Without a verified name (an address, or nothing to check), any name will do for
            // the handshake: the certificate's names are not looked at then.
            let name = match self.name.clone() {
                Some(n) => n,
                None => ServerName::try_from("localhost").map_err(|_| PgTlsError::NoHostName(self.host.clone()))?,
            };
            match tokio_rustls::TlsConnector::from(config).connect(name, stream).await {
                Ok(s) => Ok(PgTlsStream(s)),
                Err(e) => Err(self.explain(e)),
            }
        })
    }
}

/// A TLS connection to the database.
pub(crate) struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    /// No channel binding: SCRAM authenticates without it (`tls-server-end-point` would need
    /// the certificate's own hash algorithm).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// `verify-ca` (and `require` with `sslrootcert`): the chain, not the host name.
#[derive(Debug)]
struct ChainOnly {
    chain: Arc<dyn ServerCertVerifier>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        // The name is checked last, once the chain is known good: a name error means the
        // chain passed.
        match self.chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    crate::adapters::tls::signatures_by!(algorithms);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, mode, root) =
            take_tls_params("postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-full"), Some("/etc/ca.pem")));
        let (rest, mode, root) = take_tls_params("postgresql://h/db?sslrootcert=/a b.pem");
        assert_eq!((rest.as_str(), mode, root.as_deref()), ("postgresql://h/db", None, Some("/a b.pem")));
        let (rest, mode, root) =
            take_tls_params("host=h  sslmode = verify-ca dbname='my db' sslrootcert='/x\\'s/ca.pem' user=u");
        assert_eq!(rest, "host=h dbname='my db' user=u");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-ca"), Some("/x's/ca.pem")));
        let (config, tls) = parse("host=h sslmode=disable dbname='my db'").unwrap();
        assert_eq!((config.get_dbname(), tls.mode()), (Some("my db"), Mode::Disable));
        assert_eq!(config.get_ssl_mode(), WireMode::Disable);
        let (config, tls) = parse("postgres://h/db").unwrap();
        assert_eq!((config.get_ssl_mode(), tls.mode()), (WireMode::Prefer, Mode::Prefer), "libpq's default");
        let (config, _) = parse("postgres://h/db?sslmode=require").unwrap();
        assert_eq!(config.get_ssl_mode(), WireMode::Require);
    }

    #[test]
    fn bad_tls_settings_say_what_to_do() {
        let e = parse("postgres://h/db?sslmode=sometimes").unwrap_err();
        assert!(e.to_string().contains("not one of disable, prefer, require, verify-ca, verify-full"), "{e}");
        let e = parse("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(matches!(e, PgUrlError::Root { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("sslrootcert /nonexistent/ca.pem cannot be read") && e.contains("PEM file of the CA"),
            "{e}"
        );
        // `require` with a root certificate checks it, as libpq does.
        let e = parse("postgres://h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(matches!(e, PgUrlError::Root { .. }), "{e:?}");
        // `prefer` never checks, whatever is given.
        assert!(parse("postgres://h/db?sslrootcert=/nonexistent/ca.pem").is_ok());
    }
}
