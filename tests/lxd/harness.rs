//! The harness itself: a daemon starts, takes the busybox image, runs a container and trusts a
//! client certificate over HTTPS; a cluster forms with failure domains and places an instance
//! on the member asked for; both leave no process or directory behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use provisioner::testing::lxd::{unique_name, ClientCert, LxdCluster, LxdDaemon};

use super::lxd_or_skip;

/// What a daemon leaves that must be gone once it is dropped.
struct Traces {
    pid: u32,
    dir: PathBuf,
}

impl Traces {
    fn of(daemon: &LxdDaemon) -> Self {
        Traces { pid: daemon.pid(), dir: daemon.dir().to_owned() }
    }

    fn assert_gone(&self) {
        assert!(!Path::new(&format!("/proc/{}", self.pid)).exists(), "lxd {} still runs", self.pid);
        assert!(!self.dir.exists(), "{} still exists", self.dir.display());
    }
}

/// `GET /1.0` over HTTPS with curl: the server's certificate pinned (it names the host, not the
/// loopback address it listens on, hence `--resolve`), the client's certificate if any.
fn get_api(daemon: &LxdDaemon, client: Option<&ClientCert>) -> serde_json::Value {
    let url = daemon.https_url();
    let address = url.trim_start_matches("https://");
    let (ip, port) = address.rsplit_once(':').unwrap();
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap().trim().to_owned();
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--max-time", "20", "--cacert"])
        .arg(daemon.server_cert_path())
        .args(["--resolve", &format!("{host}:{port}:{ip}")]);
    if let Some(client) = client {
        curl.arg("--cert").arg(&client.cert_path).arg("--key").arg(&client.key_path);
    }
    let out = curl.arg(format!("https://{host}:{port}/1.0")).output().expect("curl runs");
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON from /1.0")
}

/// The state letter of process `pid` (`T` when stopped by a signal).
fn process_state(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let state = status.lines().find_map(|l| l.strip_prefix("State:")).unwrap();
    state.trim().chars().take(1).collect()
}

#[test]
fn a_daemon_runs_a_busybox_container_and_trusts_a_client_certificate() {
    if !lxd_or_skip() {
        return;
    }
    let lxd = LxdDaemon::standalone("solo").expect("a daemon starts");
    let traces = Traces::of(&lxd);
    assert!(lxd.socket().exists(), "its unix socket");

    lxd.import_busybox_image("busybox").expect("the image imports");
    lxd.import_busybox_image("busybox-again").expect("a second import (cached tarballs)");
    let name = unique_name("solo");
    lxd.lxc_ok(&["launch", "busybox", &name, "-c", "user.machine=0"]).expect("a container launches");
    let instances = lxd.instances().unwrap();
    let instance = instances.iter().find(|i| i.name == name).expect("listed");
    assert_eq!((instance.status.as_str(), instance.location.as_str()), ("Running", "none"), "{instance:?}");
    assert_eq!(instance.user.get("user.machine").map(String::as_str), Some("0"), "{instance:?}");

    let certs = std::env::temp_dir().join(unique_name("plxd-certs"));
    let client = ClientCert::generate(&certs).unwrap();
    assert_eq!(get_api(&lxd, Some(&client))["metadata"]["auth"], "untrusted", "before it is trusted");
    lxd.trust(&client.cert_path).expect("trusted");
    let api = get_api(&lxd, Some(&client));
    assert_eq!(api["metadata"]["auth"], "trusted", "{api}");
    std::fs::remove_dir_all(&certs).unwrap();

    lxd.freeze().unwrap();
    assert_eq!(process_state(lxd.pid()), "T", "frozen");
    lxd.thaw().unwrap();
    assert_ne!(process_state(lxd.pid()), "T", "thawed");
    lxd.lxc_ok(&["list"]).expect("it answers again");

    drop(lxd);
    traces.assert_gone();
}

#[test]
fn a_cluster_forms_with_failure_domains_and_places_an_instance_on_its_target() {
    if !lxd_or_skip() {
        return;
    }
    let cluster = LxdCluster::start(3, Some(&["zone-a", "zone-b", "zone-c"])).expect("a cluster forms");
    let traces: Vec<Traces> = cluster.members.iter().map(Traces::of).collect();
    let m1 = cluster.member("m1").unwrap();

    let list = m1.lxc_ok(&["cluster", "list", "--format", "csv"]).unwrap();
    assert_eq!(list.lines().filter(|l| l.contains("ONLINE")).count(), 3, "{list}");
    let mut states = cluster.member_states().unwrap();
    states.sort();
    let expected = [("m1", "zone-a"), ("m2", "zone-b"), ("m3", "zone-c")]
        .map(|(m, d)| (m.to_owned(), "Online".to_owned(), d.to_owned()));
    assert_eq!(states, expected);

    m1.import_busybox_image("busybox").expect("the image imports");
    let name = unique_name("placed");
    m1.lxc_ok(&["launch", "busybox", &name, "--target", "m2"]).expect("a container launches on m2");
    let instances = cluster.member("m3").unwrap().instances().unwrap();
    let instance = instances.iter().find(|i| i.name == name).expect("listed on every member");
    assert_eq!((instance.location.as_str(), instance.status.as_str()), ("m2", "Running"), "{instance:?}");

    // A client trusted through one member may use every member's HTTPS API, which all serve
    // the cluster's certificate.
    let certs = std::env::temp_dir().join(unique_name("plxd-certs"));
    let client = ClientCert::generate(&certs).unwrap();
    m1.trust(&client.cert_path).expect("trusted");
    let m3 = cluster.member("m3").unwrap();
    assert!(m3.server_cert_path().ends_with("cluster.crt"), "{}", m3.server_cert_path().display());
    assert_eq!(m3.server_cert_pem().unwrap(), m1.server_cert_pem().unwrap(), "one certificate");
    let api = get_api(m3, Some(&client));
    assert_eq!(api["metadata"]["auth"], "trusted", "{api}");
    std::fs::remove_dir_all(&certs).unwrap();

    drop(cluster);
    for t in &traces {
        t.assert_gone();
    }
}
