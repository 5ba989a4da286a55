//! Starting and stopping one model: [`open_model_store`] opens a model's store (its SQLite file
//! or its PostgreSQL schema), [`start_model`] starts its cloud, metrics, event streams and
//! provisioners over it (on PostgreSQL, through [`super::replica`]: only while this replica
//! leads), and [`stop_models`] stops models in order at a removal or a shutdown.

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use futures::future::LocalBoxFuture;

use crate::config::ProvisionerConfig;
use crate::service::cloud::sim::{SimCloud, SimSettings};
use crate::service::datadir::aside;
use crate::service::error::{data_dir_error, data_dir_io, FileOp, ServeError};
use crate::service::metrics::{MeteredBroker, Metrics};
use crate::service::settings::{BrokerKind, ServeSettings, StoreUrl};
use crate::service::store::{Store, StoreError};

use super::accounts::{account_of, GetAccount};
use super::handles::ModelRuntime;
use super::provisioners::{start_provisioners, PendingStarts};
use super::replica::{release_lease, start_replica};
use super::shared::Shared;

/// A model the model host asks its [`StartModel`] to start.
pub(crate) struct ModelToStart<'a> {
    /// The model's name.
    pub(crate) name: &'a str,
    /// The model's settings.
    pub(crate) opts: &'a ServeSettings,
    /// The simulated account it names.
    pub(crate) account: Option<&'a str>,
    /// Its store, if already open (`default`'s); else it is opened.
    pub(crate) store: Option<Store>,
    /// A model just added: its store is created.
    pub(crate) new: bool,
}

/// The model starter the model host is given (as the engine's container manager is given its
/// provisioner factory): it opens a model's store, starts the model over it, and stops
/// models. [`ModelStarter`] is the service's; `serve` passes it in.
pub(crate) trait StartModel {
    /// Opens the store of `model` (unless it comes with one) and starts the model over it
    /// ([`open_model_store`], [`start_model`]).
    fn start<'a>(
        &'a self,
        shared: &'a Shared,
        model: ModelToStart<'a>,
    ) -> LocalBoxFuture<'a, Result<ModelRuntime, ServeError>>;

    /// Stops `models` in order ([`stop_models`]).
    fn stop<'a>(&'a self, models: Vec<ModelRuntime>, opts: &'a ServeSettings) -> LocalBoxFuture<'a, ()>;
}

/// The service's model starter: [`open_model_store`], [`start_model`] and [`stop_models`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ModelStarter;

impl StartModel for ModelStarter {
    fn start<'a>(
        &'a self,
        shared: &'a Shared,
        model: ModelToStart<'a>,
    ) -> LocalBoxFuture<'a, Result<ModelRuntime, ServeError>> {
        let ModelToStart { name, opts, account, store, new } = model;
        Box::pin(async move {
            let store = match store {
                Some(s) => s,
                None => open_model_store(shared, opts, name, new).await?,
            };
            start_model(shared, name, opts, account, store).await
        })
    }

    fn stop<'a>(&'a self, models: Vec<ModelRuntime>, opts: &'a ServeSettings) -> LocalBoxFuture<'a, ()> {
        Box::pin(stop_models(models, opts))
    }
}

/// Opens the store of a model other than `default`: SQLite `models/NAME.db` in the data
/// directory (a new model's file created, private; an existing model's must be there), or
/// PostgreSQL with the connections' `search_path` set to the model's schema (created first).
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
pub(crate) async fn open_model_store(
    shared: &Shared,
    opts: &ServeSettings,
    name: &str,
    new: bool,
) -> Result<Store, ServeError> {
    match opts.store.url() {
        StoreUrl::Sqlite => {
            let dir = opts.data_dir();
            let db = super::model_db(dir, name);
            let folder = dir.join(super::MODELS_DIR);
            std::fs::create_dir_all(&folder).map_err(data_dir_io(dir, FileOp::CreateDir, &folder))?;
            if new {
                // Leftovers of an earlier model of the same name are not its history.
                for suffix in ["", "-wal", "-shm"] {
                    let f = PathBuf::from(format!("{}{suffix}", db.display()));
                    if f.exists() {
                        let to = aside(&f);
                        std::fs::rename(&f, &to).map_err(data_dir_io(dir, FileOp::MoveAside, &f))?;
                        tracing::warn!(from = %f.display(), to = %to.display(), "moved an old model's file aside");
                    }
                }
                let mut o = std::fs::OpenOptions::new();
                o.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
                o.open(&db).map_err(data_dir_io(dir, FileOp::Create, &db))?;
            } else if std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) == 0 {
                return Err(data_dir_error(
                    dir,
                    format!("the database {} of model {name:?} is missing or empty: the model is lost", db.display()),
                ));
            }
            Store::start(&db).map_err(|e| match e {
                e @ StoreError::Damaged { .. } => ServeError::Damaged { path: db.clone(), source: e },
                other => ServeError::Store(other),
            })
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(_) => {
            let schema = super::schema_name(name);
            // The schema is created over the service's URL (the model's sets a search_path
            // to a schema that may not exist yet).
            let StoreUrl::Postgres(service_url) = shared.opts.store.url() else {
                return Err(ServeError::StoreUrl("the model's store is PostgreSQL, the service's is not".into()));
            };
            super::location::pg_schema(
                &service_url,
                &schema,
                if new { super::location::SchemaOp::Fresh } else { super::location::SchemaOp::Open },
            )
            .await
            .map_err(|e| ServeError::StoreUrl(e.to_string()))?;
            // On the service's pool of connections (one per store thread), its schema set on
            // them as it borrows one.
            let store =
                shared.service_store.start_postgres_beside(&schema).map_err(|e| ServeError::StoreUrl(e.to_string()))?;
            store.exec(|s| s.model_uuid()).await?;
            Ok(store)
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => Err(ServeError::NoPostgres),
    }
}

/// Starts one model over its open store: its cloud (the simulated one over the store, or
/// EC2), the starts a previous run left pending, its metrics and event stream, and its
/// provisioners (on PostgreSQL, only while this replica holds the model's lease). `opts` are
/// the model's settings (the service's with its cloud applied: `host::model_settings`),
/// `account` the simulated account it names ([`account_of`]).
pub(crate) async fn start_model(
    shared: &Shared,
    model: &str,
    opts: &ServeSettings,
    account: Option<&str>,
    store: Store,
) -> Result<ModelRuntime, ServeError> {
    let model_uuid = store.exec(|s| s.model_uuid()).await?;
    // The account its calls count against: its limiter shared with the other models there.
    let account = match account_of(opts, account) {
        Some((key, limits, sim_rate)) => Some(
            shared
                .accounts
                .send(GetAccount { key, limits, sim_rate })
                .await
                .map_err(|source| ServeError::Stopped { what: "cloud accounts", source })?,
        ),
        None => None,
    };
    let settings = store.exec(|s| s.settings()).await?;
    // `default`'s families are the service's `/metrics`; another model's are its own.
    let metrics = if model == super::DEFAULT_MODEL { shared.metrics.clone() } else { Metrics::default().start() };
    store.watch_counts(metrics.clone().recipient());
    let pending: Option<PendingStarts>;
    let cloud_store: Option<Store>;
    // A real cloud: its broker, connected (its settings checked against it), and its zones.
    let real: Option<(Arc<dyn crate::ports::Broker>, Vec<String>, &str)> = match opts.broker() {
        BrokerKind::Sim => None,
        #[cfg(feature = "ec2")]
        BrokerKind::Ec2 => {
            let (ec2, zones) = ec2_broker(&opts.ec2, &model_uuid).await?;
            Some((Arc::new(ec2), zones, "ec2"))
        }
        #[cfg(not(feature = "ec2"))]
        BrokerKind::Ec2 => return Err(ServeError::NoEc2Broker),
        BrokerKind::Lxd => {
            let (lxd, zones) = lxd_broker(&opts.lxd, &model_uuid).await?;
            Some((Arc::new(lxd), zones, "lxd"))
        }
    };
    let (cloud, zones, broker_name): (Arc<dyn crate::ports::Broker>, Vec<String>, &str) = match real {
        // Each start's token and parameters are written before the call (`intents`), so that a
        // start left in flight is repeated after a restart under the same client token (EC2)
        // or instance name (LXD).
        Some((real, zones, name)) => {
            let intents = crate::service::cloud::intents::IntentBroker::new(real, store.clone());
            cloud_store = None;
            pending = Some(PendingStarts::Intents(intents.clone()));
            (Arc::new(intents), zones, name)
        }
        None => {
            let settings = SimSettings {
                zones: opts.sim.zones(),
                unavailable_zones: opts.sim.unavailable_zones.clone(),
                start_latency: opts.sim.start_latency(),
                stop_latency: opts.sim.stop_latency,
                subnets: opts.sim.subnets(),
                instance_type: opts.sim.instance_type.clone(),
                out_of_capacity: crate::service::cloud::sim::parse_out_of_capacity(&opts.sim.out_of_capacity)
                    .ok_or(ServeError::SimOutOfCapacity)?,
                start_failures: opts.sim.start_failures(),
                account: account.as_ref().and_then(|a| a.sim.clone()),
            };
            let zones = settings.known_zones();
            // On PostgreSQL the cloud's instances are written on a connection of their own
            // (`Store::companion`), counted there.
            cloud_store = store.companion();
            if let Some(own) = &cloud_store {
                own.watch_counts(crate::service::metrics::CloudCountsTo(metrics.clone()).start().recipient());
            }
            let cloud =
                SimCloud::new(cloud_store.clone().unwrap_or_else(|| store.clone()), model_uuid.clone(), settings);
            pending = Some(PendingStarts::Sim(Box::new(cloud.clone())));
            (Arc::new(cloud), zones, "sim")
        }
    };
    // Replicas: the leader resumes them, at each epoch it leads (its writes fenced); a lone
    // service now, before its provisioner starts, and it does not start if one cannot be
    // settled (`ServeError::Resume`).
    if let (Some(pending), false) = (&pending, matches!(opts.store.url(), StoreUrl::Postgres(_))) {
        let resumed = pending.resume().await?;
        if resumed > 0 {
            tracing::info!(starts = resumed, "resuming starts a previous run left in flight");
        }
    }
    // A real cloud's readers are served from the listings made (issue 30, item 8): the
    // listings' own calls go through the plain metered broker, the provisioner's through the
    // one that reports them. The simulated cloud's listing is a read of the store, as fresh and
    // as cheap as any other read: its readers read it.
    let plain = MeteredBroker::new(cloud, metrics.clone());
    let broker = if broker_name == "sim" {
        plain
    } else {
        let listings = crate::service::cloud::listing::InstanceListings::start(Arc::new(plain.clone()));
        plain.with_listings(listings)
    };
    let config = ProvisionerConfig {
        model_uuid: model_uuid.clone(),
        harvest_mode: settings.harvest_mode.unwrap_or(opts.harvest_mode),
        workers: settings.workers.unwrap_or(opts.workers),
        repair: settings.repair.unwrap_or_default(),
        retry: opts.retry.strategy(),
        resync_interval: opts.resync,
        harvest_grace: opts.harvest_grace,
        spot_max_price: opts.spot_max_price,
        // The simulated cloud does not throttle: pacing it like EC2 would only slow it down.
        // Against EC2 the client-side limiter keeps its EC2-sized defaults.
        rate_limits: match opts.broker() {
            BrokerKind::Sim => crate::config::rate_limits::RateLimits::unlimited(),
            BrokerKind::Ec2 => crate::config::rate_limits::RateLimits::ec2(),
            // LXD has no request buckets: its daemon queues what it is asked.
            BrokerKind::Lxd => crate::config::rate_limits::RateLimits::unlimited(),
        },
        // A start's record waits for a group commit: not holding a worker meanwhile.
        record_outside_worker: true,
        ..ProvisionerConfig::default()
    }
    .with_random_seed();
    let hub = crate::service::events::EventHub::new(opts.events.idle_timeout);
    let events_dropped = hub.dropped_counter();
    let events = hub.start();
    // On PostgreSQL the service is one replica of many: only the lease's holder runs the
    // provisioner (see `start_replica`); on SQLite it runs it, as the only one.
    let limiter = account.as_ref().map(|a| a.limiter.clone());
    let replica = start_replica(
        opts,
        model,
        &store,
        &cloud_store,
        &model_uuid,
        &config,
        &broker,
        &pending,
        &metrics,
        &events,
        &limiter,
        shared,
    )?;
    let (handle, containers) = match &replica {
        Some(_) => (None, None),
        None => {
            let (handle, containers) =
                start_provisioners(opts, config, &broker, &store, &metrics, &events, limiter.as_ref())?;
            (Some(handle), containers)
        }
    };
    Ok(ModelRuntime {
        store,
        cloud_store,
        handle,
        replica,
        broker,
        metrics,
        events,
        events_dropped,
        zones,
        // The simulated cloud's subnets are known (`--to subnet=` is checked against them);
        // another cloud's are the broker's to judge.
        subnets: matches!(opts.broker(), BrokerKind::Sim).then(|| opts.sim.subnets()),
        broker_name: broker_name.into(),
        model_uuid,
        started: shared.started,
        containers,
        sim_account: account.and_then(|a| a.sim),
    })
}

/// Stops models in order: a replica releases its lease at once (so that another takes over
/// within one retry; what it left in flight the next leader resumes by client token); a lone
/// service's provisioners start nothing new, are given `shutdown_grace` to finish their cloud
/// calls (all models at once), then stop.
pub(crate) async fn stop_models(states: Vec<ModelRuntime>, opts: &ServeSettings) {
    for st in &states {
        if let Some(r) = &st.replica {
            release_lease(r, opts).await;
        }
        if let Some(h) = &st.handle {
            h.close_starts();
        }
    }
    // The provisioners say when they are idle (their jobs, and so their cloud calls, are done);
    // the grace period bounds the wait. (A periodic listing still in flight is only a read.)
    let drained = futures::future::join_all(states.iter().filter(|st| st.handle.is_some()).map(|st| async move {
        if let Some(h) = &st.handle {
            h.wait_idle().await;
        }
        if let Some(c) = &st.containers {
            c.wait_idle().await;
        }
    }));
    if !states.iter().all(|st| st.handle.is_none())
        && actix_rt::time::timeout(opts.shutdown_grace, drained).await.is_err()
    {
        let in_flight: usize = states.iter().map(|st| st.broker.in_flight()).sum();
        tracing::warn!(in_flight, "shutdown grace over; cloud calls still in flight are resumed at the next start");
    }
    for st in &states {
        if let Some(h) = &st.handle {
            h.shutdown();
        }
        if let Some(c) = &st.containers {
            c.shutdown();
        }
        let _ = st.events.send(crate::service::events::CloseStreams).await;
    }
}

/// Connects the EC2 broker and reads its zones (the ones machines may ask for).
#[cfg(feature = "ec2")]
async fn ec2_broker(
    s: &crate::service::settings::Ec2Settings,
    model_uuid: &str,
) -> Result<(crate::adapters::ec2::Ec2Broker, Vec<String>), ServeError> {
    let config = crate::adapters::ec2::Ec2Config {
        model_uuid: model_uuid.to_owned(),
        region: s.region.clone(),
        endpoint: s.endpoint.clone(),
        image_id: s.image.clone().unwrap_or_default(),
        instance_type: s.instance_type.clone(),
        subnet_id: s.subnet.clone(),
        security_group_ids: s.security_groups.clone(),
        interruption_queue: s.interruption_queue.clone(),
        ..crate::adapters::ec2::Ec2Config::default()
    };
    let broker = crate::adapters::ec2::Ec2Broker::connect(config).await.map_err(ServeError::Ec2Settings)?;
    let zones = crate::ports::Broker::availability_zones(&broker).await.map_err(ServeError::Ec2Zones)?;
    Ok((broker, zones.into_iter().map(|z| z.name).collect()))
}

/// Connects the LXD broker (checking its settings against the daemon) and reads its zones.
async fn lxd_broker(
    s: &crate::service::settings::LxdSettings,
    model_uuid: &str,
) -> Result<(crate::adapters::lxd::LxdBroker, Vec<String>), ServeError> {
    use crate::adapters::lxd::{LxdBroker, LxdConfig, LxdConfigError, LxdEndpoint, LxdTlsFiles};
    let endpoint = s
        .endpoint
        .as_deref()
        .ok_or(ServeError::LxdSettings(LxdConfigError::Missing(
            "an endpoint (--lxd-endpoint unix:PATH or https://HOST:PORT)",
        )))
        .and_then(|e| LxdEndpoint::parse(e).map_err(ServeError::LxdSettings))?;
    let mut config = LxdConfig::new(model_uuid, endpoint, s.image.clone().unwrap_or_default());
    if let Some(p) = &s.project {
        config.project = p.clone();
    }
    config.tls = LxdTlsFiles {
        client_cert: s.client_cert.clone(),
        client_key: s.client_key.clone(),
        server_cert: s.server_cert.clone(),
    };
    let broker = LxdBroker::connect(config).await.map_err(ServeError::LxdSettings)?;
    let zones = crate::ports::Broker::availability_zones(&broker).await.map_err(ServeError::LxdZones)?;
    Ok((broker, zones.into_iter().map(|z| z.name).collect()))
}
