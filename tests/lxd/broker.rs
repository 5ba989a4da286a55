//! The LXD broker against real daemons: the broker contract on a standalone daemon (over its
//! unix socket and over HTTPS with a trusted client certificate and the daemon's certificate
//! pinned) and on a three-member cluster whose failure domains are its zones; settings the
//! daemon refuses, each named; constraints as the containers' limits; a frozen member's starts
//! bounded and answered as an unreachable zone.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use provisioner::adapters::lxd::{
    LxdBroker, LxdConfig, LxdConfigError, LxdEndpoint, LxdTlsFiles, KEY_MACHINE, KEY_MODEL,
};
use provisioner::testing::broker_contract::{run_all, ContractConfig};
use provisioner::testing::lxd::{cluster_for_test, daemon_for_test, unique_name, ClientCert, LxdDaemon};
use provisioner::{Broker, BrokerError, Constraints, InstanceId, MachineId};

/// The image alias the tests import.
const IMAGE: &str = "busybox";

fn socket_config(daemon: &LxdDaemon, model: &str) -> LxdConfig {
    LxdConfig::new(model, LxdEndpoint::Unix(daemon.socket()), IMAGE)
}

async fn connect(config: LxdConfig) -> LxdBroker {
    LxdBroker::connect(config).await.expect("the broker connects")
}

fn contract(run: &str) -> ContractConfig {
    let mut c = ContractConfig::new("model-a", "model-b");
    c.run_id = run.to_owned();
    c.missing_instance = InstanceId::new("prov-00000000-missing-000000000000");
    c
}

/// A directory for certificates, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn https_config(daemon: &LxdDaemon, model: &str, client: &ClientCert) -> LxdConfig {
    let mut c = LxdConfig::new(model, LxdEndpoint::parse(&daemon.https_url()).unwrap(), IMAGE);
    c.tls = LxdTlsFiles {
        client_cert: Some(client.cert_path.clone()),
        client_key: Some(client.key_path.clone()),
        server_cert: Some(daemon.server_cert_path()),
    };
    c
}

fn params(machine: &str, zone: Option<&str>, token: &str, model: &str) -> provisioner::ports::StartInstanceParams {
    provisioner::ports::StartInstanceParams {
        machine: MachineId::new(machine),
        zone: zone.map(str::to_owned),
        constraints: Constraints::default(),
        placement: None,
        volumes: Vec::new(),
        nonce: format!("machine-{machine}:n"),
        tags: provisioner::model::InstanceTags {
            model: Some(model.to_owned()),
            machine: Some(MachineId::new(machine)),
            start: Some(format!("machine-{machine}:n")),
        },
        extra_tags: Default::default(),
        client_token: token.to_owned(),
        distribution_group: Vec::new(),
        capacity: Default::default(),
        spot_max_price: None,
    }
}

#[actix_rt::test]
async fn the_broker_keeps_the_contract_on_a_daemon_over_its_socket_and_over_https() {
    let Some(daemon) = daemon_for_test("bk", IMAGE) else { return };

    let ours = connect(socket_config(&daemon, "model-a")).await;
    let theirs = connect(socket_config(&daemon, "model-b")).await;
    let zones = ours.availability_zones().await.unwrap();
    assert_eq!(zones.len(), 1, "a standalone daemon is one zone: {zones:?}");
    let server = daemon.query("/1.0").unwrap();
    assert_eq!(zones[0].name, server["environment"]["server_name"].as_str().unwrap(), "named after its server");
    let report = run_all(&ours, &theirs, contract("socket")).await.expect("the contract over the socket");
    assert!(report.all_passed(), "{report}");

    let certs = TempDir::new("lxd-certs");
    let client = ClientCert::generate(&certs.0).unwrap();
    daemon.trust(&client.cert_path).unwrap();
    let ours = connect(https_config(&daemon, "model-a", &client)).await;
    let theirs = connect(https_config(&daemon, "model-b", &client)).await;
    let report = run_all(&ours, &theirs, contract("https")).await.expect("the contract over HTTPS");
    assert!(report.all_passed(), "{report}");
}

#[actix_rt::test]
async fn settings_the_daemon_refuses_are_named_at_connect() {
    let Some(daemon) = daemon_for_test("bad", IMAGE) else { return };
    let refused = |r: Result<LxdBroker, LxdConfigError>| r.map(|_| ()).unwrap_err().to_string();

    let mut c = socket_config(&daemon, "m");
    c.image = "no-such-image".into();
    let e = refused(LxdBroker::connect(c).await);
    assert!(e.contains("--lxd-image \"no-such-image\"") && e.contains("not an image alias"), "{e}");

    let mut c = socket_config(&daemon, "m");
    c.project = "nope".into();
    let e = refused(LxdBroker::connect(c).await);
    assert!(e.contains("--lxd-project \"nope\""), "{e}");

    let c = LxdConfig::new("m", LxdEndpoint::Unix(daemon.dir().join("no.socket")), IMAGE);
    let e = refused(LxdBroker::connect(c).await);
    assert!(e.contains("cannot reach LXD at --lxd-endpoint unix:") && e.contains("no.socket"), "{e}");

    let certs = TempDir::new("lxd-bad-certs");
    let stranger = ClientCert::generate(&certs.0).unwrap();
    let e = refused(LxdBroker::connect(https_config(&daemon, "m", &stranger)).await);
    assert!(e.contains("does not trust the client certificate") && e.contains("lxc config trust add"), "{e}");

    // Another certificate pinned than the daemon's: the handshake is refused.
    daemon.trust(&stranger.cert_path).unwrap();
    let mut c = https_config(&daemon, "m", &stranger);
    c.tls.server_cert = Some(stranger.cert_path.clone());
    let e = refused(LxdBroker::connect(c).await);
    assert!(e.contains("TLS handshake") && e.contains("--lxd-server-cert"), "{e}");
    assert!(LxdBroker::connect(https_config(&daemon, "m", &stranger)).await.is_ok(), "the right one connects");
}

#[actix_rt::test]
async fn constraints_are_the_containers_limits_and_what_cannot_be_met_is_refused() {
    let Some(daemon) = daemon_for_test("lim", IMAGE) else { return };
    let broker = connect(socket_config(&daemon, "m")).await;
    let mut p = params("0", None, "0/a/0", "m");
    p.constraints = Constraints { cores: Some(1), mem_mb: Some(256), ..Constraints::default() };
    let started = broker.start_instance(p).await.expect("a start with limits");
    let config = daemon.query(&format!("/1.0/instances/{}", started.instance.id)).unwrap();
    assert_eq!(config["config"]["limits.cpu"], "1", "{config}");
    assert_eq!(config["config"]["limits.memory"], "256MiB");
    assert_eq!(config["config"][KEY_MODEL], "m");
    assert_eq!(config["config"][KEY_MACHINE], "0");
    assert_eq!(config["status"], "Running");

    let mut p = params("1", None, "1/a/0", "m");
    p.constraints = Constraints { instance_type: Some("t3.small".into()), ..Constraints::default() };
    let typed = broker.start_instance(p).await.expect("an instance type from the shipped table");
    let config = daemon.query(&format!("/1.0/instances/{}", typed.instance.id)).unwrap();
    assert_eq!(
        (config["config"]["limits.cpu"].as_str(), config["config"]["limits.memory"].as_str()),
        (Some("2"), Some("2048MiB"))
    );
    assert_eq!(typed.instance.instance_type.as_deref(), Some("t3.small"));
    // Issue 34: a listing names each container's image (its fingerprint), the one the
    // configured alias names now; a drift judgement compares the two.
    let today = broker.current_image().await.expect("the alias reads").expect("a fingerprint");
    let listed = broker.all_instances().await.unwrap();
    assert!(listed.iter().all(|i| i.image.as_deref() == Some(today.as_str())), "{today}: {listed:?}");

    let mut p = params("2", None, "2/a/0", "m");
    p.constraints = Constraints { root_disk_mb: Some(4096), ..Constraints::default() };
    let e = broker.start_instance(p).await.unwrap_err();
    assert!(matches!(e, BrokerError::ZoneIndependent { .. }), "{e:?}");
    assert!(e.message().contains("root-disk=4096M") && e.message().contains("driver dir"), "{e}");
    let mut p = params("3", None, "3/a/0", "m");
    p.constraints = Constraints { arch: Some("s390x".into()), ..Constraints::default() };
    let e = broker.start_instance(p).await.unwrap_err();
    assert!(e.message().contains("not s390x"), "{e}");
    let names: Vec<String> = daemon.instances().unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names.len(), 2, "refused starts make nothing: {names:?}");
}

#[actix_rt::test]
async fn a_cluster_is_zones_by_failure_domain_and_a_frozen_member_is_an_unreachable_zone() {
    let Some(cluster) = cluster_for_test(3, Some(&["zone-a", "zone-b", "zone-c"]), IMAGE) else { return };
    let first = &cluster.members[0];
    let mut config = socket_config(first, "model-a");
    config.call_timeout = Duration::from_secs(3);
    let ours = connect(config.clone()).await;
    let theirs = connect(socket_config(first, "model-b")).await;
    let zones: Vec<(String, bool)> =
        ours.availability_zones().await.unwrap().into_iter().map(|z| (z.name, z.available)).collect();
    let expected = ["zone-a", "zone-b", "zone-c"].map(|z| (z.to_owned(), true));
    assert_eq!(zones, expected);
    let report = run_all(&ours, &theirs, contract("cluster")).await.expect("the contract on a cluster");
    assert!(report.all_passed(), "{report}");

    // The member of zone-b stops answering: a start there is bounded by the call's deadline and
    // answered as an unreachable zone; another zone works meanwhile.
    let frozen = cluster.members.iter().find(|m| m.server_name() != first.server_name()).unwrap();
    let frozen_zone = ours.members().await.unwrap().into_iter().find(|m| m.name == frozen.server_name()).unwrap().zone;
    frozen.freeze().unwrap();
    let began = Instant::now();
    let e = ours.start_instance(params("7", Some(&frozen_zone), "7/a/0", "model-a")).await.unwrap_err();
    let took = began.elapsed();
    assert!(matches!(e, BrokerError::ZoneUnreachable { .. }) && e.is_ambiguous(), "{e:?}");
    assert!(took < Duration::from_secs(10), "bounded: {took:?}");
    assert!(e.message().contains(frozen.server_name()), "{e}");
    let elsewhere = if frozen_zone == "zone-a" { "zone-c" } else { "zone-a" };
    let started = ours.start_instance(params("7", Some(elsewhere), "7/a/1", "model-a")).await.expect("another zone");
    assert_eq!(started.instance.zone.as_deref(), Some(elsewhere));
    frozen.thaw().unwrap();
    // What the unanswered create makes once the member wakes is tagged for the machine: the
    // provisioner knows it as an extra instance of machine 7 (listed, never a stranger's).
    let mut listed = Vec::new();
    for _ in 0..60 {
        listed = ours.all_instances().await.unwrap_or_default();
        if listed.iter().filter(|i| i.tags.machine == Some(MachineId::new("7"))).count() == 2 {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(500)).await;
    }
    let sevens: Vec<_> = listed.iter().filter(|i| i.tags.machine == Some(MachineId::new("7"))).collect();
    assert!(!sevens.is_empty() && sevens.len() <= 2, "{sevens:?}");
    ours.stop_instances(sevens.iter().map(|i| i.id.clone()).collect()).await.expect("stops");
    let left = ours.all_instances().await.unwrap();
    assert!(left.iter().all(|i| i.tags.machine != Some(MachineId::new("7"))), "{left:?}");
}
