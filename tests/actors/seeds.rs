//! The other systems around the provisioner: instances stopped outside our control, model
//! destruction, lazy container provisioners, machine reuse.

use std::sync::Arc;
use std::time::Duration;

use provisioner::containers::HostZoneBroker;
use provisioner::containers::Stage;
use provisioner::model::{Constraints, InstanceState, InstanceStatus};
use provisioner::testing::{CloudOp, FakeInitialiser, FakeMachine, FakeModel};
use provisioner::DestroyError;
use provisioner::{
    start_containers, ContainersHandle, HarvestMode, Life, Machine, MachineId, MachineStatus, ProvisionerConfig,
};

use crate::support::*;

// ----------------------------------- instances stopped outside our control

/// Instances stopped outside our control: one stopped out of band is not replaced nor harvested
/// while its machine lives; its instance status says `stopped`, then `running` when it comes back;
/// when the machine dies the stopped instance is terminated.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn stopped_instance_is_shown_kept_and_terminated_on_death() {
    let config = ProvisionerConfig { resync_interval: Duration::from_secs(60), ..with_mode(HarvestMode::All) };
    let h = Harness::new(config, zoned_cloud(&["az1"]), FakeModel::with_machines(machines(&["0"])));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    let inst = instance_of(&model, "0").unwrap();
    h.cloud.set_state(&inst, InstanceState::Stopped);
    h.run_for(Duration::from_secs(61)).await;
    let model = h.model().await;
    let m = model.machine("0").unwrap();
    assert_eq!(m.machine.instance_status, InstanceStatus::other("stopped"));
    assert!(m.instance_status_message.contains("outside the provisioner's control"), "{}", m.instance_status_message);
    h.model.touch(&["0"]);
    h.run_for(Duration::from_secs(60)).await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), 1, "a stopped instance was replaced");
    assert!(stops(&cloud).is_empty(), "a stopped instance was harvested");

    h.cloud.set_state(&inst, InstanceState::Running);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.model().await.machine("0").unwrap().machine.instance_status, InstanceStatus::running());

    h.cloud.set_state(&inst, InstanceState::Stopped);
    h.model.set_life("0", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed).await;
    assert_eq!(h.cloud().await.state_of(&inst), Some(InstanceState::Terminated));
}

// ------------------------------------------------------- model destruction

fn destroy_model_fixture() -> Harness {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.launch_aged("i-ctl", Some("az1"), Some("0"), InstanceState::Running, false, OLD);
    let mut controller = Machine::pending("0");
    controller.controller = true;
    controller.instance = Some("i-ctl".into());
    controller.status = MachineStatus::Started;
    let manual3 = manual("3", "10.0.0.3");
    let manual7 = manual("7", "10.0.0.7");
    let model = FakeModel::new(vec![controller, Machine::pending("1"), Machine::pending("2"), manual3, manual7]);
    Harness::new(test_config(), cloud, model)
}

/// Model destruction: destroying the model stops every non-manual, non-controller instance in one
/// call, then complains about the manual machines, naming them; the model is dying and
/// refuses new machines; a second destroy is refused and changes nothing.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn destroy_model_kills_what_it_can_then_names_manual_machines() {
    let h = destroy_model_fixture();
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some() && instance_of(m, "2").is_some()).await;
    let err = h.handle.destroy_model(false).await.unwrap_err();
    assert_eq!(err.to_string(), "manually provisioned machines must first be destroyed: 3, 7");
    let DestroyError::ManualMachines { summary, .. } = err else { panic!("wrong error") };
    assert_eq!(summary.stopping.len(), 2);
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud).len(), 1, "not one call: {:?}", stops(&cloud));
    assert_eq!(stops(&cloud)[0].len(), 2);
    assert_eq!(cloud.state_of("i-ctl"), Some(InstanceState::Running), "the controller was stopped");

    h.model.add_machine(FakeMachine::new(Machine::pending("9")));
    h.settle().await;
    let model = h.model().await;
    assert_eq!(model.life, Life::Dying);
    assert!(model.errors.iter().any(|e| e == "cannot add machine 9: model is dying"), "{:?}", model.errors);
    assert!(model.machine("9").is_none());

    let again = h.handle.destroy_model(true).await.unwrap_err();
    assert_eq!(again, DestroyError::AlreadyDying);
    h.settle().await;
    assert_eq!(stops(&h.cloud().await).len(), 1, "a refused destroy changed something");
}

/// Model destruction with force: no manual-machine complaint.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn forced_destroy_skips_the_manual_machine_check() {
    let h = destroy_model_fixture();
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some()).await;
    let summary = h.handle.destroy_model(true).await.unwrap();
    assert_eq!(summary.stopping.len(), 2);
}

/// Model destruction: starts in flight when the destruction begins are stopped as they land;
/// machines added just before it, and queued starts, are never started.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn destroy_model_stops_starts_in_flight_as_they_land() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(30), Duration::ZERO);
    let config = ProvisionerConfig { workers: 2, ..test_config() };
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["1", "2", "3", "4"])));
    h.run_for(Duration::from_secs(5)).await;
    let summary = h.handle.destroy_model(false).await.unwrap();
    assert!(summary.stopping.is_empty());
    assert_eq!(summary.awaiting_starts.len(), 4);
    h.run_for(Duration::from_secs(120)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 2, "queued starts ran after the destruction");
    for i in cloud.instances.values() {
        assert_eq!(i.instance.state, InstanceState::Terminated, "{} left running", i.instance.id);
    }
    // A restarted provisioner on the dying model starts nothing either.
    let h = h.restart(test_config());
    h.settle().await;
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 2);
}

// --------------------------------------------- lazy container provisioners

struct Containers {
    h: Harness,
    containers: ContainersHandle,
    initialiser: FakeInitialiser,
}

fn with_containers(ids: &[&str], faults: Vec<(String, String, u32, String)>) -> Containers {
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.set_latency(Duration::from_secs(10), Duration::ZERO);
    let h = Harness::unwatched(test_config(), cloud, FakeModel::with_machines(machines(ids)));
    let initialiser = FakeInitialiser::new(faults);
    let containers = start_containers(
        test_config(),
        HostZoneBroker::factory(Arc::new(h.cloud.broker())),
        Arc::new(h.model.api()),
        Arc::new(initialiser.clone()),
        vec!["lxd".into(), "kvm".into()],
        vec![],
    )
    .unwrap();
    h.handle.subscribe(containers.provisioner_events());
    h.model.watch(containers.machines_changed());
    h.watch();
    Containers { h, containers, initialiser }
}

/// Lazy container provisioners: the environ provisioner (top-level machines only) never starts
/// containers; a container provisioner starts lazily on the first container, after initialising the
/// host, and puts containers in the host's zone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn containers_are_provisioned_lazily_in_their_hosts_zone() {
    let c = with_containers(&["0", "1", "0/lxd/0"], vec![]);
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/lxd/0").is_some()).await;
    assert_eq!(model.machine("0/lxd/0").unwrap().zone, model.machine("0").unwrap().zone);
    let sups = c.containers.supervisors().await.unwrap();
    let stage = |host: &str, kind: &str| {
        sups.iter().find(|(h, k, _)| h.as_str() == host && k == kind).map(|(_, _, s)| s.clone())
    };
    assert_eq!(stage("0", "lxd"), Some(Stage::Running));
    // Lazily: no supervisor (no actor at all) for a host and type without a container.
    assert_eq!(stage("0", "kvm"), None, "a kvm supervisor without a kvm container");
    assert_eq!(stage("1", "lxd"), None, "a supervisor on a host without containers");
    assert_eq!(sups.len(), 1, "{sups:?}");
    assert_eq!(c.initialiser.calls(), 1);

    c.h.model.add_machine(FakeMachine::new(Machine::pending("1/kvm/0")));
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "1/kvm/0").is_some()).await;
    assert_eq!(model.machine("1/kvm/0").unwrap().zone, model.machine("1").unwrap().zone);
    let cloud = c.h.cloud().await;
    for id in ["0/lxd/0", "1/kvm/0"] {
        assert_eq!(starts_of(&cloud, id), 1);
    }
}

/// Lazy container provisioners, where a failed call that concerns everything is retried: the
/// container manager's read of a host that is already provisioned fails (the model's `machines`
/// call); the read is retried with backoff, not dropped, so the host's containers are still
/// started, in its zone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_failed_host_read_is_retried_so_containers_still_start() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.launch_aged("i-0", Some("az2"), Some("0"), InstanceState::Running, false, OLD);
    let mut host = FakeMachine::new(Machine::pending("0"));
    host.machine.instance = Some("i-0".into());
    host.machine.status = MachineStatus::Started;
    host.zone = Some("az2".into());
    let model = FakeModel::with_machines(vec![host, FakeMachine::new(Machine::pending("0/lxd/0"))]);
    let h = Harness::unwatched(test_config(), cloud, model);
    let containers = start_containers(
        test_config(),
        HostZoneBroker::factory(Arc::new(h.cloud.broker())),
        Arc::new(h.model.api()),
        Arc::new(FakeInitialiser::new(vec![])),
        vec!["lxd".into()],
        vec![],
    )
    .unwrap();
    // Enough failures for the manager's first read (and the provisioner's) to fail.
    h.model.fail_next(provisioner::testing::ModelOp::Machines, 3, "model unavailable");
    h.handle.subscribe(containers.provisioner_events());
    h.model.watch(containers.machines_changed());
    h.watch();
    let model = h.until_model(Duration::from_secs(120), |m| instance_of(m, "0/lxd/0").is_some()).await;
    assert_eq!(model.machine("0/lxd/0").unwrap().zone.as_deref(), Some("az2"));
    assert_eq!(starts_of(&h.cloud().await, "0/lxd/0"), 1);
}

/// Lazy container provisioners: a failing host initialisation is retried with backoff and shown on
/// the containers' status; the containers start once it succeeds.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_container_initialisation_is_retried_and_shown() {
    let c = with_containers(&["0", "0/lxd/0"], vec![("0".into(), "lxd".into(), 2, "snap install lxd failed".into())]);
    c.h.until_model(Duration::from_secs(60), |m| {
        m.machine("0/lxd/0").unwrap().instance_status_message.contains("snap install lxd failed")
    })
    .await;
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/lxd/0").is_some()).await;
    assert_eq!(c.initialiser.calls(), 3);
    assert_eq!(model.machine("0/lxd/0").unwrap().machine.status, MachineStatus::Started);
}

/// Lazy container provisioners: containers wait for their host's instance; a host that dies stops
/// its supervisors' starts (they only reap from then on: a container added to the dead host dies
/// with it and is removed, across restarts too); an unsupported container type gets a clear error.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn containers_wait_for_their_host_and_stop_with_it() {
    let c = with_containers(&["0", "0/lxd/0", "0/docker/0"], vec![]);
    c.h.run_for(Duration::from_secs(5)).await;
    assert_eq!(starts_of(&c.h.cloud().await, "0/lxd/0"), 0, "a container started before its host had an instance");
    c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/lxd/0").is_some()).await;
    let model = c.h.model().await;
    let docker = model.machine("0/docker/0").unwrap();
    assert_eq!(docker.machine.instance_status, InstanceStatus::provisioning_error());
    assert!(docker.instance_status_message.contains("\"docker\""), "{}", docker.instance_status_message);

    c.h.model.set_life("0/lxd/0", Life::Dead);
    c.h.until_model(Duration::from_secs(30), |m| m.machine("0/lxd/0").unwrap().removed).await;
    c.h.model.set_life("0", Life::Dead);
    c.h.until_model(Duration::from_secs(30), |m| m.machine("0").unwrap().removed).await;
    c.h.settle().await;
    assert!(
        c.containers
            .supervisors()
            .await
            .unwrap()
            .iter()
            .all(|(h, _, stage)| h.as_str() != "0" || *stage == Stage::Stopped),
        "a supervisor of a dead host still starts containers"
    );
    assert!(c.containers.is_idle().await);
    c.h.model.add_machine(FakeMachine::new(Machine::pending("0/lxd/1")));
    let model = c.h.until_model(Duration::from_secs(60), |m| m.machine("0/lxd/1").unwrap().removed).await;
    assert_eq!(model.machine("0/lxd/1").unwrap().machine.life, Life::Dead);
    assert_eq!(starts_of(&c.h.cloud().await, "0/lxd/1"), 0, "a container of a dead host was started");
}

/// Every component honours a harvest-mode change at once: `ContainersHandle::set_harvest_mode`
/// reaches the running container provisioners and the ones started later. The test config's mode is
/// `destroyed`; after a switch to `none`, a running container that dies has its instance released
/// (left running), and so does one of a provisioner started after the switch.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn container_provisioners_honour_harvest_mode_changes() {
    let c = with_containers(&["0", "0/lxd/0"], vec![]);
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/lxd/0").is_some()).await;
    let lxd = instance_of(&model, "0/lxd/0").unwrap();
    c.h.handle.set_harvest_mode(HarvestMode::None);
    c.containers.set_harvest_mode(HarvestMode::None);
    c.h.run_for(Duration::from_secs(1)).await;
    // A kvm container: its provisioner starts after the switch.
    c.h.model.add_machine(FakeMachine::new(Machine::pending("0/kvm/0")));
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/kvm/0").is_some()).await;
    let kvm = instance_of(&model, "0/kvm/0").unwrap();
    c.h.model.set_life("0/lxd/0", Life::Dead);
    c.h.model.set_life("0/kvm/0", Life::Dead);
    c.h.until_model(Duration::from_secs(60), |m| {
        m.machine("0/lxd/0").unwrap().removed && m.machine("0/kvm/0").unwrap().removed
    })
    .await;
    let cloud = c.h.cloud().await;
    assert!(cloud.calls_of(CloudOp::StopInstances).is_empty(), "a container's instance was stopped in mode none");
    for inst in [lxd, kvm] {
        assert_eq!(
            cloud.instances[&provisioner::model::InstanceId::new(&inst)].instance.state,
            InstanceState::Running,
            "{inst} not left running"
        );
    }
}

/// The destruction wins over releases: `ContainersHandle::model_destroyed` makes every
/// container provisioner stop its containers' instances, whatever the mode (here `none`).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn container_provisioners_stop_their_instances_when_the_model_is_destroyed() {
    let c = with_containers(&["0", "0/lxd/0"], vec![]);
    c.h.handle.set_harvest_mode(HarvestMode::None);
    c.containers.set_harvest_mode(HarvestMode::None);
    let model = c.h.until_model(Duration::from_secs(60), |m| instance_of(m, "0/lxd/0").is_some()).await;
    let lxd = instance_of(&model, "0/lxd/0").unwrap();
    c.h.handle.destroy_model(true).await.unwrap();
    c.containers.model_destroyed();
    c.h.settle().await;
    let cloud = c.h.cloud().await;
    assert_eq!(cloud.instances[&provisioner::model::InstanceId::new(&lxd)].instance.state, InstanceState::Terminated);
}

/// Container provisioners have no transient-retry path.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn container_provisioners_ignore_retry_ticks() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.add_fault(provisioner::testing::Fault::zone_independent("0/lxd/0", 1, "boom"));
    let h = Harness::unwatched(test_config(), cloud, FakeModel::with_machines(machines(&["0", "0/lxd/0"])));
    let containers = start_containers(
        test_config(),
        HostZoneBroker::factory(Arc::new(h.cloud.broker())),
        Arc::new(h.model.api()),
        Arc::new(FakeInitialiser::default()),
        vec!["lxd".into()],
        vec![],
    )
    .unwrap();
    h.handle.subscribe(containers.provisioner_events());
    h.model.watch(containers.machines_changed());
    h.model.watch(h.handle.machines_changed());
    // Retry ticks reach only the environ provisioner, which does not touch containers.
    h.model.watch_retries(h.handle.retry_ticks());
    h.until_model(Duration::from_secs(60), |m| m.machine("0/lxd/0").unwrap().machine.status == MachineStatus::Error)
        .await;
    h.model.retry_provisioning(&["0/lxd/0"]);
    h.settle().await;
    assert_eq!(starts_of(&h.cloud().await, "0/lxd/0"), 1);
}

// ----------------------------------------------------------- machine reuse

fn reuse_config(reuse: bool) -> ProvisionerConfig {
    ProvisionerConfig { reuse, reuse_window: Duration::from_secs(120), ..test_config() }
}

async fn die_then_add(h: &Harness, new: FakeMachine) {
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    h.model.set_life("0", Life::Dead);
    h.run_for(Duration::from_secs(1)).await;
    h.model.add_machine(new);
    h.settle().await;
}

/// Machine reuse is off by default: a dead machine's instance is stopped and a new one
/// started for the new machine.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn without_reuse_dead_instances_are_stopped_and_new_ones_started() {
    assert!(!ProvisionerConfig::default().reuse);
    let h = Harness::zoned(reuse_config(false), &["az1"], &["0"]);
    die_then_add(&h, FakeMachine::new(Machine::pending("1"))).await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "1"), 1);
    assert_eq!(stops(&cloud), vec![vec!["i-1".to_string()]]);
}

/// Machine reuse: with reuse on, a dead machine's clean instance is handed to a new machine with
/// the same constraints: no stop, no start; the old machine is removed.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn with_reuse_a_clean_instance_is_handed_to_a_matching_machine() {
    let h = Harness::zoned(reuse_config(true), &["az1"], &["0"]);
    die_then_add(&h, FakeMachine::new(Machine::pending("1"))).await;
    let cloud = h.cloud().await;
    let model = h.model().await;
    assert_eq!(starts_of(&cloud, "1"), 0);
    assert!(stops(&cloud).is_empty());
    assert_eq!(instance_of(&model, "1").as_deref(), Some("i-1"));
    assert!(model.machine("0").unwrap().removed);
    assert_eq!(cloud.instances[&provisioner::InstanceId::new("i-1")].instance.tags.machine, Some(MachineId::new("1")));
}

/// Machine reuse: different constraints, or a zone the new machine may not use, means no reuse;
/// an instance nobody takes is stopped when the window runs out.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn reuse_needs_matching_constraints_and_zone_and_expires() {
    let config = ProvisionerConfig { reuse_window: Duration::from_secs(300), ..reuse_config(true) };
    let h = Harness::zoned(config, &["az1", "az2"], &["0"]);
    let mut bigger = FakeMachine::new(Machine::pending("1"));
    bigger.info.constraints = Constraints { mem_mb: Some(16384), ..Constraints::default() };
    die_then_add(&h, bigger).await;
    let model = h.model().await;
    let old_zone = model.machine("0").unwrap().zone.clone().unwrap();
    let other_zone = if old_zone == "az1" { "az2" } else { "az1" };
    let mut elsewhere = FakeMachine::new(Machine::pending("2"));
    elsewhere.info.constraints.zones = Some(vec![other_zone.to_string()]);
    h.model.add_machine(elsewhere);
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "1"), 1, "reused despite different constraints");
    assert_eq!(starts_of(&cloud, "2"), 1, "reused outside the machine's zones");
    assert!(stops(&cloud).is_empty(), "stopped before the reuse window ran out");
    h.run_for(Duration::from_secs(300)).await;
    let model = h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed).await;
    assert!(model.machine("0").unwrap().removed);
    assert_eq!(h.cloud().await.state_of("i-1"), Some(InstanceState::Terminated));
}

/// Machine reuse with a harvest mode that keeps dead machines' instances is refused.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn reuse_with_an_incompatible_mode_is_refused() {
    let config = ProvisionerConfig { reuse: true, harvest_mode: HarvestMode::None, ..test_config() };
    let cloud = zoneless_cloud();
    let model = FakeModel::new(vec![]);
    let err = provisioner::start(config, Arc::new(cloud.broker()), Arc::new(model.api())).err().unwrap();
    assert!(err.to_string().contains("machine reuse needs harvest mode destroyed or all"), "{err}");
}

/// A destruction at the very instant a start lands stops the
/// instance it produced (the lifecycle knows it before the registry does).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn destroy_model_at_the_instant_a_start_lands_stops_its_instance() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(1), Duration::ZERO);
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(machines(&["0"])));
    h.run_for(Duration::from_secs(1)).await;
    let _ = h.handle.destroy_model(false).await;
    h.run_for(Duration::from_secs(30)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1);
    assert_eq!(cloud.state_of("i-1"), Some(InstanceState::Terminated), "{:?}", stops(&cloud));
}

/// "Tell me when idle" for the container provisioners: `ContainersHandle::wait_idle` answers
/// only once the host's preparation (failing twice, retried with backoff) is done and the
/// container's start has landed, not at the first moment nothing happens to be in flight.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn containers_wait_idle_waits_for_the_host_and_the_containers_start() {
    let c = with_containers(&["0", "0/lxd/0"], vec![("0".into(), "lxd".into(), 2, "not yet".into())]);
    c.h.handle.wait_idle().await;
    // The host's provisioned instance reaches the container manager as an event.
    c.h.run_for(Duration::from_millis(1)).await;
    assert!(!c.containers.is_idle().await, "the host's preparation is under way");
    c.containers.wait_idle().await;
    assert!(c.containers.is_idle().await);
    let model = c.h.model().await;
    assert!(instance_of(&model, "0/lxd/0").is_some(), "answered before the container started: {model:#?}");
    assert_eq!(c.initialiser.calls(), 3, "two failures, then success");
}
