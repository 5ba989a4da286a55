//! Machines through the client commands, as an operator adds, lists, removes and retries them
//! on the simulated cloud: removal with and without the instance, a failed machine that stays
//! failed until retried, a model destroyed, duplicate ids, and the simulated cloud's fail-over
//! when its only instance type is out of capacity in a zone; a machine's constraints replaced
//! (`machine set-constraints`), which its next start uses.

use std::time::{Duration, Instant};

use crate::support::{
    assert_provisioned_once, bin, config_file, eventually, field, ids_of, machine, raw_http, temp_dir, Server,
};

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

/// A machine whose only zone is unavailable ends in provisioning error (`--wait` exits 1 and
/// names it); it stays in error across a restart (errors are not retried on their own, as in
/// Juju), and `machine retry` starts it once its zone is back.
#[test]
fn a_failed_machine_stays_failed_until_retried() {
    let dir = temp_dir("retry");
    let down = config_file(
        &dir,
        "down.toml",
        "[retry]\ncount = 0\n[sim]\nzones = [\"az1\", \"az2\"]\nunavailable_zones = [\"az3\"]\n",
    );
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

/// The simulated cloud's instance types (issue 14): with `[sim] instance_type = "m5.large"`
/// every machine gets m5.large, and with m5.large out of capacity in az1 (its only candidate)
/// every start there fails zone-specifically, so the provisioner places all the machines in
/// az2 and az3. A malformed `out_of_capacity` entry is refused with exit 2.
#[test]
fn the_simulated_cloud_fails_over_when_its_only_type_is_out_of_capacity() {
    let dir = temp_dir("types");
    let cfg =
        config_file(&dir, "serve.toml", "[sim]\ninstance_type = \"m5.large\"\nout_of_capacity = [\"m5.large:az1\"]\n");
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

/// A client command's exit code and stderr.
fn refused(s: &Server, args: &[&str]) -> (Option<i32>, String) {
    let out = s.cli(args);
    assert!(out.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `machine set-constraints` (`PUT /v1/machines/{id}/constraints`): a live machine's
/// constraints are replaced and shown, a container's too (its id holds `/`, and `GET` of it
/// still shows it); a bad string is a 400 naming what is wrong, an unknown machine a 404, a
/// manual one a 409, a read-only token a 403, each changing nothing; and the next start of a
/// machine (a retry) uses its new constraints.
#[test]
fn a_machines_constraints_are_replaced_and_its_next_start_uses_them() {
    let dir = temp_dir("set-constraints");
    let down = config_file(
        &dir,
        "down.toml",
        "[retry]\ncount = 0\n[sim]\nzones = [\"az1\", \"az2\"]\nunavailable_zones = [\"az3\"]\n",
    );
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &down]);
    let out = s.cli(&["machine", "add", "--zones", "az3", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ids_of(&s.json(&["machine", "add", "--wait", "--json"])), ["1"]);

    // Replaced, and shown as `machine show` shows it.
    let m = s.json(&["machine", "set-constraints", "1", "cores=4 mem=8G", "--json"]);
    assert_eq!((field(&m, "id"), field(&m, "constraints_text")), ("1", "cores=4 mem=8192M"), "{m}");
    assert_eq!((m["constraints"]["cores"].as_u64(), field(&m, "status")), (Some(4), "started"), "{m}");
    let shown = s.json(&["machine", "show", "1", "--json"]);
    assert_eq!(field(&shown, "constraints_text"), "cores=4 mem=8192M", "{shown}");
    let out = s.cli(&["machine", "set-constraints", "1", "cores=4 mem=8G"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("constraints:") && text.contains("cores=4 mem=8192M"), "{text}");

    // Bad strings: exit 2, one sentence naming the problem, nothing changed.
    for (bad, named) in [
        ("cores=four", "\"cores\""),
        ("colour=red", "unknown constraint \"colour\""),
        ("zones=nowhere", "unknown zone \"nowhere\""),
        ("cores", "malformed constraint"),
    ] {
        let (code, err) = refused(&s, &["machine", "set-constraints", "1", bad]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains(named) && err.trim().lines().count() == 1, "{bad}: {err}");
    }
    let (code, _, text) =
        raw_http(&s, "PUT", "/v1/machines/1/constraints", true, Some(br#"{"constraints": "cores=9"}"#.as_slice()));
    assert_eq!(code, 200, "{text}");
    let (code, _, text) =
        raw_http(&s, "PUT", "/v1/machines/1/constraints", true, Some(br#"{"constraints": "cores=1", "mem": "1G"}"#));
    assert!(code == 400 && text.contains("mem"), "{code} {text}");
    let (code, _, text) = raw_http(&s, "PUT", "/v1/machines/1/constraints", true, Some(br#"{"constraints": 4}"#));
    assert_eq!(code, 400, "{text}");
    assert_eq!(field(&s.json(&["machine", "show", "1", "--json"]), "constraints_text"), "cores=9");
    // Unknown: 404 (exit 2); manual: 409 (exit 1); neither written.
    let (code, err) = refused(&s, &["machine", "set-constraints", "77", "cores=1"]);
    assert!(code == Some(2) && err.contains("77"), "{code:?} {err}");
    let manual = ids_of(&s.json(&["machine", "add", "--manual", "--address", "10.0.0.9", "--json"]));
    let (code, err) = refused(&s, &["machine", "set-constraints", &manual[0], "cores=1"]);
    assert!(code == Some(1) && err.contains("manual"), "{code:?} {err}");
    assert_eq!(field(&s.json(&["machine", "show", &manual[0], "--json"]), "constraints_text"), "");
    // Only PUT: 405 naming it.
    let (code, headers, _) = raw_http(&s, "GET", "/v1/machines/1/constraints", true, None);
    assert_eq!((code, crate::support::header(&headers, "allow")), (405, Some("PUT")));

    // A container: its id holds `/` (as is, encoded, and per model), and it is still shown.
    let c = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "1", "--json"]));
    assert_eq!(c, ["1/lxd/0"]);
    let m = s.json(&["machine", "set-constraints", "1/lxd/0", "mem=2G", "--json"]);
    assert_eq!((field(&m, "id"), field(&m, "constraints_text")), ("1/lxd/0", "mem=2048M"), "{m}");
    let body = br#"{"constraints": "mem=3G"}"#.as_slice();
    let (code, _, text) = raw_http(&s, "PUT", "/v1/models/default/machines/1/lxd/0/constraints", true, Some(body));
    assert_eq!(code, 200, "{text}");
    let (code, _, text) = raw_http(&s, "GET", "/v1/machines/1/lxd/0", true, None);
    let shown: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((code, field(&shown, "id"), field(&shown, "constraints_text")), (200, "1/lxd/0", "mem=3072M"));
    assert_eq!(field(machine(&s.machines(), "1"), "id"), "1");

    // A read-only token: 403, exit 1, nothing changed.
    let out = s.cli(&["token", "create", "--read-only"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ro = String::from_utf8_lossy(&out.stdout).lines().last().unwrap().to_owned();
    let out = bin()
        .args(["machine", "set-constraints", "1", "cores=2", "--server", &s.url, "--token", &ro])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("read-only"), "{err}");
    assert_eq!(field(&s.json(&["machine", "show", "1", "--json"]), "constraints_text"), "cores=9");

    // Audited: what was asked, by whom, and the answer.
    let audit = std::fs::read_to_string(s.dir.join("audit.log")).unwrap();
    let line = audit.lines().find(|l| l.contains("set constraints of machine 1:")).unwrap_or_else(|| panic!("{audit}"));
    assert!(line.contains("\"admin\"") && line.contains("\"PUT\""), "{line}");

    // Machine 0 failed in az3 (unavailable); its new constraints send its retry to az1.
    let m = s.json(&["machine", "set-constraints", "0", "zones=az1", "--json"]);
    assert_eq!((field(&m, "constraints_text"), field(&m, "status")), ("zones=az1", "error"), "{m}");
    let out = s.cli(&["machine", "retry", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "the retried machine to start", || {
        field(machine(&s.machines(), "0"), "status") == "started"
    });
    assert_eq!(field(machine(&s.machines(), "0"), "zone"), "az1");
}
