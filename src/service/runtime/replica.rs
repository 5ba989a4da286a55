//! A model's replica side on PostgreSQL (issue 17): [`start_replica`] starts the model's lease
//! actor, whose [`ReplicaHooks`] start its provisioners while this replica leads (after setting
//! the store's fence for the epoch) and stop them when it follows; [`ReplicaLinks`] are what a
//! replica's models share (the lease thread, the listener, the lease arbiter);
//! [`release_lease`] lets another replica take over at a stop.

#[cfg(feature = "postgres")]
use actix::Actor;

use crate::config::ProvisionerConfig;
use crate::service::error::ServeError;
use crate::service::metrics::{MeteredBroker, Metrics};
use crate::service::settings::ServeSettings;
use crate::service::store::Store;

#[cfg(feature = "postgres")]
use super::provisioners::start_provisioners;
use super::provisioners::PendingStarts;
use super::shared::Shared;

/// On PostgreSQL, makes this service one replica of many: its lease actor contends for the
/// model's leader lease, and the hooks below start the provisioner (the environ provisioner,
/// the container provisioners, the simulated cloud's resumption) only while it leads, after
/// setting the store's fence for the epoch; on losing the lease they stop it at once (the fence
/// stays: nothing it still tries to write commits). `None` on SQLite.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_replica(
    opts: &ServeSettings,
    model: &str,
    store: &Store,
    cloud_store: &Option<Store>,
    model_uuid: &str,
    config: &ProvisionerConfig,
    broker: &MeteredBroker,
    pending: &Option<PendingStarts>,
    metrics: &actix::Addr<Metrics>,
    events: &actix::Addr<crate::service::events::EventHub>,
    limiter: &Option<crate::SharedLimiter>,
    shared: &Shared,
) -> Result<Option<super::handles::ModelReplica>, ServeError> {
    #[cfg(feature = "postgres")]
    if let crate::service::settings::StoreUrl::Postgres(_url) = opts.store.url() {
        use crate::service::lease::actor::{LeaseActor, LeaseConfig};
        let timings = opts.lease.timings().map_err(|e| ServeError::StoreUrl(e.to_string()))?;
        // One id for the process: every model's lease is held under it (the spread counts
        // replicas, not leases).
        let replica = shared.replica_id.clone();
        let leading = crate::service::lease::leading::Leading::new(store.clone())
            .for_model(model_uuid)
            .with_cloud_store(cloud_store.clone())
            .start();
        // The replica's lease thread, listener and lease arbiter, shared by its models.
        let links = match &shared.replica_links {
            Some(l) => l.clone(),
            None => return Err(ServeError::StoreUrl("the replica's lease thread was not started".into())),
        };
        // What the other replicas commit (adds, removals, retries through their API) reaches
        // the leader's provisioners by LISTEN/NOTIFY, not by polling.
        links.notices.do_send(crate::service::lease::listen::Subscribe {
            model_uuid: model_uuid.to_owned(),
            to: leading.clone().recipient(),
        });
        metrics.do_send(crate::service::metrics::LeaderChanged { leader: false, transition: false });
        let hooks = ReplicaHooks {
            opts: opts.clone(),
            store: store.clone(),
            model_uuid: model_uuid.to_owned(),
            replica: replica.clone(),
            config: config.clone(),
            broker: broker.clone(),
            pending: pending.clone(),
            metrics: metrics.clone(),
            events: events.clone(),
            leading: leading.clone(),
            limiter: limiter.clone(),
            models_led: shared.models_led.clone(),
            main: actix_rt::Arbiter::current(),
        };
        tracing::info!(%replica, lease = ?timings.lease(), renew_deadline = ?timings.renew_deadline(),
                       retry = ?timings.retry(), "replica: contending for the leader lease");
        let config = LeaseConfig {
            #[cfg(test)]
            url: _url,
            model_uuid: model_uuid.to_owned(),
            schema: (model != super::DEFAULT_MODEL).then(|| super::schema_name(model)),
            replica,
            timings,
            spread: true,
            beat: Some(links.beat),
        };
        let lease = LeaseActor::start_on(&links.arbiter, config, Box::new(hooks), links.sql);
        return Ok(Some(super::handles::ModelReplica { lease, leading, models_led: shared.models_led.clone() }));
    }
    let _ = (opts, model, store, cloud_store, model_uuid, config, broker, pending, metrics, events, limiter, shared);
    Ok(None)
}

/// Releases a replica's lease (stopping its provisioner), waiting at most two retry periods
/// for the database to answer.
pub(super) async fn release_lease(r: &super::handles::ModelReplica, opts: &ServeSettings) {
    #[cfg(feature = "postgres")]
    {
        let wait = opts.lease.timings().map(|t| t.retry() * 2).unwrap_or(std::time::Duration::from_secs(4));
        if actix_rt::time::timeout(wait, r.lease.send(crate::service::lease::actor::ReleaseLease)).await.is_err() {
            tracing::warn!("the lease's release did not answer in time: it expires on its own");
        }
        r.leading.do_send(crate::service::lease::leading::Follow);
    }
    #[cfg(not(feature = "postgres"))]
    let _ = (r, opts);
}

/// What a replica does at each change of role.
#[cfg(feature = "postgres")]
struct ReplicaHooks {
    opts: ServeSettings,
    store: Store,
    model_uuid: String,
    replica: String,
    config: ProvisionerConfig,
    broker: MeteredBroker,
    pending: Option<PendingStarts>,
    metrics: actix::Addr<Metrics>,
    events: actix::Addr<crate::service::events::EventHub>,
    leading: actix::Addr<crate::service::lease::leading::Leading>,
    limiter: Option<crate::SharedLimiter>,
    /// The models this replica leads, all models together.
    models_led: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The arbiter the model's actors run on (the lease's hooks run on the lease arbiter).
    main: actix_rt::ArbiterHandle,
}

#[cfg(feature = "postgres")]
impl ReplicaHooks {
    fn announce(&self, role: &'static str, epoch: Option<i64>, why: &'static str) {
        self.metrics.do_send(crate::service::metrics::LeaderChanged { leader: role == "leader", transition: true });
        self.events.do_send(crate::service::events::RoleChanged { role, epoch, replica: self.replica.clone(), why });
    }
}

#[cfg(feature = "postgres")]
impl crate::service::lease::actor::RoleHooks for ReplicaHooks {
    fn lead(&mut self, epoch: i64, t: crate::service::lease::Transition) {
        use crate::service::lease::leading::{Lead, NotActing, Provisioners, Started};
        self.models_led.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.leading.do_send(Lead(epoch));
        self.announce("leader", Some(epoch), t.why.name());
        let fence = crate::service::store::Fence::new(self.model_uuid.clone(), self.replica.clone(), epoch);
        let (store, broker, pending, opts) =
            (self.store.clone(), self.broker.clone(), self.pending.clone(), self.opts.clone());
        let (metrics, events, leading) = (self.metrics.clone(), self.events.clone(), self.leading.clone());
        let limiter = self.limiter.clone();
        let config = self.config.clone().with_random_seed();
        // On the model's arbiter: its provisioners are its actors, not the lease arbiter's.
        self.main.spawn_fn(move || {
            actix_rt::spawn(async move {
                // The fence first: from here on every write of this provisioner commits only under
                // this epoch.
                if let Err(e) = store.set_fence(Some(fence.clone())).await {
                    tracing::error!(error = %e, "cannot set the leader's fence: not acting");
                    leading.do_send(NotActing(epoch));
                    return;
                }
                if let Some(p) = &pending {
                    if let Err(e) = p.set_fence(fence).await {
                        tracing::error!(error = %e, "cannot set the leader's fence on the cloud's store: not acting");
                        leading.do_send(NotActing(epoch));
                        return;
                    }
                }
                // The starts an earlier leader left in flight (their client tokens were written,
                // fenced, before the cloud call): landed now, once.
                // Every one settled before the provisioner runs (its starts draw new tokens): a
                // leader that cannot settle them does not act, and steps down (its probe fails).
                if let Some(pending) = &pending {
                    match pending.resume().await {
                        Ok(n) if n > 0 => {
                            tracing::info!(instances = n, epoch, "resuming starts an earlier leader left pending")
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::error!(error = %e, epoch, "not acting: stepping down");
                            leading.do_send(NotActing(epoch));
                            return;
                        }
                    }
                }
                let started = start_provisioners(&opts, config, &broker, &store, &metrics, &events, limiter.as_ref())
                    .map(|(handle, containers)| Provisioners { handle, containers });
                match started {
                    Ok(p) => {
                        tracing::info!(epoch, "leading: the provisioner runs");
                        leading.do_send(Started(epoch, p));
                    }
                    Err(e) => tracing::error!(error = %e, "cannot start the provisioner"),
                }
            });
        });
    }

    fn follow(&mut self, why: crate::service::lease::Why, t: crate::service::lease::Transition) {
        self.leading.do_send(crate::service::lease::leading::Follow);
        let epoch = match t.from {
            crate::service::lease::Role::Leader { epoch } => {
                self.models_led.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                Some(epoch)
            }
            crate::service::lease::Role::Follower => None,
        };
        self.announce("follower", epoch, why.name());
    }

    fn probe(&mut self) -> Option<futures::future::LocalBoxFuture<'static, bool>> {
        use crate::service::lease::leading::{Acting, Probe};
        // Queued behind the store's other work: it answers only if the store's lane is free and
        // the database answers (its lane's connection answered a moment ago, or answers a query
        // now; a store whose last work failed on the database must read its model again:
        // `Store::probe`). Then the provisioner, if it runs: its pool answers a question on the
        // model's arbiter.
        let store = self.store.probe();
        let leading = self.leading.send(Probe);
        Some(Box::pin(async move {
            if store.await.is_err() {
                return false;
            }
            match leading.await {
                Ok(Acting::Running(p)) => p.handle.pool().await.is_ok(),
                Ok(Acting::Starting | Acting::Following) => true,
                // Its provisioners could not start at this epoch: not progressing.
                Ok(Acting::Stuck) => false,
                Err(_) => false,
            }
        }))
    }
}
