//! The models a running service hosts: each one's [`ModelRuntime`] (its store, cloud, metrics,
//! event stream and provisioners, started by `service::runtime::start_model`), looked up
//! by name for every request; adding one (its directory entry kept first, then its store
//! opened and its provisioners started); destroying one (the engine's destruction as for the
//! one model of old, the entry marked dying, then a reaper that removes the model once its
//! instances are gone and the provisioner is idle). One model failing to start is recorded
//! and answered for that model alone (503); the others run on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::lock::Mutex;

use thiserror::Error;

use super::directory::{CloudSettings, Directory, ModelEntry, ModelLife, ModelsError, DEFAULT_MODEL};
use super::persist::{DirectoryStore, PersistError};
use crate::service::runtime::{model_db, schema_name, schema_url, ModelRuntime, Shared};
use crate::service::settings::{BrokerKind, ServeSettings, StoreUrl};
use crate::service::store::Store;

/// How often the reaper looks at a dying model.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a model operation failed, with the HTTP status the API answers.
#[derive(Debug, Error)]
pub enum HostError {
    /// Refused by the directory (bad name, exists, unknown, `default` without force).
    #[error("{0}")]
    Refused(#[from] ModelsError),
    /// The model is in the directory but does not run here (its store could not be opened).
    #[error("model {name:?} does not run: {why}")]
    NotRunning {
        /// The model.
        name: String,
        /// Why.
        why: String,
    },
    /// The directory could not be kept.
    #[error("{0}")]
    Persist(#[source] PersistError),
    /// The model's store or provisioners could not be started.
    #[error("cannot start model {name:?}: {source}")]
    Start {
        /// The model.
        name: String,
        /// Why.
        #[source]
        source: Box<crate::service::ServeError>,
    },
}

impl From<PersistError> for HostError {
    fn from(e: PersistError) -> Self {
        match e {
            PersistError::Refused(r) => HostError::Refused(r),
            other => HostError::Persist(other),
        }
    }
}

impl HostError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            HostError::Refused(r) => r.status(),
            HostError::NotRunning { .. } => 503,
            // Bad settings of the model's cloud (as `serve` would exit 2 for them).
            HostError::Start { source, .. } if source.exit_code() == 2 => 400,
            HostError::Persist(_) | HostError::Start { .. } => 500,
        }
    }
}

/// A model's place in the host: running, or why not.
#[derive(Clone)]
enum Slot {
    Running(Box<ModelRuntime>),
    Failed(String),
}

/// One model as listed: its entry and, when it runs, its state.
pub struct Listed {
    /// The directory's entry.
    pub entry: ModelEntry,
    /// Its state, when it runs here.
    pub state: Option<ModelRuntime>,
    /// Why it does not run, if it does not.
    pub error: Option<String>,
}

/// The models of a service (cheap to clone).
#[derive(Clone)]
pub struct ModelHost {
    shared: Arc<Shared>,
    store: DirectoryStore,
    /// The directory as last written.
    directory: Arc<Mutex<Directory>>,
    slots: Arc<Mutex<BTreeMap<String, Slot>>>,
    /// One directory change at a time (adds, destructions, a replica's sync).
    changes: Arc<Mutex<()>>,
    /// The dying models this process runs a reaper for.
    reaping: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

/// The settings model `entry` runs with: the service's, with the model's cloud applied, and
/// (PostgreSQL) its own schema in the store's URL.
pub fn model_settings(opts: &ServeSettings, entry: &ModelEntry) -> ServeSettings {
    let mut o = opts.clone();
    let c = &entry.cloud;
    if let Some(b) = c.broker.as_deref() {
        o.broker = Some(if b == "ec2" { BrokerKind::Ec2 } else { BrokerKind::Sim });
    }
    if let Some(z) = &c.zones {
        o.sim.zones = Some(z.clone());
        // The service's subnets name the service's zones: a model with zones of its own gets
        // the default subnet per zone.
        o.sim.subnets = None;
        o.sim.unavailable_zones.clear();
    }
    if let Some(r) = &c.region {
        o.ec2.region = Some(r.clone());
    }
    if let Some(e) = &c.endpoint {
        o.ec2.endpoint = Some(e.clone());
    }
    if let Some(i) = &c.image {
        o.ec2.image = Some(i.clone());
    }
    if entry.name != DEFAULT_MODEL {
        if let StoreUrl::Postgres(url) = opts.store.url() {
            o.store.url = Some(StoreUrl::Postgres(schema_url(&url, &schema_name(&entry.name))));
        }
    }
    o
}

/// The broker a model uses, resolved: its own, else the service's.
pub fn broker_of(opts: &ServeSettings, cloud: &CloudSettings) -> String {
    cloud.broker.clone().unwrap_or_else(|| match opts.broker() {
        BrokerKind::Sim => "sim".to_owned(),
        BrokerKind::Ec2 => "ec2".to_owned(),
    })
}

impl ModelHost {
    /// A host with no model running yet, over the directory `store` holds (as `directory`).
    pub fn new(shared: Shared, store: DirectoryStore, directory: Directory) -> Self {
        Self {
            shared: Arc::new(shared),
            store,
            directory: Arc::new(Mutex::new(directory)),
            slots: Arc::new(Mutex::new(BTreeMap::new())),
            changes: Arc::new(Mutex::new(())),
            reaping: Arc::default(),
        }
    }

    /// What every model shares.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    async fn set_slot(&self, name: &str, slot: Option<Slot>) {
        let mut slots = self.slots.lock().await;
        match slot {
            Some(s) => slots.insert(name.to_owned(), s),
            None => slots.remove(name),
        };
    }

    async fn set_directory(&self, d: Directory) {
        *self.directory.lock().await = d;
    }

    /// The directory as last written.
    pub async fn directory(&self) -> Directory {
        self.directory.lock().await.clone()
    }

    /// The running model `name`: 404 naming it when unknown, 503 when it does not run.
    pub async fn state(&self, name: &str) -> Result<ModelRuntime, HostError> {
        let slot = self.slots.lock().await.get(name).cloned();
        match slot {
            Some(Slot::Running(s)) => Ok(*s),
            Some(Slot::Failed(why)) => Err(HostError::NotRunning { name: name.to_owned(), why }),
            // In the directory, not started here yet (a replica following another's add).
            None if self.directory().await.get(name).is_ok() => {
                Err(HostError::NotRunning { name: name.to_owned(), why: "it is starting".to_owned() })
            }
            None => Err(ModelsError::Unknown(name.to_owned()).into()),
        }
    }

    /// Every model in name order, with its state when it runs.
    pub async fn list(&self) -> Vec<Listed> {
        let d = self.directory().await;
        let slots = self.slots.lock().await.clone();
        d.models
            .into_values()
            .map(|entry| {
                let (state, error) = match slots.get(&entry.name) {
                    Some(Slot::Running(s)) => (Some(*s.clone()), None),
                    Some(Slot::Failed(why)) => (None, Some(why.clone())),
                    None => (None, Some("starting".to_owned())),
                };
                Listed { entry, state, error }
            })
            .collect()
    }

    /// Starts every model of the directory (at the service's start); `default` runs on
    /// `default_store`, already open. A model other than `default` that cannot start is
    /// recorded (its requests answer 503 saying why) and the others start; `default`'s
    /// failure is the service's. Dying models get their reaper.
    pub async fn start_all(&self, default_store: Store) -> Result<(), crate::service::ServeError> {
        for entry in self.directory().await.models.into_values() {
            let store = if entry.name == DEFAULT_MODEL { Some(default_store.clone()) } else { None };
            match self.start_one(&entry, store, false).await {
                Ok(_) => {}
                Err(e) if entry.name == DEFAULT_MODEL => return Err(e),
                Err(e) => {
                    tracing::error!(model = %entry.name, error = %e, "the model cannot start; the others run");
                    self.set_slot(&entry.name, Some(Slot::Failed(e.to_string()))).await;
                    continue;
                }
            }
            if entry.life == ModelLife::Dying {
                self.spawn_reaper(entry.name.clone());
            }
        }
        Ok(())
    }

    /// Opens the model's store (unless given) and starts it; records its uuid.
    async fn start_one(
        &self,
        entry: &ModelEntry,
        store: Option<Store>,
        new: bool,
    ) -> Result<ModelRuntime, crate::service::ServeError> {
        let opts = model_settings(&self.shared.opts, entry);
        let store = match store {
            Some(s) => s,
            None => crate::service::runtime::open_model_store(&self.shared.opts, &opts, &entry.name, new).await?,
        };
        let state = crate::service::runtime::start_model(
            &self.shared,
            &entry.name,
            &opts,
            entry.cloud.account.as_deref(),
            store,
        )
        .await?;
        self.set_slot(&entry.name, Some(Slot::Running(Box::new(state.clone())))).await;
        if entry.uuid.as_deref() != Some(state.model_uuid.as_str()) {
            let (name, uuid) = (entry.name.clone(), state.model_uuid.clone());
            match self.store.update(move |d| d.set_uuid(&name, &uuid)).await {
                Ok(((), d)) => self.set_directory(d).await,
                Err(e) => tracing::warn!(model = %entry.name, error = %e, "cannot record the model's uuid"),
            }
        }
        // At start, the service's "ready" line says how many run (and nothing may be printed
        // before a failed bind's one sentence).
        tracing::debug!(model = %entry.name, uuid = %state.model_uuid, "model running");
        Ok(state)
    }

    /// Adds a model: the entry is checked and kept, then its store created and its
    /// provisioners started. If it cannot start, the entry is taken back out (nothing stays).
    pub async fn add(&self, entry: ModelEntry) -> Result<ModelRuntime, HostError> {
        let _one = self.changes.lock().await;
        let broker = broker_of(&self.shared.opts, &entry.cloud);
        #[cfg(not(feature = "ec2"))]
        if broker == "ec2" {
            return Err(ModelsError::Cloud(
                "this build has no EC2 broker: build with `--features serve,ec2`, or use --broker sim".into(),
            )
            .into());
        }
        let added = entry.clone();
        let ((), d) = self.store.update(move |d| d.add(added, &broker)).await?;
        self.set_directory(d).await;
        match self.start_one(&entry, None, true).await {
            Ok(state) => {
                tracing::info!(model = %entry.name, uuid = %state.model_uuid, "model added");
                Ok(state)
            }
            Err(e) => {
                let name = entry.name.clone();
                self.set_slot(&name, None).await;
                if let Ok((_, d)) = self.store.update(move |d| Ok(d.remove(&name))).await {
                    self.set_directory(d).await;
                }
                Err(HostError::Start { name: entry.name, source: Box::new(e) })
            }
        }
    }

    /// Checks that `name` may be destroyed (`default` only with `force`), without changing
    /// anything: the model's entry.
    pub async fn may_destroy(&self, name: &str, force: bool) -> Result<ModelEntry, HostError> {
        let mut d = self.directory().await;
        let entry = d.get(name)?.clone();
        d.destroy(name, force)?;
        Ok(entry)
    }

    /// Marks `name` dying (kept) and starts its reaper; the engine's destruction has been asked
    /// for by the caller. A model that does not run is removed from the directory at once (with
    /// `force` only: its files are left).
    pub async fn mark_dying(&self, name: &str, force: bool) -> Result<(), HostError> {
        let _one = self.changes.lock().await;
        let n = name.to_owned();
        let (was_alive, d) = self.store.update(move |d| d.destroy(&n, force)).await?;
        self.set_directory(d).await;
        if was_alive {
            self.spawn_reaper(name.to_owned());
        }
        Ok(())
    }

    /// Removes a model that does not run from the directory (`model destroy --force` of a
    /// model whose store could not be opened): its files are left where they are.
    pub async fn forget(&self, name: &str) -> Result<(), HostError> {
        let _one = self.changes.lock().await;
        let n = name.to_owned();
        let (_, d) = self.store.update(move |d| Ok(d.remove(&n))).await?;
        self.set_directory(d).await;
        self.set_slot(name, None).await;
        Ok(())
    }

    /// Watches a dying model until its provisioner is idle and the cloud lists none of its
    /// instances (twice in a row, [`REAP_EVERY`] apart: a start answered in between would show),
    /// then stops it and removes it: the directory's entry, then its store (the SQLite file, or
    /// the PostgreSQL schema; `default`'s is kept: it holds the service's tokens).
    fn spawn_reaper(&self, name: String) {
        let host = self.clone();
        actix_rt::spawn(async move {
            if !host.reaping.lock().await.insert(name.clone()) {
                return; // one reaper per model
            }
            let mut clear = 0;
            loop {
                actix_rt::time::sleep(REAP_EVERY).await;
                let Ok(st) = host.state(&name).await else { break };
                if host.directory().await.get(&name).map(|e| e.life) != Ok(ModelLife::Dying) {
                    break;
                }
                let idle = match st.running().await {
                    Ok(p) => p.handle.is_idle().await,
                    // A follower: the leader's provisioner does the stopping.
                    Err(_) => true,
                };
                let gone = crate::ports::Broker::all_instances(&st.broker).await.is_ok_and(|l| l.is_empty());
                clear = if idle && gone { clear + 1 } else { 0 };
                if clear >= 2 {
                    break;
                }
            }
            if clear >= 2 {
                if let Err(e) = host.remove(&name).await {
                    tracing::error!(model = %name, error = %e, "cannot remove the destroyed model");
                }
            }
            host.reaping.lock().await.remove(&name);
        });
    }

    /// With replicas on PostgreSQL: every `every`, reads the directory other replicas write
    /// and follows it: a model added elsewhere is started here (its store opened, its lease
    /// contended), one removed elsewhere is stopped here, a dying one gets a reaper here too
    /// (whichever replica sees its instances gone first removes it).
    pub fn spawn_sync(&self, every: std::time::Duration) {
        let host = self.clone();
        actix_rt::spawn(async move {
            loop {
                actix_rt::time::sleep(every).await;
                if let Err(e) = host.sync().await {
                    tracing::warn!(error = %e, "cannot read the models directory; trying again");
                }
            }
        });
    }

    async fn sync(&self) -> Result<(), HostError> {
        let _one = self.changes.lock().await;
        let d = self.store.load().await?;
        self.set_directory(d.clone()).await;
        let known: Vec<String> = self.slots.lock().await.keys().cloned().collect();
        for gone in known.iter().filter(|n| !d.models.contains_key(*n)) {
            if let Ok(st) = self.state(gone).await {
                crate::service::runtime::stop_models(vec![st], &self.shared.opts).await;
            }
            self.set_slot(gone, None).await;
            tracing::info!(model = %gone, "model removed by another replica: stopped here");
        }
        for entry in d.models.values() {
            // A model added by another replica runs here once that replica has created its
            // store and recorded its uuid: opened before, its schema would be created here and
            // then moved aside by the adder's fresh creation, this replica running the old one.
            if !known.contains(&entry.name) && entry.uuid.is_some() {
                match self.start_one(entry, None, false).await {
                    Ok(_) => tracing::info!(model = %entry.name, "model added by another replica: running here"),
                    Err(e) => {
                        tracing::error!(model = %entry.name, error = %e, "the model cannot start here");
                        self.set_slot(&entry.name, Some(Slot::Failed(e.to_string()))).await;
                    }
                }
            }
            if entry.life == ModelLife::Dying {
                self.spawn_reaper(entry.name.clone());
            }
        }
        Ok(())
    }

    /// Stops a destroyed model and removes it (another replica may have removed it first).
    async fn remove(&self, name: &str) -> Result<(), HostError> {
        let _one = self.changes.lock().await;
        let Ok(state) = self.state(name).await else { return Ok(()) };
        crate::service::runtime::stop_models(vec![state], &self.shared.opts).await;
        self.set_slot(name, None).await;
        let n = name.to_owned();
        let (_, d) = self.store.update(move |d| Ok(d.remove(&n))).await?;
        self.set_directory(d).await;
        if name != DEFAULT_MODEL {
            self.drop_store(name).await;
        }
        tracing::info!(model = %name, "model destroyed and removed");
        Ok(())
    }

    /// Deletes a removed model's store: its SQLite file (and WAL), or its schema.
    async fn drop_store(&self, name: &str) {
        match self.shared.opts.store.url() {
            StoreUrl::Sqlite => {
                let db = model_db(self.shared.opts.data_dir(), name);
                for suffix in ["", "-wal", "-shm"] {
                    let f = PathBuf::from(format!("{}{suffix}", db.display()));
                    if let Err(e) = std::fs::remove_file(&f) {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(file = %f.display(), error = %e, "cannot delete a removed model's file");
                        }
                    }
                }
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                let schema = schema_name(name);
                if let Err(e) = crate::service::runtime::location::pg_schema(
                    &url,
                    &schema,
                    crate::service::runtime::location::SchemaOp::Drop,
                )
                .await
                {
                    tracing::warn!(model = %name, error = %e, "cannot drop a removed model's schema");
                }
            }
            #[cfg(not(feature = "postgres"))]
            StoreUrl::Postgres(_) => {}
        }
    }

    /// Every running model that has a lease (replicas on PostgreSQL), in name order: its name,
    /// uuid and lease actor.
    #[cfg(feature = "postgres")]
    pub async fn leases(&self) -> Vec<(String, String, actix::Addr<crate::service::lease::actor::LeaseActor>)> {
        let slots = self.slots.lock().await;
        slots
            .iter()
            .filter_map(|(name, s)| match s {
                Slot::Running(st) => {
                    st.replica.as_ref().map(|r| (name.clone(), st.model_uuid.clone(), r.lease.clone()))
                }
                Slot::Failed(_) => None,
            })
            .collect()
    }

    /// Every running model's state (to stop them all at shutdown).
    pub async fn running(&self) -> Vec<ModelRuntime> {
        let slots = self.slots.lock().await;
        slots
            .values()
            .filter_map(|s| match s {
                Slot::Running(st) => Some(*st.clone()),
                Slot::Failed(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_settings_are_the_services_with_its_cloud() {
        let opts = ServeSettings::default();
        let entry = ModelEntry::new(
            "b",
            CloudSettings { zones: Some(vec!["x1".into(), "x2".into()]), ..CloudSettings::default() },
        );
        let o = model_settings(&opts, &entry);
        assert_eq!(o.sim.zones(), ["x1", "x2"]);
        assert_eq!(o.sim.subnets().keys().collect::<Vec<_>>(), ["subnet-x1", "subnet-x2"]);
        assert_eq!(broker_of(&opts, &entry.cloud), "sim");
        let ec2 = CloudSettings { broker: Some("ec2".into()), region: Some("eu-west-1".into()), ..Default::default() };
        let o = model_settings(&opts, &ModelEntry::new("c", ec2));
        assert_eq!(o.broker(), BrokerKind::Ec2);
        assert_eq!(o.ec2.region.as_deref(), Some("eu-west-1"));
    }
}
