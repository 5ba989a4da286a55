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
use std::time::Duration;

use futures::FutureExt;

use crate::model::MachineId;
use crate::ports::{start_settled as settles, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};
use crate::service::store::{Store, StoreError};

/// How many times [`IntentBroker::resume`] makes a start's repeat that fails ambiguously
/// before it gives up (and the provisioner does not run).
pub(crate) const REPEAT_ATTEMPTS: u32 = 3;

/// The pause before the first repeat of a repeat that failed ambiguously; it doubles after each.
const REPEAT_PAUSE: Duration = Duration::from_secs(1);

/// Why the starts left in flight could not all be settled: the provisioner must not run (its
/// starts draw fresh client tokens, and an unsettled token repeated later could make a second
/// instance for a machine that has one by then).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The store failed, or fenced the leader out (it lost the lease): not acting.
    #[error("cannot resume the starts left in flight: {0}")]
    Store(#[from] StoreError),
    /// A repeat kept failing ambiguously (the cloud may or may not have made the instance).
    #[error(
        "the start of machine {machine} left in flight (client token {token}) could not be settled: its repeat          failed {attempts} times, last with: {source}"
    )]
    Unsettled {
        /// The machine the start is for.
        machine: MachineId,
        /// Its client token.
        token: String,
        /// How many repeats were made.
        attempts: u32,
        /// The last repeat's failure.
        #[source]
        source: BrokerError,
    },
}

/// A broker whose starts are written down before they are made.
#[derive(Clone)]
pub(crate) struct IntentBroker {
    inner: Arc<dyn Broker>,
    store: Store,
    /// The pause before the second repeat of an ambiguous failure (it doubles).
    repeat_pause: Duration,
}

impl std::fmt::Debug for IntentBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentBroker").finish_non_exhaustive()
    }
}

impl IntentBroker {
    /// `inner`, its starts' intents kept in `store`.
    pub(crate) fn new(inner: Arc<dyn Broker>, store: Store) -> Self {
        Self { inner, store, repeat_pause: REPEAT_PAUSE }
    }

    /// The same, pausing `pause` (doubling) between the repeats of an ambiguous failure.
    #[cfg(test)]
    pub(crate) fn with_repeat_pause(self, pause: Duration) -> Self {
        Self { repeat_pause: pause, ..self }
    }

    /// Repeats every start whose intent is not settled, with its token and parameters, and
    /// drops the intents the cloud settled; answers how many were repeated. Run before the
    /// provisioner starts (a restart, or each epoch a replica leads), and the provisioner runs
    /// only once it answers `Ok`: every start left in flight is then settled (its instance
    /// made or found, or refused), so no token of an earlier run is left to land later.
    ///
    /// A repeat that fails ambiguously is made again in place, [`REPEAT_ATTEMPTS`] times at
    /// most with a doubling pause, each one after a fenced write of its intent (a leader that
    /// lost the lease meanwhile stops: no intent, no call). Still unsettled, it is
    /// [`ResumeError::Unsettled`]: the intent stays, and the provisioner must not run (a lone
    /// service refuses to start; a leader does not act and steps down, and the next leader
    /// repeats it).
    pub(crate) async fn resume(&self) -> Result<usize, ResumeError> {
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
            self.settle(params, text).await?;
            repeated += 1;
        }
        Ok(repeated)
    }

    /// Repeats one start until it settles (at most [`REPEAT_ATTEMPTS`] calls), then drops its
    /// intent.
    async fn settle(&self, params: StartInstanceParams, text: String) -> Result<(), ResumeError> {
        let (token, machine) = (params.client_token.clone(), params.machine.clone());
        let mut pause = self.repeat_pause;
        let mut attempt = 1;
        loop {
            if attempt > 1 {
                actix_rt::time::sleep(pause).await;
                pause *= 2;
                // Fenced, as before every call: a deposed leader makes no call.
                let (key, m, t) = (token.clone(), machine.clone(), text.clone());
                self.store.exec_lazy(move |s| s.put_start_intent(&key, &m, &t)).await?;
            }
            match self.inner.start_instance(params.clone()).await {
                Ok(started) => {
                    tracing::info!(%machine, instance = %started.instance.id, attempt, "a start in flight before, repeated by its client token");
                    break;
                }
                Err(e) if !e.is_ambiguous() => {
                    tracing::warn!(%machine, error = %e, "a start in flight before, repeated by its client token, was refused");
                    break;
                }
                Err(e) if attempt >= REPEAT_ATTEMPTS => {
                    return Err(ResumeError::Unsettled { machine, token, attempts: attempt, source: e });
                }
                Err(e) => {
                    tracing::warn!(%machine, error = %e, attempt, "a start in flight before, repeated by its client token, failed ambiguously: repeating it");
                    attempt += 1;
                }
            }
        }
        self.store.exec_lazy(move |s| s.drop_start_intent(&token)).await?;
        Ok(())
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
    crate::forward_broker!(inner: pace_follow_ups, stop_instances, all_instances, instances_of_start, supports_zones, zones_change, availability_zones, derive_availability_zones, retag_instance, release_instances, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}

#[cfg(test)]
mod tests;
