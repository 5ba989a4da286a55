use std::time::Duration;

use super::state::*;
use crate::config::Backoff;
use crate::model::MachineId;

fn ids(list: &[&str]) -> Vec<MachineId> {
    list.iter().map(|i| MachineId::new(*i)).collect()
}

fn backoff() -> Backoff {
    Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(8) }
}

/// A supervisor of a zoneless provisioned host whose provisioner runs for `container`.
fn running(container: &str) -> SupervisorBook {
    let mut b = SupervisorBook::new(backoff(), Some(None));
    b.containers_changed(ids(&[container]));
    b.initialised(Ok(()));
    b
}

#[test]
fn listens_until_the_first_container_on_a_provisioned_host() {
    let mut b = SupervisorBook::new(backoff(), Some(Some("az1".into())));
    assert_eq!(b.stage(), &Stage::Listening);
    assert_eq!(b.containers_changed(ids(&["0/lxd/0"])), vec![Effect::Initialise]);
    assert_eq!(b.stage(), &Stage::Initialising { failures: 0 });
}

#[test]
fn waits_for_the_host_to_be_provisioned() {
    let mut b = SupervisorBook::new(backoff(), None);
    assert!(b.containers_changed(ids(&["0/lxd/0"])).is_empty(), "initialised before the host had an instance");
    assert_eq!(b.stage(), &Stage::Listening);
    assert_eq!(b.host_provisioned(Some("az2".into())), vec![Effect::Initialise]);
}

#[test]
fn a_provisioned_host_without_containers_stays_listening() {
    let mut b = SupervisorBook::new(backoff(), None);
    assert!(b.host_provisioned(Some("az1".into())).is_empty());
    assert_eq!(b.stage(), &Stage::Listening);
}

#[test]
fn initialisation_failures_retry_with_growing_backoff_then_run_in_the_hosts_zone() {
    let mut b = SupervisorBook::new(backoff(), Some(Some("az3".into())));
    b.containers_changed(ids(&["0/lxd/0"]));
    let first = b.initialised(Err("snap failed".into()));
    let [Effect::RetryInitialise { after, message }] = &first[..] else { panic!("{first:?}") };
    assert!(*after <= Duration::from_secs(1) && message == "snap failed", "full jitter under 1 s: {first:?}");
    assert_eq!(b.retry_due(), vec![Effect::Initialise]);
    let second = b.initialised(Err("snap failed".into()));
    let [Effect::RetryInitialise { after, .. }] = &second[..] else { panic!("{second:?}") };
    assert!(*after <= Duration::from_secs(2), "full jitter under 2 s: {second:?}");
    // Containers arriving meanwhile are remembered, not lost.
    assert!(b.containers_changed(ids(&["0/lxd/1"])).is_empty());
    assert_eq!(
        b.initialised(Ok(())),
        vec![Effect::StartProvisioner {
            zone: Some("az3".into()),
            containers: ids(&["0/lxd/0", "0/lxd/1"]),
            reap: false
        }]
    );
    assert_eq!(b.stage(), &Stage::Running);
    assert!(b.retry_due().is_empty(), "a stale retry timer re-initialised a running supervisor");
}

#[test]
fn running_supervisor_forwards_changes() {
    let mut b = running("0/kvm/0");
    assert_eq!(b.containers_changed(ids(&["0/kvm/1"])), vec![Effect::Forward(ids(&["0/kvm/1"]))]);
}

#[test]
fn host_death_closes_starts_but_keeps_reaping_containers() {
    let mut b = running("0/lxd/0");
    assert_eq!(b.host_died(), vec![Effect::CloseStarts]);
    assert_eq!(b.stage(), &Stage::Stopped);
    // A container dying with its host is still handed to the provisioner to reap.
    assert_eq!(b.containers_changed(ids(&["0/lxd/0"])), vec![Effect::Forward(ids(&["0/lxd/0"]))]);
    assert!(b.initialised(Ok(())).is_empty());
}

#[test]
fn initialisation_gives_up_after_repeated_failures() {
    let mut b = SupervisorBook::new(backoff(), Some(None)).with_max_failures(2);
    b.containers_changed(ids(&["0/lxd/0"]));
    assert!(matches!(b.initialised(Err("no".into()))[0], Effect::RetryInitialise { .. }));
    assert_eq!(b.retry_due(), vec![Effect::Initialise]);
    assert_eq!(
        b.initialised(Err("still no".into())),
        vec![Effect::GiveUp { containers: ids(&["0/lxd/0"]), message: "still no".into() }]
    );
    assert_eq!(b.stage(), &Stage::Failed { message: "still no".into() });
    // Later containers of that type fail at once; known ones are not reported twice.
    assert_eq!(
        b.containers_changed(ids(&["0/lxd/0", "0/lxd/1"])),
        vec![Effect::GiveUp { containers: ids(&["0/lxd/1"]), message: "still no".into() }]
    );
    assert!(b.retry_due().is_empty());
}

#[test]
fn host_death_while_listening_stops_without_a_provisioner() {
    let mut b = SupervisorBook::new(backoff(), None);
    assert!(b.host_died().is_empty());
    assert_eq!(b.stage(), &Stage::Stopped);
    assert!(b.host_provisioned(None).is_empty());
}

#[test]
fn host_death_before_the_provisioner_runs_starts_a_reaper_without_initialising() {
    // A host that dies takes its containers with it: they die with the host and must be reaped,
    // even if the host never finished initialising (or a restart found it dead).
    let mut b = SupervisorBook::new(backoff(), Some(Some("az1".into())));
    assert_eq!(b.containers_changed(ids(&["0/lxd/0"])), vec![Effect::Initialise]);
    assert_eq!(
        b.host_died(),
        vec![Effect::StartProvisioner { zone: Some("az1".into()), containers: ids(&["0/lxd/0"]), reap: true }]
    );
    assert!(b.initialised(Ok(())).is_empty(), "a late initialisation started a second provisioner");
    assert_eq!(b.containers_changed(ids(&["0/lxd/0"])), vec![Effect::Forward(ids(&["0/lxd/0"]))]);
}

#[test]
fn a_dead_hosts_supervisor_reaps_on_demand_and_retires_its_reaper() {
    let mut b = SupervisorBook::new(backoff(), None).for_dead_host();
    assert_eq!(
        b.containers_changed(ids(&["0/lxd/0"])),
        vec![Effect::StartProvisioner { zone: None, containers: ids(&["0/lxd/0"]), reap: true }]
    );
    let generation = b.generation();
    b.containers_changed(ids(&["0/lxd/1"]));
    assert!(!b.reaper_done(generation), "retired although a container came meanwhile");
    assert!(b.reaper_done(b.generation()));
    // A container added later gets a new reaper, told of every container.
    assert_eq!(
        b.containers_changed(ids(&["0/lxd/2"])),
        vec![Effect::StartProvisioner { zone: None, containers: ids(&["0/lxd/0", "0/lxd/1", "0/lxd/2"]), reap: true }]
    );
}

#[test]
fn model_destruction_reaches_the_running_provisioner_or_starts_a_reaper() {
    // The destruction stops every instance whatever the mode: containers are in its scope.
    let mut b = running("0/lxd/0");
    assert_eq!(b.model_destroyed(), vec![Effect::Destroyed]);
    assert!(b.model_destroyed().is_empty(), "destroyed twice");
    assert!(b.containers_changed(ids(&["0/lxd/1"])) == vec![Effect::Forward(ids(&["0/lxd/1"]))]);

    // Still initialising (a restarted supervisor): a reaper, without waiting for the host.
    let mut b = SupervisorBook::new(backoff(), Some(None));
    b.containers_changed(ids(&["0/lxd/0"]));
    assert_eq!(
        b.model_destroyed(),
        vec![Effect::StartProvisioner { zone: None, containers: ids(&["0/lxd/0"]), reap: true }]
    );
    assert!(b.initialised(Ok(())).is_empty());
}
