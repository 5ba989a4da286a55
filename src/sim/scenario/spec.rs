//! The serde types of the scenario file format: one struct per table, each refusing unknown
//! keys, so the parser's own error names an unknown key and its line. Values that can be
//! checked alone (durations, modes, pool sizes, lives) are checked while parsing, for the same
//! reason. The events and their actions are in `events.rs`, the defaults in `defaults.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::defaults::{
    default_batch_size, default_capacity_memory, default_fault_message, default_harvest_grace,
    default_harvest_max_stops, default_resync, default_retry_count, default_retry_delay, default_reuse_window,
    default_times, is_default_batch_size, is_false, PRE_EXISTING_AGE,
};
use super::units::{Dur, Workers};
use crate::actors::limiter::{BucketLimit, RateLimits};
use crate::model::{HarvestMode, InstanceState, Life, MachineStatus};

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
    pub(super) fn is_default(&self) -> bool {
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
    /// Machine reuse, off by default (an addition): a dead machine's clean instance is parked
    /// for `reuse_window` and handed to a new pending machine with the same constraints and a
    /// compatible zone, instead of stopping one instance and starting another.
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
    /// Version 2: starts queued for the same zone and shape go to the cloud in one call (each
    /// machine still logged as its own `start_instance` entry, all with the call's `batch` id).
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch_starts: bool,
    /// Version 2: most machines in one batched call (`1..=1000`, default 100).
    #[serde(default = "default_batch_size", skip_serializing_if = "is_default_batch_size")]
    pub batch_size: usize,
    /// Addition (issue 33): the most a spot start pays, in USD per hour; a spot price above it
    /// counts as no spot capacity. Default: no maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_max_price: Option<crate::model::UsdPerHour>,
    /// Addition (issue 34): how long a machine's instance stays stopped before the machine is
    /// unhealthy and repaired through a hand-over. Default: never (a stopped instance is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_after: Option<Dur>,
    /// Addition (issue 34): how many machines are repaired at a time, a count or a percentage
    /// (`"20%"`, the default); more unhealthy at once hold every repair back.
    #[serde(default = "default_max_unhealthy", skip_serializing_if = "is_default_max_unhealthy")]
    pub repair_max_unhealthy: crate::config::repair::MaxUnhealthy,
    /// Addition (issue 34): drifted machines are replaced through the hand-over (default: the
    /// report's `drift` only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub replace_drifted: bool,
    /// Addition (issue 34): how many drifted machines are replaced at a time (1 or more).
    #[serde(default = "default_drift_budget", skip_serializing_if = "is_default_drift_budget")]
    pub drift_budget: usize,
    /// Addition (issue 35): code broken on purpose, to replay a model checker's
    /// counterexample (`mutations = { new-token-after-ambiguous = true }`). Default: none.
    #[serde(default, skip_serializing_if = "crate::config::Mutations::none")]
    pub mutations: crate::config::Mutations,
}

fn default_drift_budget() -> usize {
    crate::config::repair::DEFAULT_DRIFT_BUDGET
}

fn is_default_drift_budget(n: &usize) -> bool {
    *n == crate::config::repair::DEFAULT_DRIFT_BUDGET
}

fn default_max_unhealthy() -> crate::config::repair::MaxUnhealthy {
    crate::config::repair::DEFAULT_MAX_UNHEALTHY
}

fn is_default_max_unhealthy(m: &crate::config::repair::MaxUnhealthy) -> bool {
    *m == crate::config::repair::DEFAULT_MAX_UNHEALTHY
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
    /// Addition: the instance type of machines without hardware constraints. Unset (the
    /// default): their instances have no type; machines with `arch`/`cores`/`mem_mb`/
    /// `instance_type` get the cheapest type of the shipped catalogue that satisfies them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Addition: the cloud's subnets and the zones each is in, for machines placed with
    /// `placement = "subnet=ID"` (the zones DeriveAvailabilityZones answers for them; an
    /// unknown subnet is that machine's zone-independent failure). Default: none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub subnets: std::collections::BTreeMap<String, Vec<String>>,
    /// Addition (issue 33): the spot price of every spot start, in USD per hour. Unset (the
    /// default): 0.3 × the on-demand price of the start's instance type in the shipped
    /// catalogue (unknown for a start without a type: never above a maximum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price: Option<crate::model::UsdPerHour>,
    /// Addition (issue 34): the image every start uses, and pre-existing and out-of-band
    /// instances have (`set_image` events change it later). Unset (the default): the cloud
    /// says no image, and no image drift is judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl CloudSpec {
    /// What DeriveAvailabilityZones answers for machine `id` placed with `placement`: a
    /// `zone=NAME` placement that zone, a `subnet=ID` placement the subnet's zones (an error
    /// naming an unknown subnet), otherwise the machine's `derived_zones` entry (none: empty).
    pub fn derived_zones_for(&self, id: &str, placement: Option<&str>) -> Result<Vec<String>, String> {
        if let Some(p) = placement.map(str::trim) {
            if let Some(zone) = p.strip_prefix("zone=") {
                return Ok(vec![zone.to_owned()]);
            }
            if let Some(subnet) = p.strip_prefix("subnet=") {
                return self
                    .subnets
                    .get(subnet)
                    .cloned()
                    .ok_or_else(|| format!("subnet {subnet:?} is not one of this cloud's subnets"));
            }
        }
        Ok(self.derived_zones.iter().find(|d| d.machine == id).map(|d| d.zones.clone()).unwrap_or_default())
    }
}

/// Declares a scripted fault's spec: the fields it is given, then the two every fault ends with,
/// `times` (how many matching calls fail, default 1) and `message` (the error text). A macro,
/// not a `#[serde(flatten)]` struct: flattening would lose the parsers' positions (file:line of
/// a bad field) and the list of expected fields in an unknown-field error.
macro_rules! fault_spec {
    ($(#[$attr:meta])* pub struct $name:ident { $($(#[$field_attr:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$attr])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$field_attr])* pub $field: $ty,)*
            /// How many matching calls fail.
            #[serde(default = "default_times")]
            pub times: u32,
            /// The error text.
            #[serde(default = "default_fault_message")]
            pub message: String,
        }
    };
}

fault_spec! {
    /// `[[cloud.init_faults]]`: the first `times` initialisations of `kind` on `host` fail.
    pub struct InitFaultSpec {
        /// The host.
        pub host: String,
        /// The container type.
        pub kind: String,
    }
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

/// `[[cloud.faults]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// The machine whose starts fail. May be left out (empty) by a fault with an
    /// `instance_type`: then every machine's tries of that type match.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    /// Addition: only tries of this instance type match: the type is out of capacity (in
    /// `zone`, if given), a zone-specific failure of that type alone; the start tries the next
    /// type that satisfies the machine's constraints in the same zone before it fails over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
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
    /// call whose response was lost would.
    #[serde(default, skip_serializing_if = "is_false")]
    pub lost_response: bool,
    /// Addition: a partial launch. The first `times` start calls carrying `machine` (into
    /// `zone`, if given) launch only their first `partial` machines, in launch order; the rest
    /// fail zone-specifically with `message` (a single-machine start fails when `partial` is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<u32>,
    /// Addition (issue 33): no spot capacity. The first `times` spot starts (of `machine`,
    /// into `zone`, of `instance_type`, each when given) are refused there as EC2 refuses a
    /// spot request without capacity (zone-specific; `message` defaults to EC2's
    /// `InsufficientInstanceCapacity` text). On-demand starts never match.
    #[serde(default, skip_serializing_if = "is_false")]
    pub spot_capacity: bool,
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
    /// Addition: `arch=` constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Addition: `cores=` constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Addition: `mem=` constraint, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mb: Option<u64>,
    /// Addition: `instance-type=` constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Addition: `root-disk=` constraint, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_disk_mb: Option<u64>,
    /// Addition: `spaces=` constraint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spaces: Vec<String>,
    /// Addition: `tags=` constraint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Addition: placement directive, `zone=NAME` or `subnet=ID` (`[cloud] subnets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
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
    /// Addition (issue 33): its capacity preference, `on-demand` (default), `spot` or
    /// `prefer-spot`.
    #[serde(default, skip_serializing_if = "crate::model::CapacityPreference::is_default")]
    pub capacity: crate::model::CapacityPreference,
}

impl MachineSpec {
    /// Every constraint it asks for.
    pub fn constraints(&self) -> crate::model::Constraints {
        crate::model::Constraints {
            zones: self.zones.clone(),
            arch: self.arch.clone(),
            cores: self.cores,
            mem_mb: self.mem_mb,
            root_disk_mb: self.root_disk_mb,
            instance_type: self.instance_type.clone(),
            spaces: self.spaces.clone(),
            tags: self.tags.clone(),
        }
    }

    /// The machine as the model reports it.
    pub fn to_machine(&self) -> crate::model::Machine {
        let mut m = crate::model::Machine::pending(self.id.as_str());
        m.life = self.life;
        m.status = self.status;
        m.instance_status = crate::model::InstanceStatus::other(self.instance_status.clone());
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
            arch: None,
            cores: None,
            mem_mb: None,
            instance_type: None,
            root_disk_mb: None,
            spaces: Vec::new(),
            tags: Vec::new(),
            placement: None,
            distribution_group: None,
            distribution_group_error: String::new(),
            keep_instance: false,
            manual: false,
            controller: false,
            capacity: crate::model::CapacityPreference::OnDemand,
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

/// `set_constraints` (an addition, issue 34): a machine's constraints change (Juju syntax, as
/// `[[machines]] constraints`); its instance is kept, and may drift.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetConstraintsSpec {
    /// The machine.
    pub machine: String,
    /// Its new constraints, e.g. `cores=4 zones=az2`.
    pub constraints: String,
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

/// `interrupt` (an addition, issue 33): the cloud warns that it takes an instance away, and
/// terminates it when the warning runs out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptSpec {
    /// The instance.
    pub instance: String,
    /// How long from the warning until the cloud takes it (EC2: two minutes).
    pub warning: Dur,
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

fault_spec! {
    /// `fail_next`: the next `times` calls of `call` fail.
    pub struct FailNextSpec {
        /// Which call.
        pub call: FailCall,
    }
}

/// `destroy_model`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyModelSpec {
    /// Skip the manual-machine check.
    #[serde(default)]
    pub force: bool,
}

impl Default for Workers {
    fn default() -> Self {
        Workers(crate::config::DEFAULT_WORKERS)
    }
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
            batch_starts: false,
            batch_size: default_batch_size(),
            spot_max_price: None,
            repair_after: None,
            repair_max_unhealthy: default_max_unhealthy(),
            replace_drifted: false,
            drift_budget: default_drift_budget(),
            mutations: crate::config::Mutations::default(),
        }
    }
}
