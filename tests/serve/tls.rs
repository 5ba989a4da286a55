//! TLS: `serve --tls-cert/--tls-key`, the client's `--ca-cert` (a pinned self-signed
//! certificate too), plain HTTP off loopback refused unless `--insecure-http`, and bad TLS
//! files refused naming the file.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{agent_trusting, bin, free_port, ids_of, poll, serve_exit, temp_dir, test_certificate, Server};

/// A self-signed certificate as `openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost
/// -addext "subjectAltName=IP:127.0.0.1,DNS:localhost"` makes it: marked CA:TRUE (OpenSSL's
/// default extensions for `req -x509`), written as `NAME.crt` and `NAME.key`.
fn ca_shaped_certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (cert_file, key_file)
}

/// Makes a certificate and its key in `dir` with `certificate`, starts `serve` over TLS with
/// them on `dir/data` and waits until `https://127.0.0.1:PORT/healthz` answers: the server, and
/// the certificate's file (for `--ca-cert`).
fn start_tls(dir: &Path, certificate: fn(&Path, &str) -> (PathBuf, PathBuf)) -> (Server, String) {
    let (cert, key) = certificate(dir, "server");
    let port = free_port();
    let tls = [OsStr::new("--tls-cert"), cert.as_os_str(), OsStr::new("--tls-key"), key.as_os_str()];
    let mut s = Server::spawn(port, &dir.join("data"), &dir.join(format!("serve-{port}.log")), tls);
    s.url = format!("https://127.0.0.1:{port}");
    let s = s.ready(&agent_trusting(&cert));
    (s, cert.to_str().unwrap().to_owned())
}

/// Adds `n` machines over https, trusting the certificate file `ca` (`--ca-cert`).
fn add_trusting(s: &Server, ca: &str, n: usize) {
    let added = s.json(&["machine", "add", "-n", &n.to_string(), "--json", "--ca-cert", ca]);
    assert_eq!(ids_of(&added).len(), n, "{added}");
}

#[test]
fn tls_serves_the_client_commands_and_refuses_plain_http_and_unknown_certificates() {
    let dir = temp_dir("tls");
    let (s, ca) = start_tls(&dir, test_certificate);

    // The client commands work over https with --ca-cert, and with PROVISIONER_CA_CERT.
    add_trusting(&s, &ca, 2);
    let out = bin()
        .args(["status", "--json", "--server", &s.url, "--data-dir"])
        .arg(&s.dir)
        .env("PROVISIONER_CA_CERT", &ca)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["machines"], 2, "{status}");
    let listed = s.json(&["machine", "list", "--json", "--ca-cert", &ca]);
    assert_eq!(listed.as_array().unwrap().len(), 2);

    // Plain HTTP to the TLS port gets no answer.
    let plain = s.url.replacen("https://", "http://", 1);
    let answer =
        ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build().get(&format!("{plain}/healthz")).call();
    assert!(answer.is_err(), "plain HTTP to the TLS port was answered: {:?}", answer.map(|r| r.status()));

    // Without --ca-cert the client refuses the unknown certificate, saying what to do.
    let out = bin()
        .args(["status", "--server", &s.url, "--data-dir"])
        .arg(&s.dir)
        .env_remove("PROVISIONER_CA_CERT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("certificate is not trusted") && err.contains("--ca-cert"), "{err}");
    assert!(out.stdout.is_empty());

    // A CA certificate file that is not there is bad input naming the file.
    let out = s.cli(&["status", "--ca-cert", "/nonexistent/ca.pem"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}

/// The most common self-signed certificate (CA:TRUE, as `openssl req -x509` makes it): the
/// client trusts a server that presents exactly the certificate given with `--ca-cert`; another
/// certificate is refused with a sentence that names the file and says what to pass instead.
#[test]
fn a_pinned_self_signed_ca_certificate_is_trusted_and_tls_errors_say_what_to_do() {
    let dir = temp_dir("tls-ca-shaped");
    // start_tls waits for /healthz through the library's client configuration of this file.
    let (s, ca) = start_tls(&dir, ca_shaped_certificate);
    add_trusting(&s, &ca, 1);
    let listed = s.json(&["machine", "list", "--json", "--ca-cert", &ca]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    // Another certificate of the same shape is not the server's: refused, naming the file, and
    // not telling the user to pass --ca-cert as if they had not.
    let (other, _) = ca_shaped_certificate(&dir, "other");
    let out = s.cli(&["machine", "list", "--ca-cert", other.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not trusted") && err.contains(other.to_str().unwrap()), "{err}");
    assert!(err.contains("pass the certificate this service presents"), "{err}");
    assert!(out.stdout.is_empty());

    // https:// to a plain HTTP port: the handshake fails, and the sentence says which scheme
    // to use.
    let plain_dir = dir.join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let plain = Server::start(&plain_dir, &[]);
    let https = plain.url.replacen("http://", "https://", 1);
    let out = bin().args(["status", "--server", &https, "--data-dir"]).arg(&plain.dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("TLS handshake failed") && err.contains("http://"), "{err}");
}

#[test]
fn plain_http_off_loopback_is_refused_unless_insecure_http() {
    let dir = temp_dir("insecure");
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let (code, err) = serve_exit(&dir.join("data"), &listen, [] as [&str; 0]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("without TLS") && err.contains("--insecure-http") && err.contains("--tls-cert"), "{err}");
    assert!(err.trim().lines().count() == 1 && !err.contains("  "), "one sentence: {err}");
    assert!(!dir.join("data").exists(), "a refused start touched the data directory");

    // With --insecure-http it starts (checked on loopback, then stopped at once).
    let log = dir.join("insecure.log");
    let mut child = bin()
        .args(["serve", "--listen", &listen, "--insecure-http", "--data-dir"])
        .arg(dir.join("data"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let up = poll(Duration::from_secs(30), Duration::from_millis(25), || {
        if matches!(ureq::get(&format!("http://127.0.0.1:{port}/healthz")).call(), Ok(r) if r.status() == 200) {
            return Some(true);
        }
        child.try_wait().unwrap().is_some().then_some(false)
    })
    .unwrap_or(false);
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    assert!(up, "serve --insecure-http did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
}

#[test]
fn bad_tls_files_exit_2_naming_the_file() {
    let dir = temp_dir("badtls");
    let (cert, key) = test_certificate(&dir, "good");
    let (_, other_key) = test_certificate(&dir, "other");
    let listen = format!("127.0.0.1:{}", free_port());
    let run = |cert: &Path, key: &Path| {
        serve_exit(
            &dir.join("data"),
            &listen,
            [OsStr::new("--tls-cert"), cert.as_os_str(), OsStr::new("--tls-key"), key.as_os_str()],
        )
    };

    let missing = dir.join("missing.crt");
    let (code, err) = run(&missing, &key);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(missing.to_str().unwrap()) && err.contains("TLS certificate"), "{err}");

    // Unreadable: a directory where the key should be (tests may run as root, who reads any file).
    let unreadable = dir.join("unreadable.key");
    std::fs::create_dir_all(&unreadable).unwrap();
    let (code, err) = run(&cert, &unreadable);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(unreadable.to_str().unwrap()) && err.contains("TLS key"), "{err}");

    let garbage = dir.join("garbage.key");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let (code, err) = run(&cert, &garbage);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(garbage.to_str().unwrap()), "{err}");

    let (code, err) = run(&cert, &other_key);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(other_key.to_str().unwrap()) && err.contains("does not match"), "{err}");
    assert!(err.contains(cert.to_str().unwrap()), "{err}");

    let (code, err) = serve_exit(&dir.join("data"), &listen, [OsStr::new("--tls-cert"), cert.as_os_str()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key"), "{err}");
    assert!(!dir.join("data").exists(), "a refused start touched the data directory");
}
