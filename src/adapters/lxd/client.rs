//! LXD's REST API as calls: one HTTP/1.1 connection a call (hyper's connection API), over the
//! daemon's unix socket or over TLS (rustls with ring; the client certificate the daemon
//! trusts; the daemon's certificate pinned byte for byte, since it is self-signed and names no
//! useful host). Every call is bounded by the client's deadline, connection, request and
//! answer together. LXD's answers are its envelope (`type` sync, async or error); an
//! asynchronous call answers its operation's id, which [`LxdClient::wait`] waits on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use serde_json::Value;

use super::config::{LxdConfigError, LxdEndpoint, LxdTlsFiles};
pub use super::errors::CallError;

/// The largest answer read (a listing of every instance with its config).
const MAX_ANSWER: usize = 256 << 20;

/// LXD's answer envelope.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    metadata: Value,
}

/// What a call answered: its metadata (a synchronous call), or the id of the operation it
/// started (an asynchronous one).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The result.
    Sync(Value),
    /// The operation's id.
    Async(String),
}

#[derive(Clone)]
enum Transport {
    Unix(PathBuf),
    Https { authority: String, connector: tokio_rustls::TlsConnector, server_name: ServerName<'static> },
}

/// A client of one LXD endpoint.
#[derive(Clone)]
pub struct LxdClient {
    transport: Transport,
    timeout: Duration,
}

impl std::fmt::Debug for LxdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoint = match &self.transport {
            Transport::Unix(p) => format!("unix:{}", p.display()),
            Transport::Https { authority, .. } => format!("https://{authority}"),
        };
        f.debug_struct("LxdClient").field("endpoint", &endpoint).field("timeout", &self.timeout).finish()
    }
}

impl LxdClient {
    /// A client of `endpoint` whose calls each take at most `timeout`; an HTTPS endpoint
    /// needs `tls`'s three files (read now: a bad file is refused here, naming its setting).
    pub fn new(endpoint: &LxdEndpoint, tls: &LxdTlsFiles, timeout: Duration) -> Result<Self, LxdConfigError> {
        let transport = match endpoint {
            LxdEndpoint::Unix(path) => Transport::Unix(path.clone()),
            LxdEndpoint::Https { authority } => {
                let config = tls_config(tls)?;
                let host = authority.rsplit_once(':').map_or(authority.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                // The certificate is pinned: the name only matters as SNI, and an IP sends none.
                let server_name = ServerName::try_from(host.to_owned())
                    .map_err(|_| LxdConfigError::Endpoint(format!("https://{authority}")))?;
                Transport::Https {
                    authority: authority.clone(),
                    connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
                    server_name,
                }
            }
        };
        Ok(Self { transport, timeout })
    }

    /// The same client with another per-call deadline.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self { transport: self.transport.clone(), timeout }
    }

    /// `GET path`: its metadata.
    pub async fn get(&self, path: &str) -> Result<Value, CallError> {
        match self.call(Method::GET, path, None).await? {
            Answer::Sync(v) => Ok(v),
            Answer::Async(id) => Err(CallError::Decode(format!("GET {path} started operation {id}"))),
        }
    }

    /// A call with a JSON body (or none).
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Answer, CallError> {
        let deadline = self.timeout;
        match actix_rt::time::timeout(deadline, self.exchange(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(deadline)),
        }
    }

    /// Waits for operation `id` to end, for at most `timeout`: its metadata when it
    /// succeeded, [`CallError::Operation`] with its error when it failed, a timeout when it is
    /// still running. `project` is the operation's project.
    pub async fn wait(&self, id: &str, project: &str, timeout: Duration) -> Result<Value, CallError> {
        let secs = timeout.as_secs().max(1);
        let path = format!("/1.0/operations/{id}/wait?timeout={secs}&project={project}");
        // The wait's own deadline is the operation's, plus the call's.
        let op = self.with_timeout(timeout + self.timeout).get(&path).await?;
        match op.get("status").and_then(Value::as_str) {
            Some("Success") => Ok(op),
            Some("Failure") | Some("Cancelled") => {
                let err = op.get("err").and_then(Value::as_str).unwrap_or("the operation failed");
                Err(CallError::Operation(err.to_owned()))
            }
            // Still running when LXD's wait ended.
            _ => Err(CallError::Timeout(timeout)),
        }
    }

    async fn exchange(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Answer, CallError> {
        let bytes = match body {
            Some(v) => Bytes::from(serde_json::to_vec(v).map_err(|e| CallError::Decode(e.to_string()))?),
            None => Bytes::new(),
        };
        let host = match &self.transport {
            Transport::Unix(_) => "lxd",
            Transport::Https { authority, .. } => authority.as_str(),
        };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes))
            .map_err(|e| CallError::Decode(format!("request {path}: {e}")))?;
        let (status, answer) = match &self.transport {
            Transport::Unix(socket) => {
                let stream = tokio::net::UnixStream::connect(socket).await.map_err(CallError::Connect)?;
                send(stream, request).await?
            }
            Transport::Https { authority, connector, server_name } => {
                let tcp = tokio::net::TcpStream::connect(authority.as_str()).await.map_err(CallError::Connect)?;
                let _ = tcp.set_nodelay(true);
                let tls = connector.connect(server_name.clone(), tcp).await.map_err(CallError::Handshake)?;
                send(tls, request).await?
            }
        };
        decode(status, &answer)
    }
}

/// One request on a fresh connection over `io`; the connection closes with the answer.
async fn send<S>(io: S, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), CallError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(CallError::Http)?;
    let answer = async move {
        let response = sender.send_request(request).await.map_err(CallError::Http)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(h) => CallError::Http(*h),
                Err(other) => CallError::Decode(format!("answer larger than {MAX_ANSWER} bytes: {other}")),
            })?
            .to_bytes();
        Ok((status, body))
    };
    // The connection is driven beside the exchange, in the same task; it ends with the call
    // (dropped), or first when the daemon closes it (then the exchange says how it went).
    match futures::future::select(std::pin::pin!(answer), conn).await {
        futures::future::Either::Left((answer, _conn)) => answer,
        futures::future::Either::Right((_closed, answer)) => answer.await,
    }
}

/// LXD's envelope to an [`Answer`] or its error.
fn decode(status: StatusCode, body: &[u8]) -> Result<Answer, CallError> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        if status.is_success() {
            CallError::Decode(format!("{e}: {text}"))
        } else {
            CallError::Api { status: status.as_u16(), message: text }
        }
    })?;
    match envelope.kind.as_str() {
        "sync" if status.is_success() => Ok(Answer::Sync(envelope.metadata)),
        "async" if status.is_success() => match envelope.metadata.get("id").and_then(Value::as_str) {
            Some(id) => Ok(Answer::Async(id.to_owned())),
            None => Err(CallError::Decode("an asynchronous answer without an operation id".into())),
        },
        _ => Err(CallError::Api {
            status: status.as_u16(),
            message: if envelope.error.is_empty() { status.to_string() } else { envelope.error },
        }),
    }
}

/// The TLS configuration of an HTTPS endpoint: the client certificate and key, and a verifier
/// that takes exactly the pinned server certificate.
fn tls_config(files: &LxdTlsFiles) -> Result<rustls::ClientConfig, LxdConfigError> {
    let file = |setting: &'static str, path: &Option<PathBuf>| -> Result<PathBuf, LxdConfigError> {
        path.clone().ok_or(LxdConfigError::Missing(setting))
    };
    let cert_path = file("--lxd-client-cert", &files.client_cert)?;
    let key_path = file("--lxd-client-key", &files.client_key)?;
    let server_path = file("--lxd-server-cert", &files.server_cert)?;
    let chain = certificates("--lxd-client-cert", &cert_path)?;
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| LxdConfigError::TlsFile {
        setting: "--lxd-client-key",
        path: key_path.clone(),
        problem: format!("no private key read: {e}"),
    })?;
    let pinned = certificates("--lxd-server-cert", &server_path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(crate::adapters::tls::Pinned::to(pinned, provider.signature_verification_algorithms));
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(LxdConfigError::ClientAuth)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(LxdConfigError::ClientAuth)
}

fn certificates(setting: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, LxdConfigError> {
    let problem = |problem: String| LxdConfigError::TlsFile { setting, path: path.to_owned(), problem };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| problem(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(e.to_string()))?;
    if certs.is_empty() {
        return Err(problem("no PEM CERTIFICATE in it".into()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_decode_to_answers_and_errors() {
        let ok = br#"{"type":"sync","status_code":200,"metadata":{"a":1}}"#;
        assert_eq!(decode(StatusCode::OK, ok).unwrap(), Answer::Sync(serde_json::json!({"a":1})));
        let op = br#"{"type":"async","status_code":100,"metadata":{"id":"abc","class":"task"}}"#;
        assert_eq!(decode(StatusCode::ACCEPTED, op).unwrap(), Answer::Async("abc".into()));
        let err = br#"{"type":"error","error":"Instance not found","error_code":404,"metadata":null}"#;
        let e = decode(StatusCode::NOT_FOUND, err).unwrap_err();
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.lxd_message(), Some("Instance not found"));
        assert!(!e.is_ambiguous());
        let html = b"<html>bad gateway</html>";
        let e = decode(StatusCode::BAD_GATEWAY, html).unwrap_err();
        assert!(e.to_string().contains("bad gateway") && e.status() == Some(502), "{e}");
        assert!(matches!(decode(StatusCode::OK, html).unwrap_err(), CallError::Decode(_)));
        assert!(CallError::Timeout(Duration::from_secs(1)).is_ambiguous());
    }

    #[test]
    fn a_missing_or_empty_certificate_file_is_named_with_its_setting() {
        let dir = std::env::temp_dir().join(format!("lxd-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let files = LxdTlsFiles {
            client_cert: Some(empty.clone()),
            client_key: Some(dir.join("k.pem")),
            server_cert: Some(dir.join("s.crt")),
        };
        let e =
            LxdClient::new(&LxdEndpoint::Https { authority: "127.0.0.1:8443".into() }, &files, Duration::from_secs(1))
                .unwrap_err()
                .to_string();
        assert!(e.contains("--lxd-client-cert") && e.contains("empty.pem"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
