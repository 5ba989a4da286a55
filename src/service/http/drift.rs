//! `/v1/drift` (issue 34): the model's live machines whose recorded instance no longer matches
//! what a start would make for them today (`model::drift`: an instance type the constraints now
//! forbid, another image than the model's, a zone outside the ones the machine allows, a
//! machine tag changed outside us), with the reasons. Report-only. Judged on the listings the
//! service made (at most `listing::MAX_AGE` old, the age in the `Age` header, as `/v1/instances`) and the store's
//! machines, so any replica answers and no reader drives the cloud's API (the image a start
//! uses today is the configuration's, or one read of the LXD alias, bounded).

use actix_web::HttpResponse;

use super::auth::Authorized;
use super::errors::Result;
use super::target::State;
use super::wire::{DriftReasonView, DriftView};
use crate::model::drift::{drift_of, Expected};
use crate::model::{InstanceState, Life};
use crate::ports::Broker as _;

/// How long the drift report waits for the cloud to say which image a start uses.
const IMAGE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

#[utoipa::path(get, path = "/v1/drift", tag = "machines", operation_id = "list_drift",
    responses((status = 200, description = "The live machines whose recorded instance has drifted from what a start \
        would make for them today, in id order, each with its reasons (none: an empty list); judged on a listing at \
        most 5 s old (its age in seconds in the `Age` header)", body = Vec<DriftView>)))]
pub(super) async fn list_drift(_: Authorized, st: State) -> Result<HttpResponse> {
    let (list, age) = super::instances::listing(&st).await?;
    let mut machines = st.store.read(|s| s.list_machines()).await?;
    machines.sort_by(|a, b| a.machine.id.cmp(&b.machine.id));
    let catalogue = crate::model::instance_types::shipped();
    // The image a start uses today: the configuration (EC2) or one call (LXD's alias), bounded.
    let image = match tokio::time::timeout(IMAGE_DEADLINE, st.broker.current_image()).await {
        Ok(Ok(image)) => image,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the image a start uses; image drift not judged");
            None
        }
        Err(_) => {
            tracing::warn!("reading the image a start uses timed out; image drift not judged");
            None
        }
    };
    let listed: std::collections::BTreeMap<_, _> =
        list.iter().filter(|i| i.state != InstanceState::Terminated).map(|i| (&i.id, i)).collect();
    let mut out = Vec::new();
    for m in machines.iter().filter(|m| m.machine.life == Life::Alive && !m.machine.manual) {
        let Some(instance) = m.machine.instance.as_ref().and_then(|id| listed.get(id)) else { continue };
        let expected = Expected {
            machine: &m.machine.id,
            constraints: &m.constraints,
            placement: m.placement.as_deref(),
            catalogue: &catalogue,
            image: image.as_deref(),
        };
        let reasons = drift_of(&expected, instance);
        if !reasons.is_empty() {
            out.push(DriftView {
                machine: m.machine.id.to_string(),
                instance: instance.id.to_string(),
                reasons: reasons
                    .iter()
                    .map(|r| DriftReasonView { kind: r.kind().to_owned(), message: r.to_string() })
                    .collect(),
            });
        }
    }
    Ok(HttpResponse::Ok().insert_header(("Age", age.as_secs().to_string())).json(out))
}
