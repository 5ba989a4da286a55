//! `/v1/instances`: the cloud's instances of the model, as the service's broker sees them; on
//! a real cloud from the listings the service made (at most `listing::MAX_AGE` old, the age in
//! the answer's `Age` header): no reader drives the cloud's API.

use actix_web::HttpResponse;

use super::auth::Authorized;
use super::errors::{ApiError, Result};
use super::target::State;
use super::wire::InstanceView;

#[utoipa::path(get, path = "/v1/instances", tag = "instances", operation_id = "list_instances",
    responses((status = 200, description = "The cloud's instances of this model; on a real cloud from a listing at \
        most 5 s old (its age in seconds in the `Age` header; a start, stop or release through the service makes the \
        next read list again): readers never drive the cloud's API", body = Vec<InstanceView>)))]
pub(super) async fn list_instances(_: Authorized, st: State) -> Result<HttpResponse> {
    let (list, age) = listing(&st).await?;
    let views: Vec<InstanceView> = list
        .iter()
        .map(|i| InstanceView {
            id: i.id.to_string(),
            state: i.state.to_string(),
            zone: i.zone.clone(),
            machine: i.tags.machine.as_ref().map(|m| m.to_string()),
        })
        .collect();
    Ok(HttpResponse::Ok().insert_header(("Age", age.as_secs().to_string())).json(views))
}

/// The model's instances from the listings the service made (at most `listing::MAX_AGE` old: no
/// reader drives the cloud's API), and the listing's age (the answer's `Age` header, in whole
/// seconds).
pub(super) async fn listing(
    st: &State,
) -> Result<(std::sync::Arc<Vec<crate::model::CloudInstance>>, std::time::Duration)> {
    st.broker
        .read_instances(crate::service::cloud::listing::MAX_AGE)
        .await
        .map_err(|e| ApiError::internal(format!("listing the cloud: {e}")))
}
