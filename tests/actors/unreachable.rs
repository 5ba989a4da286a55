//! A zone that does not answer (issue 32): an LXD cluster member frozen or cut off, whose calls
//! hang until the broker's timeout answers `BrokerError::ZoneUnreachable`. The call may still
//! take effect when the member wakes up (ambiguous) and another zone may work (zone-specific):
//! the start fails over without repeating the call, looks for what the unanswered call made
//! before its next call, and an instance the member makes later, once the machine has its
//! instance elsewhere, is stopped as the machine's extra instance.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use provisioner::model::{CloudInstance, InstanceId, InstanceState, MachineId};
use provisioner::ports::{Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};
use provisioner::testing::{CloudOp, CloudSnapshot, FakeBroker, FakeCloud, FakeMachine, FakeModel, ModelSnapshot};
use provisioner::{HarvestMode, Machine, ProvisionerConfig};

use crate::support::*;

/// How long the broker waits for a frozen member before it answers `ZoneUnreachable`.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The fake cloud's broker with one frozen zone: a start aimed at it hangs for [`TIMEOUT`],
/// then fails with `ZoneUnreachable`. With `made_anyway`, the frozen member makes the instance
/// before the broker gives up on it (it shows up before the start's next call); otherwise the
/// call is kept, and [`Probe::wake`] has the member complete it later. What it sees goes to
/// the test's [`Probe`] (channels: no lock).
struct Frozen {
    inner: FakeBroker,
    zone: String,
    made_anyway: bool,
    /// In order: `start ZONE`, `look MACHINE`, `stop IDS`.
    seen: Sender<String>,
    unanswered: Sender<StartInstanceParams>,
}

/// The test's end of a [`Frozen`] broker.
struct Probe {
    inner: FakeBroker,
    seen: Receiver<String>,
    log: Vec<String>,
    unanswered: Receiver<StartInstanceParams>,
}

impl Frozen {
    fn new(cloud: &FakeCloud, zone: &str, made_anyway: bool) -> (Arc<Self>, Probe) {
        let (seen, seen_rx) = channel();
        let (unanswered, unanswered_rx) = channel();
        let frozen = Arc::new(Self { inner: cloud.broker(), zone: zone.into(), made_anyway, seen, unanswered });
        let probe = Probe { inner: cloud.broker(), seen: seen_rx, log: Vec::new(), unanswered: unanswered_rx };
        (frozen, probe)
    }

    fn saw(&self, what: String) {
        let _ = self.seen.send(what);
    }
}

impl Probe {
    /// Everything the broker saw so far, in order.
    fn seen(&mut self) -> Vec<String> {
        self.log.extend(self.seen.try_iter());
        self.log.clone()
    }

    /// The frozen member wakes up and completes every call it never answered (same client
    /// token, same parameters: the instance is tagged for the machine and its start).
    async fn wake(&self) -> Vec<String> {
        let calls: Vec<StartInstanceParams> = self.unanswered.try_iter().collect();
        let mut made = Vec::new();
        for params in calls {
            let started = self.inner.start_instance(params).await.expect("the member makes it");
            made.push(started.instance.id.to_string());
        }
        made
    }
}

impl Broker for Frozen {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let zone = params.zone.clone().unwrap_or_default();
        self.saw(format!("start {zone}"));
        if zone != self.zone {
            return self.inner.start_instance(params);
        }
        let made = self.made_anyway.then(|| self.inner.start_instance(params.clone()));
        if made.is_none() {
            let _ = self.unanswered.send(params);
        }
        Box::pin(async move {
            if let Some(made) = made {
                made.await?;
            }
            actix_rt::time::sleep(TIMEOUT).await;
            Err(BrokerError::zone_unreachable(format!("cluster member {zone} did not answer in {TIMEOUT:?}")))
        })
    }
    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        self.saw(format!("look {machine}"));
        self.inner.instances_of_start(machine, nonce)
    }
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let names: Vec<String> = ids.iter().map(ToString::to_string).collect();
        self.saw(format!("stop {}", names.join(",")));
        self.inner.stop_instances(ids)
    }
    provisioner::forward_broker!(inner: all_instances, supports_zones, availability_zones, derive_availability_zones, retag_instance, release_instances);
}

/// Zones `a` and `b`; machine 9 already runs `i-9` in `b`, so that machine 0's first start goes
/// to `a` (the emptier zone).
fn cloud_and_model() -> (FakeCloud, FakeModel) {
    let cloud = zoned_cloud(&["a", "b"]);
    cloud.launch_aged("i-9", Some("b"), Some("9"), InstanceState::Running, false, OLD);
    let model = FakeModel::with_machines(vec![
        FakeMachine::new(with_instance("9", "i-9")),
        FakeMachine::new(Machine::pending("0")),
    ]);
    (cloud, model)
}

fn provisioner_over(config: ProvisionerConfig, broker: Arc<Frozen>, cloud: FakeCloud, model: FakeModel) -> Harness {
    Harness::over(config, broker, cloud, model)
}

fn zone_of(cloud: &provisioner::testing::CloudSnapshot, id: &str) -> Option<String> {
    cloud.instances.get(&InstanceId::new(id)).and_then(|i| i.instance.zone.clone())
}

/// Machine 0 started with zone `a` frozen (`makes`: the unanswered call makes its instance
/// there), once the model records an instance for it: the provisioner, the model, the cloud
/// and what the frozen broker saw.
async fn started_beside_a_frozen_zone(makes: bool) -> (Harness, ModelSnapshot, CloudSnapshot, Probe) {
    let (cloud, model) = cloud_and_model();
    let (frozen, probe) = Frozen::new(&cloud, "a", makes);
    let h = provisioner_over(one_retry(), frozen, cloud, model);
    let model = h.until_model(Duration::from_secs(120), |m| instance_of(m, "0").is_some()).await;
    let cloud = h.cloud().await;
    (h, model, cloud, probe)
}

/// Issue 32, point 1: a `ZoneUnreachable` answer is not repeated in the frozen zone with the
/// same token (as a transient failure is): the zone is marked failed for the machine and the
/// start moves to another zone at once, looking for an instance of its own first (the
/// unanswered call may have made one). The machine ends with one instance, in `b`.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn an_unreachable_zone_is_failed_over_after_a_look_and_never_repeated() {
    let (h, model, cloud, mut probe) = started_beside_a_frozen_zone(false).await;
    let instance = instance_of(&model, "0").unwrap();
    assert_eq!(zone_of(&cloud, &instance).as_deref(), Some("b"));
    assert_eq!(cloud.live_instances_of(&MachineId::new("0")).len(), 1, "exactly one instance");
    assert_eq!(probe.seen(), ["start a", "look 0", "start b"], "one call in a, the look before the call in b");
    assert!(stops(&cloud).is_empty());
    let status = model.machine("0").unwrap();
    assert_eq!(status.machine.instance_status.as_str(), "running", "{status:?}");
    h.handle.shutdown();
}

/// Issue 32, point 1: the instance the unanswered call made shows up before the start's next
/// call: the look finds it (tagged for the machine and the start), the start adopts it, and no
/// second instance is made.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn what_an_unanswered_call_made_is_adopted_before_any_other_call() {
    let (h, model, cloud, mut probe) = started_beside_a_frozen_zone(true).await;
    let instance = instance_of(&model, "0").unwrap();
    assert_eq!(zone_of(&cloud, &instance).as_deref(), Some("a"), "the unanswered call's instance");
    assert_eq!(probe.seen(), ["start a", "look 0"], "adopted: no call in b");
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1);
    assert_eq!(cloud.live_instances_of(&MachineId::new("0")).len(), 1);
    h.settle().await;
    assert!(stops(&h.cloud().await).is_empty());
    h.handle.shutdown();
}

/// One retry round (with no round left a zone failure is final: no fail-over).
fn one_retry() -> ProvisionerConfig {
    with_retries(1, Duration::from_secs(10))
}

/// A harvest mode that harvests nothing, and a resync every minute.
fn resyncing(mode: HarvestMode) -> ProvisionerConfig {
    ProvisionerConfig { resync_interval: Duration::from_secs(60), ..with_mode(mode) }
}

/// `resyncing` with one retry round (for the fail-over).
fn resyncing_with_retry(mode: HarvestMode) -> ProvisionerConfig {
    ProvisionerConfig { retry: one_retry().retry, ..resyncing(mode) }
}

fn state(cloud: &provisioner::testing::CloudSnapshot, id: &str) -> Option<InstanceState> {
    cloud.state_of(id)
}

/// Issue 32, point 2: after the fail-over the frozen member wakes up and completes the first
/// create: a second instance tagged for machine 0 (same start) runs while 0 has its instance in
/// `b`. The next fresh listing finds it as 0's extra instance and the provisioner stops it,
/// once, in harvest mode `none` (it was made by our own start); the recorded instance is never
/// stopped, and the stop is announced (`extra-instances`, then `instances-stopped`).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_live_machines_extra_instance_is_stopped_once_and_its_own_never() {
    let (cloud, model) = cloud_and_model();
    let (frozen, mut probe) = Frozen::new(&cloud, "a", false);
    let h = provisioner_over(resyncing_with_retry(HarvestMode::None), frozen, cloud, model);
    let model = h.until_model(Duration::from_secs(120), |m| instance_of(m, "0").is_some()).await;
    let own = instance_of(&model, "0").unwrap();
    let extra = probe.wake().await;
    assert_eq!(extra.len(), 1);
    let extra = extra[0].clone();
    assert_ne!(extra, own);
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec![extra.clone()]], "stopped once, nothing else");
    let seen = probe.seen();
    let stopped: Vec<&String> = seen.iter().filter(|s| s.starts_with("stop")).collect();
    assert_eq!(stopped, [&format!("stop {extra}")]);
    assert_eq!(seen.iter().filter(|s| *s == "start a").count(), 1, "{seen:?}");
    assert_eq!(state(&cloud, &extra), Some(InstanceState::Terminated));
    assert_eq!(state(&cloud, &own), Some(InstanceState::Running));
    assert_eq!(state(&cloud, "i-9"), Some(InstanceState::Running));
    assert_eq!(instance_of(&h.model().await, "0"), Some(own), "the machine keeps its instance");
    let names = h.event_names().await;
    let announced = names.iter().position(|n| *n == "extra-instances").expect("announced");
    assert!(names[announced..].contains(&"instances-stopped"), "{names:?}");
    h.handle.shutdown();
}

/// Issue 32, point 2 (careful case): the recorded instance stopped outside our control
/// (seed 000) is still the machine's: it is never stopped as an extra instance, over many
/// listings; an extra one that shows up beside it is.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_recorded_instance_stopped_outside_control_is_never_an_extra_instance() {
    let (cloud, model) = cloud_and_model();
    let (frozen, _probe) = Frozen::new(&cloud, "a", false);
    let h = provisioner_over(resyncing_with_retry(HarvestMode::All), frozen, cloud, model);
    h.until_model(Duration::from_secs(120), |m| instance_of(m, "0").is_some()).await;
    h.cloud.set_state("i-9", InstanceState::Stopped);
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    assert!(stops(&cloud).is_empty(), "{:?}", stops(&cloud));
    let nine = h.model().await.machine("9").unwrap().machine.instance_status.clone();
    assert_eq!(nine.as_str(), "stopped", "the stop outside our control is reported");
    // An instance tagged for 9 shows up beside its stopped one (launched after the machine was
    // last read: only a listing finds it).
    h.cloud.launch_aged("i-x", Some("b"), Some("9"), InstanceState::Running, false, OLD);
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    assert_eq!(stops(&cloud), vec![vec!["i-x".to_string()]]);
    assert_eq!(state(&cloud, "i-9"), Some(InstanceState::Stopped), "never stopped by us");
    h.handle.shutdown();
}

/// Issue 32, point 2 (careful case): a start in flight is never touched: its product, listed
/// (pending, tagged for the machine) by many listings while the call runs, is not an extra
/// instance (the machine records none yet), nor once it is recorded.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_start_in_flight_is_never_stopped_as_an_extra_instance() {
    let (cloud, model) = cloud_and_model();
    cloud.set_latency(Duration::from_secs(600), Duration::ZERO);
    let (frozen, _probe) = Frozen::new(&cloud, "none", false);
    let h = provisioner_over(resyncing(HarvestMode::All), frozen, cloud, model);
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.live_instances_of(&MachineId::new("0")).len(), 1, "the start's product exists");
    assert!(instance_of(&h.model().await, "0").is_none(), "still starting");
    h.until_model(Duration::from_secs(600), |m| instance_of(m, "0").is_some()).await;
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    assert!(stops(&cloud).is_empty(), "{:?}", stops(&cloud));
    assert_eq!(cloud.live_instances_of(&MachineId::new("0")).len(), 1);
    h.handle.shutdown();
}

/// Issue 32, point 2 (careful case): machine reuse hands a dead machine's parked instance to a
/// new machine (retagged): neither while parked (its dead machine records it) nor once handed
/// over (the new machine records it) is it an extra instance, over many listings.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_reused_instance_is_never_an_extra_instance() {
    let config =
        ProvisionerConfig { reuse: true, reuse_window: Duration::from_secs(600), ..resyncing(HarvestMode::Destroyed) };
    let h = Harness::zoned(config, &["az1"], &["0"]);
    h.until_model(Duration::from_secs(10), |m| instance_of(m, "0").is_some()).await;
    h.model.set_life("0", provisioner::Life::Dead);
    h.run_for(Duration::from_secs(180)).await;
    assert!(stops(&h.cloud().await).is_empty(), "parked, not stopped");
    h.model.add_machine(FakeMachine::new(Machine::pending("1")));
    h.run_for(Duration::from_secs(300)).await;
    let cloud = h.cloud().await;
    let model = h.model().await;
    assert_eq!(instance_of(&model, "1").as_deref(), Some("i-1"), "handed over");
    assert_eq!(starts_of(&cloud, "1"), 0);
    assert!(stops(&cloud).is_empty(), "{:?}", stops(&cloud));
    assert!(!h.event_names().await.contains(&"extra-instances"));
    h.handle.shutdown();
}
