//! The service, driven as an operator would: the real binary's `serve` on a temporary data
//! directory and a free loopback port, and the client commands against it. Includes the
//! crash-safety checks: `kill -9` with starts in flight, then a restart on the same directory.

// These tests drive real processes in real time: they sleep and read the wall clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_provisioner"))
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("provisioner-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running `provisioner serve`; killed (SIGKILL) if still running when dropped.
struct Server {
    child: Option<Child>,
    dir: PathBuf,
    url: String,
    log: PathBuf,
}

impl Server {
    /// Starts a service on `dir/data` and waits until `/healthz` answers 200.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        Server::start_on(&dir.join("data"), dir, extra)
    }

    /// Starts a service on `data`, logging into `logs`.
    fn start_on(data: &Path, logs: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let data = data.to_owned();
        let log = logs.join(format!("serve-{port}.log"));
        let child = bin()
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(&data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut s = Server { child: Some(child), dir: data, url: format!("http://127.0.0.1:{port}"), log };
        let began = Instant::now();
        loop {
            if matches!(ureq::get(&format!("{}/healthz", s.url)).call(), Ok(r) if r.status() == 200) {
                return s;
            }
            if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("serve exited with {status}: {}", s.log_text());
            }
            assert!(began.elapsed() < Duration::from_secs(30), "serve not ready: {}", s.log_text());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.dir.join("token")).unwrap().trim().to_owned()
    }

    /// Runs a client command against this server (token read from the data dir).
    fn cli(&self, args: &[&str]) -> Output {
        bin().args(args).arg("--server").arg(&self.url).arg("--data-dir").arg(&self.dir).output().unwrap()
    }

    /// Runs a client command that must succeed, and parses its JSON output.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.cli(args);
        assert!(out.status.success(), "{args:?}: {}\n{}", String::from_utf8_lossy(&out.stderr), self.log_text());
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {:?}", out.stdout))
    }

    fn machines(&self) -> Vec<Value> {
        self.json(&["machine", "list", "--json"]).as_array().unwrap().clone()
    }

    fn instances(&self) -> Vec<Value> {
        self.json(&["instance", "list", "--json"]).as_array().unwrap().clone()
    }

    fn metrics(&self) -> String {
        ureq::get(&format!("{}/metrics", self.url)).call().unwrap().into_string().unwrap()
    }

    /// `kill -9`: no shutdown of any kind.
    fn crash(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM, and the exit status (within 20 s).
    fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().unwrap();
        let ok = Command::new("kill").args(["-TERM", &c.id().to_string()]).status().unwrap();
        assert!(ok.success());
        let began = Instant::now();
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            if began.elapsed() > Duration::from_secs(20) {
                let _ = c.kill();
                panic!("serve did not stop within 20 s of SIGTERM: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(25));
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

/// Waits until `done` holds (polling every 50 ms), or fails after `limit`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let began = Instant::now();
    while !done() {
        assert!(began.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn ids_of(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned()).collect()
}

/// Every machine is started with an instance in one of the cloud's zones, and each has
/// exactly one live instance in the cloud, the one recorded for it.
fn assert_provisioned_once(s: &Server, ids: &[String]) {
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

#[test]
fn health_is_public_and_every_v1_request_needs_the_token() {
    let dir = temp_dir("auth");
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let token = s.token();
    assert_eq!(token.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(s.dir.join("token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "token mode {mode:o}");
    }
    let status = |path: &str, auth: Option<&str>| {
        let mut req = ureq::get(&format!("{}{path}", s.url));
        if let Some(a) = auth {
            req = req.set("Authorization", a);
        }
        match req.call() {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    for path in ["/v1/machines", "/v1/instances", "/v1/status", "/v1/config/workers", "/v1/nothing-here"] {
        assert_eq!(status(path, None), 401, "{path} without a token");
        assert_eq!(status(path, Some("Bearer not-the-token")), 401, "{path} with a wrong token");
    }
    assert_eq!(status("/v1/machines", Some(&format!("Bearer {token}"))), 200);
    assert_eq!(status("/v1/machines", Some(&format!("bearer {token}"))), 200, "the scheme is case-insensitive");
    assert_eq!(status("/v1/machines", Some(&format!("Basic {token}"))), 401);
    assert_eq!(status("/v1/nothing-here", Some(&format!("Bearer {token}"))), 404);
    assert_eq!(status("/healthz", None), 200);
    let metrics = s.metrics();
    assert!(metrics.contains("# TYPE provisioner_http_requests counter"), "{metrics}");
    assert!(metrics.contains("provisioner_workers 16"), "{metrics}");
    assert!(metrics.contains("code=\"401\""), "{metrics}");

    // A client with a wrong token fails at run time (1), in one sentence.
    let out = bin().args(["machine", "list", "--server", &s.url, "--token", "wrong"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("token"), "{err}");
}

#[test]
fn machines_are_added_provisioned_listed_and_removed() {
    let dir = temp_dir("machines");
    let s = Server::start(&dir, &["--sim-start-latency", "200ms"]);
    let began = Instant::now();
    let ids = ids_of(&s.json(&["machine", "add", "-n", "5", "--wait", "--json"]));
    assert_eq!(ids, ["0", "1", "2", "3", "4"]);
    assert!(began.elapsed() < Duration::from_secs(10));
    // --wait returned: every machine is already provisioned.
    assert_provisioned_once(&s, &ids);
    let machines = s.machines();
    for m in &machines {
        for key in ["id", "life", "status", "instance", "zone", "instance_status", "message"] {
            assert!(m.get(key).is_some(), "key {key} missing from {m}");
        }
        assert_eq!(field(m, "instance_status"), "running");
    }
    let zones: std::collections::BTreeSet<&str> = machines.iter().map(|m| field(m, "zone")).collect();
    assert!(zones.len() >= 2, "five machines over three zones landed in {zones:?}");
    for i in s.instances() {
        for key in ["id", "state", "zone", "machine"] {
            assert!(i.get(key).is_some(), "key {key} missing from {i}");
        }
        assert_eq!(field(&i, "state"), "running");
    }

    // Remove one: its instance is stopped, then the machine is gone. Keep another's instance.
    let victim = s.machines().into_iter().find(|m| field(m, "id") == "0").unwrap();
    let victim_instance = field(&victim, "instance").to_owned();
    let out = s.cli(&["machine", "remove", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = s.cli(&["machine", "remove", "1", "--keep-instance"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "machines 0 and 1 to be removed", || {
        let m = s.machines();
        !m.iter().any(|m| ["0", "1"].contains(&field(m, "id")))
    });
    let instances = s.instances();
    assert!(!instances.iter().any(|i| field(i, "id") == victim_instance), "{instances:?}");
    assert_eq!(instances.len(), 3, "the kept instance is released: no longer ours to list");
    // The cloud itself: one terminated, four still running (one of them released).
    let metrics = s.metrics();
    assert!(metrics.contains("provisioner_instances{state=\"terminated\"} 1"), "{metrics}");
    assert!(metrics.contains("provisioner_instances{state=\"running\"} 4"), "{metrics}");
    assert!(metrics.contains("provisioner_events_total{event=\"machine-started\"} 5"), "{metrics}");

    // Bad input: exit 2 and one sentence.
    for args in
        [&["machine", "remove", "77"][..], &["machine", "add", "--zones", "nowhere"], &["machine", "retry", "2"]]
    {
        let out = s.cli(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert_ne!(out.status.code(), Some(0), "{args:?}");
    }
    assert_eq!(s.cli(&["machine", "remove", "77"]).status.code(), Some(2));
}

#[test]
fn config_changes_apply_at_once_and_survive_a_restart() {
    let dir = temp_dir("config");
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let get = |s: &Server, key: &str| {
        let out = s.cli(&["config", "get", key]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(get(&s, "workers"), "16");
    assert_eq!(get(&s, "harvest-mode"), "destroyed");
    assert!(s.cli(&["config", "set", "workers", "4"]).status.success());
    assert_eq!(get(&s, "workers"), "4");
    assert!(s.metrics().contains("provisioner_workers 4"));
    assert!(s.cli(&["config", "set", "harvest-mode", "all"]).status.success());
    assert_eq!(get(&s, "harvest-mode"), "all");
    let out = s.cli(&["config", "set", "workers", "101"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("between 1 and 100"));
    assert_eq!(get(&s, "workers"), "4", "a refused value changes nothing");
    assert_eq!(s.cli(&["config", "set", "harvest-mode", "sometimes"]).status.code(), Some(2));
    assert_eq!(s.cli(&["config", "get", "colour"]).status.code(), Some(2));

    assert_eq!(s.terminate().code(), Some(0));
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    assert_eq!(get(&s, "workers"), "4");
    assert_eq!(get(&s, "harvest-mode"), "all");
}

#[test]
fn sigterm_stops_cleanly_and_a_restart_finds_everything() {
    let dir = temp_dir("sigterm");
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    let before = s.machines();
    assert_eq!(s.terminate().code(), Some(0), "{}", s.log_text());
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    assert_eq!(s.machines(), before, "the model changed across a clean restart");
    assert_provisioned_once(&s, &ids);
    let more = ids_of(&s.json(&["machine", "add", "--wait", "--json"]));
    assert_eq!(more, ["3"], "machine ids are never reused");
    let all: Vec<String> = (0..4).map(|i| i.to_string()).collect();
    assert_provisioned_once(&s, &all);
    assert_eq!(s.instances().len(), 4);
    let status = s.json(&["status", "--json"]);
    assert_eq!(status["machines"], 4);
    assert_eq!(status["model_life"], "alive");
}

/// `kill -9` while starts are in flight (1 s latency): after a restart on the same data
/// directory every acknowledged machine is there and ends provisioned, and no machine ever has
/// two live instances (the restarted provisioner adopts the instances the crash left behind).
#[test]
fn a_crash_with_starts_in_flight_loses_nothing_and_duplicates_nothing() {
    let dir = temp_dir("crash");
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, "resync = \"1s\"\n[retry]\ndelay = \"1s\"\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    // Crash safety: 30 machines, kill -9 while their starts are in flight, restart: all 30
    // provisioned, each with exactly one instance, no orphan.
    let mut acknowledged = ids_of(&s.json(&["machine", "add", "-n", "20", "--json"]));
    // Crash while starts are in flight (each takes 1 s), right after acknowledging more.
    eventually(Duration::from_secs(10), "starts to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    acknowledged.extend(ids_of(&s.json(&["machine", "add", "-n", "10", "--json"])));
    assert_eq!(acknowledged.len(), 30);
    s.crash();

    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    eventually(Duration::from_secs(40), "every acknowledged machine to be provisioned", || {
        let m = s.machines();
        acknowledged.iter().all(|id| {
            m.iter()
                .any(|m| field(m, "id") == id && field(m, "status") == "started" && !field(m, "instance").is_empty())
        })
    });
    assert_provisioned_once(&s, &acknowledged);
    let live = s.instances();
    assert_eq!(live.len(), acknowledged.len(), "one live instance per machine: {live:?}");

    // A second crash, right after adding more, then a clean stop and start: still exact.
    acknowledged.extend(ids_of(&s.json(&["machine", "add", "-n", "3", "--json"])));
    s.crash();
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    eventually(Duration::from_secs(20), "the machines added before the second crash", || {
        s.machines().iter().filter(|m| field(m, "status") == "started").count() == acknowledged.len()
    });
    assert_provisioned_once(&s, &acknowledged);
    assert_eq!(s.terminate().code(), Some(0));
    let s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    assert_provisioned_once(&s, &acknowledged);
    assert_eq!(s.instances().len(), acknowledged.len());
}

#[test]
fn serve_refuses_bad_usage_with_exit_2_and_one_sentence() {
    let dir = temp_dir("usage");
    let run = |args: &[&str]| {
        let out = bin().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (out.status.code(), err)
    };
    let data = dir.join("d");
    let data = data.to_str().unwrap();
    let (code, err) = run(&["serve", "--broker", "ec2", "--data-dir", data, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    if cfg!(feature = "ec2") {
        // Built with EC2: what is missing is named.
        assert!(err.contains("EC2 broker") && err.contains("--ec2-image"), "{err}");
    } else {
        assert!(err.contains("no EC2 broker") && err.contains("--features serve,ec2"), "{err}");
    }

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "workers = 4\nlisten_on = \"x\"\n").unwrap();
    let (code, err) = run(&["serve", "--config", bad.to_str().unwrap(), "--data-dir", data]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad.toml:2") && err.contains("listen_on"), "{err}");

    let (code, err) = run(&["serve", "--sim-start-latency", "soon", "--data-dir", data]);
    assert_eq!(code, Some(2), "{err}");

    // Listening on a port already taken is a run-time failure.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = run(&["serve", "--listen", &addr, "--data-dir", data]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot listen on"), "{err}");
    // ... said in one sentence, the provisioner stopped cleanly (it used to panic on the way
    // out: its actors were dropped after the runtime).
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // (`--insecure-http`: an address that is not loopback is refused without TLS before any bind.)
    let (code, err) = run(&["serve", "--listen", "256.0.0.1:1", "--insecure-http", "--data-dir", data]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot listen on 256.0.0.1:1") && !err.contains("panicked"), "{err}");

    // No service there: a run-time failure, in one sentence.
    let (code, err) = run(&["status", "--server", "http://127.0.0.1:9", "--token", "t"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // No token anywhere: bad usage.
    let (code, err) = run(&["machine", "list", "--data-dir", dir.join("nowhere").to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no API token"), "{err}");

    for cmd in [
        &["serve", "--help"][..],
        &["machine", "add", "--help"],
        &["config", "set", "--help"],
        &["destroy-model", "--help"],
    ] {
        let (code, _) = run(cmd);
        assert_eq!(code, Some(0), "{cmd:?}");
    }
}

#[test]
fn destroying_the_model_stops_every_instance_and_refuses_new_machines() {
    let dir = temp_dir("destroy");
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    s.json(&["machine", "add", "-n", "3", "--wait", "--json"]);
    let d = s.json(&["destroy-model", "--json"]);
    assert_eq!(d["stopping"].as_array().unwrap().len(), 3, "{d}");
    eventually(Duration::from_secs(10), "every instance to be stopped", || s.instances().is_empty());
    let out = s.cli(&["machine", "add"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dying"));
    let out = s.cli(&["destroy-model"]);
    assert_eq!(out.status.code(), Some(1), "a second destroy is refused");
}

/// SIGTERM with starts in flight waits for them: after the restart the machines are already
/// provisioned with running instances (an instance adopted after a crash would show the
/// `pending` state it was listed in until the next resync, 60 s away).
#[test]
fn sigterm_waits_for_starts_in_flight() {
    let dir = temp_dir("drain");
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "4", "--json"]));
    eventually(Duration::from_secs(5), "starts to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    let began = Instant::now();
    assert_eq!(s.terminate().code(), Some(0), "{}", s.log_text());
    assert!(began.elapsed() >= Duration::from_millis(300), "SIGTERM did not wait for the starts");
    let s = Server::start(&dir, &["--sim-start-latency", "30s"]);
    let machines = s.machines();
    for id in &ids {
        let m = machines.iter().find(|m| field(m, "id") == id).unwrap();
        assert_eq!(field(m, "status"), "started", "{m}");
        assert_eq!(field(m, "instance_status"), "running", "{m}");
    }
    assert_provisioned_once(&s, &ids);
}

/// Two services on one data directory would provision the same model twice: the second is
/// refused at start (exit 1), and the first goes on.
#[test]
fn a_second_service_on_the_same_data_directory_is_refused() {
    let dir = temp_dir("twice");
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let out = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another provisioner service"), "{err}");
    assert_eq!(s.json(&["machine", "add", "--wait", "--json"]), serde_json::json!(["0"]));
}

/// A machine whose only zone is unavailable ends in provisioning error (`--wait` exits 1 and
/// names it); it stays in error across a restart (errors are not retried on their own, as in
/// Juju), and `machine retry` starts it once its zone is back.
#[test]
fn a_failed_machine_stays_failed_until_retried() {
    let dir = temp_dir("retry");
    let down = dir.join("down.toml");
    std::fs::write(&down, "[retry]\ncount = 0\n[sim]\nzones = [\"az1\", \"az2\"]\nunavailable_zones = [\"az3\"]\n")
        .unwrap();
    let down = down.to_str().unwrap().to_owned();
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms", "--config", &down]);
    let out = s.cli(&["machine", "add", "--zones", "az3", "--wait", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("1 of 1 new machines failed to provision") && err.contains("0 ("), "{err}");
    let ids = ids_of(&serde_json::from_slice(&out.stdout).unwrap());
    assert_eq!(ids, ["0"], "the ids are printed even when a machine failed");
    let m = s.machines().remove(0);
    assert_eq!(field(&m, "status"), "error", "{m}");
    assert_eq!(field(&m, "instance_status"), "provisioning error", "{m}");
    assert!(field(&m, "message").contains("zone"), "{m}");
    assert_eq!(s.json(&["status", "--json"])["machines_in_error"], 1);

    // Its zone comes back with a restart: still in error until retried.
    assert_eq!(s.terminate().code(), Some(0));
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(field(&s.machines()[0], "status"), "error");
    assert!(s.instances().is_empty());
    let out = s.cli(&["machine", "retry", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "the retried machine to be provisioned", || {
        field(&s.machines()[0], "status") == "started"
    });
    assert_provisioned_once(&s, &ids);
    assert_eq!(field(&s.machines()[0], "zone"), "az3");
}

/// `GET /v1/events` streams provisioner events as server-sent events; SIGTERM ends the stream
/// and still exits promptly.
#[test]
fn events_are_streamed_to_connected_clients() {
    use std::io::BufRead;
    let dir = temp_dir("events");
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(10)).build();
    let unauthorized = agent.get(&format!("{}/v1/events", s.url)).call();
    assert!(matches!(unauthorized, Err(ureq::Error::Status(401, _))));
    let resp = agent
        .get(&format!("{}/v1/events", s.url))
        .set("Authorization", &format!("Bearer {}", s.token()))
        .call()
        .unwrap();
    assert_eq!(resp.content_type(), "text/event-stream");
    let mut lines = std::io::BufReader::new(resp.into_reader()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), ": connected");
    s.json(&["machine", "add", "-n", "2", "--json"]);
    let mut started = Vec::new();
    while started.len() < 2 {
        let line = lines.next().expect("stream ended early").unwrap();
        if let Some(json) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(json).unwrap();
            if v["event"] == "machine-started" {
                assert!(v["instance"].as_str().is_some_and(|i| i.starts_with("i-")), "{v}");
                started.push(v["machine"].as_str().unwrap().to_owned());
            }
        }
    }
    started.sort();
    assert_eq!(started, ["0", "1"]);
    let began = Instant::now();
    assert_eq!(s.terminate().code(), Some(0));
    assert!(began.elapsed() < Duration::from_secs(5), "an open event stream held up the shutdown");
    // The stream ends with the service.
    assert!(lines.all(
        |l| l.is_ok_and(|l| l.is_empty() || l.starts_with(':') || l.starts_with("event") || l.starts_with("data"))
    ));
}

/// `bench serve` runs end to end (a service of its own, clients, a report); no timing is
/// asserted, only that every request succeeded and every machine was provisioned.
#[test]
fn bench_serve_reports_a_clean_run() {
    let out = bin()
        .args([
            "bench",
            "serve",
            "--requests",
            "40",
            "--clients",
            "2",
            "--list-every",
            "4",
            "--start-latency",
            "10ms",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["add_requests"], 30, "{r}");
    assert_eq!(r["list_requests"], 10, "{r}");
    assert_eq!(r["machines"], 30, "{r}");
    assert_eq!(r["machines_in_error"], 0, "{r}");
    assert!(r["add_p50_ms"].as_f64().unwrap() > 0.0, "{r}");
}

/// `kill -9` while the instances of removed machines are being stopped: after a restart the
/// removal is finished (instances terminated, machines gone) and nothing else is touched.
#[test]
fn a_crash_with_stops_in_flight_finishes_the_removal() {
    let dir = temp_dir("crash-stop");
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, "[sim]\nstop_latency = \"1s\"\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    assert!(s.cli(&["machine", "remove", "0", "1"]).status.success());
    eventually(Duration::from_secs(10), "the stop to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    s.crash();
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    eventually(Duration::from_secs(15), "the removal to finish", || {
        s.machines().iter().map(|m| field(m, "id").to_owned()).collect::<Vec<_>>() == ["2"]
    });
    assert_provisioned_once(&s, &ids[2..]);
    assert_eq!(s.instances().len(), 1);
    let m = s.metrics();
    assert!(m.contains("provisioner_instances{state=\"terminated\"} 2"), "{m}");
    assert!(m.contains("provisioner_instances{state=\"running\"} 1"), "{m}");
}

/// The EC2 broker through the service: `serve --broker ec2` against moto's EC2 server. Machines are
/// added, the service is killed (`kill -9`) while their starts are under way, and restarted:
/// every machine ends with exactly one instance in the cloud (those started before the crash
/// are adopted, not started again), and removing a machine terminates its instance.
#[cfg(feature = "ec2")]
#[path = "ec2/moto.rs"]
mod moto;

/// `serve`'s arguments for the EC2 broker on moto's server.
#[cfg(feature = "ec2")]
fn moto_serve_args(moto: &moto::Moto) -> [&str; 10] {
    [
        "--broker",
        "ec2",
        "--ec2-endpoint",
        moto.endpoint.as_str(),
        "--region",
        "us-east-1",
        "--ec2-image",
        moto::IMAGE,
        "--ec2-instance-type",
        "t3.micro",
    ]
}

/// Issue 30, item 8: readers do not drive the cloud's API. 300 concurrent `GET /v1/instances`
/// with a read-only token (and status polls beside them) are served from the listings the
/// service made, with their age in the `Age` header: a bounded, small number of
/// `DescribeInstances` calls (`provisioner_broker_calls_total{op="all_instances"}`), not one
/// per request (300 before).
#[cfg(feature = "ec2")]
#[test]
fn readers_are_served_from_the_listings_made_not_one_cloud_listing_each() {
    let moto = moto::Moto::shared();
    let dir = temp_dir("ec2-readers");
    let s = Server::start(&dir, &moto_serve_args(moto));
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    let ro = s.json(&["token", "create", "--read-only", "--json"])["token"].as_str().unwrap().to_owned();
    let listings = |s: &Server| {
        sample(&s.metrics(), "provisioner_broker_calls_total{op=\"all_instances\",result=\"ok\"}").unwrap_or(0.0)
    };
    let before = listings(&s);
    let began = Instant::now();
    let threads: Vec<_> = (0..30)
        .map(|t| {
            let (url, ro) = (s.url.clone(), ro.clone());
            std::thread::spawn(move || {
                let mut ages = Vec::new();
                for i in 0..10 {
                    let path = if t == 0 && i % 2 == 0 { "status" } else { "instances" };
                    let r = ureq::get(&format!("{url}/v1/{path}"))
                        .set("Authorization", &format!("Bearer {ro}"))
                        .call()
                        .unwrap();
                    if path == "instances" {
                        ages.push(r.header("Age").unwrap().parse::<u64>().unwrap());
                        assert_eq!(r.into_json::<Value>().unwrap().as_array().unwrap().len(), 2);
                    }
                }
                ages
            })
        })
        .collect();
    let ages: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let took = began.elapsed().as_secs_f64();
    let made = listings(&s) - before;
    eprintln!("300 reads in {took:.2} s made {made} cloud listings; ages {:?}", ages.iter().max());
    assert!(ages.iter().all(|a| *a <= 5), "no listing older than 5 s is served: {ages:?}");
    // At most one listing per 5 s of reading, plus the provisioner's own.
    assert!(made <= 3.0 + (took / 5.0).ceil(), "{made} listings for 300 reads in {took:.1} s");
}

#[cfg(feature = "ec2")]
#[test]
fn the_ec2_broker_service_adopts_after_a_crash_and_terminates_on_removal() {
    let moto = moto::Moto::shared();
    let dir = temp_dir("ec2");
    let args = moto_serve_args(moto);
    let mut s = Server::start(&dir, &args);
    let added = s.json(&["machine", "add", "-n", "8", "--json"]);
    assert_eq!(added.as_array().unwrap().len(), 8);
    std::thread::sleep(Duration::from_millis(150));
    s.crash();
    let s = Server::start(&dir, &args);
    let began = Instant::now();
    let machines = loop {
        let ms = s.machines();
        if ms.iter().all(|m| m["instance"].is_string()) {
            break ms;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "not all provisioned: {ms:?}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    // The cloud's own view, by the service's instance list (our model's tag only).
    let instances = s.instances();
    let live: Vec<&Value> = instances.iter().filter(|i| i["state"] != "terminated").collect();
    assert_eq!(live.len(), 8, "one instance per machine: {instances:?}");
    let mut per_machine = BTreeMap::new();
    for i in &live {
        *per_machine.entry(i["machine"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    assert!(per_machine.values().all(|n| *n == 1), "{per_machine:?}");
    for m in &machines {
        assert!(m["zone"].as_str().unwrap().starts_with("us-east-1"), "{m}");
    }
    // Removing a machine terminates its instance in the cloud.
    let first = machines[0]["id"].as_str().unwrap().to_owned();
    let gone = machines[0]["instance"].as_str().unwrap().to_owned();
    let out = s.cli(&["machine", "remove", &first]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let began = Instant::now();
    loop {
        let still = s.instances().iter().any(|i| i["id"] == gone.as_str() && i["state"] != "terminated");
        if !still {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "instance {gone} not terminated");
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---- hardening: bad input, bounded resources, damaged databases ------------------------

/// One raw HTTP/1.1 exchange (`Connection: close`): the status, the headers (lower-case
/// names) and the body. Raw, so that made-up methods and odd bodies reach the service as sent.
fn raw_http(
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

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The value of one sample of /metrics (`name{labels}` exactly as rendered).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

/// A body that does not parse (unknown field, wrong type, not JSON) is a 400
/// naming what is wrong, and changes nothing; an empty body means the defaults.
#[test]
fn an_invalid_body_is_refused_and_changes_nothing() {
    let dir = temp_dir("bad-body");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    for (body, names) in [
        (&br#"{"forse": true}"#[..], "forse"),
        (br#"{"force": "yes"}"#, "force"),
        (b"{bad json", "JSON"),
        (br#"{"force": true, "extra": 1}"#, "extra"),
    ] {
        let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(body));
        assert_eq!(code, 400, "{}: {text}", String::from_utf8_lossy(body));
        assert!(text.contains(names), "the error names {names}: {text}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = s.json(&["status", "--json"]);
    assert_eq!(status["model_life"], "alive", "a refused destroy changed the model: {status}");
    assert_provisioned_once(&s, &ids);
    // Every other body: unknown fields and wrong types refused, nothing written.
    for (method, path, body, names) in [
        ("PUT", "/v1/config/workers", &br#"{"value": "4", "colour": "red"}"#[..], "colour"),
        ("PUT", "/v1/config/workers", br#"{"value": 4}"#, "value"),
        ("POST", "/v1/machines", br#"{"count": "3"}"#, "count"),
        ("POST", "/v1/machines", br#"{"count": 3, "zone": ["az1"]}"#, "zone"),
        ("POST", "/v1/machines/remove", br#"{"ids": ["0"], "keep": true}"#, "keep"),
        ("POST", "/v1/machines/remove", br#"{"ids": "0"}"#, "ids"),
        ("POST", "/v1/machines/retry", br#"{"ids": ["0"], "all": true}"#, "all"),
    ] {
        let (code, _, text) = raw_http(&s, method, path, true, Some(body));
        assert_eq!(code, 400, "{method} {path} {}: {text}", String::from_utf8_lossy(body));
        assert!(text.contains(names), "the error names {names}: {text}");
    }
    assert_eq!(String::from_utf8_lossy(&s.cli(&["config", "get", "workers"]).stdout).trim(), "16");
    assert_eq!(s.machines().len(), 2);
    assert_provisioned_once(&s, &ids);
    // An empty body means the defaults (force = false): the model is destroyed.
    let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(b""));
    assert_eq!(code, 200, "{text}");
    assert_eq!(s.json(&["status", "--json"])["model_life"], "dying");
}

/// Made-up HTTP methods do not add series (every label is bounded), and a
/// scrape reads counters kept up to date by the store's writes, not the database.
#[test]
fn metrics_labels_are_bounded_and_a_scrape_reads_no_database() {
    let dir = temp_dir("metrics-bounds");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    let series = |m: &str| m.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count();
    // Every family and label set a made-up method can reach exists after one such request.
    raw_http(&s, "MADEUP", "/nowhere", false, None);
    s.metrics();
    let before = series(&s.metrics());
    for i in 0..300 {
        let (code, _, _) = raw_http(&s, &format!("MADEUP{i}"), &format!("/nowhere/{i}"), false, None);
        assert!(code >= 400, "{code}");
    }
    let m = s.metrics();
    let http: Vec<&str> = m.lines().filter(|l| l.starts_with("provisioner_http_requests_total{")).collect();
    for l in &http {
        let method = l.split("method=\"").nth(1).and_then(|r| r.split('"').next()).unwrap();
        assert!(
            ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"].contains(&method),
            "unbounded method label: {l}"
        );
    }
    assert_eq!(series(&m), before, "300 made-up methods added series:\n{m}");
    assert_eq!(
        sample(&m, "provisioner_http_requests_total{method=\"other\",route=\"unmatched\",code=\"404\"}"),
        Some(301.0),
        "{m}"
    );
    // The gauges are right, and come from counters: a scrape makes no store call.
    assert_eq!(sample(&m, "provisioner_machines{status=\"started\"}"), Some(3.0), "{m}");
    assert_eq!(sample(&m, "provisioner_instances{state=\"running\"}"), Some(3.0), "{m}");
    assert_eq!(sample(&m, "provisioner_machines_by_life{life=\"alive\"}"), Some(3.0), "{m}");
    let ops =
        |m: &str| sample(m, "provisioner_store_operations_total").unwrap_or_else(|| panic!("no store counter: {m}"));
    let first = ops(&s.metrics());
    for _ in 0..20 {
        s.metrics();
    }
    let after = ops(&s.metrics());
    assert_eq!(after, first, "scrapes ran {} store operations", after - first);
    assert!(s.cli(&["machine", "remove", &ids[0]]).status.success());
    eventually(Duration::from_secs(10), "the gauges to follow the removal", || {
        let m = s.metrics();
        sample(&m, "provisioner_instances{state=\"terminated\"}") == Some(1.0)
            && sample(&m, "provisioner_machines{status=\"started\"}") == Some(2.0)
    });
}

/// List fields are deduplicated and bounded, a body over the limit is 413,
/// and one request cannot grow the database by more than its few rows.
#[test]
fn one_request_cannot_blow_up_the_database() {
    let dir = temp_dir("blowup");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let size = |s: &Server| -> u64 {
        ["provisioner.db", "provisioner.db-wal"]
            .iter()
            .map(|f| std::fs::metadata(s.dir.join(f)).map(|m| m.len()).unwrap_or(0))
            .sum()
    };
    let zones = |n: usize| serde_json::to_vec(&serde_json::json!({"count": 100, "zones": vec!["az1"; n]})).unwrap();
    // The issue's request: 145,000 copies of one zone (1 MB): over the body limit.
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&zones(145_000)));
    assert_eq!(code, 413, "{text}");
    assert!(s.machines().is_empty(), "a refused request wrote machines");
    // Under the limit: the duplicates collapse, each machine stores one short constraint.
    let before = size(&s);
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&zones(30_000)));
    assert_eq!(code, 201, "{text}");
    let grew = size(&s).saturating_sub(before);
    assert!(grew < 1 << 20, "100 machines grew the database by {grew} bytes");
    let began = Instant::now();
    assert_eq!(s.machines().len(), 100);
    assert!(began.elapsed() < Duration::from_secs(2), "machine list took {:?}", began.elapsed());
    eventually(Duration::from_secs(20), "the 100 machines to be provisioned", || {
        s.machines().iter().all(|m| field(m, "status") == "started")
    });
    assert!(s.machines().iter().all(|m| field(m, "zone") == "az1"));
    // An unknown zone among many is named; too many ids in one removal are refused.
    let (code, _, text) =
        raw_http(&s, "POST", "/v1/machines", true, Some(br#"{"count": 1, "zones": ["az1", "az1", "nowhere"]}"#));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("nowhere"), "{text}");
    let many: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "ids": many })).unwrap();
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/remove", true, Some(&body));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("10000"), "the cap is named: {text}");
    assert_eq!(s.machines().len(), 100, "a refused removal removed machines");
}

fn serve_output(data: &Path, extra: &[&str]) -> (Option<i32>, String) {
    // A service that starts is a failure of these checks: it is stopped after 5 s.
    let mut child = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.code(), err);
        }
        if began.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "serve started and kept running".into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A damaged database is refused at start with a message that says what to
/// do; a missing or empty database next to a WAL or a token is not silently a new model;
/// `serve --init` creates one on purpose.
#[test]
fn a_damaged_or_missing_database_is_refused_at_start() {
    let dir = temp_dir("damaged");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "50", "--wait", "--json"]);
    let uuid = s.json(&["status", "--json"])["model_uuid"].as_str().unwrap().to_owned();
    assert_eq!(s.terminate().code(), Some(0));
    let data = s.dir.clone();
    let db = data.join("provisioner.db");
    // Everything into the database file itself (the WAL checkpointed and gone).
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    drop(conn);
    assert!(!data.join("provisioner.db-wal").exists());
    let pristine = std::fs::read(&db).unwrap();
    assert!(pristine.len() >= 4 * 4096, "{}", pristine.len());

    // One corrupt page (the second, a table's root): refused, exit 1, says what to do.
    let mut bad = pristine.clone();
    for b in &mut bad[4096 + 8..4096 + 1000] {
        *b = 0x5a;
    }
    std::fs::write(&db, &bad).unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("damaged") && err.contains("backup") && err.contains("--init"), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("error")).count(), 1, "{err}");

    // A zero-length database: refused, not a new model.
    std::fs::write(&db, b"").unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("empty") && err.contains("--init"), "{err}");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "the refused start wrote a model");

    // Deleted, with its WAL left behind (a crash, then a careless clean-up): refused.
    std::fs::write(&db, &pristine).unwrap();
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    assert_eq!(s.json(&["status", "--json"])["model_uuid"], uuid.as_str(), "the restored copy is the model");
    s.json(&["machine", "add", "--json"]);
    s.crash();
    assert!(data.join("provisioner.db-wal").exists());
    std::fs::remove_file(&db).unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("provisioner.db-wal") && err.contains("--init"), "{err}");
    assert!(!db.exists(), "the refused start created a database");

    // On purpose: --init makes a new model (the leftover WAL is moved aside, not replayed).
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--init"]);
    let fresh = s.json(&["status", "--json"]);
    assert_ne!(fresh["model_uuid"], uuid.as_str());
    assert_eq!(fresh["machines"], 0);
    drop(s);
    // --init on a data directory that holds a model is refused: it would orphan its instances.
    let (code, err) = serve_output(&data, &["--init"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("already holds model"), "{err}");
    // A fresh, empty data directory needs no --init.
    let other = temp_dir("damaged-fresh");
    let s = Server::start(&other, &["--sim-start-latency", "50ms"]);
    assert_eq!(s.json(&["status", "--json"])["machines"], 0);
}

/// 413 for a body over the limit, 405 with `Allow` for a wrong method.
#[test]
fn oversized_bodies_are_413_and_wrong_methods_405_with_allow() {
    let dir = temp_dir("413-405");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let big = vec![b' '; 2 << 20];
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&big));
    assert_eq!(code, 413, "{text}");
    let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(&big));
    assert_eq!(code, 413, "{text}");
    assert_eq!(s.json(&["status", "--json"])["model_life"], "alive");
    for (method, path, allow) in [
        ("DELETE", "/v1/machines", "GET, POST"),
        ("GET", "/v1/destroy-model", "POST"),
        ("POST", "/v1/status", "GET"),
        ("DELETE", "/v1/config/workers", "GET, PUT"),
        ("POST", "/healthz", "GET"),
        ("PUT", "/metrics", "GET"),
    ] {
        let (code, headers, text) = raw_http(&s, method, path, true, None);
        assert_eq!(code, 405, "{method} {path}: {text}");
        assert_eq!(header(&headers, "allow"), Some(allow), "{method} {path}: {headers:?}");
    }
    // Without the token a /v1 path still answers 401 first.
    assert_eq!(raw_http(&s, "DELETE", "/v1/machines", false, None).0, 401);
    assert_eq!(raw_http(&s, "GET", "/v1/nothing", true, None).0, 404);
}

/// `machine remove 3 3` collapses the duplicate; `config set workers +4` is
/// refused (it reads like a relative change, which is not supported).
#[test]
fn duplicate_ids_collapse_and_signed_workers_are_refused() {
    let dir = temp_dir("dups");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "4", "--wait", "--json"]);
    let out = s.cli(&["machine", "remove", "3", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "machine 3 to be removed", || {
        !s.machines().iter().any(|m| field(m, "id") == "3")
    });
    let out = s.cli(&["config", "set", "workers", "+4"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole number"));
    assert_eq!(String::from_utf8_lossy(&s.cli(&["config", "get", "workers"]).stdout).trim(), "16");
    let out = s.cli(&["config", "set", "workers", "8"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "workers = 8");
}

/// The database and its WAL are private (0600) like the token, and a token
/// file others can read is warned about.
#[cfg(unix)]
#[test]
fn database_files_are_private_and_a_readable_token_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("modes");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "--wait", "--json"]);
    for f in ["provisioner.db", "provisioner.db-wal", "token"] {
        let mode = std::fs::metadata(s.dir.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}: mode {mode:o}");
    }
    assert!(!s.log_text().contains("readable by others"));
    assert_eq!(s.terminate().code(), Some(0));
    std::fs::set_permissions(s.dir.join("token"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    eventually(Duration::from_secs(5), "the warning", || s.log_text().contains("readable by others"));
}

/// A client of the event stream that stops reading is not buffered without
/// bound: past its queue's limit it is dropped, with a final event saying so.
#[test]
fn a_slow_event_client_is_dropped_with_a_final_event() {
    use std::io::{Read, Write};
    let dir = temp_dir("slow-events");
    let s = Server::start(&dir, &["--sim-start-latency", "0s"]);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\r\n",
        s.token()
    )
    .unwrap();
    // Never read while machines are provisioned, 10,000 at a time, until the client has been
    // dropped: the kernel's socket buffers (up to 4 MiB here) take the first events, then the
    // service's queue for the client fills.
    let mut added = 0;
    while sample(&s.metrics(), "provisioner_event_streams_dropped_total") == Some(0.0) {
        assert!(added < 80_000, "{added} machines' events and the slow client is still queued for");
        s.json(&["machine", "add", "-n", "10000", "--json"]);
        added += 10_000;
        eventually(Duration::from_secs(120), "the machines to be provisioned", || {
            sample(&s.metrics(), "provisioner_events_total{event=\"machine-started\"}") == Some(added as f64)
        });
    }
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    let started = text.matches("event: machine-started").count();
    assert!(started < added, "the slow client got every event: was it buffered without bound?");
    assert!(text.contains("event: stream-dropped"), "no final event: ...{}", &text[text.len().saturating_sub(500)..]);
    let last = text.trim_end().lines().rev().find(|l| l.starts_with("data: ")).unwrap_or("");
    assert!(last.contains("stream-dropped") && last.contains("reconnect"), "{last}");
}

/// Unmounts (lazily) when dropped.
struct Mounted(PathBuf);

/// A tmpfs of `size` (e.g. `8m`) mounted at `mnt` (made), unmounted when dropped; `None` where
/// it cannot be mounted (needs root and `mount`: the test then says so and checks nothing).
fn mount_tmpfs(mnt: &Path, size: &str) -> Option<Mounted> {
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

/// A start whose call made the instance and lost its answer (the service's part). The data
/// directory's disk fills while starts are in flight: the simulated cloud has written each
/// instance, then cannot record its landing, and answers a transient error. When the disk frees up,
/// every machine must end with exactly one instance ever created for it: the retried start must
/// reuse the client token (and the cloud return the instance already made for it) instead of making
/// a second one.
///
/// Before the start procedure repeated an ambiguous failure with the same client token, every
/// machine here ended with two instances.
///
/// The data directory is a 8 MiB tmpfs (needs root and `mount`; without them the test says so
/// and passes without checking anything).
#[test]
fn a_full_disk_during_starts_gives_no_machine_a_second_instance() {
    let dir = temp_dir("disk-full");
    let mnt = dir.join("mnt");
    let Some(_unmount) = mount_tmpfs(&mnt, "8m") else { return };
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, "resync = \"1s\"\n[retry]\ncount = 30\ndelay = \"500ms\"\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let s = Server::start_on(&mnt.join("data"), &dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "12", "--json"]));
    eventually(Duration::from_secs(10), "starts to be in flight", || {
        sample(&s.metrics(), "provisioner_broker_calls_in_flight").unwrap_or(0.0) >= 1.0
    });
    // Fill the disk while the starts wait for their instances to come up.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 << 10];
        while f.write_all(&chunk).and_then(|()| f.flush()).is_ok() {}
    }
    std::thread::sleep(Duration::from_secs(3));
    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(60), "every machine to be provisioned after the disk freed up", || {
        let m = s.machines();
        m.len() == ids.len() && m.iter().all(|m| field(m, "status") == "started")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_provisioned_once(&s, &ids);
    // Every instance the cloud ever made, whatever its state: one per machine.
    let m = s.metrics();
    let made: f64 = m
        .lines()
        .filter(|l| l.starts_with("provisioner_instances{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(made, ids.len() as f64, "instances ever created for {} machines:\n{m}\n{}", ids.len(), s.log_text());
    assert!(s.log_text().contains("full") || s.log_text().contains("disk"), "the disk never filled: {}", s.log_text());
}

/// `/healthz` fails (503, saying why) when the store cannot be read, here
/// because the database file was replaced under the running service (by a file that is not a
/// database); a restart then refuses the damaged file.
#[test]
fn healthz_fails_when_the_database_cannot_be_read() {
    let dir = temp_dir("health-damaged");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    assert_eq!(raw_http(&s, "GET", "/healthz", false, None).0, 200);
    assert_eq!(raw_http(&s, "GET", "/readyz", false, None).0, 200, "the store is readable: ready");
    let db = s.dir.join("provisioner.db");
    std::fs::remove_file(&db).unwrap();
    std::fs::write(&db, "this is not a database\n".repeat(1000)).unwrap();
    let (code, _, text) = raw_http(&s, "GET", "/healthz", false, None);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("database"), "{text}");
    let (code, _, text) = raw_http(&s, "GET", "/readyz", false, None);
    assert_eq!(code, 503, "not ready on an unreadable store: {text}");
    s.crash();
    // (With its WAL, SQLite could still read every page written since the service started;
    // without it, what is left is not a database.)
    std::fs::remove_file(s.dir.join("provisioner.db-wal")).unwrap();
    let (code, err) = serve_output(&s.dir, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("damaged") && err.contains("--init"), "{err}");
}

/// Replicas on PostgreSQL with one fenced leader (issue 15): fail-over under faults.
#[cfg(feature = "postgres")]
#[path = "serve/ha.rs"]
mod ha;
/// The service on PostgreSQL (issue 15): `--store postgres://...`.
#[cfg(feature = "postgres")]
#[path = "serve/postgres.rs"]
mod postgres;

#[cfg(feature = "postgres")]
#[path = "serve/spread.rs"]
mod spread;

/// The dashboard's page, and the injected start failures it retries (issue 16).
#[path = "serve/dashboard.rs"]
mod dashboard;
/// Constraints, placement, `machine show`, list filters and pages, applications (issue 14).
#[path = "serve/model.rs"]
mod model;
/// Many models per service (issue 18).
#[path = "serve/models.rs"]
mod models;
/// Scoped API tokens and the audit log (issue 16).
#[path = "serve/tokens.rs"]
mod tokens;

/// The event stream's limits: revocation, caps (issue 30).
#[path = "serve/events.rs"]
mod events;

// Issue 14: containers and manual machines.

fn machine<'a>(list: &'a [Value], id: &str) -> &'a Value {
    list.iter().find(|m| field(m, "id") == id).unwrap_or_else(|| panic!("machine {id} not listed: {list:?}"))
}

fn started(s: &Server, ids: &[String]) -> bool {
    let list = s.machines();
    ids.iter().all(|id| list.iter().any(|m| field(m, "id") == id && field(m, "status") == "started"))
}

/// The live instances tagged for `id`.
fn instances_of(s: &Server, id: &str) -> Vec<Value> {
    s.instances().into_iter().filter(|i| field(i, "machine") == id).collect()
}

/// `machine add --container lxd --host 0` makes `0/lxd/0`, `0/lxd/1`, ... (numbered per host
/// and type); the host is prepared once per type, taking the configured delay, before its
/// containers start; each container runs in its host's zone, on the service's simulated cloud.
#[test]
fn containers_start_on_their_prepared_host_in_its_zone() {
    let dir = temp_dir("containers");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--sim-container-init-delay", "1500ms"]);
    assert_eq!(ids_of(&s.json(&["machine", "add", "--wait", "--json"])), ["0"]);
    let began = Instant::now();
    let ids = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "-n", "2", "--json"]));
    assert_eq!(ids, ["0/lxd/0", "0/lxd/1"]);
    std::thread::sleep(Duration::from_millis(500));
    for id in &ids {
        let list = s.machines();
        let m = machine(&list, id);
        assert_eq!(
            (field(m, "status"), &m["instance"]),
            ("pending", &Value::Null),
            "started before its host was prepared: {m}"
        );
        assert!(instances_of(&s, id).is_empty());
    }
    eventually(Duration::from_secs(20), "the containers to start", || started(&s, &ids));
    assert!(began.elapsed() >= Duration::from_millis(1500), "the host's preparation took its delay");
    let list = s.machines();
    let host_zone = field(machine(&list, "0"), "zone").to_owned();
    assert!(["az1", "az2", "az3"].contains(&host_zone.as_str()), "{list:?}");
    for id in &ids {
        let m = machine(&list, id);
        assert_eq!(
            (field(m, "container_type"), field(m, "host"), &m["manual"]),
            ("lxd", "0", &Value::Bool(false)),
            "{m}"
        );
        assert_eq!(field(m, "zone"), host_zone, "a container takes its host's zone: {m}");
        let live = instances_of(&s, id);
        assert_eq!(live.len(), 1, "{id}: {live:?}");
        assert_eq!((field(&live[0], "id"), field(&live[0], "zone")), (field(m, "instance"), host_zone.as_str()));
    }
    assert_eq!(machine(&list, "0")["container_type"], Value::Null);
    assert_eq!(machine(&list, "0")["host"], Value::Null);
    // Numbering goes on per host and type; a new type is prepared once more, an old one not.
    assert_eq!(ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "--json"])), ["0/lxd/2"]);
    assert_eq!(ids_of(&s.json(&["machine", "add", "--container", "kvm", "--host", "0", "--json"])), ["0/kvm/0"]);
    let more = ["0/lxd/2".to_owned(), "0/kvm/0".to_owned()];
    eventually(Duration::from_secs(20), "the new containers to start", || started(&s, &more));
    assert_eq!(s.log_text().matches("initialising host for containers").count(), 2, "{}", s.log_text());
    assert_eq!(s.instances().len(), 5);
}

/// The first preparations of a host fail (`--sim-container-init-failures 2`): they are retried,
/// the failure shows on the containers' status meanwhile, and the containers then start.
#[test]
fn a_failed_host_preparation_is_retried_and_shown_on_its_containers() {
    let dir = temp_dir("container-faults");
    let s = Server::start(
        &dir,
        &["--sim-start-latency", "50ms", "--sim-container-init-delay", "700ms", "--sim-container-init-failures", "2"],
    );
    s.json(&["machine", "add", "--wait", "--json"]);
    let ids = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "--json"]));
    let mut seen = String::new();
    eventually(Duration::from_secs(20), "the failure on the container's status", || {
        let list = s.machines();
        let m = machine(&list, "0/lxd/0");
        seen = field(m, "message").to_owned();
        seen.contains("waiting for host 0 to support lxd containers") && field(m, "instance_status") == "provisioning"
    });
    assert!(seen.contains("simulated fault preparing host 0 for lxd containers"), "{seen}");
    eventually(Duration::from_secs(30), "the container to start after the retries", || started(&s, &ids));
    let list = s.machines();
    assert_eq!(field(machine(&list, "0/lxd/0"), "message"), "", "the status is cleared once it runs");
    assert_eq!(s.log_text().matches("container initialisation failed").count(), 2, "{}", s.log_text());
    assert_eq!(instances_of(&s, "0/lxd/0").len(), 1);
}

/// Removing a host with live containers is refused (409, naming them, nothing changed);
/// `--force` removes it and its containers go with it (their instances stopped).
#[test]
fn a_host_with_containers_is_removed_only_with_force_and_takes_them_along() {
    let dir = temp_dir("container-host-removal");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--sim-container-init-delay", "100ms"]);
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    let ids = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "-n", "2", "--json"]));
    eventually(Duration::from_secs(20), "the containers to start", || started(&s, &ids));
    let out = s.cli(&["machine", "remove", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("0/lxd/0, 0/lxd/1") && err.contains("--force"), "{err}");
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/remove", true, Some(br#"{"ids": ["0"]}"#));
    assert_eq!(code, 409, "{text}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.machines().iter().all(|m| field(m, "life") == "alive"), "a refusal changed nothing");
    assert_eq!(s.instances().len(), 4);
    let out = s.cli(&["machine", "remove", "0", "--force"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(20), "the host and its containers to go", || {
        let left: Vec<String> = s.machines().iter().map(|m| field(m, "id").to_owned()).collect();
        left == ["1"]
    });
    eventually(Duration::from_secs(20), "their instances to stop", || {
        s.instances().iter().map(|i| field(i, "machine").to_owned()).collect::<Vec<_>>() == ["1"]
    });
}

/// A manual machine is registered as started with instance `manual:ADDRESS`, never started in
/// the cloud; `destroy-model` names it and refuses without `--force` (the model stays alive);
/// with `--force` the destruction goes on and leaves it as it is.
#[test]
fn a_manual_machine_is_never_started_and_destroy_model_names_it() {
    let dir = temp_dir("manual");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    assert_eq!(ids_of(&s.json(&["machine", "add", "--manual", "--address", "10.0.0.5", "--json"])), ["0"]);
    assert_eq!(ids_of(&s.json(&["machine", "add", "--wait", "--json"])), ["1"]);
    assert_eq!(
        ids_of(&s.json(&["machine", "add", "--manual", "--address", "DB-1.example.", "--wait", "--json"])),
        ["2"]
    );
    std::thread::sleep(Duration::from_millis(300));
    let list = s.machines();
    for (id, address) in [("0", "10.0.0.5"), ("2", "db-1.example")] {
        let m = machine(&list, id);
        assert_eq!(
            (field(m, "status"), field(m, "instance"), field(m, "instance_status"), &m["manual"]),
            ("started", format!("manual:{address}").as_str(), "running", &Value::Bool(true)),
            "{m}"
        );
        assert!(instances_of(&s, id).is_empty(), "the cloud has an instance for manual machine {id}");
    }
    assert_eq!(s.instances().len(), 1);
    let out = s.cli(&["destroy-model"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("manually provisioned machines") && err.contains(": 0, 2"), "{err}");
    assert!(err.contains("machine remove 0 2"), "{err}");
    let status = s.json(&["status", "--json"]);
    assert_eq!(status["model_life"], "alive", "a refused destruction changed nothing: {status}");
    assert_eq!(instances_of(&s, "1").len(), 1);
    let d = s.json(&["destroy-model", "--force", "--json"]);
    assert_eq!(d["manual_machines"], serde_json::json!(["0", "2"]), "{d}");
    assert_eq!(s.json(&["status", "--json"])["model_life"], "dying");
    let again = s.cli(&["destroy-model"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("already") && !err.contains("nothing was changed"), "a dying model is already dying: {err}");
    eventually(Duration::from_secs(20), "the cloud's instances to stop", || s.instances().is_empty());
    let list = s.machines();
    assert_eq!(field(machine(&list, "0"), "instance"), "manual:10.0.0.5", "left as it is: {list:?}");
    assert!(!s.log_text().contains("machine=0 instance"), "the provisioner touched manual machine 0");
}

/// Bad container and manual-machine requests are 400 naming the field, and write nothing (no
/// machine, no id used up).
#[test]
fn bad_container_and_manual_requests_are_refused_naming_the_field() {
    let dir = temp_dir("bad-containers");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--sim-container-init-delay", "100ms"]);
    s.json(&["machine", "add", "--wait", "--json"]);
    for (body, name) in [
        (&br#"{"container": "lxd", "host": "9"}"#[..], "host"),
        (br#"{"container": "docker", "host": "0"}"#, "container"),
        (br#"{"host": "0"}"#, "container"),
        (br#"{"container": "lxd"}"#, "host"),
        (br#"{"container": "lxd", "host": "0/lxd/0"}"#, "host"),
        (br#"{"container": "lxd", "host": "0", "zones": ["az1"]}"#, "zones"),
        (br#"{"container": "lxd", "host": "0", "count": 0}"#, "count"),
        (br#"{"manual": true}"#, "address"),
        (br#"{"manual": true, "address": "not a host!"}"#, "address"),
        (br#"{"manual": true, "address": "10.0.0.300"}"#, "address"),
        (br#"{"manual": true, "address": ""}"#, "address"),
        (br#"{"address": "10.0.0.5"}"#, "address"),
        (br#"{"manual": true, "address": "10.0.0.5", "count": 2}"#, "count"),
        (br#"{"manual": "yes", "address": "10.0.0.5"}"#, "manual"),
        (br#"{"manual": true, "address": "10.0.0.5", "container": "lxd", "host": "0"}"#, "container"),
    ] {
        let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(body));
        let shown = String::from_utf8_lossy(body);
        assert_eq!(code, 400, "{shown}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{shown}: {e}: {text}"));
        let error = field(&error, "error");
        let named = error.contains(&format!("\"{name}\"")) || error.starts_with(&format!("{name} must"));
        assert!(named, "{shown}: the error names {name}: {error}");
    }
    let out = s.cli(&["machine", "add", "--manual"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"address\""), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.machines().len(), 1, "nothing was written: {:?}", s.machines());
    // No id was used up by a refusal.
    assert_eq!(ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "--json"])), ["0/lxd/0"]);
    assert_eq!(ids_of(&s.json(&["machine", "add", "--manual", "--address", "10.0.0.5", "--json"])), ["1"]);
    // Containers have no retry path: a retry of one is refused.
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/retry", true, Some(br#"{"ids": ["0/lxd/0"]}"#));
    assert!(code == 400 && text.contains("0/lxd/0") && text.contains("retry"), "{code}: {text}");
    // The same address twice, and a host that is gone, are refused too.
    let (code, _, text) =
        raw_http(&s, "POST", "/v1/machines", true, Some(br#"{"manual": true, "address": "10.0.0.5"}"#));
    assert!(code == 400 && text.contains("already manual machine 1"), "{code}: {text}");
    let out = s.cli(&["machine", "remove", "0", "--force"]);
    assert!(out.status.success());
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(br#"{"container": "kvm", "host": "0"}"#));
    assert!(code == 400 && text.contains("host"), "{code}: {text}");
}

/// A crash (`kill -9`) after containers started, and a restart: the container provisioners come
/// back, adopt what they had (no container gets a second instance) and go on numbering.
#[test]
fn containers_survive_a_crash_without_a_second_instance() {
    let dir = temp_dir("container-crash");
    let flags = ["--sim-start-latency", "50ms", "--sim-container-init-delay", "200ms"];
    let mut s = Server::start(&dir, &flags);
    s.json(&["machine", "add", "--wait", "--json"]);
    let mut ids = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "-n", "2", "--json"]));
    eventually(Duration::from_secs(20), "the containers to start", || started(&s, &ids));
    let before: Vec<Value> = s.instances();
    s.crash();
    let s = Server::start(&dir, &flags);
    ids.extend(ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "--json"])));
    assert_eq!(ids, ["0/lxd/0", "0/lxd/1", "0/lxd/2"]);
    eventually(Duration::from_secs(20), "the new container to start", || started(&s, &ids));
    std::thread::sleep(Duration::from_millis(500));
    let list = s.machines();
    for id in &ids {
        let live = instances_of(&s, id);
        assert_eq!(live.len(), 1, "{id}: {live:?}");
        assert_eq!(field(&live[0], "id"), field(machine(&list, id), "instance"), "{id}");
    }
    for i in &before {
        assert!(s.instances().contains(i), "an instance from before the crash is kept: {i}");
    }
    assert_eq!(s.instances().len(), 4);
    // A model destruction stops the containers' instances too.
    let d = s.json(&["destroy-model", "--json"]);
    assert_eq!(d["manual_machines"], serde_json::json!([]), "{d}");
    eventually(Duration::from_secs(20), "every instance, containers' included, to stop", || s.instances().is_empty());
}

/// The simulated cloud's instance types (issue 14): with `[sim] instance_type = "m5.large"`
/// every machine gets m5.large, and with m5.large out of capacity in az1 (its only candidate)
/// every start there fails zone-specifically, so the provisioner places all the machines in
/// az2 and az3. A malformed `out_of_capacity` entry is refused with exit 2.
#[test]
fn the_simulated_cloud_fails_over_when_its_only_type_is_out_of_capacity() {
    let dir = temp_dir("types");
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, "[sim]\ninstance_type = \"m5.large\"\nout_of_capacity = [\"m5.large:az1\"]\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "6", "--json"]));
    eventually(Duration::from_secs(20), "every machine to be provisioned", || {
        let m = s.machines();
        ids.iter().all(|id| m.iter().any(|m| field(m, "id") == id && field(m, "status") == "started"))
    });
    for m in s.machines() {
        assert!(["az2", "az3"].contains(&field(&m, "zone")), "{m}");
    }
    assert_eq!(s.terminate().code(), Some(0));

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[sim]\nout_of_capacity = [\"m5.large\"]\n").unwrap();
    let data = dir.join("d2");
    let out = bin()
        .args(["serve", "--config", bad.to_str().unwrap(), "--data-dir", data.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("out_of_capacity") && err.contains("TYPE:ZONE"), "{err}");
}

// ---- the OpenAPI contract (issue 16) -------------------------------------------------------

/// `GET /v1/openapi.json` needs no token and serves the committed `docs/openapi.json`; every
/// route it names answers (with the token) something it documents, and a refused request
/// that schemathesis's stateful phase makes (a body naming a missing machine) changes nothing.
#[test]
fn the_openapi_document_is_served_without_a_token_and_is_the_committed_copy() {
    let dir = temp_dir("openapi");
    let s = Server::start(&dir, &["--sim-start-latency", "20ms"]);
    let (code, headers, text) = raw_http(&s, "GET", "/v1/openapi.json", false, None);
    assert_eq!(code, 200, "{text}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json")).unwrap();
    assert_eq!(text, committed, "the served document is the committed one");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let (code, headers, _) = raw_http(&s, "POST", "/v1/openapi.json", false, None);
    assert_eq!((code, header(&headers, "allow")), (405, Some("GET")));
    // Each documented GET without parameters answers a documented status.
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(get) = item.get("get") else { continue };
        if path.contains('{') || path == "/v1/events" {
            continue;
        }
        let (code, _, text) = raw_http(&s, "GET", path, true, None);
        assert!(get["responses"].get(code.to_string()).is_some(), "GET {path}: {code} is not documented: {text}");
    }
    // A removal naming one machine that exists and one that does not is a 404, and the
    // machine that exists is left as it was.
    let ids = ids_of(&s.json(&["machine", "add", "-n", "1", "--json"]));
    let body = serde_json::to_vec(&serde_json::json!({"ids": [ids[0], "no-such-machine"]})).unwrap();
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/remove", true, Some(&body));
    assert_eq!(code, 404, "{text}");
    assert!(doc["paths"]["/v1/machines/remove"]["post"]["responses"]["404"].is_object());
    let m = s.json(&["machine", "show", &ids[0], "--json"]);
    assert_eq!(m["life"], "alive", "a refused removal changed the machine: {m}");
}

// ---- TLS: `serve --tls-cert/--tls-key`, the client's `--ca-cert`, and plain HTTP off loopback.

/// A self-signed certificate for `127.0.0.1` and `localhost` and its key, written as PEM files
/// into `dir` as `NAME.crt` and `NAME.key`.
fn test_certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

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

/// An HTTP agent that trusts exactly `ca`.
fn agent_trusting(ca: &Path) -> ureq::Agent {
    let config = provisioner::service::tls::client_config(ca).unwrap();
    ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).tls_config(std::sync::Arc::new(config)).build()
}

/// Starts `serve` over TLS on `dir/data` and waits until `https://127.0.0.1:PORT/healthz` answers.
fn start_tls(dir: &Path, cert: &Path, key: &Path) -> Server {
    let port = free_port();
    let data = dir.join("data");
    let log = dir.join(format!("serve-{port}.log"));
    let child = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&data)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut s = Server { child: Some(child), dir: data, url: format!("https://127.0.0.1:{port}"), log };
    let agent = agent_trusting(cert);
    let began = Instant::now();
    loop {
        if matches!(agent.get(&format!("{}/healthz", s.url)).call(), Ok(r) if r.status() == 200) {
            return s;
        }
        if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("serve exited with {status}: {}", s.log_text());
        }
        assert!(began.elapsed() < Duration::from_secs(30), "serve not ready: {}", s.log_text());
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn tls_serves_the_client_commands_and_refuses_plain_http_and_unknown_certificates() {
    let dir = temp_dir("tls");
    let (cert, key) = test_certificate(&dir, "server");
    let s = start_tls(&dir, &cert, &key);
    let ca = cert.to_str().unwrap();

    // The client commands work over https with --ca-cert, and with PROVISIONER_CA_CERT.
    let added = s.json(&["machine", "add", "-n", "2", "--json", "--ca-cert", ca]);
    assert_eq!(ids_of(&added).len(), 2, "{added}");
    let out = bin()
        .args(["status", "--json", "--server", &s.url, "--data-dir"])
        .arg(&s.dir)
        .env("PROVISIONER_CA_CERT", &cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["machines"], 2, "{status}");
    let listed = s.json(&["machine", "list", "--json", "--ca-cert", ca]);
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
    let (cert, key) = ca_shaped_certificate(&dir, "server");
    // start_tls waits for /healthz through the library's client configuration of this file.
    let s = start_tls(&dir, &cert, &key);
    let ca = cert.to_str().unwrap();
    let added = s.json(&["machine", "add", "-n", "1", "--json", "--ca-cert", ca]);
    assert_eq!(ids_of(&added).len(), 1, "{added}");
    let listed = s.json(&["machine", "list", "--json", "--ca-cert", ca]);
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

/// Runs `serve --listen LISTEN ARGS` and returns its exit code and stderr if it exits within
/// 5 s (None: it kept running, and was killed).
fn serve_exit(dir: &Path, listen: &str, extra: &[&OsStr]) -> (Option<i32>, String) {
    let mut child = bin()
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(dir.join("data"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.code(), err);
        }
        if began.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "serve started and kept running".into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

use std::ffi::OsStr;

#[test]
fn plain_http_off_loopback_is_refused_unless_insecure_http() {
    let dir = temp_dir("insecure");
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let (code, err) = serve_exit(&dir, &listen, &[]);
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
    let began = Instant::now();
    let up = loop {
        if matches!(ureq::get(&format!("http://127.0.0.1:{port}/healthz")).call(), Ok(r) if r.status() == 200) {
            break true;
        }
        if child.try_wait().unwrap().is_some() || began.elapsed() > Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
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
            &dir,
            &listen,
            &[OsStr::new("--tls-cert"), cert.as_os_str(), OsStr::new("--tls-key"), key.as_os_str()],
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

    let (code, err) = serve_exit(&dir, &listen, &[OsStr::new("--tls-cert"), cert.as_os_str()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key"), "{err}");
    assert!(!dir.join("data").exists(), "a refused start touched the data directory");
}

/// A start that fails for good is counted under the zone of its last cloud call (seen failing
/// before the event named one: the failure was counted under `unknown`).
#[test]
fn a_failed_start_is_counted_under_its_zone() {
    let dir = temp_dir("failed-zone");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("once.toml");
    std::fs::write(&config, "[retry]\ncount = 0\n").unwrap();
    let args = ["--sim-start-latency", "50ms", "--sim-zones", "az2", "--sim-start-failures", "1"];
    let s = Server::start(&dir, &[&args[..], &["--config", config.to_str().unwrap()]].concat());
    s.json(&["machine", "add", "-n", "1", "--json"]);
    eventually(Duration::from_secs(10), "the failed start to be counted in az2", || {
        sample(&s.metrics(), "provisioner_start_outcomes_total{zone=\"az2\",outcome=\"failed\"}") == Some(1.0)
    });
    assert_eq!(sample(&s.metrics(), "provisioner_start_outcomes_total{zone=\"unknown\",outcome=\"failed\"}"), None);
}

/// `/metrics` is OpenMetrics (its content type, `# EOF` at the end), the whole scrape parses
/// with the Prometheus project's own parser (`.ci/metrics-check`: PyPI `prometheus-client`,
/// pinned, in a venv), and the new families move: after adding machines, the start outcomes
/// of their zones and the pending-to-running histogram's count reach the number of machines.
#[test]
fn metrics_are_openmetrics_that_prometheus_parses_and_count_starts_per_zone() {
    let dir = temp_dir("openmetrics");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "4", "--wait", "--json"]));
    let response = ureq::get(&format!("{}/metrics", s.url)).call().unwrap();
    assert_eq!(response.header("Content-Type"), Some("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    let m = response.into_string().unwrap();
    assert!(m.ends_with("# EOF\n"), "{m}");
    // Per zone, the started count is the number of machines in that zone.
    let mut per_zone: BTreeMap<String, f64> = BTreeMap::new();
    for machine in s.machines() {
        *per_zone.entry(field(&machine, "zone").to_owned()).or_default() += 1.0;
    }
    assert_eq!(per_zone.values().sum::<f64>(), ids.len() as f64);
    eventually(Duration::from_secs(10), "the start metrics to reach the machines", || {
        let m = s.metrics();
        per_zone.iter().all(|(zone, n)| {
            sample(&m, &format!("provisioner_start_outcomes_total{{zone=\"{zone}\",outcome=\"started\"}}")) == Some(*n)
        }) && sample(&m, "provisioner_time_to_running_seconds_count") == Some(ids.len() as f64)
    });
    let m = s.metrics();
    assert_eq!(sample(&m, "provisioner_time_to_running_seconds_bucket{le=\"+Inf\"}"), Some(ids.len() as f64), "{m}");
    assert!(sample(&m, "provisioner_time_to_running_seconds_sum").unwrap_or(0.0) > 0.0, "{m}");
    // The whole scrape, through a real OpenMetrics parser.
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED the OpenMetrics parser check: python3 is not installed");
        return;
    }
    let scrape = dir.join("scrape.txt");
    std::fs::write(&scrape, &m).unwrap();
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/metrics-check")).arg(&scrape).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the scrape does not parse: {}\n{m}", String::from_utf8_lossy(&out.stderr));
    for family in ["provisioner_start_outcomes counter", "provisioner_time_to_running_seconds histogram"] {
        assert!(stdout.lines().any(|l| l.starts_with(family)), "the parser saw no {family}: {stdout}");
    }
}
