//! The scenario file (contract: `shared/spec/scenario-format.md`): parsing from TOML or JSON,
//! validation, and writing back (for `--dump-scenario`).
//!
//! Every struct denies unknown keys. Values that can be checked alone (durations, modes, pool
//! sizes, lives) are checked while parsing, so the parser's own error names the line;
//! cross-references (machine ids in events) are checked afterwards and located in the text.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::limiter::{BucketLimit, RateLimits};
use crate::types::{HarvestMode, InstanceState, Life, MachineStatus};

/// A bad scenario file: which file, which line, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}{}: {field}{message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ScenarioError {
    /// The file.
    pub file: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The field (with `: ` appended), or empty.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A humantime duration (`"0s"`, `"250ms"`, `"10s"`, `"2m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Duration);

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?} ({e}); use e.g. \"0s\", \"250ms\", \"10s\", \"2m\""
            ))
        })
    }
}

/// Formats a duration as the report does: `0s`, `35s`, `1m 5s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// A worker pool size, checked to be in `1..=100` while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Workers(pub usize);

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        if !(1..=crate::config::MAX_WORKERS as i64).contains(&n) {
            return Err(serde::de::Error::custom(format!(
                "workers must be between 1 and {}, got {n}",
                crate::config::MAX_WORKERS
            )));
        }
        Ok(Workers(n as usize))
    }
}

impl Default for Workers {
    fn default() -> Self {
        Workers(crate::config::DEFAULT_WORKERS)
    }
}

fn default_until() -> Dur {
    Dur(Duration::from_secs(3600))
}
fn default_retry_count() -> u32 {
    crate::config::DEFAULT_RETRY_COUNT
}
fn default_retry_delay() -> Dur {
    Dur(crate::config::DEFAULT_RETRY_DELAY)
}
fn default_resync() -> Dur {
    Dur(crate::config::DEFAULT_RESYNC_INTERVAL)
}
fn default_reuse_window() -> Dur {
    Dur(crate::config::DEFAULT_REUSE_WINDOW)
}
fn default_harvest_grace() -> Dur {
    Dur(crate::config::DEFAULT_HARVEST_GRACE)
}
fn default_harvest_max_stops() -> usize {
    crate::config::DEFAULT_HARVEST_MAX_STOPS
}
fn default_capacity_memory() -> Dur {
    Dur(crate::config::DEFAULT_CAPACITY_MEMORY)
}
fn default_times() -> u32 {
    1
}
fn default_fault_message() -> String {
    "injected failure".into()
}
fn is_false(b: &bool) -> bool {
    !*b
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The seed (`--seed` overrides).
    #[serde(default)]
    pub seed: u64,
    /// Virtual-time limit.
    #[serde(default = "default_until")]
    pub until: Dur,
    /// Provisioner settings.
    #[serde(default)]
    pub provisioner: ProvisionerSpec,
    /// The simulated cloud.
    #[serde(default)]
    pub cloud: CloudSpec,
    /// The simulated model (an addition).
    #[serde(default, skip_serializing_if = "ModelSpec::is_default")]
    pub model: ModelSpec,
    /// The model's machines at the start.
    #[serde(default)]
    pub machines: Vec<MachineSpec>,
    /// Timed events.
    #[serde(default)]
    pub events: Vec<EventSpec>,
}

/// `[model]` (an addition): how the simulated model behaves.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// How long recording an instance takes (SetInstanceInfo): a `restart` in that window
    /// crashes the provisioner after its start succeeded but before the instance is recorded.
    #[serde(default)]
    pub write_latency: Dur,
}

impl ModelSpec {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// `[provisioner]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionerSpec {
    /// Harvest mode.
    #[serde(default)]
    pub harvest_mode: HarvestMode,
    /// Pool size.
    #[serde(default)]
    pub workers: Workers,
    /// Extra StartInstance rounds.
    #[serde(default = "default_retry_count")]
    pub retry_count: u32,
    /// Delay between rounds.
    #[serde(default = "default_retry_delay")]
    pub retry_delay: Dur,
    /// Interval between full cloud listings (an addition to the contract).
    #[serde(default = "default_resync")]
    pub resync_interval: Dur,
    /// Machine reuse, off by default (an addition: seed 001).
    #[serde(default, skip_serializing_if = "is_false")]
    pub reuse: bool,
    /// How long a parked instance waits for reuse (an addition).
    #[serde(default = "default_reuse_window")]
    pub reuse_window: Dur,
    /// The client-side rate limiter (an addition; EC2-sized by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
    /// How young an unknown instance may be and still be spared by a harvest (an addition).
    #[serde(default = "default_harvest_grace")]
    pub harvest_grace: Dur,
    /// Most unknown instances stopped in one harvest pass (an addition).
    #[serde(default = "default_harvest_max_stops")]
    pub harvest_max_stops: usize,
    /// How long a zone's capacity failure steers machines of the same shape away (an addition).
    #[serde(default = "default_capacity_memory")]
    pub capacity_memory: Dur,
}

impl Default for ProvisionerSpec {
    fn default() -> Self {
        Self {
            harvest_mode: HarvestMode::default(),
            workers: Workers::default(),
            retry_count: default_retry_count(),
            retry_delay: default_retry_delay(),
            resync_interval: default_resync(),
            reuse: false,
            reuse_window: default_reuse_window(),
            rate_limit: None,
            harvest_grace: default_harvest_grace(),
            harvest_max_stops: default_harvest_max_stops(),
            capacity_memory: default_capacity_memory(),
        }
    }
}

/// `[cloud]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudSpec {
    /// Zones; empty = a zoneless cloud.
    #[serde(default)]
    pub zones: Vec<String>,
    /// Zones listed but not available.
    #[serde(default)]
    pub unavailable_zones: Vec<String>,
    /// One StartInstance's duration.
    #[serde(default)]
    pub start_latency: Dur,
    /// One StopInstances' duration.
    #[serde(default)]
    pub stop_latency: Dur,
    /// API throttling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
    /// Instances that exist before the provisioner starts.
    #[serde(default)]
    pub instances: Vec<InstanceSpec>,
    /// Scripted StartInstance failures.
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
    /// DeriveAvailabilityZones answers.
    #[serde(default)]
    pub derived_zones: Vec<DerivedZonesSpec>,
    /// Addition: scripted failures of container host initialisation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_faults: Vec<InitFaultSpec>,
}

/// `[[cloud.init_faults]]`: the first `times` initialisations of `kind` on `host` fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitFaultSpec {
    /// The host.
    pub host: String,
    /// The container type.
    pub kind: String,
    /// How many attempts fail.
    #[serde(default = "default_times")]
    pub times: u32,
    /// The error text.
    #[serde(default = "default_fault_message")]
    pub message: String,
}

/// `[cloud.rate_limit]` (the cloud's buckets) or `[provisioner.rate_limit]` (the client's,
/// an addition): one token bucket per call kind. In the cloud a missing kind is unlimited; in
/// the provisioner it keeps its EC2-sized default, and `enabled = false` turns the client-side
/// limiter off.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// Provisioner side only: `false` = no client-side limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Start bucket size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_burst: Option<u32>,
    /// Start refill rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_per_second: Option<f64>,
    /// Stop bucket size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_burst: Option<u32>,
    /// Stop refill rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_per_second: Option<f64>,
    /// Listing and lookup bucket size (an addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe_burst: Option<u32>,
    /// Listing and lookup refill rate (an addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe_per_second: Option<f64>,
}

impl RateLimitSpec {
    fn bucket(burst: Option<u32>, per_second: Option<f64>, base: Option<BucketLimit>) -> Option<BucketLimit> {
        match (burst, per_second) {
            (None, None) => base,
            (b, r) => {
                let burst = b.or(base.map(|l| l.burst)).unwrap_or_else(|| r.map_or(1, |r| r.ceil().max(1.0) as u32));
                let per_second = r.or(base.map(|l| l.per_second)).unwrap_or(f64::from(burst));
                Some(BucketLimit::new(burst, per_second))
            }
        }
    }

    /// The buckets, each kind given here overriding `base` (given burst without rate: the
    /// rate is the burst per second; rate without burst: the burst is the rate, rounded up).
    pub fn limits(&self, base: RateLimits) -> RateLimits {
        if self.enabled == Some(false) {
            return RateLimits::unlimited();
        }
        RateLimits {
            start: Self::bucket(self.start_burst, self.start_per_second, base.start),
            stop: Self::bucket(self.stop_burst, self.stop_per_second, base.stop),
            describe: Self::bucket(self.describe_burst, self.describe_per_second, base.describe),
        }
    }
}

/// The state of a pre-existing instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitialState {
    /// Running.
    #[default]
    Running,
    /// Stopped (or suspended).
    Stopped,
}

impl From<InitialState> for InstanceState {
    fn from(s: InitialState) -> Self {
        match s {
            InitialState::Running => InstanceState::Running,
            InitialState::Stopped => InstanceState::Stopped,
        }
    }
}

/// `[[cloud.instances]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// Its id.
    pub id: String,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Its state.
    #[serde(default)]
    pub state: InitialState,
    /// The machine it was started for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Belongs to another model or controller.
    #[serde(default, skip_serializing_if = "is_false")]
    pub foreign: bool,
    /// How long before the start it was launched (an addition; default a day: older than any
    /// harvest grace period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<Dur>,
}

impl InstanceSpec {
    /// Its age when the provisioner starts.
    pub fn age(&self) -> Duration {
        self.age.map_or(PRE_EXISTING_AGE, |d| d.0)
    }
}

/// The age of a pre-existing instance whose `age` is not given.
pub const PRE_EXISTING_AGE: Duration = Duration::from_secs(24 * 3600);

/// `[[cloud.faults]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// The machine whose starts fail.
    pub machine: String,
    /// How many matching calls fail.
    #[serde(default = "default_times")]
    pub times: u32,
    /// Only calls into this zone match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// "Would fail in any zone".
    #[serde(default, skip_serializing_if = "is_false")]
    pub zone_independent: bool,
    /// The error text.
    #[serde(default = "default_fault_message")]
    pub message: String,
    /// The call makes the instance (tagged, listed), then fails as a transient error, as a
    /// call whose response was lost would (version 2).
    #[serde(default, skip_serializing_if = "is_false")]
    pub lost_response: bool,
}

/// `[[cloud.derived_zones]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DerivedZonesSpec {
    /// The machine.
    pub machine: String,
    /// Its derived zones.
    pub zones: Vec<String>,
}

/// `[[machines]]` and `add_machine`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// Its id.
    pub id: String,
    /// Its life.
    #[serde(default)]
    pub life: Life,
    /// Its status.
    #[serde(default)]
    pub status: MachineStatus,
    /// Its instance status.
    #[serde(default)]
    pub instance_status: String,
    /// Its instance, if provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// `zones=` constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// The other machines of its distribution group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution_group: Option<Vec<String>>,
    /// Non-empty: the distribution-group lookup fails with this text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub distribution_group_error: String,
    /// On death, leave the instance running.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_instance: bool,
    /// Manually provisioned.
    #[serde(default, skip_serializing_if = "is_false")]
    pub manual: bool,
    /// A controller machine.
    #[serde(default, skip_serializing_if = "is_false")]
    pub controller: bool,
}

impl MachineSpec {
    /// The machine as the model reports it.
    pub fn to_machine(&self) -> crate::types::Machine {
        let mut m = crate::types::Machine::pending(self.id.as_str());
        m.life = self.life;
        m.status = self.status;
        m.instance_status = crate::types::InstanceStatus::other(self.instance_status.clone());
        m.instance = self.instance.as_deref().map(Into::into);
        m.keep_instance = self.keep_instance;
        m.manual = self.manual;
        m.controller = self.controller;
        m
    }

    /// A pending machine with defaults.
    pub fn pending(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            life: Life::Alive,
            status: MachineStatus::Pending,
            instance_status: String::new(),
            instance: None,
            zones: None,
            distribution_group: None,
            distribution_group_error: String::new(),
            keep_instance: false,
            manual: false,
            controller: false,
        }
    }
}

/// `set_life`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLifeSpec {
    /// The machine.
    pub machine: String,
    /// Its new life.
    pub life: Life,
}

/// `set_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStatusSpec {
    /// The machine.
    pub machine: String,
    /// New machine status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MachineStatus>,
    /// New instance status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_status: Option<String>,
}

/// `set_zones`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetZonesSpec {
    /// Available zones.
    #[serde(default)]
    pub zones: Vec<String>,
    /// Listed, unavailable zones.
    #[serde(default)]
    pub unavailable_zones: Vec<String>,
}

/// `cloud_launch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    /// Instance id.
    pub id: String,
    /// Zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Machine it is tagged for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Another model's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub foreign: bool,
    /// How long before the event it was launched (an addition; default: just now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<Dur>,
}

/// The calls `fail_next` can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailCall {
    /// Cloud listing.
    AllInstances,
    /// Cloud stop.
    StopInstances,
    /// Cloud zones.
    AvailabilityZones,
    /// Model machines read.
    Machines,
    /// Model SetInstanceInfo.
    SetInstanceInfo,
    /// Model provisioning info.
    ProvisioningInfo,
}

/// `fail_next`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailNextSpec {
    /// Which call.
    pub call: FailCall,
    /// How many.
    #[serde(default = "default_times")]
    pub times: u32,
    /// Error text.
    #[serde(default = "default_fault_message")]
    pub message: String,
}

/// `destroy_model`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyModelSpec {
    /// Skip the manual-machine check.
    #[serde(default)]
    pub force: bool,
}

/// `[[events]]`: `at` plus exactly one action key.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// When.
    pub at: Dur,
    /// A machine is added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_machine: Option<MachineSpec>,
    /// A machine's life changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_life: Option<SetLifeSpec>,
    /// Someone else writes a status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_status: Option<SetStatusSpec>,
    /// Model config: harvest mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_harvest_mode: Option<HarvestMode>,
    /// Model config: pool size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_workers: Option<Workers>,
    /// `retry-provisioning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_provisioning: Option<Vec<String>>,
    /// The cloud's zone list changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_zones: Option<SetZonesSpec>,
    /// Out-of-band stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_stop: Option<String>,
    /// Out-of-band start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_start: Option<String>,
    /// Out-of-band terminate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_terminate: Option<String>,
    /// Out-of-band launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_launch: Option<LaunchSpec>,
    /// Break the next calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_next: Option<FailNextSpec>,
    /// Crash and restart the provisioner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<bool>,
    /// Destroy the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_model: Option<DestroyModelSpec>,
}

/// One event's action, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// See [`EventSpec::add_machine`].
    AddMachine(MachineSpec),
    /// See [`EventSpec::set_life`].
    SetLife(SetLifeSpec),
    /// See [`EventSpec::set_status`].
    SetStatus(SetStatusSpec),
    /// See [`EventSpec::set_harvest_mode`].
    SetHarvestMode(HarvestMode),
    /// See [`EventSpec::set_workers`].
    SetWorkers(usize),
    /// See [`EventSpec::retry_provisioning`].
    RetryProvisioning(Vec<String>),
    /// See [`EventSpec::set_zones`].
    SetZones(SetZonesSpec),
    /// See [`EventSpec::cloud_stop`].
    CloudStop(String),
    /// See [`EventSpec::cloud_start`].
    CloudStart(String),
    /// See [`EventSpec::cloud_terminate`].
    CloudTerminate(String),
    /// See [`EventSpec::cloud_launch`].
    CloudLaunch(LaunchSpec),
    /// See [`EventSpec::fail_next`].
    FailNext(FailNextSpec),
    /// See [`EventSpec::restart`].
    Restart,
    /// See [`EventSpec::destroy_model`].
    DestroyModel(DestroyModelSpec),
}

impl Action {
    /// The action's key in the file.
    pub fn key(&self) -> &'static str {
        match self {
            Action::AddMachine(_) => "add_machine",
            Action::SetLife(_) => "set_life",
            Action::SetStatus(_) => "set_status",
            Action::SetHarvestMode(_) => "set_harvest_mode",
            Action::SetWorkers(_) => "set_workers",
            Action::RetryProvisioning(_) => "retry_provisioning",
            Action::SetZones(_) => "set_zones",
            Action::CloudStop(_) => "cloud_stop",
            Action::CloudStart(_) => "cloud_start",
            Action::CloudTerminate(_) => "cloud_terminate",
            Action::CloudLaunch(_) => "cloud_launch",
            Action::FailNext(_) => "fail_next",
            Action::Restart => "restart",
            Action::DestroyModel(_) => "destroy_model",
        }
    }
}

impl EventSpec {
    /// An event at `at` doing `action`.
    pub fn new(at: Duration, action: Action) -> Self {
        let mut e = EventSpec { at: Dur(at), ..EventSpec::default() };
        match action {
            Action::AddMachine(m) => e.add_machine = Some(m),
            Action::SetLife(s) => e.set_life = Some(s),
            Action::SetStatus(s) => e.set_status = Some(s),
            Action::SetHarvestMode(m) => e.set_harvest_mode = Some(m),
            Action::SetWorkers(n) => e.set_workers = Some(Workers(n)),
            Action::RetryProvisioning(ids) => e.retry_provisioning = Some(ids),
            Action::SetZones(z) => e.set_zones = Some(z),
            Action::CloudStop(i) => e.cloud_stop = Some(i),
            Action::CloudStart(i) => e.cloud_start = Some(i),
            Action::CloudTerminate(i) => e.cloud_terminate = Some(i),
            Action::CloudLaunch(l) => e.cloud_launch = Some(l),
            Action::FailNext(f) => e.fail_next = Some(f),
            Action::Restart => e.restart = Some(true),
            Action::DestroyModel(d) => e.destroy_model = Some(d),
        }
        e
    }

    /// The actions given (a valid event has exactly one).
    pub fn actions(&self) -> Vec<Action> {
        let mut out = Vec::new();
        out.extend(self.add_machine.clone().map(Action::AddMachine));
        out.extend(self.set_life.clone().map(Action::SetLife));
        out.extend(self.set_status.clone().map(Action::SetStatus));
        out.extend(self.set_harvest_mode.map(Action::SetHarvestMode));
        out.extend(self.set_workers.map(|w| Action::SetWorkers(w.0)));
        out.extend(self.retry_provisioning.clone().map(Action::RetryProvisioning));
        out.extend(self.set_zones.clone().map(Action::SetZones));
        out.extend(self.cloud_stop.clone().map(Action::CloudStop));
        out.extend(self.cloud_start.clone().map(Action::CloudStart));
        out.extend(self.cloud_terminate.clone().map(Action::CloudTerminate));
        out.extend(self.cloud_launch.clone().map(Action::CloudLaunch));
        out.extend(self.fail_next.clone().map(Action::FailNext));
        out.extend(self.restart.map(|_| Action::Restart));
        out.extend(self.destroy_model.clone().map(Action::DestroyModel));
        out
    }

    /// The one action (valid scenarios only).
    pub fn action(&self) -> Action {
        self.actions().into_iter().next().unwrap_or(Action::Restart)
    }
}

/// The file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.toml`.
    Toml,
    /// `.json`.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Toml => "TOML",
            Format::Json => "JSON",
        })
    }
}

fn line_of_offset(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

/// The key written on a line: `key = ...` (TOML) or `"key": ...` (JSON).
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line.checked_sub(1)?)?.trim();
    let key = if let Some(rest) = l.strip_prefix('"') { rest.split('"').next()? } else { l.split('=').next()?.trim() };
    let key = key.trim_matches(|c: char| c == '[' || c == ']' || c == '{' || c.is_whitespace());
    (!key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.')).then(|| key.to_owned())
}

/// The line of the `nth` (0-based) occurrence of a key in the text.
fn line_of_key(text: &str, key: &str, nth: usize) -> Option<usize> {
    let needles = [format!("\"{key}\""), key.to_owned()];
    let mut seen = 0;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim_start();
        if needles.iter().any(|n| t.starts_with(n.as_str()) && t[n.len()..].trim_start().starts_with(['=', ':'])) {
            if seen == nth {
                return Some(i + 1);
            }
            seen += 1;
        }
    }
    None
}

impl Scenario {
    /// Reads and validates a scenario file (`.toml` or `.json`).
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let err = |message: String| ScenarioError { file: file.clone(), line: None, field: String::new(), message };
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Format::Toml,
            Some("json") => Format::Json,
            _ => return Err(err("unknown scenario format: the file name must end in .toml or .json".into())),
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        Self::parse(&text, format, &file)
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str, format: Format, file: &str) -> Result<Self, ScenarioError> {
        let parsed: Result<Scenario, (Option<usize>, String)> = match format {
            Format::Toml => toml::from_str(text).map_err(|e| {
                let line = e.span().map(|s| line_of_offset(text, s.start));
                (line, e.message().trim().to_owned())
            }),
            Format::Json => serde_json::from_str(text).map_err(|e| {
                let line = (e.line() > 0).then_some(e.line());
                let msg = e.to_string();
                let msg = msg.rsplit_once(" at line ").map(|(m, _)| m.to_owned()).unwrap_or(msg);
                (line, msg)
            }),
        };
        let scenario = parsed.map_err(|(line, message)| {
            // JSON reports the line after a bad value; look back a little for its key.
            let (line, key) = match line {
                Some(l) => (0..3)
                    .filter_map(|back| l.checked_sub(back).filter(|n| *n > 0))
                    .find_map(|n| key_on_line(text, n).map(|k| (Some(n), Some(k))))
                    .unwrap_or((Some(l), None)),
                None => (None, None),
            };
            let field = key.map(|k| format!("{k}: ")).unwrap_or_default();
            let message = if message.is_empty() { format!("invalid {format}") } else { message };
            ScenarioError { file: file.to_owned(), line, field, message }
        })?;
        scenario.validate(text, file)?;
        Ok(scenario)
    }

    /// Cross-field checks: one action per event, machine ids that exist, unique ids,
    /// compatible settings.
    pub fn validate(&self, text: &str, file: &str) -> Result<(), ScenarioError> {
        if self.provisioner.reuse && !self.provisioner.harvest_mode.harvests_destroyed() {
            return Err(ScenarioError {
                file: file.to_owned(),
                line: line_of_key(text, "reuse", 0),
                field: "reuse: ".into(),
                message: crate::config::ConfigError::Reuse(self.provisioner.harvest_mode).to_string(),
            });
        }
        let fail = |key: &str, nth: usize, message: String| ScenarioError {
            file: file.to_owned(),
            line: line_of_key(text, key, nth),
            field: format!("{key}: "),
            message,
        };
        let mut known: Vec<&str> = Vec::new();
        for (i, m) in self.machines.iter().enumerate() {
            if known.contains(&m.id.as_str()) {
                return Err(fail("id", i, format!("machine id {:?} appears twice", m.id)));
            }
            validate_machine_id(&m.id).map_err(|e| fail("id", i, e))?;
            known.push(&m.id);
        }
        for e in &self.events {
            if let Some(m) = &e.add_machine {
                known.push(&m.id);
            }
        }
        let containers = self
            .machines
            .iter()
            .map(|m| m.id.as_str())
            .chain(self.events.iter().filter_map(|e| e.add_machine.as_ref().map(|m| m.id.as_str())));
        for id in containers {
            let mid = crate::types::MachineId::new(id);
            let Some((host, kind)) = mid.container_of() else { continue };
            let value_err = |message: String| ScenarioError {
                file: file.to_owned(),
                line: line_of_value(text, "id", id),
                field: "id: ".into(),
                message,
            };
            if !crate::containers::DEFAULT_CONTAINER_TYPES.contains(&kind) {
                return Err(value_err(format!(
                    "unknown container type {kind:?} in {id:?}; supported: {}",
                    crate::containers::DEFAULT_CONTAINER_TYPES.join(", ")
                )));
            }
            if !known.contains(&host.as_str()) {
                return Err(value_err(format!("container {id:?} names unknown host {:?}", host.as_str())));
            }
        }
        let value_err = |key: &str, value: &str, message: String| ScenarioError {
            file: file.to_owned(),
            line: line_of_value(text, key, value),
            field: format!("{key}: "),
            message,
        };
        for f in &self.cloud.faults {
            if !known.contains(&f.machine.as_str()) {
                return Err(value_err("machine", &f.machine, format!("fault names unknown machine {:?}", f.machine)));
            }
        }
        for d in &self.cloud.derived_zones {
            if !known.contains(&d.machine.as_str()) {
                return Err(value_err(
                    "machine",
                    &d.machine,
                    format!("derived_zones names unknown machine {:?}", d.machine),
                ));
            }
        }
        let mut counts: std::collections::BTreeMap<&'static str, usize> = Default::default();
        for (i, e) in self.events.iter().enumerate() {
            let actions = e.actions();
            let at_line = line_of_key(text, "at", i);
            let event_err = |message: String| ScenarioError {
                file: file.to_owned(),
                line: at_line,
                field: format!("events[{i}]: "),
                message,
            };
            let action = match actions.as_slice() {
                [a] => a.clone(),
                [] => {
                    return Err(event_err(
                        "an event needs exactly one action key (add_machine, set_life, ...); it has none".into(),
                    ))
                }
                many => {
                    let keys: Vec<_> = many.iter().map(Action::key).collect();
                    return Err(event_err(format!(
                        "an event needs exactly one action key; it has {}",
                        keys.join(", ")
                    )));
                }
            };
            let key = action.key();
            let nth = *counts.entry(key).and_modify(|c| *c += 1).or_insert(0);
            let unknown = |id: &str| {
                let mut err =
                    fail(key, nth, format!("unknown machine id {id:?} in event {i} (at {})", format_duration(e.at.0)));
                // Point at the id itself when it sits on a later line (JSON, multi-line tables).
                if let Some(from) = err.line {
                    let quoted = format!("\"{id}\"");
                    err.line = text
                        .lines()
                        .enumerate()
                        .skip(from - 1)
                        .find(|(_, l)| l.contains(&quoted))
                        .map(|(n, _)| n + 1)
                        .or(err.line);
                }
                err
            };
            match &action {
                Action::SetLife(s) if !known.contains(&s.machine.as_str()) => return Err(unknown(&s.machine)),
                Action::SetStatus(s) if !known.contains(&s.machine.as_str()) => return Err(unknown(&s.machine)),
                Action::RetryProvisioning(ids) => {
                    if let Some(id) = ids.iter().find(|id| !known.contains(&id.as_str())) {
                        return Err(unknown(id));
                    }
                }
                Action::AddMachine(m) => {
                    validate_machine_id(&m.id).map_err(|msg| fail(key, nth, msg))?;
                    if self.machines.iter().any(|x| x.id == m.id) {
                        return Err(fail(key, nth, format!("machine id {:?} already exists", m.id)));
                    }
                }
                Action::Restart if e.restart == Some(false) => {
                    return Err(fail(key, nth, "restart takes `true`".into()));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes the scenario as TOML (what `--dump-scenario` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write scenario: {e}\n"))
    }

    /// The events sorted by time (stable: same-time events keep file order).
    pub fn timeline(&self) -> Vec<(Duration, Action)> {
        let mut events: Vec<(Duration, Action)> = self.events.iter().map(|e| (e.at.0, e.action())).collect();
        events.sort_by_key(|(at, _)| *at);
        events
    }
}

/// The first line where `key` is given the string `value`.
fn line_of_value(text: &str, key: &str, value: &str) -> Option<usize> {
    let quoted = format!("\"{value}\"");
    text.lines().position(|l| l.contains(key) && l.contains(&quoted)).map(|i| i + 1)
}

fn validate_machine_id(id: &str) -> Result<(), String> {
    let parts: Vec<&str> = id.split('/').collect();
    let ok = match parts.as_slice() {
        [n] => !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()),
        [h, t, n] => {
            !h.is_empty()
                && h.chars().all(|c| c.is_ascii_digit())
                && !t.is_empty()
                && t.chars().all(|c| c.is_ascii_lowercase())
                && !n.is_empty()
                && n.chars().all(|c| c.is_ascii_digit())
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("invalid machine id {id:?}: expected a number like \"3\" or a container like \"0/lxd/1\""))
    }
}
