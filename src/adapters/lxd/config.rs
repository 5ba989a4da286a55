//! What the LXD broker needs to know, and its validation.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Where LXD's REST API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LxdEndpoint {
    /// The daemon's unix socket (`unix:PATH`): trusted by its file permissions, no certificate.
    Unix(PathBuf),
    /// HTTPS (`https://HOST:PORT`): a client certificate the daemon trusts, and the daemon's
    /// own certificate pinned (it is self-signed and names no useful host).
    Https {
        /// `HOST:PORT` as given (an IP address or a name; the port defaults to 8443).
        authority: String,
    },
}

impl LxdEndpoint {
    /// Parses `unix:PATH`, a bare absolute path (a socket), or `https://HOST[:PORT]`.
    pub fn parse(s: &str) -> Result<Self, LxdConfigError> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err(LxdConfigError::Endpoint(s.to_owned()));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if s.starts_with('/') {
            return Ok(Self::Unix(PathBuf::from(s)));
        }
        if let Some(rest) = s.strip_prefix("https://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') {
                return Err(LxdConfigError::Endpoint(s.to_owned()));
            }
            let has_port = match authority.rsplit_once(':') {
                // `[::1]:8443` or `host:8443`; a bare IPv6 address has colons but no brackets.
                Some((host, port)) => {
                    (host.ends_with(']') || !host.contains(':')) && port.chars().all(|c| c.is_ascii_digit())
                }
                None => false,
            };
            let authority = if has_port { authority.to_owned() } else { format!("{authority}:8443") };
            return Ok(Self::Https { authority });
        }
        Err(LxdConfigError::Endpoint(s.to_owned()))
    }
}

impl std::fmt::Display for LxdEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LxdEndpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            LxdEndpoint::Https { authority } => write!(f, "https://{authority}"),
        }
    }
}

/// The files of an HTTPS connection to LXD (PEM).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LxdTlsFiles {
    /// The client certificate LXD trusts (`lxc config trust add FILE`).
    pub client_cert: Option<PathBuf>,
    /// Its private key.
    pub client_key: Option<PathBuf>,
    /// The daemon's own certificate (`$LXD_DIR/server.crt`; for a cluster, the cluster's
    /// `cluster.crt`), pinned: the connection is made only to a server presenting exactly it.
    pub server_cert: Option<PathBuf>,
}

/// The LXD broker's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LxdConfig {
    /// The model's uuid, kept in every instance's `user.provisioner-model`; instances without
    /// it are not ours.
    pub model_uuid: String,
    /// Where the API is.
    pub endpoint: LxdEndpoint,
    /// The image alias every instance starts from (it must exist on the daemon).
    pub image: String,
    /// The LXD project instances are made in.
    pub project: String,
    /// The certificate files of an HTTPS endpoint.
    pub tls: LxdTlsFiles,
    /// How long one API call may take before it counts as unanswered (connect, send, read):
    /// an answer that never comes (a cluster member frozen or cut off) is a failure of its
    /// own zone, ambiguous (the call may still take effect).
    pub call_timeout: Duration,
    /// How long the broker waits for one operation (create, start, stop, delete) to end.
    pub operation_timeout: Duration,
}

impl LxdConfig {
    /// Settings for `model_uuid` on `endpoint` with `image`, in the `default` project, with the
    /// default deadlines (10 s a call, 60 s an operation).
    pub fn new(model_uuid: impl Into<String>, endpoint: LxdEndpoint, image: impl Into<String>) -> Self {
        Self {
            model_uuid: model_uuid.into(),
            endpoint,
            image: image.into(),
            project: DEFAULT_PROJECT.to_owned(),
            tls: LxdTlsFiles::default(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// Checks every field that can be checked without the daemon; the error names the first
    /// problem and the setting to fix.
    pub fn validate(&self) -> Result<(), LxdConfigError> {
        if self.model_uuid.trim().is_empty() {
            return Err(LxdConfigError::Missing("the model uuid"));
        }
        if self.image.trim().is_empty() {
            return Err(LxdConfigError::Missing("an image alias (--lxd-image ALIAS)"));
        }
        if self.project.trim().is_empty() {
            return Err(LxdConfigError::Missing("a project (--lxd-project NAME, or leave it out for `default`)"));
        }
        if self.call_timeout.is_zero() || self.operation_timeout.is_zero() {
            return Err(LxdConfigError::Missing("a deadline longer than zero"));
        }
        if let LxdEndpoint::Https { .. } = self.endpoint {
            let t = &self.tls;
            if t.client_cert.is_none() {
                return Err(LxdConfigError::Missing(
                    "a client certificate for an https endpoint (--lxd-client-cert FILE, trusted by the daemon)",
                ));
            }
            if t.client_key.is_none() {
                return Err(LxdConfigError::Missing("the client certificate's key (--lxd-client-key FILE)"));
            }
            if t.server_cert.is_none() {
                return Err(LxdConfigError::Missing(
                    "the daemon's certificate to pin (--lxd-server-cert FILE, e.g. $LXD_DIR/server.crt)",
                ));
            }
        }
        Ok(())
    }
}

/// The project instances go to unless told otherwise.
pub const DEFAULT_PROJECT: &str = "default";

/// How long one API call may take, by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one operation may take, by default.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings that cannot work, each naming the setting.
#[derive(Debug, Error)]
pub enum LxdConfigError {
    /// A required setting is empty.
    #[error("LXD broker: {0} is required (see `provisioner serve --help`)")]
    Missing(&'static str),
    /// The endpoint is neither `unix:PATH` nor `https://HOST:PORT`.
    #[error("LXD broker: --lxd-endpoint {0:?} is neither unix:PATH nor https://HOST:PORT")]
    Endpoint(String),
    /// A certificate or key file cannot be read or holds nothing usable.
    #[error("LXD broker: {setting} {path}: {problem}")]
    TlsFile {
        /// The setting (`--lxd-client-cert`, ...).
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The client certificate and key do not go together, or rustls refused them.
    #[error("LXD broker: --lxd-client-cert and --lxd-client-key: {0}")]
    ClientAuth(#[source] rustls::Error),
    /// The daemon cannot be reached at the endpoint.
    #[error("LXD broker: cannot reach LXD at --lxd-endpoint {endpoint}: {source}")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: super::errors::CallError,
    },
    /// The TLS handshake failed: the daemon's certificate is not the pinned one, or the
    /// daemon refused the client certificate's handshake.
    #[error(
        "LXD broker: the TLS handshake with --lxd-endpoint {endpoint} failed ({source}): is --lxd-server-cert \
         the daemon's certificate ($LXD_DIR/server.crt; a cluster's cluster.crt)?"
    )]
    Handshake {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: super::errors::CallError,
    },
    /// The daemon answered but does not trust the client certificate.
    #[error(
        "LXD broker: the daemon at --lxd-endpoint {endpoint} does not trust the client certificate \
         (--lxd-client-cert): add it with `lxc config trust add FILE` on the daemon"
    )]
    Untrusted {
        /// The endpoint.
        endpoint: String,
    },
    /// The image alias is not on the daemon.
    #[error("LXD broker: --lxd-image {alias:?} is not an image alias on the daemon (lxc image alias list): {message}")]
    UnknownImage {
        /// The alias.
        alias: String,
        /// LXD's answer.
        message: String,
    },
    /// The project does not exist.
    #[error("LXD broker: --lxd-project {project:?} does not exist on the daemon: {message}")]
    UnknownProject {
        /// The project.
        project: String,
        /// LXD's answer.
        message: String,
    },
    /// Something else LXD answered while the broker connected.
    #[error("LXD broker: {what}: {source}")]
    Setup {
        /// What was being read.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: super::errors::CallError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_bad_ones_are_named() {
        assert_eq!(
            LxdEndpoint::parse("unix:/var/lib/lxd/unix.socket").unwrap(),
            LxdEndpoint::Unix("/var/lib/lxd/unix.socket".into())
        );
        assert_eq!(LxdEndpoint::parse("/x/unix.socket").unwrap(), LxdEndpoint::Unix("/x/unix.socket".into()));
        assert_eq!(
            LxdEndpoint::parse("https://127.0.0.2:8443").unwrap(),
            LxdEndpoint::Https { authority: "127.0.0.2:8443".into() }
        );
        assert_eq!(
            LxdEndpoint::parse("https://lxd.example/").unwrap(),
            LxdEndpoint::Https { authority: "lxd.example:8443".into() }
        );
        assert_eq!(
            LxdEndpoint::parse("https://[::1]:9443").unwrap(),
            LxdEndpoint::Https { authority: "[::1]:9443".into() }
        );
        for bad in ["http://127.0.0.1:8443", "unix:", "lxd", "https://h/1.0"] {
            let e = LxdEndpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--lxd-endpoint") && e.contains(bad.trim()), "{e}");
        }
        assert_eq!(LxdEndpoint::parse("https://127.0.0.2:8443").unwrap().to_string(), "https://127.0.0.2:8443");
    }

    #[test]
    fn validation_names_the_missing_setting() {
        let mut c = LxdConfig::new("m", LxdEndpoint::Unix("/s".into()), "busybox");
        assert!(c.validate().is_ok());
        c.image = " ".into();
        assert!(c.validate().unwrap_err().to_string().contains("--lxd-image"));
        c.image = "busybox".into();
        c.endpoint = LxdEndpoint::Https { authority: "127.0.0.1:8443".into() };
        assert!(c.validate().unwrap_err().to_string().contains("--lxd-client-cert"));
        c.tls.client_cert = Some("c.pem".into());
        assert!(c.validate().unwrap_err().to_string().contains("--lxd-client-key"));
        c.tls.client_key = Some("k.pem".into());
        assert!(c.validate().unwrap_err().to_string().contains("--lxd-server-cert"));
        c.tls.server_cert = Some("s.crt".into());
        assert!(c.validate().is_ok());
    }
}
