//! The harness of the service's tests: the real binary's `serve` on a temporary data directory
//! and a free loopback port ([`Server`]), the client commands against it, one raw HTTP
//! exchange, the samples of `/metrics`, certificates, a tmpfs for a full disk, and the one wait
//! loop every wait is made of ([`poll`]; [`eventually`] when the wait is an assertion).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

#[cfg(feature = "postgres")]
use provisioner::testing::postgres::TempPostgres;
#[cfg(feature = "postgres")]
pub use provisioner::testing::postgres::{cluster, fresh_db};
use serde_json::Value;

/// The `provisioner` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_provisioner"))
}

/// An empty directory of this test's own (`name`), under the system's temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("provisioner-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh database on the shared PostgreSQL cluster, and an empty directory of this test's
/// own (`name`): the cluster (it runs while this handle lives), the database's URL, the
/// directory.
#[cfg(feature = "postgres")]
pub fn fresh_postgres(name: &str) -> (std::sync::Arc<TempPostgres>, String, PathBuf) {
    let pg = cluster();
    let url = fresh_db(&pg);
    (pg, url, temp_dir(name))
}

/// Two replicas, both started with `extra`, on a fresh database ([`fresh_postgres`]): the
/// cluster (it runs while this handle lives), the first (it initialised the database) and the
/// second ([`Server::start_second_replica`]).
#[cfg(feature = "postgres")]
pub fn two_replicas(name: &str, extra: &[&str]) -> (std::sync::Arc<TempPostgres>, Server, Server) {
    let (pg, url, dir) = fresh_postgres(name);
    let first = Server::start_on_postgres(&dir, &url, extra);
    let second = Server::start_second_replica(&dir, &url, extra);
    (pg, first, second)
}

/// Writes `text` to the config file `name` in `dir`; answers its path, for `--config`.
pub fn config_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A loopback port nothing listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The one wait loop: asks `probe` every `every` until it answers `Some`, and returns that; or
/// `None` once `limit` has passed since the first question.
pub fn poll<T>(limit: Duration, every: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let began = Instant::now();
    loop {
        if let Some(answer) = probe() {
            return Some(answer);
        }
        if began.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits until `done` holds (polling every 50 ms), or fails after `limit`.
pub fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let held = poll(limit, Duration::from_millis(50), || done().then_some(()));
    assert!(held.is_some(), "timed out waiting for {what}");
}

/// `serve --listen LISTEN --data-dir DATA ARGS`, on the binary `cmd` (with its environment).
fn serve_command(
    mut cmd: Command,
    listen: &str,
    data: &Path,
    args: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> Command {
    cmd.args(["serve", "--listen", listen, "--data-dir"]).arg(data).args(args);
    cmd
}

/// Runs `serve --listen LISTEN --data-dir DATA ARGS` and returns its exit code and stderr if it
/// exits within 5 s (None: it kept running, and was killed).
pub fn serve_exit(
    data: &Path,
    listen: &str,
    extra: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> (Option<i32>, String) {
    let mut child =
        serve_command(bin(), listen, data, extra).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    match poll(Duration::from_secs(5), Duration::from_millis(25), || child.try_wait().unwrap()) {
        Some(status) => {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            (status.code(), err)
        }
        None => {
            let _ = child.kill();
            let _ = child.wait();
            (None, "serve started and kept running".into())
        }
    }
}

/// [`serve_exit`] on a free loopback port: a service that starts is a failure of these checks
/// (it is stopped after 5 s).
pub fn serve_output(data: &Path, extra: &[&str]) -> (Option<i32>, String) {
    serve_exit(data, &format!("127.0.0.1:{}", free_port()), extra)
}

/// A running `provisioner serve`; killed (SIGKILL) if still running when dropped.
pub struct Server {
    pub child: Option<Child>,
    /// Its data directory.
    pub dir: PathBuf,
    /// `http://127.0.0.1:PORT` (`https://` over TLS).
    pub url: String,
    /// The file its stderr goes to.
    pub log: PathBuf,
}

impl Server {
    /// Starts a service on `dir/data` and waits until `/healthz` answers 200.
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        Server::start_on(&dir.join("data"), dir, extra)
    }

    /// Starts a service on `data`, logging into `logs`.
    pub fn start_on(data: &Path, logs: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        Server::spawn(port, data, &logs.join(format!("serve-{port}.log")), extra).ready(&ureq::agent())
    }

    /// `serve` on PostgreSQL at `url`, its data directory `dir/data`.
    #[cfg(feature = "postgres")]
    pub fn start_on_postgres(dir: &Path, url: &str, extra: &[&str]) -> Server {
        let mut args = vec!["--store", url];
        args.extend_from_slice(extra);
        Server::start(dir, &args)
    }

    /// A second replica on the PostgreSQL database at `url`, with its own directory
    /// `dir/other` (its data directory `dir/other/data`).
    #[cfg(feature = "postgres")]
    pub fn start_second_replica(dir: &Path, url: &str, extra: &[&str]) -> Server {
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        let mut args = vec!["--store", url];
        args.extend_from_slice(extra);
        Server::start_on(&other.join("data"), &other, &args)
    }

    /// Spawns `serve --listen 127.0.0.1:PORT --data-dir DATA ARGS`, its stderr into `log`, and
    /// returns at once: it may never be ready ([`Server::ready`] waits).
    pub fn spawn(port: u16, data: &Path, log: &Path, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Server {
        Server::spawn_with(bin(), port, data, log, args)
    }

    /// [`Server::spawn`] on `cmd`, the binary with its environment set.
    pub fn spawn_with(
        cmd: Command,
        port: u16,
        data: &Path,
        log: &Path,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
    ) -> Server {
        let child = serve_command(cmd, &format!("127.0.0.1:{port}"), data, args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Server {
            child: Some(child),
            dir: data.to_owned(),
            url: format!("http://127.0.0.1:{port}"),
            log: log.to_owned(),
        }
    }

    /// Waits until `/healthz` answers 200 through `agent` (30 s at most); fails at once if
    /// `serve` exits.
    pub fn ready(mut self, agent: &ureq::Agent) -> Server {
        let up = poll(Duration::from_secs(30), Duration::from_millis(25), || {
            if matches!(agent.get(&format!("{}/healthz", self.url)).call(), Ok(r) if r.status() == 200) {
                return Some(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("serve exited with {status}: {}", self.log_text());
            }
            None
        });
        assert!(up.is_some(), "serve not ready: {}", self.log_text());
        self
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.dir.join("token")).unwrap().trim().to_owned()
    }

    /// Runs a client command against this server (token read from the data dir).
    pub fn cli(&self, args: &[&str]) -> Output {
        bin().args(args).arg("--server").arg(&self.url).arg("--data-dir").arg(&self.dir).output().unwrap()
    }

    /// Runs a client command that must succeed, and parses its JSON output.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.cli(args);
        assert!(out.status.success(), "{args:?}: {}\n{}", String::from_utf8_lossy(&out.stderr), self.log_text());
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {:?}", out.stdout))
    }

    pub fn machines(&self) -> Vec<Value> {
        self.json(&["machine", "list", "--json"]).as_array().unwrap().clone()
    }

    pub fn instances(&self) -> Vec<Value> {
        self.json(&["instance", "list", "--json"]).as_array().unwrap().clone()
    }

    pub fn metrics(&self) -> String {
        ureq::get(&format!("{}/metrics", self.url)).call().unwrap().into_string().unwrap()
    }

    /// `kill -9`: no shutdown of any kind.
    pub fn crash(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM, and the exit status (within 20 s).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().unwrap();
        let ok = Command::new("kill").args(["-TERM", &c.id().to_string()]).status().unwrap();
        assert!(ok.success());
        match poll(Duration::from_secs(20), Duration::from_millis(25), || c.try_wait().unwrap()) {
            Some(status) => status,
            None => {
                let _ = c.kill();
                panic!("serve did not stop within 20 s of SIGTERM: {}", self.log_text());
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// The `key` field of each element of the JSON array `list`.
pub fn fields(list: &Value, key: &str) -> Vec<String> {
    list.as_array().unwrap().iter().map(|m| field(m, key).to_owned()).collect()
}

/// The machine `id` of a machine list (failing if it is not listed).
pub fn machine<'a>(list: &'a [Value], id: &str) -> &'a Value {
    list.iter().find(|m| field(m, "id") == id).unwrap_or_else(|| panic!("machine {id} not listed: {list:?}"))
}

pub fn ids_of(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned()).collect()
}

/// Every machine is started with an instance in one of the cloud's zones, and each has
/// exactly one live instance in the cloud, the one recorded for it.
pub fn assert_provisioned_once(s: &Server, ids: &[String]) {
    let machines = s.machines();
    let instances = s.instances();
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in &instances {
        live.entry(field(i, "machine").to_owned()).or_default().push(field(i, "id").to_owned());
    }
    for id in ids {
        let m =
            machines.iter().find(|m| field(m, "id") == id).unwrap_or_else(|| panic!("machine {id} lost: {machines:?}"));
        assert_eq!(field(m, "life"), "alive", "{m}");
        assert_eq!(field(m, "status"), "started", "{m}");
        let instance = field(m, "instance");
        assert!(!instance.is_empty(), "{m}");
        assert!(["az1", "az2", "az3"].contains(&field(m, "zone")), "{m}");
        assert_eq!(live.get(id.as_str()), Some(&vec![instance.to_owned()]), "machine {id}: live instances {live:?}");
    }
}

/// One raw HTTP/1.1 exchange (`Connection: close`): the status, the headers (lower-case
/// names) and the body. Raw, so that made-up methods and odd bodies reach the service as sent.
pub fn raw_http(
    s: &Server,
    method: &str,
    path: &str,
    token: bool,
    body: Option<&[u8]>,
) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let addr = s.url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if token {
        head.push_str(&format!("Authorization: Bearer {}\r\n", s.token()));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    if let Some(b) = body {
        // The service may answer (413) and close before reading all of an oversized body.
        let _ = conn.write_all(b);
    }
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `GET path` without a token, answered 200 with `content_type`: the headers and the body.
pub fn served_without_a_token(s: &Server, path: &str, content_type: &str) -> (Vec<(String, String)>, String) {
    let (status, headers, body) = raw_http(s, "GET", path, false, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "content-type"), Some(content_type));
    (headers, body)
}

/// The value of one sample of /metrics (`name{labels}` exactly as rendered).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

/// Unmounts (lazily) when dropped.
pub struct Mounted(PathBuf);

/// A tmpfs of `size` (e.g. `8m`) mounted at `mnt` (made), unmounted when dropped; `None` where
/// it cannot be mounted (needs root and `mount`: the test then says so and checks nothing).
pub fn mount_tmpfs(mnt: &Path, size: &str) -> Option<Mounted> {
    std::fs::create_dir_all(mnt).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(mnt).status();
    if !matches!(mounted, Ok(s) if s.success()) {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root): this test checked nothing");
        return None;
    }
    Some(Mounted(mnt.to_owned()))
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A self-signed certificate for `127.0.0.1` and `localhost` and its key, written as PEM files
/// into `dir` as `NAME.crt` and `NAME.key`.
pub fn test_certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

/// An HTTP agent that trusts exactly `ca`.
pub fn agent_trusting(ca: &Path) -> ureq::Agent {
    let config = provisioner::service::tls::client_config(ca).unwrap();
    ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).tls_config(std::sync::Arc::new(config)).build()
}

/// `serve`'s arguments for the EC2 broker on moto's server.
#[cfg(all(feature = "ec2", feature = "test-util"))]
pub fn moto_serve_args(moto: &provisioner::testing::moto::Moto) -> [&str; 10] {
    [
        "--broker",
        "ec2",
        "--ec2-endpoint",
        moto.endpoint.as_str(),
        "--region",
        "us-east-1",
        "--ec2-image",
        provisioner::testing::moto::IMAGE,
        "--ec2-instance-type",
        "t3.micro",
    ]
}
