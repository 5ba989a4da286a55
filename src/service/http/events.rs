//! `/v1/events`: the server-sent event stream of the model's provisioner events, admitted by the
//! service's stream gate (caps per token and per replica: 429 naming the cap).

use actix_web::{web, HttpResponse};

use super::auth::Authorized;
use super::errors::{ApiError, Result};
use super::target::{Host, State};
use super::wire::ErrorBody;

#[utoipa::path(get, path = "/v1/events", tag = "service", operation_id = "events",
    responses(
        (status = 200, description = "Server-sent events, one `EventView` (JSON) per `data:` line, until the \
            client disconnects, falls behind or goes idle (`stream-dropped`), or its token is revoked \
            (`token-revoked`)", content_type = "text/event-stream", body = String),
        (status = 429, description = "The token already holds `[events] max_streams_per_token` streams (8) on this \
            replica, or the replica `[events] max_streams` (256), all tokens together; the message names the cap \
            and how to raise it", body = ErrorBody),
    ))]
pub(super) async fn events(who: Authorized, st: State, host: Host) -> Result<HttpResponse> {
    use crate::service::events::{Admit, OpenStream};
    use futures::StreamExt;
    let ticket = host
        .shared()
        .streams
        .send(Admit(who.0.id))
        .await
        .map_err(|e| ApiError::internal(format!("event stream: {e}")))?
        .map_err(|refused| ApiError::new(429, refused.to_string()))?;
    let rx =
        st.events.send(OpenStream(Some(ticket))).await.map_err(|e| ApiError::internal(format!("event stream: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(rx.map(|frame| Ok::<_, actix_web::Error>(web::Bytes::from(frame)))))
}
