//! Vocabulary shared by every actor: identifiers, lives, statuses, constraints, the harvest
//! mode and the cloud's view of an instance.
//!
//! Everything here is plain data (no actix), cheap to clone and ordered, so that maps keyed by
//! these types iterate in a fixed order and a seed reproduces a run exactly.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Errors from parsing the textual forms of the types in this module.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// A harvest mode other than `none`, `unknown`, `destroyed` or `all`.
    #[error("invalid harvest mode {0:?}: expected one of none, unknown, destroyed, all")]
    HarvestMode(String),
    /// A life other than `alive`, `dying` or `dead`.
    #[error("invalid life {0:?}: expected one of alive, dying, dead")]
    Life(String),
    /// A machine status other than `pending`, `started`, `error` or `stopped`.
    #[error("invalid machine status {0:?}: expected one of pending, started, error, stopped")]
    MachineStatus(String),
    /// An instance state other than `pending`, `running`, `stopped` or `terminated`.
    #[error("invalid instance state {0:?}: expected one of pending, running, stopped, terminated")]
    InstanceState(String),
}

/// The sort key of an id: its length in the top byte, then its first seven bytes. Keys
/// order ids shortlex (shorter first, then bytewise); ids longer than seven bytes with equal
/// keys are then compared in full.
#[inline]
fn sort_key(s: &str) -> u64 {
    let b = s.as_bytes();
    let head = b.iter().take(7).fold(0u64, |x, &c| (x << 8) | u64::from(c)) << (8 * (7 - b.len().min(7)));
    ((b.len().min(255) as u64) << 56) | head
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Shared, immutable text: cloning is a reference-count bump, which matters when every
        /// actor keeps the ids of 100,000 machines. Ordered shortlex (shorter first, then
        /// bytewise), so numeric ids sort numerically ("2" before "10"), through a precomputed
        /// integer key: a map lookup compares integers, not strings.
        #[derive(Clone)]
        pub struct $name {
            key: u64,
            text: std::sync::Arc<str>,
        }

        impl $name {
            /// Wraps an identifier.
            pub fn new(id: impl AsRef<str>) -> Self {
                Self::from_arc(std::sync::Arc::from(id.as_ref()))
            }
            fn from_arc(text: std::sync::Arc<str>) -> Self {
                Self { key: sort_key(&text), text }
            }
            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.text
            }
            /// The integer the order starts with: ids with different keys are ordered by their
            /// keys; ids with equal keys (only ids longer than seven bytes share one) by their
            /// text. A sort by this key (an integer sort) and then of each run of equal keys
            /// orders ids as [`Ord`] does.
            pub fn sort_key(&self) -> u64 {
                self.key
            }
        }
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.key == other.key && self.text == other.text
            }
        }
        impl Eq for $name {}
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.text.hash(state);
            }
        }
        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.key.cmp(&other.key).then_with(|| {
                    if self.text.len() > 7 {
                        self.text.as_bytes().cmp(other.text.as_bytes())
                    } else {
                        std::cmp::Ordering::Equal
                    }
                })
            }
        }
        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.text)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.text)
            }
        }
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.text)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Ok(Self::from(String::deserialize(d)?))
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self::from_arc(std::sync::Arc::from(s))
            }
        }
    };
}

string_id!(
    /// A machine's id in the model: `"3"` for a top-level machine, `"0/lxd/1"` for a container.
    MachineId
);
string_id!(
    /// A cloud instance id, as the broker names it.
    InstanceId
);

impl MachineId {
    /// For a container id `HOST/TYPE/N`, its host id and container type; `None` for a
    /// top-level machine.
    pub fn container_of(&self) -> Option<(MachineId, &str)> {
        let mut parts = self.text.rsplitn(3, '/');
        let _n = parts.next()?;
        let kind = parts.next()?;
        let host = parts.next()?;
        Some((MachineId::new(host), kind))
    }

    /// Whether this is a container (`HOST/TYPE/N`).
    pub fn is_container(&self) -> bool {
        self.text.contains('/')
    }

    /// The Juju-style tag of the machine, used in nonces: `machine-3`, `machine-0-lxd-1`.
    pub fn tag(&self) -> String {
        format!("machine-{}", self.text.replace('/', "-"))
    }
}

/// The life of a machine or of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Life {
    /// In service.
    #[default]
    Alive,
    /// Being destroyed; waits to become dead.
    Dying,
    /// Done; its instance may be stopped and its record removed.
    Dead,
}

impl Life {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Life::Alive => "alive",
            Life::Dying => "dying",
            Life::Dead => "dead",
        }
    }
}

impl fmt::Display for Life {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Life {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "alive" => Ok(Life::Alive),
            "dying" => Ok(Life::Dying),
            "dead" => Ok(Life::Dead),
            other => Err(ParseError::Life(other.to_owned())),
        }
    }
}

/// The machine (agent) status the provisioner reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MachineStatus {
    /// Waiting for an instance.
    #[default]
    Pending,
    /// The machine agent runs.
    Started,
    /// Something failed; the provisioner skips the machine until the status is reset.
    Error,
    /// The machine agent is stopped.
    Stopped,
}

impl MachineStatus {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineStatus::Pending => "pending",
            MachineStatus::Started => "started",
            MachineStatus::Error => "error",
            MachineStatus::Stopped => "stopped",
        }
    }
}

impl fmt::Display for MachineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MachineStatus {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(MachineStatus::Pending),
            "started" => Ok(MachineStatus::Started),
            "error" => Ok(MachineStatus::Error),
            "stopped" => Ok(MachineStatus::Stopped),
            other => Err(ParseError::MachineStatus(other.to_owned())),
        }
    }
}

/// The instance status of a machine: free text in Juju, with a few values the provisioner
/// itself writes or reads. Kept as a string so that any status a cloud reports round-trips.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct InstanceStatus(std::borrow::Cow<'static, str>);

impl InstanceStatus {
    /// No instance status yet (`""`).
    pub fn empty() -> Self {
        Self::from_static("")
    }
    /// `provisioning`: a start is under way.
    pub fn provisioning() -> Self {
        Self::from_static("provisioning")
    }
    /// `provisioning error`: the start failed for good; the message says why.
    pub fn provisioning_error() -> Self {
        Self::from_static("provisioning error")
    }
    /// `running`.
    pub fn running() -> Self {
        Self::from_static("running")
    }
    /// A status known at compile time (no allocation).
    pub fn from_static(s: &'static str) -> Self {
        Self(std::borrow::Cow::Borrowed(s))
    }
    /// Any other value, e.g. `stopped` for an instance stopped outside our control.
    pub fn other(s: impl Into<String>) -> Self {
        Self(std::borrow::Cow::Owned(s.into()))
    }
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Whether this is `provisioning`.
    pub fn is_provisioning(&self) -> bool {
        self.0 == "provisioning"
    }
    /// Whether this is `provisioning error` (or Juju's older `error`).
    pub fn is_error(&self) -> bool {
        self.0 == "provisioning error" || self.0 == "error"
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for InstanceStatus {
    fn from(s: &str) -> Self {
        Self::other(s)
    }
}

/// What the provisioner does with instances it does not need (Juju's `provisioner-harvest-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HarvestMode {
    /// Stop nothing.
    None,
    /// Stop instances of ours that no live machine owns.
    Unknown,
    /// Stop the instances of dead machines (the default).
    #[default]
    Destroyed,
    /// Both `unknown` and `destroyed`.
    All,
}

impl HarvestMode {
    /// Whether unknown instances are stopped.
    pub fn harvests_unknown(self) -> bool {
        matches!(self, HarvestMode::Unknown | HarvestMode::All)
    }
    /// Whether dead machines' instances are stopped.
    pub fn harvests_destroyed(self) -> bool {
        matches!(self, HarvestMode::Destroyed | HarvestMode::All)
    }
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            HarvestMode::None => "none",
            HarvestMode::Unknown => "unknown",
            HarvestMode::Destroyed => "destroyed",
            HarvestMode::All => "all",
        }
    }
}

impl fmt::Display for HarvestMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HarvestMode {
    type Err = ParseError;
    /// Case-insensitive, as Juju parses it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(HarvestMode::None),
            "unknown" => Ok(HarvestMode::Unknown),
            "destroyed" => Ok(HarvestMode::Destroyed),
            "all" => Ok(HarvestMode::All),
            _ => Err(ParseError::HarvestMode(s.to_owned())),
        }
    }
}

/// Hardware and placement constraints of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Constraints {
    /// `zones=`: the machine may only be placed in one of these zones.
    pub zones: Option<Vec<String>>,
    /// `arch=`; `amd64` when absent.
    pub arch: Option<String>,
    /// `mem=` in MiB.
    pub mem_mb: Option<u64>,
    /// `cores=`.
    pub cores: Option<u32>,
    /// `root-disk=` in MiB.
    pub root_disk_mb: Option<u64>,
    /// `instance-type=`.
    pub instance_type: Option<String>,
    /// `spaces=`.
    pub spaces: Vec<String>,
    /// `tags=`: instance tags the machine needs (`^tag`: one it must not have). Left out of
    /// serialisations when empty, so that data written before it existed reads the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Constraints {
    /// What is asked of the cloud, zones aside: machines with one shape compete for the same
    /// capacity (a zone out of capacity for one is, for a while, out of capacity for all).
    pub fn shape(&self) -> String {
        use std::fmt::Write;
        let arch = self.arch_or_default();
        let mut s = String::with_capacity(5 + arch.len());
        s.push_str("arch=");
        s.push_str(arch);
        if let Some(t) = &self.instance_type {
            s.push_str(" instance-type=");
            s.push_str(t);
        }
        // Writing to a String cannot fail.
        if let Some(c) = self.cores {
            let _ = write!(s, " cores={c}");
        }
        if let Some(m) = self.mem_mb {
            let _ = write!(s, " mem={m}M");
        }
        if let Some(m) = self.root_disk_mb {
            let _ = write!(s, " root-disk={m}M");
        }
        // Only when given: machines without tags keep the shape they always had.
        if !self.tags.is_empty() {
            s.push_str(" tags=");
            s.push_str(&self.tags.join(","));
        }
        s
    }

    /// The architecture to start, `amd64` by default (as Juju looks tools up).
    pub fn arch_or_default(&self) -> &str {
        self.arch.as_deref().unwrap_or("amd64")
    }
}

/// A machine as the model API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// Its id.
    pub id: MachineId,
    /// Its life.
    pub life: Life,
    /// Its (agent) status.
    pub status: MachineStatus,
    /// Its instance status.
    pub instance_status: InstanceStatus,
    /// The instance recorded for it, if provisioned.
    pub instance: Option<InstanceId>,
    /// On death, leave the instance alone.
    pub keep_instance: bool,
    /// Manually provisioned: never started or stopped by the provisioner.
    pub manual: bool,
    /// A controller machine.
    pub controller: bool,
}

impl Machine {
    /// A new alive, pending, unprovisioned machine.
    pub fn pending(id: impl Into<MachineId>) -> Self {
        Self {
            id: id.into(),
            life: Life::Alive,
            status: MachineStatus::Pending,
            instance_status: InstanceStatus::empty(),
            instance: None,
            keep_instance: false,
            manual: false,
            controller: false,
        }
    }
}

/// A volume to create with the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeParams {
    /// Volume tag, e.g. `volume-0`.
    pub tag: String,
    /// Size in MiB.
    pub size_mb: u64,
    /// Storage provider, e.g. `static`, `ebs`.
    pub provider: String,
}

/// Everything the provisioner needs to start a machine, read from the model in one batched call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProvisioningInfo {
    /// Constraints, including `zones=`.
    pub constraints: Constraints,
    /// Placement directive, e.g. `zone=az1`.
    pub placement: Option<String>,
    /// Volumes to create.
    pub volumes: Vec<VolumeParams>,
    /// Extra instance tags.
    pub tags: std::collections::BTreeMap<String, String>,
    /// Its capacity preference (issue 33): `on-demand` (the default, left out of
    /// serialisations so that data written before it existed reads the same), `spot` or
    /// `prefer-spot`.
    #[serde(default, skip_serializing_if = "crate::model::CapacityPreference::is_default")]
    pub capacity: crate::model::CapacityPreference,
    /// The trace context (W3C `traceparent`) of the request that added it (issue 37), when
    /// that request was traced: its start's spans join that trace, on whichever replica starts
    /// it. See [`crate::trace`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
    /// For a container, its host's trace context: the container's start is linked to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_trace_parent: Option<String>,
}

/// What a machine asks of the allocator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneRequest {
    /// `zones=` constraint.
    pub allowed: Option<Vec<String>>,
    /// Zones derived from placement or volumes; non-empty = only these.
    pub derived: Vec<String>,
    /// The other machines of its distribution group; `None` = count every machine.
    pub group: Option<Vec<MachineId>>,
    /// What it asks the cloud for, zones aside (see [`Constraints::shape`]): machines of one
    /// shape share the capacity memory. `None` = no memory.
    ///
    /// [`Constraints::shape`]: Constraints::shape
    pub shape: Option<String>,
}

impl ZoneRequest {
    /// What a start asks of the allocator: its `zones=` constraint, the zones derived from its
    /// placement or volumes, its distribution group (empty = none) and its shape. The one
    /// place a start's request is built (the pool's start and `provisioner plan` both use it).
    pub fn for_start(info: &ProvisioningInfo, group: &[MachineId], derived: Vec<String>) -> Self {
        Self {
            allowed: info.constraints.zones.clone(),
            derived,
            group: (!group.is_empty()).then(|| group.to_vec()),
            shape: Some(info.constraints.shape()),
        }
    }
}

/// A dead machine's clean instance, parked for reuse (machine reuse, opt-in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reusable {
    /// The instance.
    pub instance: InstanceId,
    /// Its zone.
    pub zone: Option<String>,
    /// The constraints it was started with (a new machine must ask for the same).
    pub constraints: Constraints,
}

impl Reusable {
    /// Whether a machine with these constraints, zone constraint and derived zones may take it.
    pub fn fits(&self, constraints: &Constraints, derived: &[String]) -> bool {
        let same = Constraints { zones: None, ..self.constraints.clone() }
            == Constraints { zones: None, ..constraints.clone() };
        let zone_ok = |allowed: &[String]| self.zone.as_ref().is_some_and(|z| allowed.contains(z));
        same && constraints.zones.as_deref().is_none_or(zone_ok) && (derived.is_empty() || zone_ok(derived))
    }
}

/// An instance's state as the cloud reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Being created (exists, tagged).
    Pending,
    /// Up.
    Running,
    /// Stopped or suspended outside the provisioner's control.
    Stopped,
    /// Gone for good.
    Terminated,
}

impl InstanceState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
            InstanceState::Terminated => "terminated",
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstanceState {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(InstanceState::Pending),
            "running" => Ok(InstanceState::Running),
            "stopped" => Ok(InstanceState::Stopped),
            "terminated" => Ok(InstanceState::Terminated),
            other => Err(ParseError::InstanceState(other.to_owned())),
        }
    }
}

/// The tags that identify an instance as ours: which model, which machine, which start.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InstanceTags {
    /// The model's uuid; instances without ours are invisible to the provisioner.
    pub model: Option<String>,
    /// The machine the instance was started for.
    pub machine: Option<MachineId>,
    /// The start (nonce) that produced it.
    pub start: Option<String>,
}

/// What a hand-over's replacement start's nonce says after the host's tag (issue 33).
const REPLACES: &str = ":replaces:";

impl InstanceTags {
    /// The nonce of the start that replaces `interrupted` (a spot hand-over, issue 33):
    /// `HOST_TAG:replaces:INSTANCE`, the same whichever provisioner makes it and however often,
    /// so that a start repeated after a crash or a leader's fail-over sends the same client
    /// token (the cloud answers the instance it made then, not a second one), and so that the
    /// replacement found in a listing names the instance it replaces
    /// ([`InstanceTags::replaces`]).
    pub fn replacement_nonce(host_tag: &str, interrupted: &InstanceId) -> String {
        let mut nonce = String::with_capacity(host_tag.len() + REPLACES.len() + interrupted.as_str().len());
        nonce.push_str(host_tag);
        nonce.push_str(REPLACES);
        nonce.push_str(interrupted.as_str());
        nonce
    }

    /// The instance this one was started to replace, if its start was a hand-over's
    /// ([`InstanceTags::replacement_nonce`]).
    pub fn replaces(&self) -> Option<&str> {
        self.start.as_deref()?.split_once(REPLACES).map(|(_, id)| id)
    }
}

/// One instance in the cloud's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudInstance {
    /// Its id.
    pub id: InstanceId,
    /// Its state.
    pub state: InstanceState,
    /// Its availability zone, if the cloud has zones.
    pub zone: Option<String>,
    /// Its identity tags.
    pub tags: InstanceTags,
    /// How long before this answer it was launched, when the cloud says (EC2 `LaunchTime`).
    /// Harvests spare an unknown instance younger than their grace period; one whose age is
    /// not known is aged from the moment it was first listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<std::time::Duration>,
    /// Its instance type, when the cloud says (EC2 `InstanceType`; the simulated clouds when
    /// the machine's constraints chose one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// The capacity it runs on, when the cloud says (issue 33): `spot` or `on-demand`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<crate::model::CapacityType>,
    /// The image it was started from, when the cloud says (issue 34: EC2 `ImageId`, LXD's
    /// `volatile.base_image` fingerprint, the simulated clouds' image at its start), in the form
    /// [`crate::ports::Broker::current_image`] answers; another than today's is drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl CloudInstance {
    /// An instance with these identity tags, in `state`, of which the cloud says nothing else
    /// (no zone, age, type, capacity type or image).
    pub fn tagged(id: InstanceId, state: InstanceState, tags: InstanceTags) -> Self {
        Self { id, state, zone: None, tags, age: None, instance_type: None, capacity_type: None, image: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harvest_mode_parses_case_insensitively_and_rejects_others() {
        assert_eq!("ALL".parse::<HarvestMode>(), Ok(HarvestMode::All));
        assert_eq!("none".parse::<HarvestMode>(), Ok(HarvestMode::None));
        let err = "sometimes".parse::<HarvestMode>().unwrap_err();
        assert!(err.to_string().contains("sometimes"));
        assert_eq!(HarvestMode::default(), HarvestMode::Destroyed);
    }

    #[test]
    fn harvest_mode_bits_match_juju() {
        assert!(!HarvestMode::None.harvests_unknown() && !HarvestMode::None.harvests_destroyed());
        assert!(HarvestMode::Unknown.harvests_unknown() && !HarvestMode::Unknown.harvests_destroyed());
        assert!(!HarvestMode::Destroyed.harvests_unknown() && HarvestMode::Destroyed.harvests_destroyed());
        assert!(HarvestMode::All.harvests_unknown() && HarvestMode::All.harvests_destroyed());
    }

    #[test]
    fn ids_sort_shortlex_so_numbers_sort_numerically() {
        let mut ids: Vec<MachineId> = ["10", "9", "2", "0/lxd/10", "0/lxd/9", "100", "12345678", "12345679"]
            .into_iter()
            .map(MachineId::from)
            .collect();
        ids.sort();
        let sorted: Vec<&str> = ids.iter().map(MachineId::as_str).collect();
        assert_eq!(sorted, ["2", "9", "10", "100", "0/lxd/9", "0/lxd/10", "12345678", "12345679"]);
        assert_eq!(MachineId::new("0/lxd/10"), MachineId::from("0/lxd/10".to_string()));
        assert_ne!(MachineId::new("12345678"), MachineId::new("12345679"));
    }

    #[test]
    fn container_ids_split_into_host_and_type() {
        let c = MachineId::new("0/lxd/1");
        assert_eq!(c.container_of(), Some((MachineId::new("0"), "lxd")));
        assert!(c.is_container());
        assert_eq!(MachineId::new("3").container_of(), None);
        assert_eq!(c.tag(), "machine-0-lxd-1");
    }

    #[test]
    fn shape_is_the_constraints_but_zones() {
        let mut c = Constraints { zones: Some(vec!["az1".into()]), ..Constraints::default() };
        assert_eq!(c.shape(), "arch=amd64");
        let other_zone = Constraints { zones: Some(vec!["az2".into()]), ..c.clone() };
        assert_eq!(other_zone.shape(), c.shape(), "zones are not part of the shape");
        c.instance_type = Some("m5.large".into());
        c.cores = Some(2);
        c.mem_mb = Some(8192);
        c.root_disk_mb = Some(10240);
        assert_eq!(c.shape(), "arch=amd64 instance-type=m5.large cores=2 mem=8192M root-disk=10240M");
        c.tags = vec!["ssd".into(), "^gpu".into()];
        assert_eq!(c.shape(), "arch=amd64 instance-type=m5.large cores=2 mem=8192M root-disk=10240M tags=ssd,^gpu");
    }
}

/// A dead machine, with what harvesting needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadMachine {
    /// The machine.
    pub id: MachineId,
    /// Its instance, if provisioned.
    pub instance: Option<InstanceId>,
    /// Leave the instance alone.
    pub keep_instance: bool,
    /// Manually provisioned: never stopped.
    pub manual: bool,
    /// Other live instances tagged for it that nobody owns (a start whose result was lost):
    /// they share the machine's fate.
    pub tagged: Vec<InstanceId>,
    /// Its instance, if it is clean enough to be reused (known constraints, running, the
    /// machine not in error).
    pub reusable: Option<crate::model::Reusable>,
}

impl DeadMachine {
    /// The dead-machine view of a cached machine (no stray tagged instances).
    pub fn of(m: &Machine) -> Self {
        Self {
            id: m.id.clone(),
            instance: m.instance.clone(),
            keep_instance: m.keep_instance,
            manual: m.manual,
            tagged: Vec::new(),
            reusable: None,
        }
    }

    /// The same machine owning `instance` too: as its recorded instance if it has none, else
    /// among its tagged ones (unless it is one of its instances already).
    pub fn with_instance(mut self, instance: InstanceId) -> Self {
        match &self.instance {
            None => self.instance = Some(instance),
            Some(own) if *own == instance || self.tagged.contains(&instance) => {}
            Some(_) => self.tagged.push(instance),
        }
        self
    }

    /// Every instance of the machine: the recorded one, then the stray tagged ones.
    pub fn instances(&self) -> impl Iterator<Item = &InstanceId> {
        self.instance.iter().chain(self.tagged.iter().filter(move |t| Some(*t) != self.instance.as_ref()))
    }
}

/// Why the allocator chose no zone (here, not in the allocator's folder, because a failed
/// start carries it: the workers' error has it as its source).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ZoneError {
    /// Every zone is excluded by constraints, derived zones, failures or availability.
    #[error("suitable availability zone for machine {0} not found")]
    NoSuitableZone(MachineId),
}

/// What a zone-specific failure leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Another eligible zone is left untried this round: fail over now.
    TryAnotherZone,
    /// Every eligible zone failed: the marks were cleared; a round is used.
    RoundExhausted,
}
