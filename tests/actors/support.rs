//! Test harness: a provisioner wired to a fake cloud and model, plus an event log.

use std::time::Duration;

use actix::prelude::*;
use provisioner::testing::{CloudOp, CloudSnapshot, FakeCloud, FakeMachine, FakeModel, ModelSnapshot};
use provisioner::{start, HarvestMode, Machine, ProvisionerConfig, ProvisionerEvent, ProvisionerHandle, RetryStrategy};

pub const MODEL: &str = "model-uuid-1";

/// Collects every event.
#[derive(Default)]
pub struct EventLog {
    events: Vec<ProvisionerEvent>,
}

impl Actor for EventLog {
    type Context = Context<Self>;
}

impl Handler<ProvisionerEvent> for EventLog {
    type Result = ();
    fn handle(&mut self, msg: ProvisionerEvent, _ctx: &mut Self::Context) {
        self.events.push(msg);
    }
}

#[derive(Message)]
#[rtype(result = "Vec<ProvisionerEvent>")]
pub struct GetEvents;

impl Handler<GetEvents> for EventLog {
    type Result = MessageResult<GetEvents>;
    fn handle(&mut self, _msg: GetEvents, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.events.clone())
    }
}

/// The configuration Juju's tests use: no retries, no delay, 4 workers; resync far away so
/// call counts are exact.
/// The age of instances a test puts in the cloud as existing state: older than any harvest
/// grace period.
pub const OLD: Duration = Duration::from_secs(86_400);

pub fn test_config() -> ProvisionerConfig {
    ProvisionerConfig {
        model_uuid: MODEL.into(),
        workers: 4,
        retry: RetryStrategy::new(0, Duration::ZERO),
        resync_interval: Duration::from_secs(3600),
        ..ProvisionerConfig::default()
    }
}

pub fn zoned_cloud(zones: &[&str]) -> FakeCloud {
    FakeCloud::with_zones(MODEL, zones)
}

pub fn zoneless_cloud() -> FakeCloud {
    FakeCloud::new(MODEL)
}

pub fn machines(ids: &[&str]) -> Vec<FakeMachine> {
    ids.iter().map(|id| FakeMachine::new(Machine::pending(*id))).collect()
}

/// A provisioner over a fake cloud and model.
pub struct Harness {
    pub cloud: FakeCloud,
    pub model: FakeModel,
    pub handle: ProvisionerHandle,
    log: Addr<EventLog>,
}

impl Harness {
    /// Starts a provisioner; it does not watch the model yet.
    pub fn unwatched(config: ProvisionerConfig, cloud: FakeCloud, model: FakeModel) -> Self {
        let handle =
            start(config, std::sync::Arc::new(cloud.broker()), std::sync::Arc::new(model.api())).expect("valid config");
        let log = EventLog::default().start();
        handle.subscribe(log.clone().recipient());
        Self { cloud, model, handle, log }
    }

    /// Starts a provisioner over `broker` (a wrapper of `cloud`'s) that watches the model.
    pub fn over(
        config: ProvisionerConfig,
        broker: std::sync::Arc<dyn provisioner::ports::Broker>,
        cloud: FakeCloud,
        model: FakeModel,
    ) -> Self {
        let handle = start(config, broker, std::sync::Arc::new(model.api())).expect("valid config");
        let log = EventLog::default().start();
        handle.subscribe(log.clone().recipient());
        let h = Self { cloud, model, handle, log };
        h.watch();
        h
    }

    /// Starts a provisioner that watches the model (the first notification carries every machine).
    pub fn new(config: ProvisionerConfig, cloud: FakeCloud, model: FakeModel) -> Self {
        let h = Self::unwatched(config, cloud, model);
        h.watch();
        h
    }

    /// Connects the model's watchers to the provisioner.
    pub fn watch(&self) {
        self.model.watch(self.handle.machines_changed());
        self.model.watch_retries(self.handle.retry_ticks());
    }

    /// A provisioner on a zoned cloud with these machines.
    pub fn zoned(config: ProvisionerConfig, zones: &[&str], ids: &[&str]) -> Self {
        Self::new(config, zoned_cloud(zones), FakeModel::with_machines(machines(ids)))
    }

    /// Crashes the provisioner and starts a new one on the same cloud and model.
    pub fn restart(self, config: ProvisionerConfig) -> Self {
        self.handle.shutdown();
        Self::new(config, self.cloud, self.model)
    }

    pub async fn cloud(&self) -> CloudSnapshot {
        self.cloud.snapshot().await
    }

    pub async fn model(&self) -> ModelSnapshot {
        self.model.snapshot().await
    }

    pub async fn events(&self) -> Vec<ProvisionerEvent> {
        self.log.send(GetEvents).await.unwrap()
    }

    pub async fn event_names(&self) -> Vec<&'static str> {
        self.events().await.iter().map(|e| e.name()).collect()
    }

    /// Lets virtual time run (every timer under this long fires).
    pub async fn run_for(&self, d: Duration) {
        actix_rt::time::sleep(d).await;
    }

    /// Lets the actors do all they can without timers of more than a minute.
    pub async fn settle(&self) {
        self.run_for(Duration::from_secs(60)).await;
    }

    /// Polls (in virtual time) until the model satisfies `cond`; panics after `limit`.
    pub async fn until_model(&self, limit: Duration, cond: impl Fn(&ModelSnapshot) -> bool) -> ModelSnapshot {
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        loop {
            let snap = self.model().await;
            if cond(&snap) {
                return snap;
            }
            assert!(waited < limit, "condition not met within {limit:?}: {snap:#?}");
            actix_rt::time::sleep(step).await;
            waited += step;
        }
    }
}

/// The instance lists of every stop call, in order.
pub fn stops(snap: &CloudSnapshot) -> Vec<Vec<String>> {
    snap.calls_of(CloudOp::StopInstances).iter().map(|c| c.instances.iter().map(|i| i.to_string()).collect()).collect()
}

/// Start calls for a machine.
pub fn starts_of(snap: &CloudSnapshot, machine: &str) -> usize {
    snap.calls_of(CloudOp::StartInstance)
        .iter()
        .filter(|c| c.machine.as_ref().map(|m| m.as_str()) == Some(machine))
        .count()
}

/// A config in this harvest mode.
pub fn with_mode(mode: HarvestMode) -> ProvisionerConfig {
    ProvisionerConfig { harvest_mode: mode, ..test_config() }
}

/// A pending machine that records `instance`.
pub fn with_instance(id: &str, instance: &str) -> Machine {
    Machine { instance: Some(instance.into()), ..Machine::pending(id) }
}

/// A manual machine at `address` (its instance `manual:ADDRESS`).
pub fn manual(id: &str, address: &str) -> Machine {
    Machine { manual: true, ..with_instance(id, &format!("manual:{address}")) }
}

/// The test configuration with `count` retry rounds `delay` apart.
pub fn with_retries(count: u32, delay: Duration) -> ProvisionerConfig {
    ProvisionerConfig { retry: RetryStrategy::new(count, delay), ..test_config() }
}

/// The model's instance id for a machine.
pub fn instance_of(snap: &ModelSnapshot, id: &str) -> Option<String> {
    snap.machine(id).and_then(|m| m.machine.instance.as_ref().map(|i| i.to_string()))
}
