//! Start intents: a broker decorator that writes each start's client token and parameters to
//! the store *before* the cloud call, and drops them once the start is settled, so that a
//! restarted service or a new leader repeats every start that may be in flight with the same
//! token and the same parameters (the cloud answers the instance the first call made, or makes
//! it once) before its provisioner runs.
//!
//! Why: a provisioner's start job draws a fresh nonce, hence a fresh client token; adoption by
//! tags finds an instance the listing shows, but a cloud whose listing lags its starts (EC2's
//! is eventually consistent), or a call abandoned in flight by a leader that stepped down, can
//! land after the new provisioner looked. The intent closes that window: the call is repeated
//! by token first, then the provisioner's listing sees the instance and adopts it.
//!
//! The intent's writes are the provisioner's own (`Store::exec_lazy`): on PostgreSQL they are
//! fenced, so a leader that lost its lease cannot write one, and then makes no call. The
//! simulated cloud keeps its own intents (its pending instances, `simcloud.rs`); this decorator
//! is for the brokers that talk to a real cloud (EC2).

use std::sync::Arc;

use futures::FutureExt;

use crate::ports::{start_settled as settles, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};
use crate::service::store::{Store, StoreError};

/// A broker whose starts are written down before they are made.
#[derive(Clone)]
pub(crate) struct IntentBroker {
    inner: Arc<dyn Broker>,
    store: Store,
}

impl std::fmt::Debug for IntentBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentBroker").finish_non_exhaustive()
    }
}

impl IntentBroker {
    /// `inner`, its starts' intents kept in `store`.
    pub(crate) fn new(inner: Arc<dyn Broker>, store: Store) -> Self {
        Self { inner, store }
    }

    /// Repeats every start whose intent is not settled, with its token and parameters, and
    /// drops the intents the cloud settled; answers how many were repeated. Run before the
    /// provisioner starts (a restart, or each epoch a replica leads). A cloud error leaves the
    /// intent for the next attempt (the provisioner adopts what it finds by tags meanwhile).
    pub(crate) async fn resume(&self) -> Result<usize, StoreError> {
        let intents = self.store.exec_lazy(|s| s.start_intents()).await?;
        let mut repeated = 0;
        for text in intents {
            let params: StartInstanceParams = match serde_json::from_str(&text) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "a start intent that does not parse is left alone");
                    continue;
                }
            };
            let token = params.client_token.clone();
            let machine = params.machine.clone();
            let outcome = self.inner.start_instance(params).await;
            repeated += 1;
            match &outcome {
                Ok(started) => {
                    tracing::info!(%machine, instance = %started.instance.id, "a start in flight before, repeated by its client token")
                }
                Err(e) => {
                    tracing::warn!(%machine, error = %e, "a start in flight before, repeated by its client token, failed")
                }
            }
            if settles(&outcome) {
                self.store.exec_lazy(move |s| s.drop_start_intent(&token)).await?;
            }
        }
        Ok(repeated)
    }
}

impl Broker for IntentBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let (inner, store) = (self.inner.clone(), self.store.clone());
        async move {
            let text = serde_json::to_string(&params)
                .map_err(|e| BrokerError::zone_independent(format!("cannot write the start's intent: {e}")))?;
            let (token, machine) = (params.client_token.clone(), params.machine.clone());
            // Written (fenced) before the call: no intent, no call. A failure here is definite:
            // nothing reached the cloud.
            let key = token.clone();
            store
                .exec_lazy(move |s| s.put_start_intent(&key, &machine, &text))
                .await
                .map_err(|e| BrokerError::zone_independent(format!("cannot write the start's intent: {e}")))?;
            let outcome = inner.start_instance(params).await;
            if settles(&outcome) {
                if let Err(e) = store.exec_lazy(move |s| s.drop_start_intent(&token)).await {
                    // Left behind, it is repeated (by token: no second instance) at the next resume.
                    tracing::warn!(error = %e, "cannot drop a settled start's intent");
                }
            }
            outcome
        }
        .boxed()
    }
    crate::forward_broker!(inner: pace_follow_ups, stop_instances, all_instances, instances_of_start, supports_zones, availability_zones, derive_availability_zones, retag_instance, release_instances, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}

#[cfg(test)]
mod tests;
