//! A throwaway PostgreSQL server for tests: a cluster of its own in a temporary directory, on a
//! free loopback port, started with `.ci/pg-cluster` (which installs Debian's packages when
//! they are missing and runs the server as the `postgres` user, since `initdb` refuses root),
//! and stopped when the value is dropped.
//!
//! ```no_run
//! let pg = provisioner::testing::TempPostgres::start("my-test").unwrap();
//! let url = pg.url(); // postgres://postgres@127.0.0.1:PORT/postgres
//! ```
//!
//! Beside it, what the unit tests of the PostgreSQL store and the service's tests
//! (`tests/serve`) share: [`cluster`], one server for the tests running at the same time;
//! [`fresh_db`], a database of a test's own on it (feature `postgres`); and
//! [`tls_certificates`], a CA and a server certificate it signed, for a server with TLS
//! ([`TempPostgres::start_tls`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock, Weak};

/// A running PostgreSQL cluster of one test's own.
#[derive(Debug)]
pub struct TempPostgres {
    dir: PathBuf,
    url: String,
    stopped: bool,
}

/// Why the test server could not be started or restarted.
#[derive(Debug, thiserror::Error)]
pub enum TempPostgresError {
    /// The helper script could not be run.
    #[error("cannot run {script}: {source}")]
    Spawn {
        /// The script's path.
        script: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A file for the server could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The helper script failed.
    #[error("{script} {action} failed: {stderr}")]
    Failed {
        /// The script's path.
        script: PathBuf,
        /// What it was asked to do.
        action: &'static str,
        /// What it printed on stderr.
        stderr: String,
    },
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci").join("pg-cluster")
}

fn run(action: &'static str, dir: &Path) -> Result<String, TempPostgresError> {
    run_with(action, dir, &[])
}

fn run_with(action: &'static str, dir: &Path, args: &[&Path]) -> Result<String, TempPostgresError> {
    let script = script();
    let out = Command::new(&script)
        .arg(action)
        .arg(dir)
        .args(args)
        .output()
        .map_err(|source| TempPostgresError::Spawn { script: script.clone(), source })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        return Err(TempPostgresError::Failed { script, action, stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl TempPostgres {
    /// Starts a new cluster under the system's temporary directory (`name` and the process id
    /// keep concurrent tests apart); any leftover of an earlier run with the same name is
    /// removed first.
    pub fn start(name: &str) -> Result<Self, TempPostgresError> {
        let dir = std::env::temp_dir().join(format!("provisioner-pg-{}-{name}", std::process::id()));
        if dir.exists() {
            let _ = run("stop", &dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let url = run("start", &dir)?;
        Ok(Self { dir, url, stopped: false })
    }

    /// [`TempPostgres::start`], then TLS turned on (`ssl = on`) with the certificate chain
    /// `cert_pem` and its key `key_pem` (PEM), and the server restarted: it then offers TLS on
    /// its port (and still takes plain connections, as `trust` allows).
    pub fn start_tls(name: &str, cert_pem: &str, key_pem: &str) -> Result<Self, TempPostgresError> {
        let pg = Self::start(name)?;
        let (cert, key) = (pg.dir.join("tls-cert.pem"), pg.dir.join("tls-key.pem"));
        let write = |path: &Path, text: &str| {
            std::fs::write(path, text).map_err(|source| TempPostgresError::Write { path: path.to_owned(), source })
        };
        write(&cert, cert_pem)?;
        write(&key, key_pem)?;
        run_with("ssl", &pg.dir, &[&cert, &key])?;
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().and_then(|p| p.split('/').next()).and_then(|p| p.parse().ok()).unwrap_or(0)
    }

    /// Stops the server at once (as a crash would: `pg_ctl -m immediate`).
    pub fn stop(&mut self) -> Result<(), TempPostgresError> {
        run("stop", &self.dir)?;
        self.stopped = true;
        Ok(())
    }

    /// Restarts the server on the same port and data (a clean shutdown, then a start).
    pub fn restart(&mut self) -> Result<(), TempPostgresError> {
        if self.stopped {
            run("start", &self.dir)?;
        } else {
            run("restart", &self.dir)?;
        }
        self.stopped = false;
        Ok(())
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let _ = run("stop", &self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a caller of [`cluster`] is answered: the shared server, or why none could be started.
type Shared = Result<Arc<TempPostgres>, String>;

/// The server shared by the tests of this process that run at the same time: started by the
/// first that asks, stopped when the last lets its `Arc` go (the next then starts another).
///
/// One thread owns the slot and answers the askers in turn (no lock): it keeps only a `Weak`,
/// so that the server's fate is its users'.
pub fn cluster() -> Arc<TempPostgres> {
    static OWNER: OnceLock<Sender<Sender<Shared>>> = OnceLock::new();
    let owner = OWNER.get_or_init(|| {
        let (asks, asked) = mpsc::channel::<Sender<Shared>>();
        std::thread::Builder::new()
            .name("shared-postgres".into())
            .spawn(move || {
                let mut held: Weak<TempPostgres> = Weak::new();
                let mut starts = 0;
                for reply in asked {
                    let answer = match held.upgrade() {
                        Some(pg) => Ok(pg),
                        None => {
                            starts += 1;
                            TempPostgres::start(&format!("shared-{starts}")).map(Arc::new).map_err(|e| e.to_string())
                        }
                    };
                    if let Ok(pg) = &answer {
                        held = Arc::downgrade(pg);
                    }
                    let _ = reply.send(answer);
                }
            })
            .expect("spawn the shared PostgreSQL's owner");
        asks
    });
    let (reply, answer) = mpsc::channel();
    owner.send(reply).expect("the shared PostgreSQL's owner runs");
    match answer.recv().expect("the shared PostgreSQL's owner answers") {
        Ok(pg) => pg,
        Err(e) => panic!("start a PostgreSQL cluster: {e}"),
    }
}

/// A fresh, empty database on `pg` (feature `postgres`): its URL.
#[cfg(feature = "postgres")]
pub fn fresh_db(pg: &TempPostgres) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static DATABASES: AtomicUsize = AtomicUsize::new(0);
    let name = format!("t_{}", DATABASES.fetch_add(1, Ordering::Relaxed));
    let mut admin = ::postgres::Client::connect(pg.url(), ::postgres::NoTls).expect("connect as admin");
    admin.batch_execute(&format!("CREATE DATABASE {name}")).expect("create a database");
    let base = pg.url().rsplit_once('/').map(|(b, _)| b).unwrap_or(pg.url());
    format!("{base}/{name}")
}

/// A CA named `ca_name`, and a server certificate for `127.0.0.1` and `localhost` it signed:
/// (the CA's PEM, the server's PEM, the server's key PEM), for [`TempPostgres::start_tls`] and
/// a client's `sslrootcert`.
pub fn tls_certificates(ca_name: &str) -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.distinguished_name.push(rcgen::DnType::CommonName, ca_name);
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let ca = ca.self_signed(&ca_key).expect("a self-signed CA");
    let server =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("server parameters");
    let server_key = rcgen::KeyPair::generate().expect("a server key");
    let server = server.signed_by(&server_key, &ca, &ca_key).expect("a server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(url: &str) -> Option<String> {
        let out = Command::new("psql").arg(url).args(["-tAc", "SELECT 40 + 2"]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The server answers on its port, is down after `stop`, up again after `restart`, and its
    /// directory is gone once dropped.
    #[test]
    fn a_temporary_server_starts_stops_restarts_and_cleans_up() {
        let mut pg = TempPostgres::start("selftest").unwrap();
        assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:") && pg.port() > 0, "{}", pg.url());
        assert_eq!(query(pg.url()).as_deref(), Some("42"));
        pg.stop().unwrap();
        assert_eq!(query(pg.url()), None, "stopped");
        pg.restart().unwrap();
        assert_eq!(query(pg.url()).as_deref(), Some("42"), "restarted on the same port");
        let dir = pg.dir.clone();
        drop(pg);
        assert!(!dir.exists());
    }
}
