//! `/v1/models`: the models a service hosts (issue 18).
//!
//! - `GET /v1/models`: every model, in name order (`name`, `life`, `machines`, `leader`,
//!   `epoch`).
//! - `POST /v1/models` (`AddModel`): a new model, its store created and its provisioners
//!   started; 400 for a bad name or cloud setting, 409 for a name taken.
//! - `GET /v1/models/{model}`: one model and its cloud; 404 naming an unknown one.
//! - `DELETE /v1/models/{model}[?force=true]`: the model's destruction as `destroy-model` does
//!   it, then the model is removed once its instances are gone (`life` is `dying` meanwhile);
//!   `default` only with `force` (409 otherwise).
//!
//! Everything per model is under `/v1/models/{model}/...`; the plain `/v1/...` routes mean
//! `default` (see [`super::routes::routes`]).

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::{note, Authorized};
use super::body::json_body;
use super::destroy::destroy_running;
use super::errors::{ApiError, Result};
use super::target::Host;
use super::wire::{AddModel, ErrorBody, ModelDetail, ModelView};
use crate::service::host::{broker_of, Listed};
use crate::service::host::{CloudSettings, ModelEntry, ModelLife};

/// Machines, life (the store's when the directory says alive: a `destroy-model` through the
/// model's own route shows), leader and epoch of a listed model.
async fn live_facts(l: &Listed) -> (Option<u64>, String, Option<String>, Option<i64>) {
    let Some(st) = &l.state else {
        return (None, l.entry.life.as_str().to_owned(), None, None);
    };
    let counts = st.store.read(|s| Ok(s.counts().clone())).await.ok();
    let machines = counts.as_ref().map(|c| c.machines_by_status.values().sum());
    let life = match (l.entry.life, &counts) {
        (ModelLife::Alive, Some(c)) if !c.model_life.is_empty() => c.model_life.clone(),
        (life, _) => life.as_str().to_owned(),
    };
    let lease = match &st.replica {
        Some(r) => r.lease_status().await.ok(),
        None => None,
    };
    let leader = lease.as_ref().and_then(|l| l.leader.clone());
    let epoch = lease.as_ref().and_then(|l| l.epoch);
    (machines, life, leader, epoch)
}

async fn detail(host: &Host, l: Listed) -> ModelDetail {
    let (machines, life, leader, epoch) = live_facts(&l).await;
    let broker = broker_of(&host.shared().opts, &l.entry.cloud);
    let zones = l.state.as_ref().map(|s| s.zones.clone()).unwrap_or_default();
    let account_throttled = l.state.as_ref().and_then(|s| s.sim_account.as_ref()).map(|a| a.throttled());
    let c = l.entry.cloud;
    ModelDetail {
        name: l.entry.name,
        life,
        machines,
        leader,
        epoch,
        uuid: l.entry.uuid,
        account: if broker == "sim" { Some(c.account.unwrap_or_else(|| "default".to_owned())) } else { None },
        broker,
        zones,
        region: c.region,
        endpoint: c.endpoint,
        image: c.image,
        lxd: c.lxd,
        error: l.error,
        account_throttled,
    }
}

async fn listed(host: &Host, name: &str) -> Result<Listed> {
    host.list().await.into_iter().find(|l| l.entry.name == name).ok_or_else(|| {
        ApiError::from(crate::service::host::HostError::from(crate::service::host::ModelsError::Unknown(
            name.to_owned(),
        )))
    })
}

/// `GET /v1/models`.
#[utoipa::path(get, path = "/v1/models", tag = "models", operation_id = "list_models",
    responses((status = 200, description = "Every model, in name order", body = Vec<ModelView>)))]
pub(crate) async fn list_models(Authorized(caller): Authorized, host: Host) -> Result<HttpResponse> {
    let mut out = Vec::new();
    // A model-scoped token sees its model alone.
    for l in host.list().await.into_iter().filter(|l| caller.model.as_ref().is_none_or(|m| *m == l.entry.name)) {
        let (machines, life, leader, epoch) = live_facts(&l).await;
        out.push(ModelView { name: l.entry.name, life, machines, leader, epoch });
    }
    Ok(HttpResponse::Ok().json(out))
}

/// `POST /v1/models`.
#[utoipa::path(post, path = "/v1/models", tag = "models", operation_id = "add_model",
    request_body = AddModel,
    responses(
        (status = 201, description = "The new model, running", body = ModelDetail),
        (status = 400, description = "A bad name (Juju's rule) or cloud setting, named", body = ErrorBody),
        (status = 409, description = "A model of that name exists", body = ErrorBody),
    ))]
pub(crate) async fn add_model(
    Authorized(caller): Authorized,
    host: Host,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    caller.service_admin("adding a model")?;
    let AddModel { name, broker, zones, account, region, endpoint, image, lxd } = json_body(&req, payload).await?;
    note(&req, format!("add model {name}"));
    let cloud = CloudSettings { broker, zones, account, region, endpoint, image, lxd };
    host.add(ModelEntry::new(&name, cloud)).await?;
    Ok(HttpResponse::Created().json(detail(&host, listed(&host, &name).await?).await))
}

/// `GET /v1/models/{model}`.
#[utoipa::path(get, path = "/v1/models/{model}", tag = "models", operation_id = "show_model",
    params(("model" = String, Path, description = "The model's name")),
    responses(
        (status = 200, description = "The model and its cloud", body = ModelDetail),
        (status = 404, description = "No such model (named)", body = ErrorBody),
    ))]
pub(crate) async fn show_model(_: Authorized, host: Host, name: web::Path<String>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(detail(&host, listed(&host, &name).await?).await))
}

/// `force` from the query string (`force`, `force=true` or `force=false`); anything else is a
/// 400 naming it.
fn force_of(query: &str) -> Result<bool> {
    let mut force = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        force = match pair {
            "force" | "force=true" => true,
            "force=false" => false,
            other => {
                return Err(ApiError::bad_request(format!(
                    "invalid query {other:?}: only force=true or force=false is taken"
                )))
            }
        };
    }
    Ok(force)
}

/// `DELETE /v1/models/{model}[?force=true]`.
#[utoipa::path(delete, path = "/v1/models/{model}", tag = "models", operation_id = "destroy_model_and_remove",
    params(
        ("model" = String, Path, description = "The model's name"),
        ("force" = Option<bool>, Query, description = "Destroy `default` too; leave live manual machines as they are"),
    ),
    responses(
        (status = 200, description = "The model is dying: it is removed once its instances are gone", body = ModelDetail),
        (status = 400, description = "A query other than `force`", body = ErrorBody),
        (status = 404, description = "No such model (named)", body = ErrorBody),
        (status = 409, description = "`default` without `force`, or live manual machines without `force` (named); \
            nothing was changed", body = ErrorBody),
    ))]
pub(crate) async fn destroy_model(
    Authorized(caller): Authorized,
    host: Host,
    name: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    caller.service_admin("destroying a model")?;
    let force = force_of(req.query_string())?;
    let name = name.into_inner();
    note(&req, format!("destroy model {name}{}", if force { " (force)" } else { "" }));
    let entry = host.may_destroy(&name, force).await?;
    if entry.life == ModelLife::Alive {
        match host.state(&name).await {
            Ok(st) => {
                // Its own `destroy-model` may have come first: the engine is at it already.
                if st.store.read(|s| s.model_life()).await? == crate::model::Life::Alive {
                    destroy_running(&st, force).await?;
                }
            }
            Err(crate::service::host::HostError::NotRunning { .. }) if force => {
                host.forget(&name).await?;
                revoke_tokens_of(&host, &req, &entry).await?;
                let mut gone = detail(&host, Listed { entry, state: None, error: None }).await;
                gone.life = "removed".into();
                return Ok(HttpResponse::Ok().json(gone));
            }
            Err(e) => return Err(e.into()),
        }
    }
    host.mark_dying(&name, force).await?;
    revoke_tokens_of(&host, &req, &entry).await?;
    Ok(HttpResponse::Ok().json(detail(&host, listed(&host, &name).await?).await))
}

/// A destroyed model's scoped tokens end with it (listed as revoked): a later model of the same
/// name is another model, which they were never valid for.
async fn revoke_tokens_of(host: &Host, req: &HttpRequest, entry: &ModelEntry) -> Result<()> {
    let Some(uuid) = entry.uuid.clone() else { return Ok(()) };
    let (name, at) = (entry.name.clone(), crate::service::audit::now_rfc3339());
    let revoked = host.shared().service_store.exec(move |s| s.revoke_model_tokens(&name, &uuid, &at)).await?;
    if !revoked.is_empty() {
        let ids: Vec<String> = revoked.into_iter().map(|t| t.id).collect();
        note(
            req,
            format!("destroy model {}: revoked its tokens {}", entry.name, crate::service::audit::list_summary(&ids)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::force_of;

    #[test]
    fn only_force_is_taken_from_the_query() {
        assert!(!force_of("").unwrap());
        assert!(force_of("force=true").unwrap());
        assert!(force_of("force").unwrap());
        assert!(!force_of("force=false").unwrap());
        let e = force_of("forse=true").unwrap_err();
        assert!(e.status == 400 && e.message.contains("forse"), "{e}");
    }
}
