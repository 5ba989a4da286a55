//! Starting machines: classification, start params, retries, de-duplication, adoption.

use std::time::Duration;

use provisioner::model::{Constraints, InstanceState, InstanceStatus, ProvisioningInfo, VolumeParams};
use provisioner::testing::{CloudOp, FakeMachine, FakeModel, Fault, ModelOp};
use provisioner::{Life, Machine, MachineId, MachineStatus};

use crate::support::*;

/// T1 `TestStartStop`: a provisioner that has not heard from its watcher makes no cloud call,
/// and stops cleanly.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn no_broker_calls_before_the_first_notification() {
    let h = Harness::unwatched(test_config(), zoned_cloud(&["az1"]), FakeModel::new(vec![Machine::pending("0")]));
    h.settle().await;
    assert!(h.cloud().await.calls.is_empty());
    assert!(h.handle.is_running());
    h.handle.shutdown();
    h.settle().await;
    assert!(!h.handle.is_running());
}

/// P2 `TestSimple` / `TestMachineStartedAndStopped`: a pending machine is started with a nonce
/// `<host-tag>:<uuid>` and tags naming model and machine; its instance is recorded; when it
/// dies its instance is stopped and it is marked for removal.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn pending_machine_is_started_then_stopped_when_dead() {
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::new(vec![Machine::pending("1")]));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some()).await;
    let inst = instance_of(&model, "1").unwrap();
    let cloud = h.cloud().await;
    let start = &cloud.calls_of(CloudOp::StartInstance)[0];
    let params = start.params.as_ref().unwrap();
    assert!(params.nonce.starts_with("machine-0:"), "nonce {}", params.nonce);
    assert_eq!(params.nonce.len(), "machine-0:".len() + 36);
    assert_eq!(params.tags.model.as_deref(), Some(MODEL));
    assert_eq!(params.tags.machine, Some(MachineId::new("1")));
    assert_eq!(params.zone, None);
    assert_eq!(cloud.state_of(&inst), Some(InstanceState::Running));

    h.model.set_life("1", Life::Dead);
    let model = h.until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().removed).await;
    assert_eq!(model.marked_for_removal, vec![MachineId::new("1")]);
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec![inst.clone()]]);
    assert_eq!(cloud.state_of(&inst), Some(InstanceState::Terminated));
}

/// P3 `TestConstraints`, `TestSetUpToStartMachine`, P16/P17 root disk and volumes: the start
/// params carry the machine's constraints, placement, volumes and extra tags.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn start_params_carry_constraints_placement_volumes_and_tags() {
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.info = ProvisioningInfo {
        constraints: Constraints {
            mem_mb: Some(8192),
            arch: Some("amd64".into()),
            cores: Some(2),
            root_disk_mb: Some(10240),
            ..Constraints::default()
        },
        placement: Some("foo=bar".into()),
        volumes: vec![VolumeParams { tag: "volume-0".into(), size_mb: 1024, provider: "static".into() }],
        tags: [("hello".to_string(), "world".to_string())].into(),
        ..ProvisioningInfo::default()
    };
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::with_machines(vec![m.clone()]));
    h.until_model(Duration::from_secs(10), |s| instance_of(s, "0").is_some()).await;
    let cloud = h.cloud().await;
    let p = cloud.calls_of(CloudOp::StartInstance)[0].params.clone().unwrap();
    assert_eq!(p.constraints, m.info.constraints);
    assert_eq!(p.placement.as_deref(), Some("foo=bar"));
    assert_eq!(p.volumes, m.info.volumes);
    assert_eq!(p.extra_tags.get("hello").map(String::as_str), Some("world"));
}

/// P18 / 4.0 `TestProvisioningDoesNotProvisionTheSameMachineAfterRestart`: a machine
/// that already has an instance is read but never started.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn provisioned_machine_is_not_started_again() {
    let mut m = with_instance("0", "i-0");
    m.status = MachineStatus::Started;
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::new(vec![m]));
    h.settle().await;
    assert!(h.model().await.machines_calls >= 1);
    assert_eq!(starts_of(&h.cloud().await, "0"), 0);
}

/// A machine in `error` is skipped until its status is reset; one whose instance
/// status is `provisioning` is started even if its machine status is not pending.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn machines_in_error_are_skipped_and_provisioning_ones_started() {
    let mut errored = Machine::pending("0");
    errored.status = MachineStatus::Error;
    errored.instance_status = InstanceStatus::provisioning_error();
    let mut provisioning = Machine::pending("1");
    provisioning.status = MachineStatus::Error;
    provisioning.instance_status = InstanceStatus::provisioning();
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::new(vec![errored, provisioning]));
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), 0);
    assert_eq!(starts_of(&cloud, "1"), 1);
}

/// P19 / 4.0 `TestDyingMachines`: a dying unprovisioned machine is taken to dead and removed; a
/// dying provisioned one is left alone; no instance is stopped.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn dying_unprovisioned_machine_is_ensured_dead_and_removed() {
    let mut provisioned = Machine::pending("0");
    provisioned.life = Life::Dying;
    provisioned.instance = Some("i-0".into());
    let mut unprovisioned = Machine::pending("1");
    unprovisioned.life = Life::Dying;
    let cloud = zoneless_cloud();
    cloud.launch_aged("i-0", None, Some("0"), InstanceState::Running, false, OLD);
    let h =
        Harness::new(with_mode(provisioner::HarvestMode::All), cloud, FakeModel::new(vec![provisioned, unprovisioned]));
    let model = h.until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().removed).await;
    assert_eq!(model.ensure_dead, vec![MachineId::new("1")]);
    assert_eq!(model.machine("1").unwrap().machine.life, Life::Dead);
    let m0 = model.machine("0").unwrap();
    assert_eq!((m0.machine.life, m0.removed), (Life::Dying, false));
    h.settle().await;
    assert!(h.cloud().await.calls_of(CloudOp::StopInstances).is_empty());
}

/// T3 `TestProvisionerRetries`, P7: with retry count N a machine that always fails (zone
/// independent) gets exactly N+1 calls; its status and instance status carry the last message.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_start_is_retried_count_plus_one_times_then_errors() {
    let config = with_retries(2, Duration::from_secs(10));
    let cloud = zoneless_cloud();
    for msg in [
        "container failed to start and was destroyed",
        "container failed to start and was destroyed",
        "failed to destroy: manual cleanup of containers needed",
    ] {
        cloud.add_fault(Fault::zone_independent("0", 1, msg));
    }
    let h = Harness::new(config, cloud, FakeModel::new(vec![Machine::pending("0")]));
    let model = h
        .until_model(Duration::from_secs(120), |m| m.machine("0").unwrap().machine.status == MachineStatus::Error)
        .await;
    let m = model.machine("0").unwrap();
    assert_eq!(m.machine.instance_status, InstanceStatus::provisioning_error());
    assert_eq!(m.instance_status_message, "failed to destroy: manual cleanup of containers needed");
    assert_eq!(m.status_message, "failed to destroy: manual cleanup of containers needed");
    assert_eq!(m.machine.instance, None);
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 3);
    // Rounds are separated by the retry delay, with full jitter: under 10 s, then under 20 s.
    assert!(starts[1].at - starts[0].at <= Duration::from_secs(10));
    assert!(starts[2].at - starts[1].at <= Duration::from_secs(20));
    assert!(h.event_names().await.contains(&"machine-failed"));
    assert!(h.handle.is_running());
}

/// T8 `TestZoneConstraintsNoDistributionGroupRetry`: a machine in provisioning
/// error marked for retry is started again on the next retry tick; with retry count 0 each tick
/// gives exactly one attempt.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn retry_tick_restarts_machines_marked_transient() {
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.add_fault(Fault::zone_independent("0", 1, "oh no"));
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.info.constraints.zones = Some(vec!["az1".into()]);
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(vec![m]));
    let model = h
        .until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().machine.status == MachineStatus::Error)
        .await;
    assert_eq!(model.machine("0").unwrap().instance_status_message, "oh no");
    assert_eq!(starts_of(&h.cloud().await, "0"), 1);

    h.model.retry_provisioning(&["0"]);
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    assert_eq!(model.machine("0").unwrap().zone.as_deref(), Some("az1"));
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 2);
    assert!(starts.iter().all(|c| c.zone.as_deref() == Some("az1")));
    assert_eq!((starts[0].ok, starts[1].ok), (Some(false), Some(true)));
    assert!(h.event_names().await.contains(&"retried-machines-with-errors"));
}

/// A machine is never started twice (Juju may queue a second start): notifications that arrive
/// while a start is in flight never cause a second start.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn machine_is_never_started_twice_while_its_start_is_in_flight() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.set_latency(Duration::from_secs(30), Duration::ZERO);
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(machines(&["0", "1"])));
    for _ in 0..5 {
        h.run_for(Duration::from_secs(3)).await;
        h.model.touch(&["0", "1"]);
        h.handle.retry_tick();
    }
    h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some() && instance_of(m, "1").is_some()).await;
    for _ in 0..3 {
        h.model.touch(&["0", "1"]);
        h.settle().await;
    }
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), 1);
    assert_eq!(starts_of(&cloud, "1"), 1);
    assert_eq!(cloud.live_instances_of(&"0".into()).len(), 1);
}

/// P9 / 4.0 `TestProvisionerStopRetryingIfDying`: a machine that dies between retry rounds is
/// not tried again, and nothing of it is left running.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn start_retries_stop_when_the_machine_dies() {
    let config = with_retries(10, Duration::from_secs(10));
    let cloud = zoneless_cloud();
    cloud.add_fault(Fault::zone_independent("0", 100, "nope"));
    let h = Harness::new(config, cloud, FakeModel::new(vec![Machine::pending("0")]));
    h.run_for(Duration::from_secs(15)).await;
    let before = starts_of(&h.cloud().await, "0");
    assert!(before >= 2, "retried within 15 s");
    h.model.set_life("0", Life::Dead);
    h.until_model(Duration::from_secs(30), |m| m.machine("0").unwrap().removed).await;
    h.run_for(Duration::from_secs(600)).await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), before, "kept retrying after death");
    assert!(cloud.live_instances_of(&"0".into()).is_empty());
}

/// A failing SetInstanceInfo is retried; when it keeps failing the new instance is stopped
/// (never left unrecorded) and the machine gets a provisioning error; the provisioner lives on.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn unrecordable_instance_is_stopped_and_the_machine_errors() {
    let model = FakeModel::new(vec![Machine::pending("0"), Machine::pending("1")]);
    model.fail_next(ModelOp::SetInstanceInfo, 3, "state unavailable");
    let config = provisioner::ProvisionerConfig { workers: 1, ..test_config() };
    let h = Harness::new(config, zoneless_cloud(), model);
    let model = h
        .until_model(Duration::from_secs(60), |m| {
            m.machine("0").unwrap().machine.status == MachineStatus::Error && instance_of(m, "1").is_some()
        })
        .await;
    assert!(model.machine("0").unwrap().instance_status_message.contains("state unavailable"));
    let cloud = h.cloud().await;
    assert!(cloud.live_instances_of(&"0".into()).is_empty());
    assert_eq!(cloud.live_instances_of(&"1".into()).len(), 1);
    assert!(h.handle.is_running());
}

/// A SetInstanceInfo that fails once is retried and the machine is provisioned.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn set_instance_info_failure_is_retried() {
    let model = FakeModel::new(vec![Machine::pending("0")]);
    model.fail_next(ModelOp::SetInstanceInfo, 1, "blip");
    let h = Harness::new(test_config(), zoneless_cloud(), model);
    let model = h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some()).await;
    let m = model.machine("0").unwrap();
    assert_ne!(m.machine.status, MachineStatus::Error);
    assert_eq!(m.machine.instance_status, InstanceStatus::running());
    assert_eq!(m.instance_status_message, "");
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 1);
}

/// Restarts lose no instance: an instance tagged for a pending machine (its start's result was lost
/// in a crash) is adopted, not duplicated.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn instance_tagged_for_a_pending_machine_is_adopted() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.launch_aged("i-lost", Some("az1"), Some("0"), InstanceState::Running, false, OLD);
    let h = Harness::new(with_mode(provisioner::HarvestMode::All), cloud, FakeModel::new(vec![Machine::pending("0")]));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    assert_eq!(instance_of(&model, "0").as_deref(), Some("i-lost"));
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 0);
    assert!(cloud.calls_of(CloudOp::StopInstances).is_empty());
}

/// Restart with starts in flight: the new provisioner adopts what the old one started and
/// never starts a machine twice.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn restart_during_starts_adopts_instead_of_duplicating() {
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.set_latency(Duration::from_secs(20), Duration::ZERO);
    let ids: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(machines(&id_refs)));
    h.run_for(Duration::from_secs(5)).await;
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 4);
    let h = h.restart(test_config());
    let model =
        h.until_model(Duration::from_secs(120), |m| id_refs.iter().all(|id| instance_of(m, id).is_some())).await;
    h.settle().await;
    let cloud = h.cloud().await;
    for id in &id_refs {
        let live = cloud.live_instances_of(&MachineId::new(*id));
        assert_eq!(live.len(), 1, "machine {id} has {} instances", live.len());
        assert_eq!(Some(live[0].instance.id.to_string()), instance_of(&model, id));
    }
}

/// A tagged instance is adopted before any lookup a new start needs: a pending machine with an
/// instance already tagged for it (a crash lost the start's result) adopts it even though its
/// distribution-group lookup fails: adopting needs no lookup, so the failure cannot leave the
/// instance unowned.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_failing_group_lookup_does_not_stop_the_adoption_of_a_tagged_instance() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.launch_aged("tag-0", Some("az1"), Some("0"), InstanceState::Running, false, OLD);
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.group = Err("group lookup failed".into());
    let mut other = FakeMachine::new(Machine::pending("1"));
    other.group = Err("group lookup failed".into());
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(vec![m, other]));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    assert_eq!(instance_of(&model, "0").as_deref(), Some("tag-0"));
    assert_eq!(model.machine("0").unwrap().machine.status, MachineStatus::Started);
    // The machine that needs a new start still fails on its lookup.
    let model = h
        .until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().machine.status == MachineStatus::Error)
        .await;
    assert_eq!(model.machine("1").unwrap().instance_status_message, "group lookup failed");
    let cloud = h.cloud().await;
    assert!(cloud.calls_of(CloudOp::StartInstance).is_empty());
    assert!(stops(&cloud).is_empty());
}

/// Starts at which virtual second each of three machines' StartInstance was called, on one
/// worker, a cloud taking 1 s a start and a model taking 5 s to record an instance.
async fn start_call_seconds(record_outside_worker: bool) -> (Vec<u64>, Duration) {
    let cloud = zoneless_cloud();
    cloud.set_latency(Duration::from_secs(1), Duration::ZERO);
    let model = FakeModel::new(vec![Machine::pending("0"), Machine::pending("1"), Machine::pending("2")]);
    model.set_write_latency(Duration::from_secs(5));
    let config = provisioner::ProvisionerConfig { workers: 1, record_outside_worker, ..test_config() };
    let h = Harness::new(config, cloud, model);
    let began = actix_rt::time::Instant::now();
    let model =
        h.until_model(Duration::from_secs(60), |m| ["0", "1", "2"].iter().all(|id| instance_of(m, id).is_some())).await;
    let took = began.elapsed();
    for id in ["0", "1", "2"] {
        assert_eq!(model.machine(id).unwrap().machine.instance_status, InstanceStatus::running(), "{id}");
    }
    let cloud = h.cloud().await;
    assert_eq!(cloud.live_instances_of(&"0".into()).len(), 1);
    (cloud.calls_of(CloudOp::StartInstance).iter().map(|c| c.at.as_secs()).collect(), took)
}

/// With the records outside the workers, a start gives its worker back once its instance is
/// started, so the next machine's cloud call does not wait for the model's record: one worker
/// still makes one cloud call at a time (a call each second), but no longer one per 6 s.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_start_recording_its_instance_frees_its_worker_for_the_next_cloud_call() {
    let (held, held_took) = start_call_seconds(false).await;
    assert_eq!(held, vec![0, 6, 12], "each start held its worker through its record");
    assert!(held_took >= Duration::from_secs(18), "{held_took:?}");
    let (freed, freed_took) = start_call_seconds(true).await;
    assert_eq!(freed, vec![0, 1, 2], "one call at a time, each as soon as the last returned");
    assert!(freed_took < Duration::from_secs(9), "{freed_took:?}");
}

/// With the records outside the workers, an instance whose record keeps failing is still
/// stopped and its machine errors (the start's outcome is still reported after its record).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn an_unrecordable_instance_is_stopped_with_the_records_outside_the_workers() {
    let model = FakeModel::new(vec![Machine::pending("0")]);
    model.fail_next(ModelOp::SetInstanceInfo, 3, "state unavailable");
    let config = provisioner::ProvisionerConfig { workers: 1, record_outside_worker: true, ..test_config() };
    let h = Harness::new(config, zoneless_cloud(), model);
    let model = h
        .until_model(Duration::from_secs(60), |m| m.machine("0").unwrap().machine.status == MachineStatus::Error)
        .await;
    assert!(model.machine("0").unwrap().instance_status_message.contains("state unavailable"));
    h.settle().await;
    let cloud = h.cloud().await;
    assert!(cloud.live_instances_of(&"0".into()).is_empty(), "the unrecorded instance was stopped");
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1);
    assert_eq!(cloud.calls_of(CloudOp::StopInstances).len(), 1);
    assert!(h.handle.is_running());
}
