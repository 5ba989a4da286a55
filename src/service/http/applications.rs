//! `/v1/applications`: add (the application and a machine for each unit, in one transaction),
//! list and remove. Its units' machines form a distribution group; their constraints are
//! checked as a new machine's ([`super::machines::new_machine`]).

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::{note, Authorized};
use super::body::json_body;
use super::errors::{ApiError, Result};
use super::machines::{cloud, names, new_machine_with, CloudShape, MAX_ADD};
use super::target::State;
use super::wire::{AddApplication, ApplicationView, ConstraintsView, ErrorBody};
use crate::model::check_application_name;
use crate::service::store::ApplicationRecord;
use crate::service::store::NewMachine;

/// A path's `{name}` (taken by name: per-model paths also hold `{model}`).
#[derive(serde::Deserialize)]
pub(crate) struct NamePath {
    /// The name.
    pub name: String,
}

fn application_view(a: &ApplicationRecord) -> ApplicationView {
    ApplicationView {
        name: a.name.clone(),
        units: a.machines.len(),
        machines: a.machines.iter().map(ToString::to_string).collect(),
        constraints: ConstraintsView::from(&a.constraints),
        capacity: a.capacity.as_str().to_owned(),
    }
}

/// Checks an `application add` request; the name, the units, the constraints and the
/// capacity preference.
pub(crate) fn check_application(cloud: &CloudShape, body: AddApplication) -> Result<(String, usize, NewMachine)> {
    check_application_name(&body.name).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    if body.units == 0 || body.units > MAX_ADD {
        return Err(ApiError::bad_request(format!("units must be between 1 and {MAX_ADD}, got {}", body.units)));
    }
    let spec = new_machine_with(cloud, None, body.constraints, None, body.capacity.as_deref())?;
    Ok((body.name, body.units, spec))
}

#[utoipa::path(post, path = "/v1/applications", tag = "applications", operation_id = "add_application",
    request_body = AddApplication,
    responses(
        (status = 201, description = "The application and its units' new machines", body = ApplicationView),
        (status = 400, description = "A field is wrong (named), or names a zone the cloud does not have", body = ErrorBody),
        (status = 409, description = "The application exists, or the model is dying", body = ErrorBody),
    ))]
/// `POST /v1/applications`: the application and a machine for each unit, in one transaction.
pub(crate) async fn add_application(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let body: AddApplication = json_body(&req, payload).await?;
    let (name, units, spec) = check_application(&cloud(&st), body)?;
    let (constraints, capacity) = (spec.constraints, spec.capacity);
    let c = constraints.clone();
    let n = name.clone();
    let ids = st.store.exec(move |s| s.add_application(&n, units, &c, capacity)).await?;
    let summary = crate::service::audit::list_summary(&names(&ids));
    note(&req, format!("added application {name} with {units} units: {summary}"));
    let added = ApplicationRecord { name, constraints, capacity, machines: ids };
    Ok(HttpResponse::Created().json(application_view(&added)))
}

/// `GET /v1/applications`.
#[utoipa::path(get, path = "/v1/applications", tag = "applications", operation_id = "list_applications",
    responses((status = 200, description = "Every application", body = Vec<ApplicationView>)))]
pub(crate) async fn list_applications(_: Authorized, st: State) -> Result<HttpResponse> {
    let apps = st.store.read(|s| s.applications()).await?;
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
pub(crate) async fn remove_application(
    _: Authorized,
    st: State,
    name: web::Path<NamePath>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let name = name.into_inner().name;
    check_application_name(&name).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    let n = name.clone();
    let (app, ids) = st
        .store
        .exec(move |s| {
            let app = s.applications()?.into_iter().find(|a| a.name == n).map(|a| (a.constraints, a.capacity));
            Ok((app, s.remove_application(&n)?))
        })
        .await?;
    let summary = crate::service::audit::list_summary(&names(&ids));
    note(&req, format!("removed application {name}: {} machines to dead: {summary}", ids.len()));
    let (constraints, capacity) = app.unwrap_or_default();
    let view = application_view(&ApplicationRecord { name, constraints, capacity, machines: ids });
    Ok(HttpResponse::Ok().json(view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::http::machines::tests::{bad, cloud};

    #[test]
    fn applications_are_checked() {
        let body = |name: &str, units: usize, c: Option<serde_json::Value>| AddApplication {
            name: name.into(),
            units,
            constraints: c,
            capacity: None,
        };
        let (name, units, c) = check_application(&cloud(), body("web", 3, Some(serde_json::json!("cores=2")))).unwrap();
        assert_eq!((name.as_str(), units, c.constraints.cores), ("web", 3, Some(2)));
        assert_eq!(c.capacity, crate::model::CapacityPreference::OnDemand);
        let spot = AddApplication { capacity: Some("prefer-spot".into()), ..body("web", 1, None) };
        assert_eq!(check_application(&cloud(), spot).unwrap().2.capacity, crate::model::CapacityPreference::PreferSpot);
        let wrong = AddApplication { capacity: Some("cheap".into()), ..body("web", 1, None) };
        assert_eq!(
            bad(check_application(&cloud(), wrong)),
            "capacity: invalid capacity \"cheap\": expected one of on-demand, spot, prefer-spot"
        );
        assert!(bad(check_application(&cloud(), body("Web", 3, None))).starts_with("name: invalid application name"));
        assert!(bad(check_application(&cloud(), body("web", 0, None))).starts_with("units must be"));
        assert!(bad(check_application(&cloud(), body("web", 1, Some(serde_json::json!("mem=lots")))))
            .starts_with("constraints:"));
    }
}
