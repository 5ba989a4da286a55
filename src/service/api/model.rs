//! The parts of the API that speak the model: constraints and placement of new machines,
//! `GET /v1/machines/{id}`, the machine list's filters and pages, and applications. The
//! checks are plain functions (unit-tested below); a refused request writes nothing.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::types::{AddApplication, ApplicationView, ConstraintsView, ErrorBody, MachineDetail, MachineView};
use super::{json_body, view, ApiError, Authorized, Result, State, MAX_ADD, MAX_IDS};
use crate::model::{check_application_name, Constraints, MachineId, MachineStatus, Placement};
use crate::service::store::{ApplicationRecord, MachineRecord, NewMachine, StoreError};

/// What the cloud offers that a request is checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudShape {
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
pub fn constraints_from_json(value: Option<serde_json::Value>) -> Result<Constraints> {
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
pub fn new_machine(
    cloud: &CloudShape,
    zones: Option<Vec<String>>,
    constraints: Option<serde_json::Value>,
    placement: Option<String>,
) -> Result<NewMachine> {
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
    if let Some(z) = &constraints.zones {
        for zone in z {
            cloud.check_zone("zones", zone)?;
        }
        // Each zone once, in the order first given (so at most the cloud's zones).
        let mut seen = std::collections::BTreeSet::new();
        constraints.zones = Some(z.iter().filter(|z| seen.insert(z.to_string())).cloned().collect());
    }
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
    Ok(NewMachine { constraints, placement, application: None })
}

/// `GET /v1/machines` query parameters, all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MachineQuery {
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
pub enum StatusFilter {
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
}

/// The instance statuses a `status` filter may name (besides the machine statuses).
pub const INSTANCE_STATUSES: [&str; 5] = ["provisioning", "provisioning error", "running", "stopped", "missing"];

/// A checked [`MachineQuery`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineFilter {
    application: Option<String>,
    status: Option<String>,
    zone: Option<String>,
    after: Option<MachineId>,
    limit: Option<usize>,
}

impl MachineQuery {
    /// Parses a query string strictly (unknown parameters refused, naming them).
    pub fn from_query_string(query: &str) -> Result<Self> {
        web::Query::<MachineQuery>::from_query(query)
            .map(web::Query::into_inner)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
    }

    /// Checks every parameter, naming the one that is wrong.
    pub fn check(self, cloud: &CloudShape) -> Result<MachineFilter> {
        if let Some(a) = &self.application {
            check_application_name(a).map_err(|e| ApiError::bad_request(format!("application: {e}")))?;
        }
        if let Some(s) = &self.status {
            if s.parse::<MachineStatus>().is_err() && !INSTANCE_STATUSES.contains(&s.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "status: unknown status {s:?}: expected a machine status (pending, started, error, stopped) or an instance status ({})",
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
    fn keeps(&self, m: &MachineRecord) -> bool {
        self.application.as_ref().is_none_or(|a| m.application.as_ref() == Some(a))
            && self
                .status
                .as_ref()
                .is_none_or(|s| m.machine.status.as_str() == s || m.machine.instance_status.as_str() == s)
            && self.zone.as_ref().is_none_or(|z| m.zone.as_ref() == Some(z))
            && self.after.as_ref().is_none_or(|a| &m.machine.id > a)
    }

    /// The machines the filter keeps, in id order (numbers numerically), one page of them.
    pub fn select(&self, mut machines: Vec<MachineRecord>) -> Vec<MachineRecord> {
        machines.retain(|m| self.keeps(m));
        machines.sort_by(|a, b| a.machine.id.cmp(&b.machine.id));
        if let Some(n) = self.limit {
            machines.truncate(n);
        }
        machines
    }
}

fn cloud(st: &State) -> CloudShape {
    CloudShape { zones: st.zones.clone(), subnets: st.subnets.clone() }
}

/// `GET /v1/machines[?application=&status=&zone=&after=&limit=]`.
#[utoipa::path(get, path = "/v1/machines", tag = "machines", operation_id = "list_machines",
    params(MachineQuery),
    responses(
        (status = 200, description = "The machines the filters keep, one page in id order", body = Vec<MachineView>),
        (status = 400, description = "A parameter is wrong (named): an unknown one, a zone the cloud does not have", body = ErrorBody),
    ))]
pub async fn list_machines(_: Authorized, st: State, req: HttpRequest) -> Result<HttpResponse> {
    let filter = MachineQuery::from_query_string(req.query_string())?.check(&cloud(&st))?;
    let machines = st.store.exec(|s| s.list_machines()).await?;
    Ok(HttpResponse::Ok().json(filter.select(machines).iter().map(view).collect::<Vec<_>>()))
}

/// Everything the store holds for one machine.
pub fn detail(m: &MachineRecord) -> MachineDetail {
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
pub fn machine_id_of_path(raw: &str) -> Result<MachineId> {
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
pub async fn show_machine(_: Authorized, st: State, req: HttpRequest) -> Result<HttpResponse> {
    let id = machine_id_of_path(req.match_info().get("id").unwrap_or_default())?;
    let wanted = id.clone();
    let m = st.store.exec(move |s| s.machine(&wanted)).await?.ok_or(StoreError::NotFound(id))?;
    Ok(HttpResponse::Ok().json(detail(&m)))
}

fn application_view(a: &ApplicationRecord) -> ApplicationView {
    ApplicationView {
        name: a.name.clone(),
        units: a.machines.len(),
        machines: a.machines.iter().map(ToString::to_string).collect(),
        constraints: ConstraintsView::from(&a.constraints),
    }
}

/// Checks an `application add` request; the name, the units and the constraints.
pub fn check_application(cloud: &CloudShape, body: AddApplication) -> Result<(String, usize, Constraints)> {
    check_application_name(&body.name).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    if body.units == 0 || body.units > MAX_ADD {
        return Err(ApiError::bad_request(format!("units must be between 1 and {MAX_ADD}, got {}", body.units)));
    }
    let spec = new_machine(cloud, None, body.constraints, None)?;
    Ok((body.name, body.units, spec.constraints))
}

#[utoipa::path(post, path = "/v1/applications", tag = "applications", operation_id = "add_application",
    request_body = AddApplication,
    responses(
        (status = 201, description = "The application and its units' new machines", body = ApplicationView),
        (status = 400, description = "A field is wrong (named), or names a zone the cloud does not have", body = ErrorBody),
        (status = 409, description = "The application exists, or the model is dying", body = ErrorBody),
    ))]
/// `POST /v1/applications`: the application and a machine for each unit, in one transaction.
pub async fn add_application(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let body: AddApplication = json_body(&req, payload).await?;
    let (name, units, constraints) = check_application(&cloud(&st), body)?;
    let c = constraints.clone();
    let n = name.clone();
    let ids = st.store.exec(move |s| s.add_application(&n, units, &c)).await?;
    let summary = crate::service::audit::list_summary(&super::names(&ids));
    super::note(&req, format!("added application {name} with {units} units: {summary}"));
    Ok(HttpResponse::Created().json(application_view(&ApplicationRecord { name, constraints, machines: ids })))
}

/// `GET /v1/applications`.
#[utoipa::path(get, path = "/v1/applications", tag = "applications", operation_id = "list_applications",
    responses((status = 200, description = "Every application", body = Vec<ApplicationView>)))]
pub async fn list_applications(_: Authorized, st: State) -> Result<HttpResponse> {
    let apps = st.store.exec(|s| s.applications()).await?;
    Ok(HttpResponse::Ok().json(apps.iter().map(application_view).collect::<Vec<_>>()))
}

#[utoipa::path(delete, path = "/v1/applications/{name}", tag = "applications", operation_id = "remove_application",
    params(("name" = String, Path, description = "The application", pattern = r"^[a-z][a-z0-9]*(-[a-z0-9]*[a-z][a-z0-9]*)*$")),
    responses(
        (status = 200, description = "The machines taken to dead (the application is forgotten)", body = ApplicationView),
        (status = 400, description = "Not an application name", body = ErrorBody),
        (status = 404, description = "No such application", body = ErrorBody),
        (status = 409, description = "The model is dying", body = ErrorBody),
    ))]
/// `DELETE /v1/applications/{name}`: its machines become dead (their instances are stopped,
/// then they are removed) and it is forgotten. Answers the machines it took to dead.
pub async fn remove_application(
    _: Authorized,
    st: State,
    name: web::Path<super::NamePath>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let name = name.into_inner().name;
    check_application_name(&name).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    let n = name.clone();
    let (constraints, ids) = st
        .store
        .exec(move |s| {
            let constraints = s.applications()?.into_iter().find(|a| a.name == n).map(|a| a.constraints);
            Ok((constraints, s.remove_application(&n)?))
        })
        .await?;
    let summary = crate::service::audit::list_summary(&super::names(&ids));
    super::note(&req, format!("removed application {name}: {} machines to dead: {summary}", ids.len()));
    let view =
        application_view(&ApplicationRecord { name, constraints: constraints.unwrap_or_default(), machines: ids });
    Ok(HttpResponse::Ok().json(view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Machine;

    fn cloud() -> CloudShape {
        CloudShape {
            zones: vec!["az1".into(), "az2".into(), "az3".into()],
            subnets: Some([("subnet-az1".to_owned(), vec!["az1".to_owned()])].into()),
        }
    }

    fn bad(r: Result<impl std::fmt::Debug>) -> String {
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

    #[test]
    fn applications_are_checked() {
        let body = |name: &str, units: usize, c: Option<serde_json::Value>| AddApplication {
            name: name.into(),
            units,
            constraints: c,
        };
        let (name, units, c) = check_application(&cloud(), body("web", 3, Some(serde_json::json!("cores=2")))).unwrap();
        assert_eq!((name.as_str(), units, c.cores), ("web", 3, Some(2)));
        assert!(bad(check_application(&cloud(), body("Web", 3, None))).starts_with("name: invalid application name"));
        assert!(bad(check_application(&cloud(), body("web", 0, None))).starts_with("units must be"));
        assert!(bad(check_application(&cloud(), body("web", 1, Some(serde_json::json!("mem=lots")))))
            .starts_with("constraints:"));
    }
}
