//! Containers and manual machines (issue 14): containers start on their prepared host in its
//! zone, a failed host preparation is retried and shown, a host goes only with `--force` and
//! takes its containers along, a manual machine is never started, bad requests name the field,
//! and containers survive a crash without a second instance.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{eventually, field, ids_of, machine, raw_http, temp_dir, Server};

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
