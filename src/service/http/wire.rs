//! The JSON bodies of the HTTP API, shared by the server and the client commands.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A machine, as `GET /v1/machines` and `machine list --json` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MachineView {
    /// Its id.
    pub id: String,
    /// `alive`, `dying` or `dead`.
    pub life: String,
    /// `pending`, `started`, `error` or `stopped`.
    pub status: String,
    /// Its instance, once provisioned.
    pub instance: Option<String>,
    /// Its instance's zone.
    pub zone: Option<String>,
    /// `provisioning`, `running`, `provisioning error`, ...
    pub instance_status: String,
    /// The latest message (the instance status's, else the machine status's).
    pub message: String,
    /// A container's type (`lxd`, `kvm`); `null` for a machine that is not a container.
    #[serde(default)]
    pub container_type: Option<String>,
    /// A container's host machine; `null` for a machine that is not a container.
    #[serde(default)]
    pub host: Option<String>,
    /// Manually provisioned (`machine add --manual`): never started or stopped by the
    /// provisioner.
    #[serde(default)]
    pub manual: bool,
    /// Its capacity preference: `on-demand`, `spot` or `prefer-spot` (issue 33).
    #[serde(default = "on_demand")]
    #[schema(pattern = "^(on-demand|spot|prefer-spot)$")]
    pub capacity: String,
    /// What its instance runs on, `spot` or `on-demand`, as recorded with the instance
    /// (`null`: no instance yet, or the cloud did not say).
    #[serde(default)]
    pub capacity_type: Option<String>,
    /// Set while the machine is unhealthy (issue 34: its instance stopped longer than the
    /// model's `repair-after`), as the provisioner's last listing showed; `null` when healthy,
    /// when repair is off, or on a replica that does not lead.
    #[serde(default)]
    pub health: Option<HealthView>,
}

/// Why a machine is unhealthy, for how long, and what its repair is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthView {
    /// Why: `stopped` (its instance stays stopped).
    pub reason: String,
    /// For how many seconds, as of the provisioner's last listing.
    pub unhealthy_for_s: u64,
    /// `repairing` (a replacement is starting or running), `due` (at the next listing),
    /// `held` (more machines unhealthy at once than `repair-max-unhealthy` allows) or `never`
    /// (a keep-instance machine).
    #[schema(pattern = "^(repairing|due|held|never)$")]
    pub repair: String,
}

fn on_demand() -> String {
    "on-demand".into()
}

impl MachineView {
    /// Whether the provisioner is done with it: provisioned, or in error.
    pub fn settled(&self) -> bool {
        (self.instance.is_some() && self.status == "started") || self.is_error()
    }
    /// Whether its start failed.
    pub fn is_error(&self) -> bool {
        self.status == "error" || self.instance_status == "provisioning error"
    }
}

/// An instance, as `GET /v1/instances` and `instance list --json` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstanceView {
    /// Its id.
    pub id: String,
    /// `pending`, `running`, `stopped` (terminated ones are not listed).
    pub state: String,
    /// Its zone.
    pub zone: Option<String>,
    /// The machine it is tagged for.
    pub machine: Option<String>,
}

/// A drifted machine, as `GET /v1/drift` and `drift --json` show it (issue 34).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DriftView {
    /// The machine.
    pub machine: String,
    /// Its recorded instance.
    pub instance: String,
    /// Why it has drifted, at least one reason.
    pub reasons: Vec<DriftReasonView>,
}

/// One reason a machine's instance has drifted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DriftReasonView {
    /// `instance-type` (a type the constraints now forbid), `image` (another image than a
    /// start uses today), `zone` (outside the zones the machine allows) or `tags` (its machine
    /// tag changed outside the provisioner).
    #[schema(pattern = "^(instance-type|zone|tags)$")]
    pub kind: String,
    /// The reason as a sentence.
    pub message: String,
}

/// `POST /v1/machines`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMachines {
    /// How many (1..=10000).
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 10000, default = 1)]
    pub count: usize,
    /// A `zones=` constraint for each (the cloud's zones: `GET /v1/status`).
    #[serde(default)]
    #[schema(min_items = 1)]
    pub zones: Option<Vec<String>>,
    /// Their constraints: a string in Juju's syntax (`"cores=4 mem=16G"`) or an object with
    /// the keys of [`ConstraintsView`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ConstraintsInput>)]
    pub constraints: Option<serde_json::Value>,
    /// A placement directive: `zone=NAME` or `subnet=ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Containers of this type (`lxd` or `kvm`) on `host`, instead of top-level machines.
    #[serde(default)]
    pub container: Option<String>,
    /// The host of the new containers (with `container`): an existing, alive machine.
    #[serde(default)]
    pub host: Option<String>,
    /// Register one manually provisioned machine at `address` (never started or stopped).
    #[serde(default)]
    pub manual: bool,
    /// The manual machine's address: an IP address or a hostname (with `manual`).
    #[serde(default)]
    pub address: Option<String>,
    /// Their capacity preference: `on-demand` (the default), `spot` (spot only: no spot
    /// capacity in any allowed zone is a provisioning error) or `prefer-spot` (spot while it
    /// can be had, else on-demand). Not for containers or manual machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(on-demand|spot|prefer-spot)$")]
    pub capacity: Option<String>,
}

impl AddMachines {
    /// `count` plain machines, each with this `zones=` constraint.
    pub fn plain(count: usize, zones: Option<Vec<String>>) -> Self {
        Self {
            count,
            zones,
            constraints: None,
            placement: None,
            container: None,
            host: None,
            manual: false,
            address: None,
            capacity: None,
        }
    }

    /// Whether the request asks for containers or a manual machine (any of their fields given).
    pub fn is_container_or_manual(&self) -> bool {
        self.container.is_some() || self.host.is_some() || self.manual || self.address.is_some()
    }
}

fn one() -> usize {
    1
}

/// The answer to `POST /v1/machines`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AddedMachines {
    /// The new machines' ids.
    pub ids: Vec<String>,
}

/// `POST /v1/machines/remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveMachines {
    /// The machines (1..=10000 ids; each counted once).
    #[schema(min_items = 1, max_items = 10000)]
    pub ids: Vec<String>,
    /// Leave their instances running (released from the model).
    #[serde(default)]
    pub keep_instance: bool,
    /// Also ask again for machines already being removed.
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/machines/retry`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryMachines {
    /// The machines (each in provisioning error; 1..=10000 ids; no container: containers have no
    /// retry).
    #[schema(min_items = 1, max_items = 10000, value_type = Vec<TopLevelId>)]
    pub ids: Vec<String>,
}

/// `PUT /v1/machines/{id}/constraints`: the machine's new constraints, replacing all it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetConstraints {
    /// The constraints in Juju's syntax (`"cores=4 mem=8G"`), checked as `POST /v1/machines`
    /// checks them (zones among the cloud's); `""` clears them.
    #[schema(example = "cores=4 mem=8G")]
    pub constraints: String,
}

/// A model setting: `GET /v1/config/{key}`, and the body of `PUT` (`key` ignored there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigValue {
    /// `harvest-mode`, `workers`, `repair-after`, `repair-max-unhealthy`, `replace-drifted` or
    /// `drift-budget`.
    #[serde(default)]
    pub key: String,
    /// Its value, as text: a harvest mode (`none`, `unknown`, `destroyed`, `all`, any case) for
    /// `harvest-mode`, a whole number 1..=100 (digits only) for `workers`, a duration (`10m`,
    /// `1h 30m`) or `off` for `repair-after`, a count or a percentage (`3`, `20%`) for
    /// `repair-max-unhealthy`, `true` or `false` for `replace-drifted`, a whole number (1 or
    /// more) for `drift-budget`. A value of the right shape for another key is a 400 naming it.
    #[schema(
        pattern = r"^\s*([Nn][Oo][Nn][Ee]|[Uu][Nn][Kk][Nn][Oo][Ww][Nn]|[Dd][Ee][Ss][Tt][Rr][Oo][Yy][Ee][Dd]|[Aa][Ll][Ll]|[0-9]+%?|off|true|false|[0-9]+[a-z]+( [0-9]+[a-z]+)*)\s*$"
    )]
    pub value: String,
}

/// `POST /v1/destroy-model`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DestroyRequest {
    /// Do not fail on machines that cannot be destroyed.
    #[serde(default)]
    pub force: bool,
}

/// What a model destruction set in motion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DestroyView {
    /// Instances being stopped.
    pub stopping: Vec<String>,
    /// Machines whose start is in flight: their instances are stopped as they land.
    pub awaiting_starts: Vec<String>,
    /// Manually provisioned machines left as they are (`destroy-model --force`; without it
    /// they refuse the destruction).
    #[serde(default)]
    pub manual_machines: Vec<String>,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StatusView {
    /// The model's uuid (tagged on its instances).
    pub model_uuid: String,
    /// `alive` or `dying`.
    pub model_life: String,
    /// `sim`.
    pub broker: String,
    /// The cloud's zones.
    pub zones: Vec<String>,
    /// The harvest mode in force.
    pub harvest_mode: String,
    /// The worker pool size.
    pub workers: usize,
    /// Machines in the model.
    pub machines: usize,
    /// Machines by status.
    pub machines_by_status: BTreeMap<String, usize>,
    /// Machines in provisioning error.
    pub machines_in_error: usize,
    /// The cloud's live instances of this model; `null` when the cloud could not be listed
    /// (`instances_error` says why).
    pub instances: Option<usize>,
    /// Why the cloud could not be listed (absent when it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances_error: Option<String>,
    /// Start and stop jobs running.
    pub jobs_in_flight: usize,
    /// Start and stop jobs waiting for a worker.
    pub jobs_queued: usize,
    /// Broker calls in flight.
    pub broker_calls_in_flight: usize,
    /// Whether the provisioner has nothing left to do.
    pub idle: bool,
    /// Seconds since the service started.
    pub uptime_s: f64,
    /// With replicas on PostgreSQL: `leader` or `follower`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// With replicas: the lease holder's replica id (absent while nobody is known to hold it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// With replicas: the lease's epoch (grows at each transition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// With replicas: this replica's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// With replicas: this replica's last change of role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<TransitionView>,
    /// With replicas: this replica's changes of role so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transitions: Option<u64>,
    /// With replicas: how many models this replica leads now, all models together (the same
    /// in every model's status; the models' leaders are spread over the replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_led: Option<usize>,
}

/// A replica's change of role, as the status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TransitionView {
    /// The role before.
    pub from: String,
    /// The role after.
    pub to: String,
    /// Why: `acquired`, `refused`, `renew_deadline`, `released`.
    pub why: String,
    /// How long ago.
    pub seconds_ago: f64,
}

/// Constraints as a request gives them (`constraints` of `POST /v1/machines` and
/// `POST /v1/applications`): a string in Juju's syntax or an object. Only the OpenAPI
/// document uses this type; the handlers read the JSON value as it comes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ConstraintsInput {
    /// Juju's syntax: `cores=4 mem=16G zones=az1,az2` (keys `arch`, `cores`, `mem`,
    /// `root-disk`, `instance-type`, `zones`, `spaces`, `tags`; sizes with `M`, `G`, `T`, MiB
    /// when bare).
    Text(String),
    /// The keys of `machine show --json`'s `constraints`.
    Object(ConstraintsView),
}

/// The id of a machine that is not a container (no `/`). Only the OpenAPI document uses
/// this type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(pattern = "^[^/]*$")]
pub struct TopLevelId(pub String);

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// One sentence.
    pub error: String,
}

/// A machine's (or an application's) constraints as JSON: every key, absent ones `null`
/// (sizes in MiB). Also what `POST /v1/machines` and `POST /v1/applications` take as an object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstraintsView {
    /// `arch=`.
    #[serde(default)]
    pub arch: Option<String>,
    /// `cores=`.
    #[serde(default)]
    pub cores: Option<u32>,
    /// `mem=`, in MiB.
    #[serde(default)]
    pub mem_mb: Option<u64>,
    /// `root-disk=`, in MiB.
    #[serde(default)]
    pub root_disk_mb: Option<u64>,
    /// `instance-type=`.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// `zones=`.
    #[serde(default)]
    pub zones: Option<Vec<String>>,
    /// `spaces=` (`^space`: not in it).
    #[serde(default)]
    pub spaces: Option<Vec<String>>,
    /// `tags=` (`^tag`: without it).
    #[serde(default)]
    pub tags: Option<Vec<String>>,
}

impl From<&crate::model::Constraints> for ConstraintsView {
    fn from(c: &crate::model::Constraints) -> Self {
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        Self {
            arch: c.arch.clone(),
            cores: c.cores,
            mem_mb: c.mem_mb,
            root_disk_mb: c.root_disk_mb,
            instance_type: c.instance_type.clone(),
            zones: c.zones.clone(),
            spaces: list(&c.spaces),
            tags: list(&c.tags),
        }
    }
}

impl From<ConstraintsView> for crate::model::Constraints {
    fn from(v: ConstraintsView) -> Self {
        Self {
            zones: v.zones,
            arch: v.arch,
            mem_mb: v.mem_mb,
            cores: v.cores,
            root_disk_mb: v.root_disk_mb,
            instance_type: v.instance_type,
            spaces: v.spaces.unwrap_or_default(),
            tags: v.tags.unwrap_or_default(),
        }
    }
}

/// One machine with everything the store holds for it: `GET /v1/machines/{id}` and
/// `machine show --json` (the keys of [`MachineView`] and more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MachineDetail {
    /// What `machine list` shows.
    #[serde(flatten)]
    pub machine: MachineView,
    /// Every constraint (absent ones `null`).
    pub constraints: ConstraintsView,
    /// The constraints in Juju's syntax (`""`: none).
    pub constraints_text: String,
    /// Its placement directive (`zone=az2`, `subnet=...`).
    pub placement: Option<String>,
    /// The application whose unit it hosts.
    pub application: Option<String>,
    /// A manual machine's address, `null` for others.
    pub address: Option<String>,
    /// The machine status's message.
    pub status_message: String,
    /// The instance status's message.
    pub instance_status_message: String,
    /// Its instance is left running when it is removed.
    pub keep_instance: bool,
    /// Marked for another start (`machine retry`), not yet picked up.
    pub retry_requested: bool,
    /// When the store last changed it (UTC, RFC 3339).
    pub changed_at: Option<String>,
    /// How many start attempts the provisioner made for it (each failed attempt it reported,
    /// and the one that recorded its instance).
    #[serde(default)]
    pub start_attempts: u64,
    /// The last attempt's error (`null`: no attempt yet, or it succeeded).
    #[serde(default)]
    pub last_error: Option<String>,
}

/// `POST /v1/applications`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddApplication {
    /// Its name (Juju's rule: lowercase letters, digits and hyphens, starting with a letter).
    #[schema(pattern = r"^[a-z][a-z0-9]*(-[a-z0-9]*[a-z][a-z0-9]*)*$")]
    pub name: String,
    /// How many units, each on a new machine (1..=10000).
    #[schema(minimum = 1, maximum = 10000)]
    pub units: usize,
    /// Their constraints, as in [`AddMachines::constraints`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ConstraintsInput>)]
    pub constraints: Option<serde_json::Value>,
    /// Their capacity preference, as in [`AddMachines::capacity`]: every unit's machine has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(on-demand|spot|prefer-spot)$")]
    pub capacity: Option<String>,
}

/// An application: `GET /v1/applications`, `application list --json`; the answer to `POST`
/// (201) and `DELETE /v1/applications/{name}` (the machines it added or took to dead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApplicationView {
    /// Its name.
    pub name: String,
    /// Its units (one machine each).
    pub units: usize,
    /// The machines hosting them (not dead ones), in id order.
    pub machines: Vec<String>,
    /// Its constraints (absent ones `null`).
    pub constraints: ConstraintsView,
    /// Its units' capacity preference: `on-demand`, `spot` or `prefer-spot` (issue 33).
    #[serde(default = "on_demand")]
    #[schema(pattern = "^(on-demand|spot|prefer-spot)$")]
    pub capacity: String,
}

/// `POST /v1/tokens`: the new token's scope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// A read-only token (every change refused with 403); else an admin token.
    #[serde(default)]
    pub read_only: bool,
    /// The one model it may use (`null`: every model, and the service's own routes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// What a token may do: `admin` (everything) or `read-only` (reads only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum TokenScope {
    /// Everything, token management included.
    #[serde(rename = "admin")]
    Admin,
    /// Reads (`GET`) only.
    #[serde(rename = "read-only")]
    ReadOnly,
}

/// A new token: shown once, in this answer (the service keeps only its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// Its id (`tok-N`): what `token list`, `token revoke` and the audit log name.
    pub id: String,
    /// What it may do.
    pub scope: TokenScope,
    /// The token itself (64 hex digits): send it as `Authorization: Bearer TOKEN`.
    pub token: String,
    /// The one model it may use (left out: every model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A created token as `GET /v1/tokens` lists it: never the token, never its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    /// Its id (`tok-N`).
    pub id: String,
    /// What it may do.
    pub scope: TokenScope,
    /// When it was created (RFC 3339, UTC).
    pub created: String,
    /// When it was revoked (RFC 3339, UTC); `null` while it is valid.
    pub revoked: Option<String>,
    /// The one model it may use (left out: every model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `POST /v1/models`: a new model and its cloud (a setting left out is the service's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddModel {
    /// Its name: 1 to 63 lowercase letters, digits and hyphens, starting with a letter or
    /// digit and not ending with a hyphen (Juju's rule).
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")]
    pub name: String,
    /// `sim`, `ec2` or `lxd` (default: the service's `--broker`).
    #[serde(default)]
    pub broker: Option<String>,
    /// The simulated cloud's zones (sim; default: the service's `--sim-zones`).
    #[serde(default)]
    pub zones: Option<Vec<String>>,
    /// The simulated account whose request limits it shares with the other models on it (sim;
    /// default `default`).
    #[serde(default)]
    pub account: Option<String>,
    /// EC2's region (ec2).
    #[serde(default)]
    pub region: Option<String>,
    /// EC2's endpoint (ec2).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// EC2's image id (ec2).
    #[serde(default)]
    pub image: Option<String>,
    /// LXD's settings (lxd; each one left out is the service's `--lxd-...`; files on the
    /// service's host).
    #[serde(default)]
    pub lxd: Option<crate::service::settings::LxdSettings>,
}

/// A model, as `GET /v1/models` and `model list --json` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelView {
    /// Its name.
    pub name: String,
    /// `alive`, or `dying` (its destruction under way: it is removed once its instances are
    /// gone).
    pub life: String,
    /// How many machines it has (`null` when it does not run here: see `show`'s `error`).
    pub machines: Option<u64>,
    /// The replica whose provisioners run it (with replicas on PostgreSQL; `null` otherwise).
    pub leader: Option<String>,
    /// The leader's epoch (with replicas on PostgreSQL; `null` otherwise).
    pub epoch: Option<i64>,
}

/// `GET /v1/models/{model}` and `model show --json`: the list's keys and the model's cloud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelDetail {
    /// Its name.
    pub name: String,
    /// `alive` or `dying`.
    pub life: String,
    /// How many machines it has.
    pub machines: Option<u64>,
    /// The leading replica (replicas on PostgreSQL).
    pub leader: Option<String>,
    /// The leader's epoch (replicas on PostgreSQL).
    pub epoch: Option<i64>,
    /// Its uuid.
    pub uuid: Option<String>,
    /// `sim`, `ec2` or `lxd`.
    pub broker: String,
    /// Its cloud's zones.
    pub zones: Vec<String>,
    /// The simulated account (sim).
    pub account: Option<String>,
    /// EC2's region (ec2).
    pub region: Option<String>,
    /// EC2's endpoint (ec2).
    pub endpoint: Option<String>,
    /// EC2's image id (ec2).
    pub image: Option<String>,
    /// The model's own LXD settings (lxd; `null`: the service's).
    #[serde(default)]
    pub lxd: Option<crate::service::settings::LxdSettings>,
    /// Why it does not run here, if it does not (its store could not be opened).
    pub error: Option<String>,
    /// The starts its simulated account refused as throttled, all the account's models
    /// together (with `--sim-account-start-rate`; `null` otherwise).
    #[serde(default)]
    pub account_throttled: Option<u64>,
}
