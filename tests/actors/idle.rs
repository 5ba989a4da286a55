//! "Tell me when idle": `ProvisionerHandle::wait_idle` answers when the provisioner's work
//! guards are all dropped (no batch, job, call or one-shot retry left), without anyone polling
//! `is_idle`; on a paused clock it answers at the virtual instant the last work ends.

use std::time::Duration;

use actix_rt::time::Instant;
use provisioner::testing::{FakeModel, ModelOp};
use provisioner::Machine;

use crate::support::*;

/// The last start lands after the cloud's start latency: `wait_idle` answers then, with every
/// machine started, not at some later polling tick.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn wait_idle_answers_when_the_last_start_lands() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.set_latency(Duration::from_secs(5), Duration::from_secs(1));
    let t0 = Instant::now();
    let h = Harness::new(test_config(), cloud, FakeModel::with_machines(machines(&["0", "1", "2"])));
    h.handle.wait_idle().await;
    let waited = t0.elapsed();
    assert!(h.handle.is_idle().await);
    let model = h.model().await;
    for m in ["0", "1", "2"] {
        assert!(instance_of(&model, m).is_some(), "machine {m} not started when idle: {model:#?}");
    }
    assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(6), "answered after {waited:?}");
}

/// A failed provisioning-info call retries the machines after a backoff (a one-shot timer, held
/// as work): `wait_idle` waits it out and answers once the retried start landed.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn wait_idle_waits_out_a_retry_later_backoff() {
    let model = FakeModel::new(vec![Machine::pending("0")]);
    model.fail_next(ModelOp::ProvisioningInfo, 1, "model busy");
    let h = Harness::new(test_config(), zoneless_cloud(), model);
    h.handle.wait_idle().await;
    assert!(h.handle.is_idle().await);
    let model = h.model().await;
    assert!(instance_of(&model, "0").is_some(), "the retry had not run: {model:#?}");
}

/// Dead machines are stopped and marked for removal (a stop job, then a removal call the
/// registry holds until the model acknowledges it): idle only once both are done.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn wait_idle_waits_for_stops_and_removals() {
    let cloud = zoneless_cloud();
    cloud.set_latency(Duration::from_secs(1), Duration::from_secs(3));
    let h = Harness::new(test_config(), cloud, FakeModel::new(vec![Machine::pending("0")]));
    h.handle.wait_idle().await;
    let t0 = Instant::now();
    h.model.set_life("0", provisioner::Life::Dead);
    // Let the fake model's notification reach the coordinator (a millisecond of virtual time).
    h.run_for(Duration::from_millis(1)).await;
    h.handle.wait_idle().await;
    assert!(t0.elapsed() >= Duration::from_secs(3), "answered before the stop landed: {:?}", t0.elapsed());
    let model = h.model().await;
    assert!(model.machine("0").unwrap().removed, "{model:#?}");
    assert!(h.handle.is_idle().await);
}

/// A stopped provisioner is idle: `wait_idle` answers at once.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn wait_idle_answers_at_once_for_a_stopped_provisioner() {
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::new(vec![Machine::pending("0")]));
    h.handle.shutdown();
    h.settle().await;
    let t0 = Instant::now();
    h.handle.wait_idle().await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
}
