//! The model a request is about: `{model}` of `/v1/models/{model}/...`, else `default` for a
//! per-model route, and none for the service's own routes (`/v1/models`, `/v1/tokens`); the
//! extractor that looks that model's runtime up ([`ModelState`]: 404 for an unknown model, 503
//! for one that does not run).

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};

use super::errors::{ApiError, Result};
use crate::service::host::{ModelHost, DEFAULT_MODEL};
use crate::service::runtime::ModelRuntime;

/// The model a request is about: `{model}` of `/v1/models/{model}/...`, else `default`.
pub(super) type State = ModelState;
/// The service's models.
pub(super) type Host = web::Data<ModelHost>;

/// The state of the model a request names (`/v1/models/{model}/...`; the plain routes mean
/// `default`): 404 naming an unknown model, 503 for one that does not run.
pub(crate) struct ModelState(pub ModelRuntime);

impl std::ops::Deref for ModelState {
    type Target = ModelRuntime;
    fn deref(&self) -> &ModelRuntime {
        &self.0
    }
}

/// The model a request is about, for a model-scoped token's check: `{model}` in its path, else
/// `default` for a per-model route; `None` for the service's own routes (`/v1/models`,
/// `/v1/tokens`).
pub(super) fn target_model(req: &HttpRequest) -> Option<&str> {
    match req.match_info().get("model") {
        Some(m) => Some(m),
        None if ["/v1/models", "/v1/tokens"]
            .iter()
            .any(|p| req.path() == *p || req.path().starts_with(&format!("{p}/"))) =>
        {
            None
        }
        None => Some(DEFAULT_MODEL),
    }
}

/// The model a request names: `{model}` in its path, else `default`.
pub(crate) fn model_of(req: &HttpRequest) -> &str {
    req.match_info().get("model").unwrap_or(DEFAULT_MODEL)
}

impl FromRequest for ModelState {
    type Error = ApiError;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, ApiError>>;
    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let host = req.app_data::<Host>().cloned();
        let name = model_of(req).to_owned();
        Box::pin(async move {
            match host {
                Some(host) => host.state(&name).await.map(ModelState).map_err(ApiError::from),
                None => Err(ApiError::internal("the API has no models")),
            }
        })
    }
}
