//! Harvesting: modes, keep-instance, released instances, deferred stops, safe mode.

use std::time::Duration;

use provisioner::model::InstanceState;
use provisioner::testing::{CloudOp, CloudSnapshot, FakeMachine, FakeModel, ModelSnapshot};
use provisioner::{HarvestMode, Life, Machine, MachineId, MachineStatus, ProvisionerConfig};

use crate::support::*;

/// Machine 0 provisioned with instance `i-0`, plus an unknown instance of ours `999`.
fn provisioned_with_unknown(mode: HarvestMode) -> Harness {
    let cloud = zoneless_cloud();
    cloud.launch_aged("i-0", None, Some("0"), InstanceState::Running, false, OLD);
    cloud.launch_aged("999", None, None, InstanceState::Running, false, OLD);
    let mut m = with_instance("0", "i-0");
    m.status = MachineStatus::Started;
    Harness::new(with_mode(mode), cloud, FakeModel::new(vec![m]))
}

/// The cloud after machine 0's death, once the machine is removed (and marked for removal once).
async fn cloud_after_machine_0_dies(h: &Harness) -> CloudSnapshot {
    let model = kill_machine_0(h).await;
    assert_eq!(model.marked_for_removal, vec![MachineId::new("0")]);
    h.cloud().await
}

async fn kill_machine_0(h: &Harness) -> ModelSnapshot {
    h.settle().await;
    h.model.set_life("0", Life::Dead);
    let model = h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed).await;
    h.settle().await;
    model
}

/// P23 `TestHarvestNoneReapsNothing`: mode none stops nothing; the dead machine is still removed.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn harvest_none_reaps_nothing() {
    let h = provisioned_with_unknown(HarvestMode::None);
    let cloud = cloud_after_machine_0_dies(&h).await;
    assert!(stops(&cloud).is_empty());
    assert_eq!(cloud.state_of("i-0"), Some(InstanceState::Running));
    assert_eq!(cloud.state_of("999"), Some(InstanceState::Running));
}

/// P24 / 4.0 `TestHarvestUnknownReapsOnlyUnknown`: exactly `StopInstances(["999"])`.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn harvest_unknown_reaps_only_unknown() {
    let h = provisioned_with_unknown(HarvestMode::Unknown);
    let cloud = cloud_after_machine_0_dies(&h).await;
    assert_eq!(stops(&cloud), vec![vec!["999".to_string()]]);
    assert_eq!(cloud.state_of("i-0"), Some(InstanceState::Running));
}

/// P25 / 4.0 `TestHarvestDestroyedReapsOnlyDestroyed`: a first notification does nothing;
/// after death, exactly `StopInstances(["i-0"])`.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn harvest_destroyed_reaps_only_destroyed() {
    let h = provisioned_with_unknown(HarvestMode::Destroyed);
    h.settle().await;
    assert!(stops(&h.cloud().await).is_empty());
    let cloud = cloud_after_machine_0_dies(&h).await;
    assert_eq!(stops(&cloud), vec![vec!["i-0".to_string()]]);
    assert_eq!(cloud.state_of("999"), Some(InstanceState::Running));
}

/// P26 / 4.0 `TestHarvestAllReapsAllTheThings`: one call stopping the dead machine's
/// instance and the unknown one.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn harvest_all_reaps_all_the_things_in_one_call() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("i-0", None, Some("0"), InstanceState::Running, false, OLD);
    cloud.launch_aged("999", None, None, InstanceState::Running, false, OLD);
    let mut m = with_instance("0", "i-0");
    m.life = Life::Dead;
    let h = Harness::new(with_mode(HarvestMode::All), cloud, FakeModel::new(vec![m]));
    h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed).await;
    h.settle().await;
    assert_eq!(stops(&h.cloud().await), vec![vec!["i-0".to_string(), "999".to_string()]]);
}

/// T2 `TestStopInstancesIgnoresMachinesWithKeep`: a keep-instance machine's
/// instance is never stopped, both machines are removed, and the kept instance is released
/// (stripped of our identity) so it is not harvested later as unknown, even after a restart.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn keep_instance_is_released_never_harvested_even_after_restart() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("zero", None, Some("0"), InstanceState::Running, false, OLD);
    cloud.launch_aged("one", None, Some("1"), InstanceState::Running, false, OLD);
    let mut m0 = with_instance("0", "zero");
    m0.life = Life::Dead;
    let mut m1 = with_instance("1", "one");
    m1.life = Life::Dead;
    m1.keep_instance = true;
    let h = Harness::new(with_mode(HarvestMode::All), cloud, FakeModel::new(vec![m0, m1, Machine::pending("2")]));
    let model = h
        .until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed && m.machine("1").unwrap().removed)
        .await;
    assert_eq!(model.marked_for_removal.len(), 2);
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec!["zero".to_string()]]);
    assert_eq!(
        cloud.instances[&provisioner::InstanceId::new("one")].instance.tags.model,
        None,
        "kept instance keeps our identity"
    );
    assert!(h.event_names().await.contains(&"instances-released"));

    // Later deaths in mode all, and a restart, never reap "one".
    h.model.set_life("2", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("2").unwrap().removed).await;
    let h = h.restart(with_mode(HarvestMode::All));
    h.settle().await;
    h.model.add_machine(FakeMachine::new(Machine::pending("3")));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "3").is_some()).await;
    h.model.set_life("3", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("3").unwrap().removed).await;
    h.settle().await;
    assert_eq!(h.cloud().await.state_of("one"), Some(InstanceState::Running));
}

/// A release is final: a machine that dies in mode `none` has its instance released; switching to
/// `all` later does not reap it.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn instance_left_in_mode_none_is_not_reaped_after_switching_to_all() {
    let h = provisioned_with_unknown(HarvestMode::None);
    kill_machine_0(&h).await;
    h.handle.set_harvest_mode(HarvestMode::All);
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec!["999".to_string()]]);
    assert_eq!(cloud.state_of("i-0"), Some(InstanceState::Running));
}

/// T13 `TestDedupStopRequests`: a second notification while the stop is in flight
/// does not stop again, and is still processed.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn stop_requests_are_deduplicated() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::ZERO, Duration::from_secs(10));
    cloud.launch_aged("0", Some("az1"), Some("0"), InstanceState::Running, false, OLD);
    let mut m = with_instance("0", "0");
    m.life = Life::Dead;
    let h = Harness::new(with_mode(HarvestMode::All), cloud, FakeModel::new(vec![m]));
    h.run_for(Duration::from_secs(2)).await;
    let before = h.event_names().await.iter().filter(|e| **e == "processed-machines").count();
    h.model.touch(&["0"]);
    h.run_for(Duration::from_secs(2)).await;
    let after = h.event_names().await.iter().filter(|e| **e == "processed-machines").count();
    assert_eq!(after, before + 1, "second batch not processed");
    h.until_model(Duration::from_secs(30), |m| m.machine("0").unwrap().removed).await;
    h.settle().await;
    assert_eq!(stops(&h.cloud().await), vec![vec!["0".to_string()]]);
    assert!(h.handle.is_running());
}

/// T14 `TestDeferStopRequestsForMachinesStillProvisioning`: a machine that
/// dies while starting is not stopped then; when the start returns, exactly the instance it
/// produced is stopped, in the default mode, and the machine is removed.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn deferred_stop_stops_the_instance_the_start_produced() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(30), Duration::ZERO);
    cloud.launch_aged("0", Some("az1"), None, InstanceState::Running, false, OLD);
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.info.constraints.zones = Some(vec!["az1".into()]);
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(vec![m]));
    h.run_for(Duration::from_secs(5)).await;
    h.model.set_life("0", Life::Dead);
    h.run_for(Duration::from_secs(5)).await;
    assert!(stops(&h.cloud().await).is_empty(), "stopped while starting");
    let model = h.until_model(Duration::from_secs(60), |m| m.machine("0").unwrap().removed).await;
    h.settle().await;
    let cloud = h.cloud().await;
    let started = cloud.calls_of(CloudOp::StartInstance)[0].instances[0].to_string();
    assert_eq!(stops(&cloud), vec![vec![started.clone()]]);
    assert_eq!(cloud.state_of(&started), Some(InstanceState::Terminated));
    assert_eq!(cloud.state_of("0"), Some(InstanceState::Running), "unrelated instance reaped in destroyed mode");
    assert!(model.machine("0").unwrap().removed);
}

/// Switching to `unknown` harvests unknown instances at once, with
/// `harvest-mode-changed` then `processed-machines`.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn switching_to_unknown_harvests_at_once() {
    let h = provisioned_with_unknown(HarvestMode::Destroyed);
    h.settle().await;
    assert!(stops(&h.cloud().await).is_empty());
    h.handle.set_harvest_mode(HarvestMode::Unknown);
    h.settle().await;
    assert_eq!(stops(&h.cloud().await), vec![vec!["999".to_string()]]);
    let names = h.event_names().await;
    let changed = names.iter().position(|e| *e == "harvest-mode-changed").expect("mode change announced");
    assert!(names[changed..].contains(&"processed-machines"));
    assert_eq!(h.handle.harvest_mode().await.unwrap(), HarvestMode::Unknown);
    // The same mode again is a no-op without an event.
    h.handle.set_harvest_mode(HarvestMode::Unknown);
    h.settle().await;
    assert_eq!(h.event_names().await.iter().filter(|e| **e == "harvest-mode-changed").count(), 1);
}

/// Safe mode: a mode change before the first notification waits for it; nothing is
/// harvested before the cache is complete.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn nothing_is_harvested_before_the_first_full_notification() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("999", None, None, InstanceState::Running, false, OLD);
    let h = Harness::unwatched(test_config(), cloud, FakeModel::new(vec![]));
    h.handle.set_harvest_mode(HarvestMode::All);
    h.settle().await;
    assert!(h.cloud().await.calls.is_empty());
    assert_eq!(h.handle.harvest_mode().await.unwrap(), HarvestMode::Destroyed);
    h.watch();
    h.settle().await;
    assert_eq!(stops(&h.cloud().await), vec![vec!["999".to_string()]]);
    assert_eq!(h.handle.harvest_mode().await.unwrap(), HarvestMode::All);
}

/// A dead machine's stopped (suspended) instance is terminated too.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn dead_machines_stopped_instance_is_terminated() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("i-0", None, Some("0"), InstanceState::Stopped, false, OLD);
    let m = with_instance("0", "i-0");
    let h = Harness::new(test_config(), cloud, FakeModel::new(vec![m]));
    kill_machine_0(&h).await;
    assert_eq!(h.cloud().await.state_of("i-0"), Some(InstanceState::Terminated));
}

/// Invariant 2: foreign instances are never listed, stopped or counted, even in mode all.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn foreign_instances_are_invisible() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.launch_aged("theirs", Some("az1"), Some("0"), InstanceState::Running, true, OLD);
    let h = Harness::new(with_mode(HarvestMode::All), cloud, FakeModel::with_machines(machines(&["0"])));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    h.handle.set_harvest_mode(HarvestMode::Unknown);
    h.settle().await;
    let snap = h.handle.registry().await.unwrap();
    assert!(snap.instances.iter().all(|i| i.id.as_str() != "theirs"));
    let cloud = h.cloud().await;
    assert!(stops(&cloud).is_empty());
    assert_eq!(cloud.state_of("theirs"), Some(InstanceState::Running));
    assert_eq!(starts_of(&cloud, "0"), 1, "a foreign instance tagged 0 was adopted");
}

/// Manual machines are never started or stopped (invariant 3), and are removed when dead.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn manual_machines_are_never_started_or_stopped() {
    let mut dead = manual("0", "10.0.0.1");
    dead.life = Life::Dead;
    let mut pending = Machine::pending("1");
    pending.manual = true;
    let h = Harness::new(with_mode(HarvestMode::All), zoneless_cloud(), FakeModel::new(vec![dead, pending]));
    h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().removed).await;
    h.settle().await;
    let cloud = h.cloud().await;
    assert!(stops(&cloud).is_empty());
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 0);
}

/// Periodic resync in mode `unknown`: an instance launched out of band later is harvested at
/// the next listing, and only then (no listing per event).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn unknown_instances_are_harvested_at_resync_without_listing_per_event() {
    let config =
        provisioner::ProvisionerConfig { resync_interval: Duration::from_secs(60), ..with_mode(HarvestMode::Unknown) };
    let h = Harness::new(config, zoneless_cloud(), FakeModel::with_machines(machines(&["0", "1"])));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    for _ in 0..10 {
        h.model.touch(&["0", "1"]);
        h.run_for(Duration::from_secs(1)).await;
    }
    assert_eq!(h.cloud().await.calls_of(CloudOp::AllInstances).len(), 1, "listed per event");
    h.cloud.launch_aged("stray", None, None, InstanceState::Running, false, OLD);
    h.run_for(Duration::from_secs(60)).await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec!["stray".to_string()]]);
    assert_eq!(cloud.live_instances_of(&"0".into()).len(), 1);
}

/// Safe mode: a periodic listing before the first notification harvests nothing,
/// even in mode all (with an empty cache every instance would look unknown).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_resync_before_the_first_notification_harvests_nothing() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("i-0", None, Some("0"), InstanceState::Running, false, OLD);
    let mut m = with_instance("0", "i-0");
    m.status = MachineStatus::Started;
    let config =
        provisioner::ProvisionerConfig { resync_interval: Duration::from_secs(10), ..with_mode(HarvestMode::All) };
    let h = Harness::unwatched(config, cloud, FakeModel::new(vec![m]));
    h.run_for(Duration::from_secs(25)).await;
    let cloud = h.cloud().await;
    assert!(!cloud.calls_of(CloudOp::AllInstances).is_empty(), "no resync happened");
    assert!(stops(&cloud).is_empty(), "{:?}", stops(&cloud));
    assert_eq!(cloud.state_of("i-0"), Some(InstanceState::Running));
}

/// A release is final: a machine dying in mode `none` while every worker is busy has
/// its instance released at once (a release waits for no worker), so a restart after a switch
/// to `destroyed` finds it released and never stops it.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_release_does_not_wait_for_a_busy_worker_and_survives_a_restart() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(30), Duration::ZERO);
    cloud.launch_aged("pre-0", Some("az1"), Some("0"), InstanceState::Running, false, OLD);
    let mut m0 = with_instance("0", "pre-0");
    m0.status = MachineStatus::Started;
    let config = ProvisionerConfig { workers: 1, ..with_mode(HarvestMode::None) };
    let h = Harness::new(config.clone(), cloud, FakeModel::new(vec![m0, Machine::pending("1")]));
    h.run_for(Duration::from_secs(5)).await;
    h.model.set_life("0", Life::Dead);
    h.run_for(Duration::from_secs(1)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).iter().filter(|c| c.ok.is_none()).count(), 1, "start in flight");
    assert_eq!(
        cloud.instances[&provisioner::InstanceId::new("pre-0")].instance.tags.model,
        None,
        "released at once, while the start is in flight"
    );
    let h = h.restart(ProvisionerConfig { harvest_mode: HarvestMode::Destroyed, ..config });
    h.run_for(Duration::from_secs(60)).await;
    let cloud = h.cloud().await;
    assert!(stops(&cloud).is_empty(), "{:?}", stops(&cloud));
    assert_eq!(cloud.state_of("pre-0"), Some(InstanceState::Running));
}
