//! The EC2 broker against moto's EC2 server (`tests/ec2/moto_server.py`, installed into a
//! virtualenv by `.ci/moto-venv` on first use): the real provisioner actors, the real AWS SDK,
//! an EC2-compatible endpoint on loopback, in real time. The tests share one server (it starts
//! in seconds, but five at once on two cores take a minute) and each uses its own model uuid,
//! so none sees another's instances or faults.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, InstanceStateName};
use provisioner::adapters::ec2::{Ec2Broker, TAG_MACHINE};
use provisioner::testing::broker_contract::{run_all, ContractConfig};
use provisioner::testing::{FakeMachine, FakeModel, ModelSnapshot};
use provisioner::{start, HarvestMode, Life, Machine, ProvisionerConfig, ProvisionerHandle};

use provisioner::testing::moto::{self, Moto, CAPACITY_MODEL, IMAGE};

/// Spot capacity (issue 33).
mod spot;

fn config(model: &str, mode: HarvestMode) -> ProvisionerConfig {
    ProvisionerConfig {
        model_uuid: model.into(),
        harvest_mode: mode,
        workers: 4,
        retry: provisioner::RetryStrategy::new(3, Duration::from_millis(200)),
        harvest_grace: Duration::ZERO,
        ..ProvisionerConfig::default()
    }
}

fn pending(ids: &[String]) -> FakeModel {
    FakeModel::with_machines(ids.iter().map(|id| FakeMachine::new(Machine::pending(id.as_str()))).collect())
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn run(uuid: &str, broker: &Ec2Broker, model: &FakeModel, mode: HarvestMode) -> ProvisionerHandle {
    run_with(config(uuid, mode), broker, model)
}

/// The provisioner with `config` on moto, watching `model`.
fn run_with(config: ProvisionerConfig, broker: &Ec2Broker, model: &FakeModel) -> ProvisionerHandle {
    let handle = start(config, Arc::new(broker.clone()), Arc::new(model.api())).expect("valid config");
    model.watch(handle.machines_changed());
    handle
}

/// The provisioner for model `uuid` on moto in harvest mode `mode`, and `model` once every
/// machine of `ids` records an instance.
async fn provisioned(
    uuid: &str,
    broker: &Ec2Broker,
    model: &FakeModel,
    ids: &[String],
    mode: HarvestMode,
) -> (ProvisionerHandle, ModelSnapshot) {
    let handle = run(uuid, broker, model, mode);
    (handle, until(model, all_provisioned(ids)).await)
}

/// Polls the model (real time) until `cond` holds; panics after 60 s.
async fn until(model: &FakeModel, cond: impl Fn(&ModelSnapshot) -> bool) -> ModelSnapshot {
    for _ in 0..600 {
        let snap = model.snapshot().await;
        if cond(&snap) {
            return snap;
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("condition not met within 60 s: {:#?}", model.snapshot().await);
}

/// The instance machine `id` records.
fn recorded(snap: &ModelSnapshot, id: &str) -> String {
    snap.machine(id).unwrap().machine.instance.as_ref().unwrap().to_string()
}

fn all_provisioned(ids: &[String]) -> impl Fn(&ModelSnapshot) -> bool + '_ {
    move |m| ids.iter().all(|id| m.machine(id).is_some_and(|f| f.machine.instance.is_some()))
}

/// Every instance of this model in moto (any state), with its state, zone and machine tag.
async fn cloud(broker: &Ec2Broker, model: &str) -> Vec<(String, InstanceStateName, String, Option<String>)> {
    let ours = Filter::builder().name("tag:provisioner-model").values(model).build();
    let out = broker.client().describe_instances().filters(ours).send().await.unwrap();
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            let machine =
                i.tags().iter().find(|t| t.key() == Some(TAG_MACHINE)).and_then(|t| t.value()).map(str::to_owned);
            (
                i.instance_id().unwrap().to_owned(),
                i.state().and_then(|s| s.name()).cloned().unwrap(),
                i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_owned(),
                machine,
            )
        })
        .collect()
}

/// Machines are spread over the available zones: lowest population first.
#[actix_rt::test]
async fn machines_spread_over_the_available_zones() {
    let uuid = "model-spread";
    let broker = Moto::shared().broker(uuid).await;
    let zones = provisioner::Broker::availability_zones(&broker).await.unwrap();
    let available: Vec<_> = zones.iter().filter(|z| z.available).map(|z| z.name.clone()).collect();
    assert!(available.len() >= 3, "{zones:?}");
    let ids = ids(2 * available.len());
    let model = pending(&ids);
    let (handle, snap) = provisioned(uuid, &broker, &model, &ids, HarvestMode::Destroyed).await;
    let mut per_zone = std::collections::BTreeMap::new();
    for id in &ids {
        *per_zone.entry(snap.machine(id).unwrap().zone.clone().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(per_zone.len(), available.len(), "{per_zone:?}");
    assert!(per_zone.values().all(|n| *n == 2), "{per_zone:?}");
    assert_eq!(cloud(&broker, uuid).await.len(), ids.len(), "one instance per machine");
    handle.shutdown();
}

/// A zone out of capacity (InsufficientInstanceCapacity) is failed over, not fatal, and
/// avoided: every machine ends up elsewhere.
#[actix_rt::test]
async fn a_zone_out_of_capacity_is_avoided() {
    let broker = Moto::shared().broker(CAPACITY_MODEL).await;
    let ids = ids(8);
    let model = pending(&ids);
    let (handle, snap) = provisioned(CAPACITY_MODEL, &broker, &model, &ids, HarvestMode::Destroyed).await;
    for id in &ids {
        let m = snap.machine(id).unwrap();
        assert_ne!(m.zone.as_deref(), Some("us-east-1a"), "machine {id}");
        assert!(!m.machine.instance_status.is_error(), "machine {id}: {}", m.instance_status_message);
    }
    let instances = cloud(&broker, CAPACITY_MODEL).await;
    assert_eq!(instances.len(), 8);
    assert!(instances.iter().all(|(_, _, zone, _)| zone != "us-east-1a"), "{instances:?}");
    handle.shutdown();
}

/// An instance without our model tag is invisible: harvest mode `all` leaves it running.
#[actix_rt::test]
async fn an_untagged_instance_survives_harvest_mode_all() {
    let uuid = "model-untagged";
    let broker = Moto::shared().broker(uuid).await;
    let theirs = broker.client().run_instances().image_id(IMAGE).min_count(1).max_count(1).send().await.unwrap();
    let theirs = theirs.instances()[0].instance_id().unwrap().to_owned();
    let ids = ids(2);
    let model = pending(&ids);
    let (handle, _) = provisioned(uuid, &broker, &model, &ids, HarvestMode::All).await;
    handle.set_harvest_mode(HarvestMode::All);
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    let listed = provisioner::Broker::all_instances(&broker).await.unwrap();
    assert!(listed.iter().all(|i| i.id.to_string() != theirs), "listed as ours");
    let out = broker.client().describe_instances().instance_ids(theirs.clone()).send().await.unwrap();
    let state = out.reservations()[0].instances()[0].state().and_then(|s| s.name()).cloned();
    assert_eq!(state, Some(InstanceStateName::Running));
    handle.shutdown();
}

/// A machine that is removed (dead) has its instance terminated.
#[actix_rt::test]
async fn removing_machines_terminates_their_instances() {
    let uuid = "model-remove";
    let broker = Moto::shared().broker(uuid).await;
    let ids = ids(3);
    let model = pending(&ids);
    let (handle, snap) = provisioned(uuid, &broker, &model, &ids, HarvestMode::Destroyed).await;
    let gone = recorded(&snap, "1");
    model.set_life("1", Life::Dead);
    until(&model, |m| m.machine("1").unwrap().removed).await;
    let states: Vec<_> = cloud(&broker, uuid).await;
    let state = states.iter().find(|(id, ..)| *id == gone).map(|(_, s, ..)| s.clone());
    assert!(matches!(state, Some(InstanceStateName::Terminated | InstanceStateName::ShuttingDown)), "{state:?}");
    let running = states.iter().filter(|(_, s, ..)| *s == InstanceStateName::Running).count();
    assert_eq!(running, 2);
    handle.shutdown();
}

/// A restart whose model lost the instance records (a crash between a start and its record)
/// adopts the running, tagged instances instead of starting new ones.
#[actix_rt::test]
async fn a_restart_adopts_running_instances() {
    let uuid = "model-restart";
    let broker = Moto::shared().broker(uuid).await;
    let ids = ids(4);
    let first_model = pending(&ids);
    let handle = run(uuid, &broker, &first_model, HarvestMode::All);
    until(&first_model, all_provisioned(&ids)).await;
    handle.shutdown();
    let before = cloud(&broker, uuid).await;
    assert_eq!(before.len(), 4);
    // The new incarnation's model knows the machines but none of their instances.
    let model = pending(&ids);
    let (handle, snap) = provisioned(uuid, &broker, &model, &ids, HarvestMode::All).await;
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    let after = cloud(&broker, uuid).await;
    assert_eq!(after.len(), 4, "no new instance: {after:?}");
    for (id, state, _, machine) in &after {
        assert_eq!(*state, InstanceStateName::Running, "{id}");
        let machine = machine.clone().unwrap();
        assert_eq!(recorded(&snap, &machine), *id);
    }
    handle.shutdown();
}

/// A lost response, on moto made idempotent by client token (as EC2 is) and losing the first
/// four RunInstances answers of every machine after the call took effect: each machine ends
/// with exactly one instance ever made for it (before the fix, a retry with a new token made
/// another: 13 live instances for 9 machines).
#[actix_rt::test]
async fn lost_answers_make_one_instance_per_machine() {
    let uuid = moto::LOSSY_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let ids = ids(9);
    let model = pending(&ids);
    let (handle, snap) = provisioned(uuid, &broker, &model, &ids, HarvestMode::Destroyed).await;
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    let all = cloud(&broker, uuid).await;
    assert_eq!(all.len(), 9, "one instance ever made per machine: {all:?}");
    for id in &ids {
        let of: Vec<_> = all.iter().filter(|(_, _, _, m)| m.as_deref() == Some(id.as_str())).collect();
        assert_eq!(of.len(), 1, "machine {id}: {of:?}");
        assert_eq!(of[0].1, InstanceStateName::Running, "machine {id}");
        assert_eq!(recorded(&snap, id), of[0].0);
    }
    handle.shutdown();
}

/// The broker contract suite (`provisioner::testing::broker_contract`) against the EC2 broker on
/// moto, with a broker for another model on the same server as the stranger: every property
/// holds, zones and retags included.
#[actix_rt::test]
async fn the_ec2_broker_keeps_the_broker_contract() {
    let (uuid, other) = ("model-contract", "model-contract-stranger");
    let broker = Moto::shared().broker(uuid).await;
    let stranger = Moto::shared().broker(other).await;
    let config = ContractConfig { poll_interval: Duration::from_millis(100), ..ContractConfig::new(uuid, other) };
    let report = run_all(&broker, &stranger, config).await.unwrap_or_else(|e| panic!("{e}: {e:?}"));
    assert!(report.all_passed(), "{report}");
    // Everything the suite made is terminated again.
    let left: Vec<_> =
        cloud(&broker, uuid).await.into_iter().filter(|(_, s, ..)| *s == InstanceStateName::Running).collect();
    assert!(left.is_empty(), "{left:?}");
}

/// What moto shows of one instance: its type, zone, tags, and the sizes (GiB) of its volumes
/// by device.
struct Shown {
    instance_type: String,
    zone: String,
    tags: std::collections::BTreeMap<String, String>,
    volumes: std::collections::BTreeMap<String, i32>,
}

async fn shown(broker: &Ec2Broker, id: &str) -> Shown {
    let out = broker.client().describe_instances().instance_ids(id).send().await.unwrap();
    let i = &out.reservations()[0].instances()[0];
    let tags = i.tags().iter().map(|t| (t.key().unwrap().to_owned(), t.value().unwrap_or("").to_owned())).collect();
    let attached = Filter::builder().name("attachment.instance-id").values(id).build();
    let vols = broker.client().describe_volumes().filters(attached).send().await.unwrap();
    let volumes = vols
        .volumes()
        .iter()
        .flat_map(|v| v.attachments().iter().map(move |a| (a.device().unwrap_or("").to_owned(), v.size().unwrap_or(0))))
        .collect();
    Shown {
        instance_type: i.instance_type().unwrap().as_str().to_owned(),
        zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or("").to_owned(),
        tags,
        volumes,
    }
}

/// `cores=2 mem=8G`: t3.large is the cheapest amd64 type that fits, m5.large the next.
fn c2m8() -> provisioner::Constraints {
    provisioner::Constraints { cores: Some(2), mem_mb: Some(8192), ..provisioner::Constraints::default() }
}

fn with_constraints(id: &str, c: provisioner::Constraints) -> FakeMachine {
    let mut m = FakeMachine::new(Machine::pending(id));
    m.info.constraints = c;
    m
}

/// Constraints choose the instance type as Juju does, on the types moto's
/// `DescribeInstanceTypes` lists priced by the shipped table: `cores=2 mem=8G` gets the
/// cheapest such amd64 type (t3.large), `arch=arm64` the cheapest arm64 one (t4g.large), an
/// explicit `instance-type` that type, no hardware constraint the configured default
/// (t3.micro); an `instance-type` moto does not know is the machine's provisioning error.
#[actix_rt::test]
async fn constraints_pick_the_cheapest_satisfying_instance_type() {
    use provisioner::Constraints;
    let uuid = "model-types";
    let broker = Moto::shared().broker(uuid).await;
    let c2m8 = c2m8();
    let model = FakeModel::with_machines(vec![
        with_constraints("0", c2m8.clone()),
        with_constraints("1", Constraints { arch: Some("arm64".into()), ..c2m8.clone() }),
        with_constraints("2", Constraints { instance_type: Some("m5.xlarge".into()), ..Constraints::default() }),
        with_constraints("3", Constraints::default()),
        with_constraints("4", Constraints { instance_type: Some("x9.nonesuch".into()), ..Constraints::default() }),
    ]);
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let started: Vec<String> = ids(4);
    let snap = until(&model, |m| {
        all_provisioned(&started)(m) && m.machine("4").is_some_and(|f| f.machine.instance_status.is_error())
    })
    .await;
    for (id, want) in [("0", "t3.large"), ("1", "t4g.large"), ("2", "m5.xlarge"), ("3", "t3.micro")] {
        let i = recorded(&snap, id);
        assert_eq!(shown(&broker, &i).await.instance_type, want, "machine {id}");
    }
    let failed = snap.machine("4").unwrap();
    assert!(failed.instance_status_message.contains("x9.nonesuch"), "{}", failed.instance_status_message);
    assert_eq!(cloud(&broker, uuid).await.len(), 4, "nothing started for machine 4");
    // The listing shows the type too.
    let listed = provisioner::Broker::all_instances(&broker).await.unwrap();
    assert!(listed.iter().any(|i| i.instance_type.as_deref() == Some("t4g.large")), "{listed:?}");
    handle.shutdown();
}

/// A capacity fault on one type in one zone (moto made to fail t3.large in us-east-1a with
/// InsufficientInstanceCapacity) moves the start to the next type that satisfies the
/// constraints in the same zone (m5.large, as Karpenter does), instead of moving zone or
/// failing: the machines are pinned to us-east-1a and still start there.
#[actix_rt::test]
async fn a_type_out_of_capacity_in_a_zone_fails_over_to_the_next_type_there() {
    use provisioner::Constraints;
    let uuid = moto::TYPE_CAPACITY_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let pinned = Constraints { zones: Some(vec!["us-east-1a".into()]), ..c2m8() };
    let elsewhere = Constraints { zones: Some(vec!["us-east-1b".into()]), ..pinned.clone() };
    let model = FakeModel::with_machines(vec![
        with_constraints("0", pinned.clone()),
        with_constraints("1", pinned),
        with_constraints("2", elsewhere),
    ]);
    // No retry round: the fail-over happens within the one start, not on a later round.
    let config = ProvisionerConfig {
        retry: provisioner::RetryStrategy::new(0, Duration::from_millis(200)),
        ..config(uuid, HarvestMode::Destroyed)
    };
    let handle = run_with(config, &broker, &model);
    let ids = ids(3);
    let snap = until(&model, all_provisioned(&ids)).await;
    for (id, zone, ty) in
        [("0", "us-east-1a", "m5.large"), ("1", "us-east-1a", "m5.large"), ("2", "us-east-1b", "t3.large")]
    {
        let m = snap.machine(id).unwrap();
        assert!(!m.machine.instance_status.is_error(), "machine {id}: {}", m.instance_status_message);
        let s = shown(&broker, &m.machine.instance.clone().unwrap().to_string()).await;
        assert_eq!((s.zone.as_str(), s.instance_type.as_str()), (zone, ty), "machine {id}");
    }
    assert_eq!(cloud(&broker, uuid).await.len(), 3, "one instance per machine");
    handle.shutdown();
}

/// `root-disk=20G` becomes a 20 GiB root volume on the image's root device; the `tags`
/// constraint and the model's tags become instance tags (`KEY=VALUE` as is, a bare name as
/// `juju-tag-NAME=true`), the provisioner's identity tags untouched.
#[actix_rt::test]
async fn root_disk_sizes_the_root_volume_and_tags_become_instance_tags() {
    use provisioner::Constraints;
    let uuid = "model-disk-tags";
    let broker = Moto::shared().broker(uuid).await;
    let c = Constraints {
        root_disk_mb: Some(20 * 1024),
        tags: vec!["team=web".into(), "gpu".into(), "provisioner-machine=9".into()],
        ..Constraints::default()
    };
    let mut m = with_constraints("0", c);
    m.info.tags.insert("owner".into(), "alice".into());
    let model = FakeModel::with_machines(vec![m]);
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, all_provisioned(&ids(1))).await;
    let s = shown(&broker, &recorded(&snap, "0")).await;
    assert_eq!(s.volumes.get("/dev/sda1"), Some(&20), "{:?}", s.volumes);
    assert_eq!(s.tags.get("team").map(String::as_str), Some("web"), "{:?}", s.tags);
    assert_eq!(s.tags.get("juju-tag-gpu").map(String::as_str), Some("true"), "{:?}", s.tags);
    assert_eq!(s.tags.get("owner").map(String::as_str), Some("alice"), "{:?}", s.tags);
    assert_eq!(s.tags.get(TAG_MACHINE).map(String::as_str), Some("0"), "identity untouched");
    assert_eq!(s.instance_type, "t3.micro");
    handle.shutdown();
}

/// At-least-once safety across the per-type fail-over: t3.large is out of capacity in
/// us-east-1a and the first two answers of the calls that take effect (m5.large, under the
/// token derived for it) are lost. The retries repeat that same call (same type, same derived
/// token), which moto, idempotent by token as EC2 is, answers with the instance it made: one
/// instance per machine, m5.large in us-east-1a.
#[actix_rt::test]
async fn lost_answers_after_a_type_fail_over_make_one_instance_per_machine() {
    use provisioner::Constraints;
    let uuid = moto::TYPE_LOSSY_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let pinned = Constraints { zones: Some(vec!["us-east-1a".into()]), ..c2m8() };
    let ids = ids(3);
    let model = FakeModel::with_machines(ids.iter().map(|id| with_constraints(id, pinned.clone())).collect());
    let (handle, snap) = provisioned(uuid, &broker, &model, &ids, HarvestMode::Destroyed).await;
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    let all = cloud(&broker, uuid).await;
    assert_eq!(all.len(), 3, "one instance ever made per machine: {all:?}");
    for id in &ids {
        let recorded = recorded(&snap, id);
        let s = shown(&broker, &recorded).await;
        assert_eq!((s.zone.as_str(), s.instance_type.as_str()), ("us-east-1a", "m5.large"), "machine {id}");
    }
    handle.shutdown();
}

/// Without `--ec2-instance-type`, a machine without hardware constraints gets the cheapest
/// amd64 type with at least 1 GiB (t3.micro), from the catalogue moto lists.
#[actix_rt::test]
async fn no_default_type_takes_the_cheapest_amd64_type_with_a_gib() {
    let uuid = "model-no-default-type";
    let broker = Moto::shared().broker_with(uuid, |c| c.instance_type = None).await;
    let catalogue = broker.catalogue().await.unwrap();
    let t3 = catalogue.iter().find(|t| t.name == "t3.large").expect("moto lists t3.large");
    assert_eq!((t3.arch.as_str(), t3.cores, t3.mem_mb, t3.price_per_hour), ("amd64", 2, 8192, Some(0.0832)));
    let model = pending(&ids(1));
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, all_provisioned(&ids(1))).await;
    let s = shown(&broker, &recorded(&snap, "0")).await;
    assert_eq!(s.instance_type, "t3.micro");
    handle.shutdown();
}

fn placed(id: &str, placement: &str) -> FakeMachine {
    let mut m = FakeMachine::new(Machine::pending(id));
    m.info.placement = Some(placement.to_owned());
    m
}

/// An application's machines (one distribution group, as the fake model's groups are) spread
/// over three zones one per zone on EC2, although the zones' populations would put two of
/// them together: `zone=` placements first put two machines in us-east-1a and two in
/// us-east-1b (honoured: that is where moto shows their instances), then the group's three
/// machines, allowed us-east-1a..c, land one in each (by population alone the second would
/// go to us-east-1c again).
#[actix_rt::test]
async fn an_applications_machines_spread_one_per_zone_and_zone_placements_are_honoured() {
    use provisioner::{Constraints, MachineId};
    let uuid = "model-app-spread";
    let broker = Moto::shared().broker(uuid).await;
    let fillers = [("0", "us-east-1a"), ("1", "us-east-1a"), ("2", "us-east-1b"), ("3", "us-east-1b")];
    let model = FakeModel::with_machines(fillers.iter().map(|(id, z)| placed(id, &format!("zone={z}"))).collect());
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, all_provisioned(&ids(4))).await;
    for (id, zone) in fillers {
        let i = recorded(&snap, id);
        assert_eq!(shown(&broker, &i).await.zone, zone, "machine {id}: its zone= placement");
    }
    let app = ["10", "11", "12"];
    let three = Constraints {
        zones: Some(vec!["us-east-1a".into(), "us-east-1b".into(), "us-east-1c".into()]),
        ..Constraints::default()
    };
    for id in app {
        let mut m = with_constraints(id, three.clone());
        m.group = Ok(app.iter().filter(|o| **o != id).map(|o| MachineId::new(*o)).collect());
        model.add_machine(m);
    }
    let app_ids: Vec<String> = app.iter().map(|s| (*s).to_owned()).collect();
    let snap = until(&model, all_provisioned(&app_ids)).await;
    let mut zones = Vec::new();
    for id in app {
        let m = snap.machine(id).unwrap();
        zones.push(shown(&broker, &m.machine.instance.clone().unwrap().to_string()).await.zone);
    }
    zones.sort();
    assert_eq!(zones, ["us-east-1a", "us-east-1b", "us-east-1c"], "one per zone");
    assert_eq!(cloud(&broker, uuid).await.len(), 7, "one instance per machine");
    handle.shutdown();
}

/// `--to subnet=SUBNET` on EC2: the broker derives the machine's zone from `DescribeSubnets`
/// (a default subnet of moto's default VPC, in us-east-1c) and launches into that subnet
/// (`SubnetId`); an unknown subnet is that machine's provisioning error, nothing started.
#[actix_rt::test]
async fn a_subnet_placement_derives_its_zone_and_launches_into_the_subnet() {
    let uuid = "model-subnet";
    let broker = Moto::shared().broker(uuid).await;
    let default = Filter::builder().name("default-for-az").values("true").build();
    let subnets = broker.client().describe_subnets().filters(default).send().await.unwrap();
    let in_c = subnets
        .subnets()
        .iter()
        .find(|s| s.availability_zone() == Some("us-east-1c"))
        .and_then(|s| s.subnet_id())
        .expect("moto's default VPC has a subnet in us-east-1c")
        .to_owned();
    let derived = provisioner::Broker::derive_availability_zones(
        &broker,
        &provisioner::ports::StartInstanceParams {
            machine: provisioner::MachineId::new("9"),
            zone: None,
            constraints: provisioner::Constraints::default(),
            placement: Some(format!("subnet={in_c}")),
            volumes: Vec::new(),
            nonce: "n".into(),
            tags: provisioner::model::InstanceTags::default(),
            extra_tags: Default::default(),
            client_token: "t".into(),
            distribution_group: Vec::new(),
            capacity: Default::default(),
            spot_max_price: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(derived, ["us-east-1c"]);
    let model =
        FakeModel::with_machines(vec![placed("0", &format!("subnet={in_c}")), placed("1", "subnet=subnet-0nonesuch")]);
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, |m| {
        all_provisioned(&ids(1))(m) && m.machine("1").is_some_and(|f| f.machine.instance_status.is_error())
    })
    .await;
    let i = recorded(&snap, "0");
    let out = broker.client().describe_instances().instance_ids(i.clone()).send().await.unwrap();
    let inst = &out.reservations()[0].instances()[0];
    assert_eq!(inst.subnet_id(), Some(in_c.as_str()), "launched into the subnet");
    assert_eq!(inst.placement().and_then(|p| p.availability_zone()), Some("us-east-1c"));
    assert_eq!(snap.machine("0").unwrap().zone.as_deref(), Some("us-east-1c"));
    let failed = snap.machine("1").unwrap();
    assert!(failed.instance_status_message.contains("subnet-0nonesuch"), "{}", failed.instance_status_message);
    assert!(failed.machine.instance.is_none());
    assert_eq!(cloud(&broker, uuid).await.len(), 1, "nothing started for machine 1");
    handle.shutdown();
}

/// A batched start of `machines` into `zone` under the batch token `token` (as the engine
/// makes it: the first member's start token and the size), each member's nonce carrying
/// `marks[i]` when given (the moto server's tagging faults key on it).
fn batch(
    uuid: &str,
    machines: &[&str],
    marks: &[&str],
    zone: &str,
    constraints: provisioner::Constraints,
) -> provisioner::ports::BatchStartParams {
    use provisioner::model::InstanceTags;
    use provisioner::ports::{BatchMember, BatchStartParams};
    use provisioner::MachineId;
    let members: Vec<BatchMember> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let nonce = format!("machine-0:{uuid}-{m}-{}", marks.get(i).copied().unwrap_or("plain"));
            BatchMember {
                machine: MachineId::new(*m),
                nonce: nonce.clone(),
                tags: InstanceTags {
                    model: Some(uuid.to_owned()),
                    machine: Some(MachineId::new(*m)),
                    start: Some(nonce),
                },
                distribution_group: Vec::new(),
            }
        })
        .collect();
    let first = &members[0];
    BatchStartParams {
        zone: Some(zone.to_owned()),
        constraints,
        placement: None,
        volumes: Vec::new(),
        extra_tags: [("owner".to_owned(), "alice".to_owned())].into(),
        client_token: format!("{}/{}/0+{}", first.machine, first.nonce, members.len()),
        members,
        capacity: Default::default(),
        spot_max_price: None,
    }
}

/// One instance as moto shows it, for the batched-start tests.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Launched {
    id: String,
    launch_index: i32,
    instance_type: String,
    zone: String,
    tags: std::collections::BTreeMap<String, String>,
}

/// Every instance of this model in moto, by reservation (one reservation = one RunInstances
/// call that made instances), each ordered by launch index.
async fn reservations(broker: &Ec2Broker, model: &str) -> std::collections::BTreeMap<String, Vec<Launched>> {
    let ours = Filter::builder().name("tag:provisioner-model").values(model).build();
    let out = broker.client().describe_instances().filters(ours).send().await.unwrap();
    out.reservations()
        .iter()
        .map(|r| {
            let mut instances: Vec<Launched> = r
                .instances()
                .iter()
                .map(|i| Launched {
                    id: i.instance_id().unwrap().to_owned(),
                    launch_index: i.ami_launch_index().unwrap(),
                    instance_type: i.instance_type().unwrap().as_str().to_owned(),
                    zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or("").to_owned(),
                    tags: i
                        .tags()
                        .iter()
                        .map(|t| (t.key().unwrap().to_owned(), t.value().unwrap_or("").to_owned()))
                        .collect(),
                })
                .collect();
            instances.sort_by_key(|l| l.launch_index);
            (r.reservation_id().unwrap().to_owned(), instances)
        })
        .collect()
}

fn answered_ids(answer: &provisioner::ports::BatchStarted) -> Vec<Option<String>> {
    answer.iter().map(|r| r.as_ref().ok().map(|s| s.instance.id.to_string())).collect()
}

/// A batch of four machines is ONE RunInstances call (one reservation in moto) of four
/// instances; the instance at launch index i is member i's, tagged with its machine, start
/// and Name (CreateTags), and all with the model, the batch token and the model's tags
/// (TagSpecifications). The same batch again (same token, same machines) answers the same
/// instances and makes no other.
#[actix_rt::test]
async fn a_batched_start_is_one_run_instances_call_each_instance_tagged_with_its_machine() {
    use provisioner::Broker;
    let uuid = "model-batch";
    let broker = Moto::shared().broker(uuid).await;
    assert!(broker.batches_starts(), "the EC2 broker batches natively");
    let params = batch(uuid, &["0", "1", "2", "3"], &[], "us-east-1b", provisioner::Constraints::default());
    let answer = broker.start_instances(params.clone()).await.unwrap();
    let ids = answered_ids(&answer);
    assert!(ids.iter().all(Option::is_some), "{answer:?}");
    let calls = reservations(&broker, uuid).await;
    assert_eq!(calls.len(), 1, "one RunInstances call: {calls:#?}");
    let launched = calls.values().next().unwrap();
    assert_eq!(launched.len(), 4, "{launched:#?}");
    for (i, (member, l)) in params.members.iter().zip(launched).enumerate() {
        assert_eq!(l.launch_index, i32::try_from(i).unwrap());
        assert_eq!(Some(&l.id), ids[i].as_ref(), "launch index {i} answers member {i}");
        let tag = |k: &str| l.tags.get(k).map(String::as_str);
        assert_eq!(tag(TAG_MACHINE), Some(member.machine.as_str()), "{:?}", l.tags);
        assert_eq!(tag("provisioner-start"), Some(member.nonce.as_str()));
        assert_eq!(tag("Name"), Some(format!("provisioner-{}", member.machine).as_str()));
        assert_eq!(tag("provisioner-model"), Some(uuid));
        assert_eq!(tag(provisioner::adapters::ec2::TAG_BATCH), Some(params.client_token.as_str()));
        assert_eq!(tag("owner"), Some("alice"), "the model's tags, shared");
        assert_eq!((l.zone.as_str(), l.instance_type.as_str()), ("us-east-1b", "t3.micro"));
        let got = &answer[i].as_ref().unwrap().instance;
        assert_eq!(got.tags, member.tags, "the answer carries the member's tags");
        assert_eq!(got.zone.as_deref(), Some("us-east-1b"));
    }
    let again = broker.start_instances(params).await.unwrap();
    assert_eq!(answered_ids(&again), ids, "a repeated batch answers the same instances");
    assert_eq!(reservations(&broker, uuid).await, calls, "and makes nothing");
    let listed = broker.all_instances().await.unwrap();
    assert_eq!(listed.len(), 4);
    assert!(listed.iter().all(|i| i.tags.machine.is_some()), "{listed:?}");
}

/// The tagging a batched start does on its own (one `CreateTags` per instance) is paced by the
/// provisioner's limiter, handed over with `pace_follow_ups`: each call waits for a token of
/// the mutating calls' class (`stop`) and reports how it went. With two tokens for a batch of
/// four, the start waits, launched and half tagged, until two more are granted.
#[actix_rt::test]
async fn a_batched_starts_tagging_waits_for_the_limiters_tokens() {
    use futures::channel::mpsc;
    use futures::StreamExt;
    use provisioner::config::rate_limits::ApiClass;
    use provisioner::ports::Pacer;
    use provisioner::Broker;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Grants a token for each unit sent on its channel; counts the tokens (of the `stop`
    /// class: any other is counted apart) and passes the reports on.
    struct Tokens {
        grants: Arc<futures::lock::Mutex<mpsc::UnboundedReceiver<()>>>,
        taken: Arc<AtomicU64>,
        other_class: Arc<AtomicU64>,
        reports: mpsc::UnboundedSender<(ApiClass, u64, bool)>,
    }
    impl Pacer for Tokens {
        fn token(&self, class: ApiClass) -> futures::future::BoxFuture<'static, u64> {
            let (grants, taken, other) = (self.grants.clone(), self.taken.clone(), self.other_class.clone());
            Box::pin(async move {
                grants.lock().await.next().await;
                if class != ApiClass::Stop {
                    other.fetch_add(1, Ordering::SeqCst);
                }
                taken.fetch_add(1, Ordering::SeqCst) + 1
            })
        }
        fn report(&self, class: ApiClass, epoch: u64, throttled: bool) {
            let _ = self.reports.unbounded_send((class, epoch, throttled));
        }
    }

    let uuid = "model-batch-paced";
    let broker = Moto::shared().broker(uuid).await;
    let (grant, grants) = mpsc::unbounded();
    let (report, mut reports) = mpsc::unbounded();
    let taken = Arc::new(AtomicU64::new(0));
    let other_class = Arc::new(AtomicU64::new(0));
    broker.pace_follow_ups(Arc::new(Tokens {
        grants: Arc::new(futures::lock::Mutex::new(grants)),
        taken: taken.clone(),
        other_class: other_class.clone(),
        reports: report,
    }));
    grant.unbounded_send(()).unwrap();
    grant.unbounded_send(()).unwrap();
    let params = batch(uuid, &["0", "1", "2", "3"], &[], "us-east-1b", provisioner::Constraints::default());
    let mut start = Box::pin(broker.start_instances(params));
    // Without more tokens it cannot finish: two instances are tagged, two wait.
    let waited = actix_rt::time::timeout(Duration::from_secs(3), &mut start).await;
    assert!(waited.is_err(), "the batch finished with two tokens for four taggings: {waited:?}");
    assert_eq!(taken.load(Ordering::SeqCst), 2);
    let launched = reservations(&broker, uuid).await;
    assert_eq!(launched.values().map(Vec::len).sum::<usize>(), 4, "the one RunInstances call is made");
    let tagged = launched.values().flatten().filter(|l| l.tags.contains_key(TAG_MACHINE)).count();
    assert_eq!(tagged, 2, "{launched:#?}");
    grant.unbounded_send(()).unwrap();
    grant.unbounded_send(()).unwrap();
    let answer = actix_rt::time::timeout(Duration::from_secs(60), start).await.expect("tokens granted").unwrap();
    assert!(answered_ids(&answer).iter().all(Option::is_some), "{answer:?}");
    assert_eq!(taken.load(Ordering::SeqCst), 4);
    assert_eq!(other_class.load(Ordering::SeqCst), 0, "every tagging takes a stop-class token");
    let mut seen = Vec::new();
    while let Ok(r) = reports.try_recv() {
        seen.push(r);
    }
    seen.sort_by_key(|r| r.1);
    assert_eq!(seen, (1..=4).map(|e| (ApiClass::Stop, e, false)).collect::<Vec<_>>(), "each reported, unthrottled");
}

/// A batch pinned to us-east-1a where t3.large is out of capacity (the moto server's fault)
/// moves, in the same zone, to the next type that fits `cores=2 mem=8G` (m5.large) under its
/// per-type token, in one call; the repeat answers the same instances. A zone out of capacity
/// for every type answers the whole call zone-specifically and makes nothing.
#[actix_rt::test]
async fn a_batch_out_of_capacity_moves_to_the_next_type_then_fails_zone_specifically() {
    use provisioner::{Broker, BrokerError, Constraints};
    let uuid = moto::BATCH_TYPE_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let params = batch(uuid, &["0", "1", "2"], &[], "us-east-1a", c2m8());
    let answer = broker.start_instances(params.clone()).await.unwrap();
    let ids = answered_ids(&answer);
    assert!(ids.iter().all(Option::is_some), "{answer:?}");
    let calls = reservations(&broker, uuid).await;
    assert_eq!(calls.len(), 1, "one call made instances: {calls:#?}");
    let launched = calls.values().next().unwrap();
    assert_eq!(launched.len(), 3);
    for (member, l) in params.members.iter().zip(launched) {
        assert_eq!((l.zone.as_str(), l.instance_type.as_str()), ("us-east-1a", "m5.large"));
        assert_eq!(l.tags.get(TAG_MACHINE).map(String::as_str), Some(member.machine.as_str()));
    }
    let again = broker.start_instances(params).await.unwrap();
    assert_eq!(answered_ids(&again), ids, "the repeat takes the same type's token: the same instances");
    assert_eq!(reservations(&broker, uuid).await.len(), 1);

    let uuid = moto::BATCH_CAPACITY_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let params = batch(uuid, &["0", "1"], &[], "us-east-1a", Constraints::default());
    let err = broker.start_instances(params).await.unwrap_err();
    assert!(matches!(err, BrokerError::ZoneSpecific { .. }), "{err:?}");
    assert!(err.message().contains("InsufficientInstanceCapacity"), "{err}");
    assert!(reservations(&broker, uuid).await.is_empty(), "nothing made");
}

/// A partial launch (moto made to launch at most two of the three asked): the first two
/// members get their instances, the third a zone-specific failure (the engine fails it over
/// to another zone); the repeat answers the same.
#[actix_rt::test]
async fn a_partial_launch_fails_the_members_left_out_zone_specifically() {
    use provisioner::{Broker, BrokerError};
    let uuid = moto::PARTIAL_MODEL;
    let broker = Moto::shared().broker(uuid).await;
    let params = batch(uuid, &["0", "1", "2"], &[], "us-east-1c", provisioner::Constraints::default());
    let answer = broker.start_instances(params.clone()).await.unwrap();
    assert_eq!(answer.len(), 3);
    for (i, member) in params.members.iter().enumerate().take(2) {
        assert_eq!(answer[i].as_ref().unwrap().instance.tags, member.tags, "launch index {i}");
    }
    let err = answer[2].clone().unwrap_err();
    assert!(matches!(err, BrokerError::ZoneSpecific { .. }), "{err:?}");
    assert!(err.message().contains("launched 2 of 3"), "{err}");
    let again = broker.start_instances(params).await.unwrap();
    assert_eq!(answered_ids(&again), answered_ids(&answer));
    let calls = reservations(&broker, uuid).await;
    assert_eq!(calls.values().map(Vec::len).collect::<Vec<_>>(), [2], "{calls:#?}");
}

/// Tagging faults: the first CreateTags of member 2's instance do not find it (EC2's eventual
/// consistency) and are tried again until it is tagged; member 1's keep failing, so member 1
/// is answered ambiguously (its instance exists, untagged) and the others are not touched.
/// Member 1's look-up (`instances_of_start`, what the engine does after an ambiguous answer)
/// tags that instance and finds it: no second instance is needed.
#[actix_rt::test]
async fn a_failed_tagging_is_ambiguous_for_that_member_only_and_its_look_up_finds_it() {
    use provisioner::Broker;
    let uuid = "model-batch-tags";
    let broker = Moto::shared().broker(uuid).await;
    let marks = ["plain", moto::TAGS_FAIL, moto::TAGS_LAG];
    let params = batch(uuid, &["0", "1", "2"], &marks, "us-east-1d", provisioner::Constraints::default());
    let answer = broker.start_instances(params.clone()).await.unwrap();
    assert_eq!(answer[0].as_ref().unwrap().instance.tags, params.members[0].tags);
    assert_eq!(answer[2].as_ref().unwrap().instance.tags, params.members[2].tags, "tagged once EC2 saw it");
    let err = answer[1].clone().unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
    assert!(err.message().contains("InvalidInstanceID.NotFound"), "{err}");
    let launched = reservations(&broker, uuid).await.into_values().next().unwrap();
    assert_eq!(launched[1].tags.get(TAG_MACHINE), None, "untagged for now");
    // A restarted provisioner (a new broker, no memory of the failed tagging) lists it as
    // member 1's all the same: the batch named its machines at launch (seen failing before
    // the member tags: nobody's, so never adopted and, in mode `destroyed`, never stopped).
    let fresh = Moto::shared().broker(uuid).await;
    let listed = fresh.all_instances().await.unwrap();
    let one = listed.iter().find(|i| i.id.to_string() == launched[1].id).expect("listed");
    assert_eq!(one.tags.machine.as_ref(), Some(&params.members[1].machine));
    let (m1, nonce1) = (params.members[1].machine.clone(), params.members[1].nonce.clone());
    // The first look-up's tagging fails once more (the fault's fifth time): an error, never
    // "nothing made"; the next one tags and finds it.
    assert!(broker.instances_of_start(m1.clone(), nonce1.clone()).await.is_err());
    let found = broker.instances_of_start(m1.clone(), nonce1).await.unwrap();
    assert_eq!(found.iter().map(|i| i.id.to_string()).collect::<Vec<_>>(), [launched[1].id.clone()]);
    assert_eq!(found[0].tags, params.members[1].tags);
    assert_eq!(reservations(&broker, uuid).await.values().map(Vec::len).sum::<usize>(), 3, "nothing else made");
}

/// The engine with batching on (`batch_starts`) over the EC2 broker: eight machines pinned to
/// one zone, a client-side start bucket of one call at once then one per second, so the
/// starts waiting for the second token share its call. Every machine gets its own instance,
/// tagged with it, in at most three RunInstances calls (one per machine before).
#[actix_rt::test]
async fn the_engine_batches_starts_on_ec2() {
    use provisioner::config::rate_limits::{BucketLimit, RateLimits};
    use provisioner::Constraints;
    let uuid = "model-batch-engine";
    let broker = Moto::shared().broker(uuid).await;
    let pinned = Constraints { zones: Some(vec!["us-east-1e".into()]), ..Constraints::default() };
    let ids = ids(8);
    let model = FakeModel::with_machines(ids.iter().map(|id| with_constraints(id, pinned.clone())).collect());
    let config = ProvisionerConfig {
        batch_starts: true,
        batch_size: 100,
        rate_limits: RateLimits { start: Some(BucketLimit::new(1, 1.0)), ..RateLimits::unlimited() },
        ..config(uuid, HarvestMode::Destroyed)
    };
    let handle = run_with(config, &broker, &model);
    let snap = until(&model, all_provisioned(&ids)).await;
    let calls = reservations(&broker, uuid).await;
    assert!(calls.len() <= 3, "{} RunInstances calls for 8 machines: {calls:#?}", calls.len());
    let launched: Vec<&Launched> = calls.values().flatten().collect();
    assert_eq!(launched.len(), 8, "one instance per machine");
    for id in &ids {
        let recorded = recorded(&snap, id);
        let l = launched.iter().find(|l| l.id == recorded).expect("recorded instance exists");
        assert_eq!(l.tags.get(TAG_MACHINE), Some(id), "{:?}", l.tags);
        assert_eq!(l.zone, "us-east-1e");
    }
    handle.shutdown();
}

/// The engine with batching on, when its batched start's instance cannot be tagged (the
/// moto server fails the first five CreateTags of this start: the broker's four tries and the
/// first look-up's): the member is answered ambiguously, looks for its instance instead of
/// starting another (the look-up tags it), and adopts it. One instance, tagged with the
/// machine (before the batcher took a member's own ambiguous failure as "maybe made", a
/// second start made a second instance).
#[actix_rt::test]
async fn the_engine_adopts_a_batched_instance_whose_tagging_failed() {
    let uuid = "model-batch-engine-tags";
    let broker = Moto::shared().broker(uuid).await;
    let ids = ids(1);
    let model = pending(&ids);
    let config = ProvisionerConfig {
        batch_starts: true,
        host_tag: format!("machine-{}", moto::TAGS_FAIL_ENGINE),
        ..config(uuid, HarvestMode::Destroyed)
    };
    let handle = run_with(config, &broker, &model);
    let snap = until(&model, all_provisioned(&ids)).await;
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    let launched: Vec<Launched> = reservations(&broker, uuid).await.into_values().flatten().collect();
    assert_eq!(launched.len(), 1, "one instance ever made: {launched:#?}");
    let recorded = recorded(&snap, "0");
    assert_eq!(launched[0].id, recorded);
    assert_eq!(launched[0].tags.get(TAG_MACHINE).map(String::as_str), Some("0"), "{:?}", launched[0].tags);
    handle.shutdown();
}

/// A repeat of a batch whose tagging failed for one member (the engine replays an ambiguous
/// call so) tags that member's instance and answers it: the same instances, nothing new. The
/// broker then forgets the instance it had kept for that member's look-up, so a later look-up
/// never tags it again: once released (no model tag), it stays released.
#[actix_rt::test]
async fn a_repeated_batch_finishes_a_failed_tagging_and_the_look_up_forgets_it() {
    use provisioner::Broker;
    let uuid = "model-batch-retag";
    let broker = Moto::shared().broker(uuid).await;
    let marks = ["plain", moto::TAGS_FAIL_REPEAT];
    let params = batch(uuid, &["0", "1"], &marks, "us-east-1b", provisioner::Constraints::default());
    let first = broker.start_instances(params.clone()).await.unwrap();
    assert!(first[1].as_ref().is_err_and(provisioner::BrokerError::is_ambiguous), "{first:?}");
    let again = broker.start_instances(params.clone()).await.unwrap();
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(again[1].as_ref().unwrap().instance.tags, params.members[1].tags);
    assert_eq!(answered_ids(&again)[0], answered_ids(&first)[0], "the same reservation");
    let launched: Vec<Launched> = reservations(&broker, uuid).await.into_values().flatten().collect();
    assert_eq!(launched.len(), 2, "nothing new: {launched:#?}");
    let id = again[1].as_ref().unwrap().instance.id.clone();
    broker.release_instances(vec![id]).await.unwrap();
    let (m1, nonce1) = (params.members[1].machine.clone(), params.members[1].nonce.clone());
    let found = broker.instances_of_start(m1, nonce1).await.unwrap();
    assert!(found.is_empty(), "a released instance is not ours again: {found:?}");
}
