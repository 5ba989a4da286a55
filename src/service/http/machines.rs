//! `/v1/machines`: add (top-level machines with constraints and placement, containers on a
//! host, or a manual machine), list (filters and pages), show, remove, retry, and a change of
//! one machine's constraints. The checks are plain functions (unit-tested below): what the
//! cloud offers ([`CloudShape`]) that constraints, zones and placement are checked against;
//! what a request for containers or a manual machine means, field by field
//! ([`container_or_manual`]), before the store checks what only it knows (the host exists and
//! is alive, the address is not already a machine's). A refused request writes nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::auth::{note, Authorized};
use super::body::json_body;
use super::errors::{ApiError, Result};
use super::target::State;
use super::wire::{
    AddMachines, AddedMachines, ConstraintsView, ErrorBody, HealthView, MachineDetail, MachineView, RemoveMachines,
    RetryMachines, SetConstraints,
};
use crate::model::{check_application_name, Constraints, MachineId, MachineStatus, Placement};
use crate::service::audit::list_summary;
use crate::service::runtime::ModelRuntime;
use crate::service::store::{MachineRecord, NewMachine, StoreError};

/// The most machines one `POST /v1/machines` may add.
pub(crate) const MAX_ADD: usize = 10_000;
/// The most machine ids one removal or retry may name.
pub(crate) const MAX_IDS: usize = 10_000;

/// What the cloud offers that a request is checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CloudShape {
    /// Its zones (available or not).
    pub zones: Vec<String>,
    /// Its subnets and their zones, where known (`None`: any subnet is the broker's to judge).
    pub subnets: Option<BTreeMap<String, Vec<String>>>,
}

impl CloudShape {
    fn check_zone(&self, field: &str, zone: &str) -> Result<()> {
        if self.zones.is_empty() {
            return Err(ApiError::bad_request(format!("{field}: this cloud has no availability zones")));
        }
        if !self.zones.iter().any(|z| z == zone) {
            return Err(ApiError::bad_request(format!(
                "{field}: unknown zone {zone:?}: this cloud's zones are {}",
                self.zones.join(", ")
            )));
        }
        Ok(())
    }
}

/// Reads the `constraints` of a request: a string in Juju's syntax or an object with the JSON
/// keys; every error names the field (and the key).
pub(crate) fn constraints_from_json(value: Option<serde_json::Value>) -> Result<Constraints> {
    let c = match value {
        None | Some(serde_json::Value::Null) => return Ok(Constraints::default()),
        Some(serde_json::Value::String(text)) => {
            Constraints::parse(&text).map_err(|e| ApiError::bad_request(format!("constraints: {e}")))?
        }
        Some(v @ serde_json::Value::Object(_)) => {
            let view: ConstraintsView = serde_path_to_error::deserialize(v).map_err(|e| {
                let at = e.path().to_string();
                let at = if at == "." { String::new() } else { format!(".{at}") };
                ApiError::bad_request(format!("constraints{at}: {}", e.into_inner()))
            })?;
            Constraints::from(view)
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "constraints: expected a string such as \"cores=4 mem=16G\" or an object, got {other}"
            )))
        }
    };
    c.validate().map_err(|e| ApiError::bad_request(format!("constraints: {e}")))?;
    Ok(c)
}

/// Checks a new machine's constraints (given as `constraints`, with `zones` also accepted on
/// its own, but not both) and placement against the cloud.
#[cfg(test)]
pub(crate) fn new_machine(
    cloud: &CloudShape,
    zones: Option<Vec<String>>,
    constraints: Option<serde_json::Value>,
    placement: Option<String>,
) -> Result<NewMachine> {
    new_machine_with(cloud, zones, constraints, placement, None)
}

/// A capacity preference as a request gives it (`None`: `on-demand`).
pub(crate) fn capacity_of(text: Option<&str>) -> Result<crate::model::CapacityPreference> {
    text.map_or(Ok(crate::model::CapacityPreference::OnDemand), |t| {
        t.parse().map_err(|e| ApiError::bad_request(format!("capacity: {e}")))
    })
}

/// [`new_machine`] with a capacity preference (`capacity`, as the request gives it).
pub(crate) fn new_machine_with(
    cloud: &CloudShape,
    zones: Option<Vec<String>>,
    constraints: Option<serde_json::Value>,
    placement: Option<String>,
    capacity: Option<&str>,
) -> Result<NewMachine> {
    let capacity = capacity_of(capacity)?;
    let mut constraints = constraints_from_json(constraints)?;
    if let Some(z) = zones {
        if constraints.zones.is_some() {
            return Err(ApiError::bad_request("zones: given both as zones and in constraints; give them once"));
        }
        if z.is_empty() {
            return Err(ApiError::bad_request("zones must not be empty when given"));
        }
        constraints.zones = Some(z);
    }
    check_zones(cloud, &mut constraints)?;
    let placement = match placement {
        None => None,
        Some(p) => {
            let parsed = Placement::parse(&p).map_err(|e| ApiError::bad_request(format!("placement: {e}")))?;
            match &parsed {
                Placement::Zone(z) => cloud.check_zone("placement", z)?,
                Placement::Subnet(s) => {
                    if let Some(known) = &cloud.subnets {
                        if !known.contains_key(s) {
                            let names: Vec<&str> = known.keys().map(String::as_str).collect();
                            return Err(ApiError::bad_request(format!(
                                "placement: unknown subnet {s:?}: this cloud's subnets are {}",
                                if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                            )));
                        }
                    }
                }
            }
            Some(parsed.to_string())
        }
    };
    Ok(NewMachine { constraints, placement, application: None, capacity, trace_parent: None })
}

/// Checks a `zones=` constraint against the cloud's zones, and keeps each zone once, in the
/// order first given (so at most the cloud's zones).
fn check_zones(cloud: &CloudShape, constraints: &mut Constraints) -> Result<()> {
    if let Some(z) = &constraints.zones {
        for zone in z {
            cloud.check_zone("zones", zone)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        constraints.zones = Some(z.iter().filter(|z| seen.insert(z.to_string())).cloned().collect());
    }
    Ok(())
}

/// A machine's new constraints as `PUT /v1/machines/{id}/constraints` gives them: Juju's
/// syntax, parsed and checked against the cloud as `POST /v1/machines` does.
pub(crate) fn constraints_for_change(cloud: &CloudShape, text: &str) -> Result<Constraints> {
    let mut constraints = constraints_from_json(Some(serde_json::Value::String(text.to_owned())))?;
    check_zones(cloud, &mut constraints)?;
    Ok(constraints)
}

/// `GET /v1/machines` query parameters, all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct MachineQuery {
    /// Only the machines of this application.
    #[param(pattern = r"^[a-z][a-z0-9]*(-[a-z0-9]*[a-z][a-z0-9]*)*$")]
    pub application: Option<String>,
    /// Only machines with this machine status or instance status.
    #[param(value_type = Option<StatusFilter>)]
    pub status: Option<String>,
    /// Only machines whose instance is in this zone (one of the cloud's zones: `GET /v1/status`).
    pub zone: Option<String>,
    /// The page starts after this machine id (id order).
    #[param(pattern = r"\S")]
    pub after: Option<String>,
    /// At most this many (1..=10000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    pub limit: Option<String>,
}

/// What a `status` filter may name: a machine status or an instance status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) enum StatusFilter {
    /// Machine status.
    #[serde(rename = "pending")]
    Pending,
    /// Machine status.
    #[serde(rename = "started")]
    Started,
    /// Machine status.
    #[serde(rename = "error")]
    Error,
    /// Machine status (and instance status).
    #[serde(rename = "stopped")]
    Stopped,
    /// Instance status.
    #[serde(rename = "provisioning")]
    Provisioning,
    /// Instance status.
    #[serde(rename = "provisioning error")]
    ProvisioningError,
    /// Instance status.
    #[serde(rename = "running")]
    Running,
    /// Instance status.
    #[serde(rename = "missing")]
    Missing,
    /// Unhealthy (issue 34): an instance stopped longer than `repair-after`.
    #[serde(rename = "unhealthy")]
    Unhealthy,
}

/// The instance statuses a `status` filter may name (besides the machine statuses).
pub(crate) const INSTANCE_STATUSES: [&str; 5] = ["provisioning", "provisioning error", "running", "stopped", "missing"];

/// The `status` filter that keeps unhealthy machines (issue 34).
pub(crate) const UNHEALTHY: &str = "unhealthy";

/// A checked [`MachineQuery`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MachineFilter {
    application: Option<String>,
    status: Option<String>,
    zone: Option<String>,
    after: Option<MachineId>,
    limit: Option<usize>,
}

impl MachineQuery {
    /// Parses a query string strictly (unknown parameters refused, naming them).
    pub(crate) fn from_query_string(query: &str) -> Result<Self> {
        web::Query::<MachineQuery>::from_query(query)
            .map(web::Query::into_inner)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
    }

    /// Checks every parameter, naming the one that is wrong.
    pub(crate) fn check(self, cloud: &CloudShape) -> Result<MachineFilter> {
        if let Some(a) = &self.application {
            check_application_name(a).map_err(|e| ApiError::bad_request(format!("application: {e}")))?;
        }
        if let Some(s) = &self.status {
            if s.parse::<MachineStatus>().is_err() && !INSTANCE_STATUSES.contains(&s.as_str()) && s != UNHEALTHY {
                return Err(ApiError::bad_request(format!(
                    "status: unknown status {s:?}: expected a machine status (pending, started, error, stopped), {UNHEALTHY} or an instance status ({})",
                    INSTANCE_STATUSES.join(", ")
                )));
            }
        }
        if let Some(z) = &self.zone {
            cloud.check_zone("zone", z)?;
        }
        let after = match self.after {
            Some(a) if a.trim().is_empty() => return Err(ApiError::bad_request("after: must be a machine id")),
            a => a.map(|a| MachineId::new(a.trim())),
        };
        let limit = match self.limit {
            None => None,
            Some(l) => Some(
                Some(l.trim())
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_IDS).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "limit must be a whole number between 1 and {MAX_IDS}, got {l:?}"
                        ))
                    })?,
            ),
        };
        Ok(MachineFilter { application: self.application, status: self.status, zone: self.zone, after, limit })
    }
}

impl MachineFilter {
    /// Whether it keeps only unhealthy machines (`status=unhealthy`: the provisioner's view,
    /// not the store's, decides; the caller filters on it).
    pub(crate) fn wants_unhealthy(&self) -> bool {
        self.status.as_deref() == Some(UNHEALTHY)
    }

    fn keeps(&self, m: &MachineRecord) -> bool {
        self.application.as_ref().is_none_or(|a| m.application.as_ref() == Some(a))
            && self.status.as_ref().is_none_or(|s| {
                s == UNHEALTHY || m.machine.status.as_str() == s || m.machine.instance_status.as_str() == s
            })
            && self.zone.as_ref().is_none_or(|z| m.zone.as_ref() == Some(z))
            && self.after.as_ref().is_none_or(|a| &m.machine.id > a)
    }

    /// The machines the filter keeps, in id order (numbers numerically), one page of them.
    pub(crate) fn select(&self, mut machines: Vec<MachineRecord>) -> Vec<MachineRecord> {
        machines.retain(|m| self.keeps(m));
        machines.sort_by(|a, b| a.machine.id.cmp(&b.machine.id));
        if let Some(n) = self.limit {
            machines.truncate(n);
        }
        machines
    }
}

/// What the model's cloud offers, for the checks.
pub(super) fn cloud(st: &State) -> CloudShape {
    CloudShape { zones: st.zones.clone(), subnets: st.subnets.clone() }
}

/// `GET /v1/machines[?application=&status=&zone=&after=&limit=]`.
#[utoipa::path(get, path = "/v1/machines", tag = "machines", operation_id = "list_machines",
    params(MachineQuery),
    responses(
        (status = 200, description = "The machines the filters keep, one page in id order", body = Vec<MachineView>),
        (status = 400, description = "A parameter is wrong (named): an unknown one, a zone the cloud does not have", body = ErrorBody),
    ))]
pub(crate) async fn list_machines(_: Authorized, st: State, req: HttpRequest) -> Result<HttpResponse> {
    let filter = MachineQuery::from_query_string(req.query_string())?.check(&cloud(&st))?;
    let health = health_here(&st).await;
    let mut machines = st.store.read(|s| s.list_machines()).await?;
    if filter.wants_unhealthy() {
        machines.retain(|m| health.as_ref().is_some_and(|h| h.unhealthy.iter().any(|u| u.machine == m.machine.id)));
    }
    let views = filter.select(machines).iter().map(|m| with_health(view(m), health.as_ref())).collect::<Vec<_>>();
    Ok(HttpResponse::Ok().json(views))
}

/// The provisioner's health view, where it runs on this replica (`None` elsewhere).
pub(crate) async fn health_here(st: &State) -> Option<crate::actors::coordinator::Health> {
    st.running().await.ok()?.handle.health().await.ok()
}

/// The machine's view with its health filled in from the provisioner's.
pub(crate) fn with_health(mut v: MachineView, health: Option<&crate::actors::coordinator::Health>) -> MachineView {
    let Some(h) = health else { return v };
    v.health = h.unhealthy.iter().find(|u| u.machine.as_str() == v.id).map(|u| HealthView {
        reason: u.reason.to_owned(),
        unhealthy_for_s: u.unhealthy_for.as_secs(),
        repair: if !u.repairable {
            "never"
        } else if h.repairing.contains(&u.machine) {
            "repairing"
        } else if h.held {
            "held"
        } else {
            "due"
        }
        .to_owned(),
    });
    v
}

/// Everything the store holds for one machine.
pub(crate) fn detail(m: &MachineRecord) -> MachineDetail {
    MachineDetail {
        machine: view(m),
        constraints: ConstraintsView::from(&m.constraints),
        constraints_text: m.constraints.to_string(),
        placement: m.placement.clone(),
        application: m.application.clone(),
        address: m.address.clone(),
        status_message: m.status_message.clone(),
        instance_status_message: m.instance_status_message.clone(),
        keep_instance: m.machine.keep_instance,
        retry_requested: m.transient,
        changed_at: m.changed_at.clone(),
        start_attempts: m.start_attempts,
        last_error: m.last_start_error.clone(),
    }
}

/// The machine id of a `/v1/machines/{id}` path: container ids hold `/`, given as is
/// (`/v1/machines/3/lxd/0`) or encoded (`3%2Flxd%2F0`).
pub(crate) fn machine_id_of_path(raw: &str) -> Result<MachineId> {
    let id = raw.replace("%2F", "/").replace("%2f", "/");
    let id = id.trim_matches('/');
    if id.is_empty() {
        return Err(ApiError::bad_request("no machine id given"));
    }
    Ok(MachineId::new(id))
}

/// `GET /v1/machines/{id}`.
#[utoipa::path(get, path = "/v1/machines/{id}", tag = "machines", operation_id = "show_machine",
    params(("id" = String, Path, description = "A machine id (`3`; a container's `3/lxd/0`, as is or encoded). \
        `remove` and `retry` are routes of their own (`POST` only: `GET` on them is 405)")),
    responses(
        (status = 200, description = "Everything the store holds for the machine", body = MachineDetail),
        (status = 400, description = "No machine id: the path's id is only slashes (`%2F`)", body = ErrorBody),
        (status = 404, description = "No such machine", body = ErrorBody),
    ))]
pub(crate) async fn show_machine(_: Authorized, st: State, req: HttpRequest) -> Result<HttpResponse> {
    let id = machine_id_of_path(req.match_info().get("id").unwrap_or_default())?;
    let wanted = id.clone();
    let m = st.store.read(move |s| s.machine(&wanted)).await?.ok_or(StoreError::NotFound(id))?;
    let mut d = detail(&m);
    d.machine = with_health(d.machine, health_here(&st).await.as_ref());
    Ok(HttpResponse::Ok().json(d))
}

pub(super) fn view(m: &MachineRecord) -> MachineView {
    MachineView {
        id: m.machine.id.to_string(),
        life: m.machine.life.to_string(),
        status: m.machine.status.to_string(),
        instance: m.machine.instance.as_ref().map(ToString::to_string),
        zone: m.zone.clone(),
        instance_status: m.machine.instance_status.to_string(),
        message: m.message().to_owned(),
        container_type: m.machine.id.container_of().map(|(_, kind)| kind.to_owned()),
        host: m.machine.id.container_of().map(|(host, _)| host.to_string()),
        manual: m.machine.manual,
        capacity: m.capacity.as_str().to_owned(),
        capacity_type: m.capacity_type.map(|t| t.as_str().to_owned()),
        health: None,
    }
}

/// Machine ids as text.
pub(super) fn names(ids: &[MachineId]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

/// The machine ids of a request, each once (in the order first given), at most [`MAX_IDS`].
fn ids(raw: &[String]) -> Result<Vec<MachineId>> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("no machine ids given"));
    }
    if raw.len() > MAX_IDS {
        return Err(ApiError::bad_request(format!("at most {MAX_IDS} machine ids per request, got {}", raw.len())));
    }
    let mut seen = std::collections::BTreeSet::new();
    Ok(raw.iter().map(|s| s.trim()).filter(|s| seen.insert(*s)).map(MachineId::new).collect())
}

#[utoipa::path(post, path = "/v1/machines", tag = "machines", operation_id = "add_machines",
    request_body = AddMachines,
    responses(
        (status = 201, description = "The new machines' ids", body = AddedMachines),
        (status = 400, description = "A field is wrong (named), or names what the cloud or model lacks: a zone, a \
            subnet, a host that is not an alive top-level machine, an address already registered", body = ErrorBody),
        (status = 409, description = "The model is dying", body = ErrorBody),
    ))]
pub(super) async fn add_machines(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let body: AddMachines = json_body(&req, payload).await?;
    if body.count == 0 || body.count > MAX_ADD {
        return Err(ApiError::bad_request(format!("count must be between 1 and {MAX_ADD}, got {}", body.count)));
    }
    if body.is_container_or_manual() {
        return add_containers_or_manual(&st, &req, &body).await;
    }
    let AddMachines { count, zones, constraints, placement, capacity, .. } = body;
    // Constraints (zones among them), placement and capacity, checked against the cloud.
    let cloud = CloudShape { zones: st.zones.clone(), subnets: st.subnets.clone() };
    let mut spec = new_machine_with(&cloud, zones, constraints, placement, capacity.as_deref())?;
    // Stored with the machines (issue 37): their starts join this request's trace, on
    // whichever replica leads (`None` unless traces are exported).
    spec.trace_parent = crate::trace::context_of(&tracing::Span::current());
    let added = st.store.add_machines(count, spec).await?;
    st.metrics.do_send(crate::service::metrics::MachinesPending(added.clone()));
    let ids = names(&added);
    note(&req, format!("added {} machines: {}", ids.len(), list_summary(&ids)));
    Ok(HttpResponse::Created().json(AddedMachines { ids }))
}

/// `POST /v1/machines` with `container` and `host` (containers on a host), or with `manual`
/// and `address` (a manual machine): each field checked ([`container_or_manual`]), then
/// the store checks the host (exists, alive) or the address (not a live manual machine's yet)
/// in the transaction that adds. Every refusal is a 400 naming its field, nothing written.
async fn add_containers_or_manual(st: &ModelRuntime, req: &HttpRequest, body: &AddMachines) -> Result<HttpResponse> {
    let kinds = crate::containers::DEFAULT_CONTAINER_TYPES;
    let request = container_or_manual(body, kinds).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let added = match request {
        SpecialAdd::Containers { kind, host, count } => {
            if st.containers.is_none() {
                return Err(ApiError::bad_request(format!(
                    "field \"container\": this service's cloud ({}) runs no containers; use --broker sim",
                    st.broker_name
                )));
            }
            st.store.exec(move |s| s.add_containers(&host, &kind, count)).await?
        }
        SpecialAdd::Manual { address } => vec![st.store.exec(move |s| s.add_manual(&address)).await?],
    };
    let ids = names(&added);
    note(req, format!("added {} machines: {}", ids.len(), list_summary(&ids)));
    Ok(HttpResponse::Created().json(AddedMachines { ids }))
}

#[utoipa::path(post, path = "/v1/machines/remove", tag = "machines", operation_id = "remove_machines",
    request_body = RemoveMachines,
    responses(
        (status = 204, description = "The machines are dying (or dead): their instances are stopped, then they are removed"),
        (status = 400, description = "No ids, too many, or a body that does not parse", body = ErrorBody),
        (status = 404, description = "No such machine (nothing was changed)", body = ErrorBody),
        (status = 409, description = "The model's state refuses it (a host with live containers without `force`, \
            a manual machine's instance to keep, the model dying); nothing was changed", body = ErrorBody),
    ))]
pub(super) async fn remove_machines(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let RemoveMachines { ids: raw, keep_instance, force } = json_body(&req, payload).await?;
    let ids = ids(&raw)?;
    let flags =
        [(keep_instance, " keep-instance"), (force, " force")].iter().filter(|f| f.0).map(|f| f.1).collect::<String>();
    note(&req, format!("remove {} machines: {}{flags}", ids.len(), list_summary(&names(&ids))));
    st.store.exec(move |s| s.remove_machines(&ids, keep_instance, force)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/v1/machines/retry", tag = "machines", operation_id = "retry_machines",
    request_body = RetryMachines,
    responses(
        (status = 204, description = "The machines will be started again"),
        (status = 400, description = "No ids, too many, a container, or a body that does not parse", body = ErrorBody),
        (status = 404, description = "No such machine (nothing was changed)", body = ErrorBody),
        (status = 409, description = "A machine is not in provisioning error, or the model is dying; nothing was changed", body = ErrorBody),
    ))]
pub(super) async fn retry_machines(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let body: RetryMachines = json_body(&req, payload).await?;
    let ids = ids(&body.ids)?;
    note(&req, format!("retry {} machines: {}", ids.len(), list_summary(&names(&ids))));
    refuse_container_retries(&ids)?;
    st.store.exec(move |s| s.retry_machines(&ids)).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(put, path = "/v1/machines/{id}/constraints", tag = "machines", operation_id = "set_machine_constraints",
    params(("id" = String, Path, description = "A machine id (`3`; a container's `3/lxd/0`, as is or encoded)")),
    request_body = SetConstraints,
    responses(
        (status = 200, description = "The machine with its new constraints (its next start uses them)", body = MachineDetail),
        (status = 400, description = "The constraints are wrong (named: a bad key or value, a zone the cloud does not \
            have), or a body that does not parse; nothing was changed", body = ErrorBody),
        (status = 404, description = "No such machine", body = ErrorBody),
        (status = 409, description = "The machine is not alive, or is manual; nothing was changed", body = ErrorBody),
    ))]
pub(super) async fn set_machine_constraints(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let id = machine_id_of_path(req.match_info().get("id").unwrap_or_default())?;
    let body: SetConstraints = json_body(&req, payload).await?;
    note(&req, format!("set constraints of machine {id}: {:?}", body.constraints));
    let constraints = constraints_for_change(&cloud(&st), &body.constraints)?;
    let wanted = id.clone();
    let m = st
        .store
        .exec(move |s| {
            s.set_constraints(&wanted, &constraints)?;
            s.machine(&wanted)
        })
        .await?
        .ok_or(StoreError::NotFound(id))?;
    let mut d = detail(&m);
    d.machine = with_health(d.machine, health_here(&st).await.as_ref());
    Ok(HttpResponse::Ok().json(d))
}

/// Containers have no retry path (Juju's container provisioner has no retry watcher): a retry
/// of one would be accepted and never happen, so it is refused (400 naming it).
fn refuse_container_retries(ids: &[MachineId]) -> Result<()> {
    match ids.iter().find(|id| id.is_container()) {
        Some(c) => Err(ApiError::bad_request(format!(
            "field \"ids\": machine {c} is a container, and containers have no retry-provisioning path (as in Juju): \
             remove it and add another"
        ))),
        None => Ok(()),
    }
}

/// A request for containers or for a manual machine, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpecialAdd {
    /// `count` containers of `kind` on `host` (`HOST/KIND/N`, numbered per host and type).
    Containers {
        /// `lxd` or `kvm`.
        kind: String,
        /// The host (a top-level machine).
        host: MachineId,
        /// How many.
        count: usize,
    },
    /// One manually provisioned machine at `address` (an IP address or a lower-case hostname).
    Manual {
        /// Where it is.
        address: String,
    },
}

/// A refused field: its name (as in the JSON body) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field:?}: {message}")]
pub(crate) struct FieldError {
    /// The body's field.
    pub field: &'static str,
    /// Why it is refused.
    pub message: String,
}

fn refuse<T>(field: &'static str, message: impl Into<String>) -> Result<T, FieldError> {
    Err(FieldError { field, message: message.into() })
}

/// Checks a request that names `container`, `host`, `manual` or `address` (see
/// [`AddMachines::is_container_or_manual`]); `kinds` are the container types the service runs.
/// `count` is checked for its range by the caller.
pub(crate) fn container_or_manual(body: &AddMachines, kinds: &[&str]) -> Result<SpecialAdd, FieldError> {
    let container = body.container.as_deref().map(str::trim);
    let host = body.host.as_deref().map(str::trim);
    if body.manual {
        if container.is_some() || host.is_some() {
            let field = if container.is_some() { "container" } else { "host" };
            return refuse(
                field,
                "a manual machine is not a container: give manual and address, or container and host",
            );
        }
        let Some(address) = body.address.as_deref() else {
            return refuse("address", "a manual machine needs an address (an IP address or a hostname)");
        };
        let address = parse_address(address).map_err(|message| FieldError { field: "address", message })?;
        if body.count != 1 {
            return refuse(
                "count",
                format!("manual machines are registered one at a time (count 1), got {}", body.count),
            );
        }
        if body.zones.is_some() {
            return refuse("zones", "a manual machine is where it is: zones do not apply to it");
        }
        return Ok(SpecialAdd::Manual { address });
    }
    if body.address.is_some() {
        return refuse("address", "an address is only for a manual machine: add \"manual\": true");
    }
    let Some(kind) = container else {
        return refuse("container", format!("host needs a container type: one of {}", kinds.join(", ")));
    };
    if !kinds.contains(&kind) {
        return refuse(
            "container",
            format!("unknown container type {kind:?}: this service runs {} containers", kinds.join(", ")),
        );
    }
    let Some(host) = host else {
        return refuse("host", "containers need a host: give the id of the machine to put them on");
    };
    if host.is_empty() {
        return refuse("host", "the host's id is empty");
    }
    if MachineId::new(host).is_container() {
        return refuse("host", format!("machine {host} is a container: containers go on top-level machines"));
    }
    if body.zones.is_some() {
        return refuse("zones", "containers take their host's zone: zones do not apply to them");
    }
    Ok(SpecialAdd::Containers { kind: kind.to_owned(), host: MachineId::new(host), count: body.count })
}

/// A manual machine's address: an IP address (v4 or v6) or a hostname (RFC 1123 labels of
/// letters, digits and hyphens, 1 to 63 characters, not starting or ending with a hyphen; 253
/// characters at most; one trailing dot allowed; lower-cased). All-numeric dotted names are
/// IPv4 addresses or nothing (`10.0.0.300` is refused).
pub(crate) fn parse_address(raw: &str) -> Result<String, String> {
    let text = raw.trim();
    if text.is_empty() {
        return Err("the address is empty: give an IP address or a hostname".into());
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let bad = |why: &str| Err(format!("{text:?} is not an IP address or a hostname: {why}"));
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.len() > 253 {
        return bad("a hostname has at most 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return bad("each part between dots has 1 to 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return bad("a hostname has only letters, digits, hyphens and dots");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a part of a hostname does not start or end with a hyphen");
        }
    }
    if labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        return bad("it looks like an IPv4 address but is not one");
    }
    Ok(name.to_ascii_lowercase())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::Machine;

    pub(crate) fn cloud() -> CloudShape {
        CloudShape {
            zones: vec!["az1".into(), "az2".into(), "az3".into()],
            subnets: Some([("subnet-az1".to_owned(), vec!["az1".to_owned()])].into()),
        }
    }

    pub(crate) fn bad(r: Result<impl std::fmt::Debug>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, 400, "{e}");
        e.message
    }

    #[test]
    fn constraints_come_as_a_string_or_an_object() {
        let s = constraints_from_json(Some(serde_json::json!("cores=4 mem=16G zones=az1,az2"))).unwrap();
        let o = constraints_from_json(Some(serde_json::json!({"cores": 4, "mem_mb": 16384, "zones": ["az1", "az2"]})))
            .unwrap();
        assert_eq!(s, o);
        assert_eq!(constraints_from_json(None).unwrap(), Constraints::default());
        let m = bad(constraints_from_json(Some(serde_json::json!("colour=blue"))));
        assert!(m.starts_with("constraints: ") && m.contains("\"colour\""), "{m}");
        let m = bad(constraints_from_json(Some(serde_json::json!("mem=lots"))));
        assert!(m.contains("\"mem\"") && m.contains("\"lots\""), "{m}");
        let m = bad(constraints_from_json(Some(serde_json::json!({"colour": "blue"}))));
        assert!(m.starts_with("constraints") && m.contains("colour"), "{m}");
        let m = bad(constraints_from_json(Some(serde_json::json!({"cores": -1}))));
        assert!(m.starts_with("constraints.cores: "), "{m}");
        let m = bad(constraints_from_json(Some(serde_json::json!({"arch": "vax"}))));
        assert!(m.contains("\"arch\""), "{m}");
        assert!(bad(constraints_from_json(Some(serde_json::json!(4)))).starts_with("constraints: expected"));
    }

    #[test]
    fn new_machines_are_checked_against_the_cloud() {
        let c = cloud();
        let ok = new_machine(&c, None, Some(serde_json::json!("zones=az2,az2,az1")), Some("zone=az2".into())).unwrap();
        assert_eq!(ok.constraints.zones, Some(vec!["az2".to_owned(), "az1".to_owned()]));
        assert_eq!(ok.placement.as_deref(), Some("zone=az2"));
        let ok = new_machine(&c, Some(vec!["az3".into()]), None, Some(" subnet=subnet-az1".into())).unwrap();
        assert_eq!(
            (ok.constraints.zones.as_deref(), ok.placement.as_deref()),
            (Some(&["az3".to_owned()][..]), Some("subnet=subnet-az1"))
        );
        assert!(
            bad(new_machine(&c, None, None, Some("zone=az9".into()))).starts_with("placement: unknown zone \"az9\"")
        );
        assert!(bad(new_machine(&c, None, None, Some("subnet=nope".into())))
            .starts_with("placement: unknown subnet \"nope\""));
        assert!(bad(new_machine(&c, None, None, Some("rack=4".into()))).starts_with("placement: invalid placement"));
        assert!(
            bad(new_machine(&c, None, Some(serde_json::json!("zones=az9")), None)).starts_with("zones: unknown zone")
        );
        assert!(bad(new_machine(&c, Some(vec!["az1".into()]), Some(serde_json::json!("zones=az1")), None))
            .starts_with("zones: given both"));
        let any_subnet = CloudShape { subnets: None, ..cloud() };
        assert!(new_machine(&any_subnet, None, None, Some("subnet=whatever".into())).is_ok());
        let zoneless = CloudShape::default();
        assert!(bad(new_machine(&zoneless, None, None, Some("zone=az1".into()))).contains("no availability zones"));
    }

    fn record(id: &str, app: Option<&str>, zone: Option<&str>, status: MachineStatus) -> MachineRecord {
        let mut machine = Machine::pending(id);
        machine.status = status;
        MachineRecord {
            machine,
            zone: zone.map(str::to_owned),
            zones: None,
            status_message: String::new(),
            instance_status_message: String::new(),
            transient: false,
            constraints: Constraints::default(),
            placement: None,
            application: app.map(str::to_owned),
            changed_at: None,
            address: None,
            start_attempts: 0,
            last_start_error: None,
            capacity: Default::default(),
            capacity_type: None,
        }
    }

    fn filter(q: &str) -> Result<MachineFilter> {
        MachineQuery::from_query_string(q)?.check(&cloud())
    }

    #[test]
    fn lists_filter_and_page_in_id_order() {
        let all = vec![
            record("10", Some("web"), Some("az1"), MachineStatus::Started),
            record("2", Some("web"), Some("az2"), MachineStatus::Started),
            record("9", None, None, MachineStatus::Pending),
            record("3", Some("db"), Some("az1"), MachineStatus::Error),
        ];
        let ids = |q: &str| -> Vec<String> {
            filter(q).unwrap().select(all.clone()).iter().map(|m| m.machine.id.to_string()).collect()
        };
        assert_eq!(ids(""), ["2", "3", "9", "10"], "numbers in numeric order");
        assert_eq!(ids("application=web"), ["2", "10"]);
        assert_eq!(ids("zone=az1"), ["3", "10"]);
        assert_eq!(ids("status=pending"), ["9"]);
        assert_eq!(ids("application=web&zone=az1"), ["10"]);
        assert_eq!(ids("limit=2"), ["2", "3"]);
        assert_eq!(ids("after=3&limit=2"), ["9", "10"]);
        assert_eq!(ids("after=4"), ["9", "10"], "after an id that is gone");
        assert_eq!(ids("after=10"), Vec::<String>::new());
        assert_eq!(ids("status=provisioning%20error"), Vec::<String>::new());
        assert!(bad(filter("limit=0")).starts_with("limit must be"));
        assert!(bad(filter("limit=lots")).contains("\"lots\""));
        assert!(bad(filter("limit=10001")).starts_with("limit must be"));
        assert!(bad(filter("zone=az9")).starts_with("zone: unknown zone"));
        assert!(bad(filter("status=sleepy")).starts_with("status: unknown status"));
        assert!(bad(filter("application=Web")).starts_with("application: invalid application name"));
        assert!(bad(filter("colour=blue")).contains("colour"));
        assert!(bad(filter("after=")).starts_with("after:"));
    }

    #[test]
    fn container_ids_come_through_the_path_as_is_or_encoded() {
        assert_eq!(machine_id_of_path("3/lxd/0").unwrap(), MachineId::new("3/lxd/0"));
        assert_eq!(machine_id_of_path("3%2Flxd%2f0").unwrap(), MachineId::new("3/lxd/0"));
        assert_eq!(machine_id_of_path("7").unwrap(), MachineId::new("7"));
        assert!(machine_id_of_path("").is_err());
        let d = detail(&record("3/lxd/0", None, None, MachineStatus::Pending));
        assert_eq!(
            (d.machine.container_type.as_deref(), d.machine.host.as_deref(), d.machine.manual),
            (Some("lxd"), Some("3"), false)
        );
        let json = serde_json::to_value(detail(&record("4", Some("web"), None, MachineStatus::Pending))).unwrap();
        for key in [
            "id",
            "life",
            "status",
            "instance",
            "zone",
            "instance_status",
            "message",
            "constraints",
            "placement",
            "application",
            "container_type",
            "host",
            "manual",
        ] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(json["constraints"]["mem_mb"], serde_json::Value::Null);
        assert_eq!(json["container_type"], serde_json::Value::Null);
    }

    const KINDS: &[&str] = &["lxd", "kvm"];

    fn body(f: impl FnOnce(&mut AddMachines)) -> AddMachines {
        let mut b = AddMachines::plain(1, None);
        f(&mut b);
        b
    }

    fn field_of(b: AddMachines) -> &'static str {
        container_or_manual(&b, KINDS).unwrap_err().field
    }

    #[test]
    fn containers_need_a_known_type_and_a_top_level_host() {
        let ok = body(|b| {
            b.container = Some("lxd".into());
            b.host = Some(" 3 ".into());
            b.count = 2;
        });
        assert_eq!(
            container_or_manual(&ok, KINDS).unwrap(),
            SpecialAdd::Containers { kind: "lxd".into(), host: MachineId::new("3"), count: 2 }
        );
        assert_eq!(field_of(body(|b| b.host = Some("3".into()))), "container");
        assert_eq!(field_of(body(|b| b.container = Some("lxd".into()))), "host");
        let docker = body(|b| {
            b.container = Some("docker".into());
            b.host = Some("3".into());
        });
        let e = container_or_manual(&docker, KINDS).unwrap_err();
        assert_eq!(e.field, "container");
        assert!(e.to_string().contains("\"docker\"") && e.to_string().contains("lxd, kvm"), "{e}");
        let nested = body(|b| {
            b.container = Some("lxd".into());
            b.host = Some("3/lxd/0".into());
        });
        assert_eq!(field_of(nested), "host");
        let zoned = body(|b| {
            b.container = Some("kvm".into());
            b.host = Some("3".into());
            b.zones = Some(vec!["az1".into()]);
        });
        assert_eq!(field_of(zoned), "zones");
    }

    #[test]
    fn a_manual_machine_needs_one_valid_address_and_nothing_else() {
        let ok = body(|b| {
            b.manual = true;
            b.address = Some("Host-1.Example.com.".into());
        });
        assert_eq!(
            container_or_manual(&ok, KINDS).unwrap(),
            SpecialAdd::Manual { address: "host-1.example.com".into() }
        );
        assert_eq!(field_of(body(|b| b.manual = true)), "address");
        assert_eq!(field_of(body(|b| b.address = Some("10.0.0.5".into()))), "address");
        let bad = body(|b| {
            b.manual = true;
            b.address = Some("not an address".into());
        });
        let e = container_or_manual(&bad, KINDS).unwrap_err();
        assert_eq!(e.field, "address");
        assert!(e.to_string().starts_with("field \"address\":"), "{e}");
        let two = body(|b| {
            b.manual = true;
            b.address = Some("10.0.0.5".into());
            b.count = 2;
        });
        assert_eq!(field_of(two), "count");
        let both = body(|b| {
            b.manual = true;
            b.address = Some("10.0.0.5".into());
            b.container = Some("lxd".into());
        });
        assert_eq!(field_of(both), "container");
    }

    #[test]
    fn addresses_are_ips_or_hostnames() {
        assert_eq!(parse_address("10.0.0.5").unwrap(), "10.0.0.5");
        assert_eq!(parse_address(" fe80::1 ").unwrap(), "fe80::1");
        assert_eq!(parse_address("db-2").unwrap(), "db-2");
        assert_eq!(parse_address("NODE7.lan").unwrap(), "node7.lan");
        for bad in ["", "  ", "10.0.0.300", "1.2.3", "-a.b", "a-.b", "a..b", "a_b", "host name", "a/b", "http://x"] {
            assert!(parse_address(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_address(&"a".repeat(64)).is_err());
        assert!(parse_address(&["a"; 130].join(".")).is_err());
    }

    #[test]
    fn machine_ids_are_taken_once_each() {
        assert_eq!(ids(&["3".into(), "3".into(), " 4".into()]).unwrap(), [MachineId::new("3"), MachineId::new("4")]);
    }
}
