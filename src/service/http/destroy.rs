//! `/v1/destroy-model`: the engine's destruction of the model the path names (its instances
//! stopped, its machines removed), refused while live manual machines remain unless `force`;
//! `destroy_running` is also the first step of `DELETE /v1/models/{model}`.

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::{note, Authorized};
use super::body::{parse_body, read_body};
use super::errors::{ApiError, Result};
use super::target::State;
use super::wire::{DestroyRequest, DestroyView, ErrorBody};
use crate::model::MachineId;
use crate::service::runtime::ModelRuntime;
use crate::DestroyError;

#[utoipa::path(post, path = "/v1/destroy-model", tag = "model", operation_id = "destroy_model",
    request_body(content = Option<DestroyRequest>, description = "Optional: no body (or an empty one) means `force: false`"),
    responses(
        (status = 200, description = "The model is dying: what the destruction set in motion", body = DestroyView),
        (status = 400, description = "A body that does not parse", body = ErrorBody),
        (status = 409, description = "The model is already dying, or live manual machines refuse it (named) without `force`", body = ErrorBody),
    ))]
pub(super) async fn destroy_model(
    _: Authorized,
    st: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    // No body (or an empty one) means the defaults; anything else must parse, or nothing happens.
    let DestroyRequest { force } = parse_body(&read_body(&req, payload).await?, Some(DestroyRequest::default()))?;
    note(&req, if force { "destroy the model (force)" } else { "destroy the model" });
    Ok(HttpResponse::Ok().json(destroy_running(&st, force).await?))
}

/// The engine's destruction of a model, as `destroy-model` asks it (and `model destroy` before
/// the model is removed): live manual machines refuse it without `force` (409, nothing
/// changed); containers are in its scope too.
pub(crate) async fn destroy_running(st: &ModelRuntime, force: bool) -> Result<DestroyView> {
    let manual = refuse_destroy_with_manual_machines(st, force).await?;
    let running = st.running().await?;
    let result = running.handle.destroy_model(force).await;
    if let (Some(c), Ok(_) | Err(DestroyError::ManualMachines { .. })) = (&running.containers, &result) {
        // Containers are in the destruction's scope too.
        c.model_destroyed();
    }
    match result {
        Ok(s) => Ok(DestroyView {
            stopping: s.stopping.iter().map(ToString::to_string).collect(),
            awaiting_starts: s.awaiting_starts.iter().map(ToString::to_string).collect(),
            manual_machines: manual.iter().map(ToString::to_string).collect(),
        }),
        Err(DestroyError::ManualMachines { ids, .. }) => Err(ApiError::new(409, manual_machines_message(&ids, true))),
        Err(e @ DestroyError::AlreadyDying) => Err(ApiError::new(409, e.to_string())),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// Juju's check before a model destruction: without `force`, live manual machines refuse it
/// (409 naming them) and nothing changes (the model stays alive); with `force` the
/// destruction goes on and leaves them as they are (answered in `manual_machines`). A manual
/// machine added after this check is caught by the engine's own check, which answers the same
/// way (the model is dying by then).
async fn refuse_destroy_with_manual_machines(st: &ModelRuntime, force: bool) -> Result<Vec<MachineId>> {
    let (manual, life) = st.store.exec(|s| Ok((s.live_manual_machines()?, s.model_life()?))).await?;
    // A dying model is the engine's to answer (already dying).
    if !force && !manual.is_empty() && life == crate::model::Life::Alive {
        return Err(ApiError::new(409, manual_machines_message(&manual, false)));
    }
    Ok(manual)
}

/// The refusal naming the manual machines, as Juju words it, with what to do.
fn manual_machines_message(ids: &[MachineId], dying: bool) -> String {
    let names: Vec<&str> = ids.iter().map(MachineId::as_str).collect();
    format!(
        "manually provisioned machines must first be destroyed with `provisioner machine remove {}`, or the model \
         destroyed with --force, which leaves them as they are: {}{}",
        names.join(" "),
        names.join(", "),
        if dying { " (the model is dying; its other instances are being stopped)" } else { " (nothing was changed)" }
    )
}
