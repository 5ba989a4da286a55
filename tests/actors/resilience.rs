//! Resilience: failed calls are retried with backoff, one machine's failure never kills the
//! provisioner, the pool resizes without losing work.

use std::time::Duration;

use provisioner::model::InstanceState;
use provisioner::testing::{CloudOp, FakeMachine, FakeModel, ModelOp};
use provisioner::{HarvestMode, Life, Machine, MachineStatus, ProvisionerConfig, ProvisionerError, ProvisionerEvent};

use crate::support::*;

/// T12: a failing cloud listing no longer kills the provisioner (as it does in Juju): the batch is
/// retried with backoff and the machine is started once a listing succeeds.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_listing_is_retried_with_backoff() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.fail_next(CloudOp::AllInstances, 3, "boom");
    let h = Harness::new(test_config(), cloud, FakeModel::new(vec![Machine::pending("0")]));
    h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some()).await;
    let cloud = h.cloud().await;
    let lists = cloud.calls_of(CloudOp::AllInstances);
    assert_eq!(lists.len(), 4);
    assert_eq!(lists.iter().filter(|c| c.ok == Some(false)).count(), 3);
    // Exponential backoff with full jitter: under 1 s, 2 s, 4 s.
    for (i, ceiling) in [1, 2, 4].into_iter().enumerate() {
        let gap = lists[i + 1].at - lists[i].at;
        assert!(gap <= Duration::from_secs(ceiling), "retry {i} after {gap:?}");
    }
    assert!(h.handle.is_running());
}

/// Nothing unknown is harvested from a view that failed to load; once a
/// listing succeeds the harvest goes ahead.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn nothing_is_harvested_from_a_view_that_failed_to_load() {
    let config = ProvisionerConfig { resync_interval: Duration::from_secs(60), ..with_mode(HarvestMode::All) };
    let cloud = zoneless_cloud();
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["0", "1"])));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    h.cloud.launch_aged("stray", None, None, InstanceState::Running, false, OLD);
    // The resync fails, and so do its jittered retries and the fresh listing the next harvest
    // asks for.
    h.cloud.fail_next(CloudOp::AllInstances, 4, "listing broke");
    h.run_for(Duration::from_millis(60_500)).await;
    // A death now must not reap the unknown instance from a stale view.
    h.model.set_life("1", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().removed).await;
    let cloud = h.cloud().await;
    assert!(stops(&cloud).iter().all(|s| !s.contains(&"stray".to_string())), "{:?}", stops(&cloud));
    // A retried listing succeeds (backoff under 1 + 2 + 4 + 8 s): now it is harvested.
    assert_eq!(h.cloud().await.state_of("stray"), Some(InstanceState::Running));
    h.run_for(Duration::from_secs(20)).await;
    assert_eq!(h.cloud().await.state_of("stray"), Some(InstanceState::Terminated));
}

/// `TestMachineErrorsRetainInstances` (fixed): a per-machine read error stops nothing, does not
/// kill the provisioner, and the machine is processed once it reads again.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn machine_read_errors_retain_instances_and_are_retried() {
    let cloud = zoneless_cloud();
    cloud.launch_aged("999", None, None, InstanceState::Running, false, OLD);
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.read_error = Some("some error".into());
    let h = Harness::new(with_mode(HarvestMode::All), cloud, FakeModel::with_machines(vec![m]));
    h.run_for(Duration::from_secs(3)).await;
    assert!(h.handle.is_running());
    assert_eq!(starts_of(&h.cloud().await, "0"), 0);
    h.model.update("0", |m| m.read_error = None);
    h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some()).await;
}

/// A failing `machines` call is retried with backoff; no machine is lost.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_machines_call_is_retried() {
    let model = FakeModel::with_machines(machines(&["0", "1", "2"]));
    model.fail_next(ModelOp::Machines, 2, "api down");
    let h = Harness::new(test_config(), zoneless_cloud(), model);
    h.until_model(Duration::from_secs(60), |m| ["0", "1", "2"].iter().all(|id| instance_of(m, id).is_some())).await;
    assert!(h.handle.is_running());
}

/// A failing provisioning-info call leaves the machines to a later retry; they start.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_provisioning_info_call_is_retried() {
    let model = FakeModel::with_machines(machines(&["0", "1"]));
    model.fail_next(ModelOp::ProvisioningInfo, 1, "info down");
    let h = Harness::new(test_config(), zoneless_cloud(), model);
    h.until_model(Duration::from_secs(60), |m| ["0", "1"].iter().all(|id| instance_of(m, id).is_some())).await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), 1);
    assert_eq!(starts_of(&cloud, "1"), 1);
}

/// A failing StopInstances no longer kills the provisioner: it is retried with backoff
/// and the machine is removed once the stop lands; starts meanwhile go on.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_stop_is_retried_and_other_work_goes_on() {
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::with_machines(machines(&["0"])));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    let inst = instance_of(&model, "0").unwrap();
    h.cloud.fail_next(CloudOp::StopInstances, 3, "stop failed");
    h.model.set_life("0", Life::Dead);
    h.model.add_machine(FakeMachine::new(Machine::pending("1")));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some()).await;
    let model = h.until_model(Duration::from_secs(60), |m| m.machine("0").unwrap().removed).await;
    assert!(model.machine("0").unwrap().removed);
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud).len(), 4);
    assert_eq!(cloud.state_of(&inst), Some(InstanceState::Terminated));
}

/// A failing MarkForRemoval is retried until it lands.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failing_mark_for_removal_is_retried() {
    let mut m = Machine::pending("0");
    m.life = Life::Dead;
    let model = FakeModel::new(vec![m]);
    model.fail_next(ModelOp::MarkForRemoval, 2, "nope");
    let h = Harness::new(test_config(), zoneless_cloud(), model);
    h.until_model(Duration::from_secs(60), |m| m.machine("0").unwrap().removed).await;
}

/// A DeriveAvailabilityZones failure becomes that machine's provisioning error.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn derive_zones_failure_errors_only_that_machine() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.fail_next(CloudOp::DeriveZones, 1, "derive broke");
    let config = ProvisionerConfig { workers: 1, ..test_config() };
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["0", "1"])));
    let model = h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some()).await;
    let m0 = model.machine("0").unwrap();
    assert_eq!(m0.machine.status, MachineStatus::Error);
    assert!(m0.instance_status_message.contains("derive broke"));
    assert!(h.handle.is_running());
}

/// T15 `TestResizeWorkerPool`: resizing fires `resized-worker-pool`; the same size again fires
/// nothing; out-of-range sizes are refused and change nothing.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn resize_worker_pool_validates_and_announces() {
    let h = Harness::zoned(test_config(), &["az1"], &[]);
    h.handle.set_workers(5).await.unwrap();
    h.handle.set_workers(5).await.unwrap();
    for bad in [0, 101] {
        let err = h.handle.set_workers(bad).await.unwrap_err();
        assert!(matches!(err, ProvisionerError::Config(_)));
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
    h.settle().await;
    assert_eq!(h.handle.pool().await.unwrap().size, 5);
    let events = h.events().await;
    let resized: Vec<_> = events.iter().filter(|e| matches!(e, ProvisionerEvent::ResizedWorkerPool { .. })).collect();
    assert_eq!(resized, vec![&ProvisionerEvent::ResizedWorkerPool { size: 5 }]);
}

/// Resizing (which in Juju closes the pool) with starts queued and in flight loses nothing, waits
/// for nothing, and raises concurrency at once.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn resizing_with_work_in_flight_loses_nothing() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.set_latency(Duration::from_secs(10), Duration::ZERO);
    let ids: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let config = ProvisionerConfig { workers: 2, ..test_config() };
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&refs)));
    h.run_for(Duration::from_secs(1)).await;
    let pool = h.handle.pool().await.unwrap();
    assert_eq!((pool.size, pool.in_flight, pool.queued), (2, 2, 8));
    h.handle.set_workers(5).await.unwrap();
    let pool = h.handle.pool().await.unwrap();
    assert_eq!((pool.in_flight, pool.queued), (5, 5));
    h.handle.set_workers(1).await.unwrap();
    let model = h.until_model(Duration::from_secs(120), |m| refs.iter().all(|id| instance_of(m, id).is_some())).await;
    let cloud = h.cloud().await;
    for id in &refs {
        assert_eq!(starts_of(&cloud, id), 1);
        assert!(instance_of(&model, id).is_some());
    }
}

/// `processed-machines` fires after every batch, including the first empty one.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn processed_machines_fires_after_each_batch() {
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::new(vec![]));
    h.settle().await;
    assert_eq!(h.event_names().await, vec!["processed-machines"]);
    h.model.add_machine(FakeMachine::new(Machine::pending("0")));
    h.settle().await;
    let names = h.event_names().await;
    assert_eq!(names.iter().filter(|e| **e == "processed-machines").count(), 2);
    assert!(names.contains(&"machine-started"));
}

/// An invalid configuration is refused before anything starts.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn invalid_configuration_is_refused() {
    let cloud = zoneless_cloud();
    let model = FakeModel::new(vec![]);
    let config = ProvisionerConfig { workers: 0, ..test_config() };
    let err = provisioner::start(config, std::sync::Arc::new(cloud.broker()), std::sync::Arc::new(model.api()))
        .err()
        .unwrap();
    assert_eq!(err.to_string(), "workers must be between 1 and 100, got 0");
}

/// Unknown instances are not harvested from a view whose last listing failed,
/// even when the last good listing is younger than `harvest_listing_max_age`.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn nothing_is_harvested_from_a_young_view_after_a_failed_listing() {
    let config = ProvisionerConfig {
        resync_interval: Duration::from_secs(60),
        harvest_listing_max_age: Duration::from_secs(3600),
        ..with_mode(HarvestMode::Destroyed)
    };
    let h = Harness::new(config, zoneless_cloud(), FakeModel::with_machines(machines(&["0", "1"])));
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "1").is_some()).await;
    h.cloud.launch_aged("stray", None, None, InstanceState::Running, false, OLD);
    h.run_for(Duration::from_secs(61)).await; // the resync at 60 s lists `stray`; mode destroyed keeps it
    h.cloud.fail_next(CloudOp::AllInstances, 1, "listing broke");
    h.handle.set_harvest_mode(HarvestMode::Unknown); // its fresh listing fails: the view is stale
    h.run_for(Duration::from_secs(1)).await;
    h.model.set_life("1", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().removed).await;
    assert_eq!(h.cloud().await.state_of("stray"), Some(InstanceState::Running), "harvested from a stale view");
}

/// A failed record is that machine's error, and every stop is retried until it succeeds: the orphan
/// of a failed `set_instance_info` is stopped through a normal stop job: a failed stop is retried
/// with backoff until it succeeds.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn the_orphan_of_a_failed_record_is_stopped_until_the_stop_succeeds() {
    let model = FakeModel::with_machines(machines(&["0"]));
    model.fail_next(ModelOp::SetInstanceInfo, 3, "model write failed");
    let cloud = zoneless_cloud();
    cloud.fail_next(CloudOp::StopInstances, 2, "cloud says no");
    let h = Harness::new(test_config(), cloud, model);
    h.run_for(Duration::from_secs(60)).await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec!["i-1".to_string()]; 3]);
    assert_eq!(cloud.state_of("i-1"), Some(InstanceState::Terminated));
    let model = h.model().await;
    let m = model.machine("0").unwrap();
    assert_eq!(m.machine.instance, None);
    assert_eq!(m.machine.status, MachineStatus::Error);
    assert_eq!(m.instance_status_message, "cannot record instance i-1: model write failed");
    assert!(h.handle.is_running());
}

/// An instance being stopped is never adopted: a restart while the orphan's stop is in flight (the
/// cloud still lists it as running) never adopts it: the machine's error was written before the
/// stop was sent, and the new incarnation stops the orphan of a machine in error itself.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_restart_never_adopts_an_orphan_being_stopped() {
    let model = FakeModel::with_machines(machines(&["0"]));
    model.fail_next(ModelOp::SetInstanceInfo, 3, "state gone");
    let cloud = zoneless_cloud();
    cloud.set_latency(Duration::ZERO, Duration::from_secs(5));
    let h = Harness::new(test_config(), cloud, model);
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(h.cloud().await.state_of("i-1"), Some(InstanceState::Running), "stop still in flight");
    let h = h.restart(test_config());
    h.run_for(Duration::from_secs(30)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.state_of("i-1"), Some(InstanceState::Terminated));
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1);
    let model = h.model().await;
    let m = model.machine("0").unwrap();
    assert_eq!(m.machine.instance, None, "adopted an instance being stopped");
    assert_eq!(m.machine.status, MachineStatus::Error);
}
