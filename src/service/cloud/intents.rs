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

use crate::model::{CloudInstance, InstanceId, InstanceTags, MachineId};
use crate::ports::{AvailabilityZone, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};
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

/// Whether a start's outcome settles its intent: anything but an ambiguous failure (which the
/// start itself retries with the same token, and a successor must be able to repeat).
fn settles(outcome: &Result<StartedInstance, BrokerError>) -> bool {
    !matches!(outcome, Err(e) if e.is_ambiguous())
}

impl IntentBroker {
    /// `inner`, its starts' intents kept in `store`.
    #[cfg_attr(not(feature = "ec2"), allow(dead_code))]
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
    fn pace_follow_ups(&self, pacer: std::sync::Arc<dyn crate::ports::Pacer>) {
        self.inner.pace_follow_ups(pacer)
    }
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
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.inner.stop_instances(ids)
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        self.inner.all_instances()
    }
    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        self.inner.instances_of_start(machine, nonce)
    }
    fn supports_zones(&self) -> bool {
        self.inner.supports_zones()
    }
    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        self.inner.availability_zones()
    }
    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        self.inner.derive_availability_zones(params)
    }
    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        self.inner.retag_instance(id, tags)
    }
    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.inner.release_instances(ids)
    }
}

#[cfg(test)]
mod tests {
    // A scripted broker shared with the test through a std mutex (no actor involved).
    #![allow(clippy::disallowed_types)]

    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::model::{InstanceState, InstanceTags};

    /// Answers its starts from a script and records every call.
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<VecDeque<Result<StartedInstance, BrokerError>>>,
        calls: Mutex<Vec<StartInstanceParams>>,
    }

    fn started(id: &str) -> Result<StartedInstance, BrokerError> {
        Ok(StartedInstance {
            instance: CloudInstance {
                id: InstanceId::new(id),
                state: InstanceState::Running,
                zone: Some("az1".into()),
                tags: InstanceTags::default(),
                age: None,
                instance_type: None,
            },
            display_name: String::new(),
        })
    }

    impl Broker for Scripted {
        fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
            self.calls.lock().unwrap().push(params);
            let answer = self.answers.lock().unwrap().pop_front().unwrap_or_else(|| started("i-default"));
            async move { answer }.boxed()
        }
        fn stop_instances(&self, _ids: Vec<InstanceId>) -> BrokerFuture<()> {
            async { Ok(()) }.boxed()
        }
        fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
            async { Ok(Vec::new()) }.boxed()
        }
        fn release_instances(&self, _ids: Vec<InstanceId>) -> BrokerFuture<()> {
            async { Ok(()) }.boxed()
        }
    }

    fn params(machine: &str, token: &str) -> StartInstanceParams {
        StartInstanceParams {
            machine: MachineId::new(machine),
            zone: Some("az1".into()),
            constraints: crate::model::Constraints::parse("cores=2 mem=4G").unwrap(),
            placement: None,
            volumes: Vec::new(),
            nonce: format!("machine-{machine}:n"),
            tags: InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None },
            extra_tags: Default::default(),
            client_token: token.into(),
            distribution_group: vec![MachineId::new("7")],
        }
    }

    fn fresh_db(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("provisioner-intents-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("p.db")
    }

    /// A start whose answer was lost keeps its intent; after a restart (a new broker over the
    /// same database) `resume` repeats it with the same token and parameters, then drops it. A
    /// settled start (an instance, or a definite refusal) leaves no intent.
    #[test]
    fn an_unsettled_start_is_repeated_by_its_token_after_a_restart() {
        let db = fresh_db("resume");
        actix_rt::System::new().block_on(async move {
            let store = Store::start(&db).unwrap();
            let before = Arc::new(Scripted::default());
            before.answers.lock().unwrap().extend([
                started("i-1"),
                Err(BrokerError::zone_specific("no capacity in az1")),
                Err(BrokerError::transient("connection reset before the answer")),
            ]);
            let broker = IntentBroker::new(before.clone(), store.clone());
            broker.start_instance(params("1", "tok-1")).await.unwrap();
            broker.start_instance(params("2", "tok-2")).await.unwrap_err();
            let lost = broker.start_instance(params("3", "tok-3")).await.unwrap_err();
            assert!(lost.is_ambiguous());
            let left = store.exec(|s| s.start_intents()).await.unwrap();
            assert_eq!(left.len(), 1, "only the unsettled start is left: {left:?}");

            // The restart: a new broker over the same store repeats it before anything else.
            let after = Arc::new(Scripted::default());
            after.answers.lock().unwrap().push_back(started("i-3"));
            let broker = IntentBroker::new(after.clone(), store.clone());
            assert_eq!(broker.resume().await.unwrap(), 1);
            assert_eq!(*after.calls.lock().unwrap(), vec![params("3", "tok-3")], "same token, same parameters");
            assert!(store.exec(|s| s.start_intents()).await.unwrap().is_empty(), "settled by the repeat");
            assert_eq!(broker.resume().await.unwrap(), 0, "nothing is repeated twice");
        });
    }

    /// The intent is written before the call, fenced: a replica that lost the lease cannot
    /// write it, and then makes no call at all (nothing reached the cloud: a definite failure).
    #[cfg(feature = "postgres")]
    #[test]
    fn a_fenced_out_leader_writes_no_intent_and_makes_no_call() {
        let pg = crate::testing::TempPostgres::start("intents-fence").unwrap();
        let url = pg.url().to_owned();
        // The model, and another replica's lease on it, before the store's actor runs.
        use crate::service::store::StoreBackend;
        let model = crate::service::store::PgStore::open(&url).unwrap().model_uuid().unwrap();
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin
            .execute(
                "INSERT INTO leader_lease (model_uuid, holder, epoch, expires_at) \
                 VALUES ($1, 'replica-b', 2, now() + interval '1 minute')",
                &[&model],
            )
            .unwrap();
        actix_rt::System::new().block_on(async move {
            let store = Store::start_postgres(&url).unwrap();
            let fence = crate::service::store::Fence { model_uuid: model, holder: "replica-a".into(), epoch: 1 };
            store.set_fence(Some(fence)).await.unwrap();
            let inner = Arc::new(Scripted::default());
            let broker = IntentBroker::new(inner.clone(), store.clone());
            let e = broker.start_instance(params("1", "tok-1")).await.unwrap_err();
            assert!(!e.is_ambiguous() && e.to_string().contains("fenced"), "{e}");
            assert!(inner.calls.lock().unwrap().is_empty(), "no cloud call without an intent");
            assert!(store.exec(|s| s.start_intents()).await.unwrap().is_empty());
        });
    }
}
