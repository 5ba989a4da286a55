//! [`ModelRuntime`], the handles of one running model (its store, cloud, provisioners,
//! metrics, event streams, and with replicas its lease) that the HTTP handlers and the model
//! host use; [`ModelReplica`], its lease on this replica; [`NotRunning`], why its provisioners
//! cannot be reached here.

use std::collections::BTreeMap;

use actix_rt::time::Instant;

use crate::service::metrics::{MeteredBroker, Metrics};
use crate::service::store::Store;
use crate::ProvisionerHandle;

/// Why a model's provisioners cannot be reached on this replica.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotRunning {
    /// This replica follows: the leader's replica runs them.
    #[error("this replica is a follower (the leader is {leader}): ask the leader's replica")]
    Follower {
        /// The leader's replica id, or `none yet`.
        leader: String,
    },
    /// An actor that should answer did not.
    #[error("{0}")]
    Internal(String),
}

/// One running model: its store, cloud, provisioners, metrics and event streams, as the HTTP
/// handlers use them (cheap to clone: handles and addresses).
#[derive(Clone)]
pub(crate) struct ModelRuntime {
    /// The database.
    pub store: Store,
    /// The simulated cloud's own store, when its instances are written on a connection of
    /// their own (PostgreSQL: [`Store::companion`]); `None`: on `store`.
    pub cloud_store: Option<Store>,
    /// The running provisioner (`None` with replicas: the leader's is in `replica`).
    pub handle: Option<ProvisionerHandle>,
    /// The cloud, metered.
    pub broker: MeteredBroker,
    /// The metrics actor.
    pub metrics: actix::Addr<Metrics>,
    /// The event streams.
    pub events: actix::Addr<crate::service::events::EventHub>,
    /// Event-stream clients dropped for falling behind.
    pub events_dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The cloud's zones.
    pub zones: Vec<String>,
    /// The cloud's subnets and their zones, where the service knows them (the simulated cloud).
    pub subnets: Option<BTreeMap<String, Vec<String>>>,
    /// `sim`.
    pub broker_name: String,
    /// The model's uuid.
    pub model_uuid: String,
    /// When the service started.
    pub started: Instant,
    /// The lazy container provisioners (`None`: this service runs no containers, and refuses
    /// to add them).
    pub containers: Option<crate::ContainersHandle>,
    /// With replicas on PostgreSQL: the lease and the leader's provisioners.
    pub replica: Option<ModelReplica>,
    /// The simulated account the model's starts spend (with `--sim-account-start-rate`).
    pub sim_account: Option<crate::service::cloud::sim::SimAccount>,
}

/// A model's lease on this replica and, while it leads, its provisioners.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub(crate) struct ModelReplica {
    /// The lease actor (role, holder, epoch).
    pub lease: actix::Addr<crate::service::lease::actor::LeaseActor>,
    /// The provisioners of the epoch this replica leads.
    pub leading: actix::Addr<crate::service::lease::leading::Leading>,
    /// How many models this replica leads, all models together (shared by every model).
    pub models_led: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Without PostgreSQL there are no replicas: this type has no value.
#[cfg(not(feature = "postgres"))]
#[derive(Clone)]
pub(crate) enum ModelReplica {}

#[cfg(feature = "postgres")]
impl ModelReplica {
    /// The lease's status (role, holder, epoch).
    pub(crate) async fn lease_status(&self) -> Result<crate::service::lease::state::LeaseStatus, NotRunning> {
        let status = self.lease.send(crate::service::lease::actor::GetLeaseStatus).await;
        status.map_err(|e| NotRunning::Internal(format!("the lease: {e}")))
    }

    fn models_led(&self) -> usize {
        self.models_led.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn current(&self) -> Result<Option<crate::service::lease::leading::Provisioners>, NotRunning> {
        let current = self.leading.send(crate::service::lease::leading::Current).await;
        current.map_err(|e| NotRunning::Internal(format!("the leader's provisioners: {e}")))
    }
}

#[cfg(not(feature = "postgres"))]
impl ModelReplica {
    /// The lease's status: no value without PostgreSQL.
    pub(crate) async fn lease_status(&self) -> Result<crate::service::lease::state::LeaseStatus, NotRunning> {
        match *self {}
    }

    fn models_led(&self) -> usize {
        match *self {}
    }

    async fn current(&self) -> Result<Option<crate::service::lease::leading::Provisioners>, NotRunning> {
        match *self {}
    }
}

impl ModelRuntime {
    /// With replicas: how many models this replica leads now, all models together.
    pub(crate) fn models_led(&self) -> Option<usize> {
        self.replica.as_ref().map(ModelReplica::models_led)
    }

    /// The provisioners this replica runs: the service's own, or with replicas the leader's
    /// of the current epoch; a follower answers 503 naming the leader.
    pub(crate) async fn running(&self) -> Result<crate::service::lease::leading::Provisioners, NotRunning> {
        use crate::service::lease::leading::Provisioners;
        match (&self.handle, &self.replica) {
            (Some(handle), _) => Ok(Provisioners { handle: handle.clone(), containers: self.containers.clone() }),
            (None, Some(r)) => match r.current().await? {
                Some(p) => Ok(p),
                None => {
                    let lease = r.lease_status().await.ok();
                    let leader = lease.and_then(|l| l.leader).unwrap_or_else(|| "none yet".to_owned());
                    Err(NotRunning::Follower { leader })
                }
            },
            (None, None) => Err(NotRunning::Internal("no provisioner runs here".into())),
        }
    }
}
