//! A model's provisioners: the environ provisioner over its store and cloud, and the container
//! provisioners beside it, both heard by the metrics and the event stream and fed the store's
//! changes (what a lone service runs at start and a leader at each epoch it leads); and
//! [`PendingStarts`], the starts a previous run or leader left in flight, repeated first.

use std::sync::Arc;

use crate::config::ProvisionerConfig;
use crate::service::cloud::intents::ResumeError;
use crate::service::cloud::sim::SimCloud;
use crate::service::error::ServeError;
use crate::service::metrics::{MeteredBroker, Metrics};
use crate::service::settings::{BrokerKind, ServeSettings};
use crate::service::store::Store;

use super::StoreModel;

/// What holds the starts a previous run or leader may have left in flight, repeated before the
/// provisioner starts: the simulated cloud's pending instances, or the start intents a real
/// cloud's broker wrote before its calls (`service::cloud::intents`).
#[derive(Clone)]
pub(crate) enum PendingStarts {
    /// The simulated cloud lands its pending instances.
    Sim(Box<SimCloud>),
    /// A real cloud's starts are repeated by their client tokens.
    Intents(crate::service::cloud::intents::IntentBroker),
}

impl PendingStarts {
    /// Repeats them: how many. The provisioner runs only once this answers `Ok` (every start
    /// left in flight settled).
    pub(crate) async fn resume(&self) -> Result<usize, ResumeError> {
        match self {
            PendingStarts::Sim(sim) => Ok(sim.resume().await?),
            PendingStarts::Intents(intents) => intents.resume().await,
        }
    }

    /// Sets the leader's fence on the cloud's own store, if it has one apart from the model's
    /// (the simulated cloud on PostgreSQL: [`Store::companion`]); the intents' store is the
    /// model's, fenced with it.
    #[cfg(feature = "postgres")]
    pub(super) async fn set_fence(
        &self,
        fence: crate::service::store::Fence,
    ) -> Result<(), crate::service::store::StoreError> {
        match self {
            PendingStarts::Sim(sim) => sim.set_fence(fence).await,
            PendingStarts::Intents(_) => Ok(()),
        }
    }
}

/// Starts the environ provisioner over the store, and the container provisioners beside it,
/// both heard by the metrics and the event stream, and both fed the store's changes: what a
/// lone service runs at start and a replica runs when it becomes the leader.
pub(super) fn start_provisioners(
    opts: &ServeSettings,
    config: ProvisionerConfig,
    broker: &MeteredBroker,
    store: &Store,
    metrics: &actix::Addr<Metrics>,
    events: &actix::Addr<crate::service::events::EventHub>,
    limiter: Option<&crate::SharedLimiter>,
) -> Result<(crate::ProvisionerHandle, Option<crate::ContainersHandle>), ServeError> {
    let (cloud, model) = (Arc::new(broker.clone()), Arc::new(StoreModel::new(store.clone())));
    // Paced by its account's limiter, shared with the other models there.
    let handle = match limiter {
        Some(l) => crate::start_sharing(config.clone(), cloud, model, l)?,
        None => crate::start(config.clone(), cloud, model)?,
    };
    handle.subscribe(metrics.clone().recipient());
    handle.subscribe(events.clone().recipient());
    let subscribers = vec![metrics.clone().recipient(), events.clone().recipient()];
    let containers = start_container_provisioners(opts, config, broker, store, &handle, subscribers)?;
    store.watch(handle.machines_changed());
    store.watch_retries(handle.retry_ticks());
    // A retry asked for before this provisioner watched (while no replica led the model: a
    // start-up, a fail-over, a hand-over) is acted on now: only machines flagged for a retry.
    handle.retry_ticks().do_send(crate::RetryTick);
    Ok((handle, containers))
}

/// Starts the lazy container provisioners beside the environ provisioner `handle`, with the
/// simulated cloud only (`None` with EC2: no real container initialiser exists yet, so the API
/// refuses containers there). They hear every store change (as the environ provisioner does)
/// and its events (to learn when a host is provisioned); each host and container type gets its
/// supervisor, which prepares the host through the simulated initialiser
/// (`--sim-container-init-delay`, `--sim-container-init-failures`) on the first container of
/// that type, then runs a container provisioner whose broker is the same metered cloud, every
/// container in its host's zone (`HostZoneBroker`).
fn start_container_provisioners(
    opts: &ServeSettings,
    config: ProvisionerConfig,
    broker: &MeteredBroker,
    store: &Store,
    handle: &crate::ProvisionerHandle,
    subscribers: Vec<actix::Recipient<crate::ProvisionerEvent>>,
) -> Result<Option<crate::ContainersHandle>, ServeError> {
    let cloud: Arc<dyn crate::Broker> = Arc::new(broker.clone());
    // The simulated cloud simulates a host's preparation; on LXD a host is a member's
    // container, and its containers are the member's too (`OnHost`): nothing to install.
    let (factory, initialiser, kinds): (_, Arc<dyn crate::containers::ContainerInitialiser>, Vec<String>) =
        match opts.broker() {
            BrokerKind::Sim => {
                let plan = crate::service::cloud::initialiser::SimInitPlan {
                    delay: opts.sim.container_init_delay(),
                    failures: opts.sim.container_init_failures(),
                };
                (
                    crate::containers::HostZoneBroker::factory(cloud),
                    Arc::new(crate::service::cloud::initialiser::SimInitialiser::start(plan)),
                    crate::containers::DEFAULT_CONTAINER_TYPES.iter().map(|k| (*k).to_owned()).collect(),
                )
            }
            BrokerKind::Lxd => {
                let factory: crate::containers::BrokerFactory = Arc::new(move |host, _kind, zone| {
                    let on_host = Arc::new(crate::adapters::lxd::OnHost::new(cloud.clone(), host.clone()));
                    Arc::new(crate::containers::HostZoneBroker::new(on_host, zone)) as Arc<dyn crate::Broker>
                });
                (factory, Arc::new(crate::service::cloud::initialiser::Ready), vec!["lxd".to_owned()])
            }
            BrokerKind::Ec2 => return Ok(None),
        };
    let containers = crate::start_containers(
        config,
        factory,
        Arc::new(StoreModel::new(store.clone())),
        initialiser,
        kinds,
        subscribers,
    )?;
    handle.subscribe(containers.provisioner_events());
    store.watch(containers.machines_changed());
    Ok(Some(containers))
}
