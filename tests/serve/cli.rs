//! The command line around the service: `config get|set` applied at once and kept across a
//! restart, bad usage refused with exit 2 and one sentence, and `bench serve` end to end.

use serde_json::Value;

use crate::support::{bin, temp_dir, Server};

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
