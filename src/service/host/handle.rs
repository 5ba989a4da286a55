//! [`ModelHost`]'s methods: the handle the HTTP layer, `serve` and the spread hold (what
//! every model shares, and the address of the model host's actor; its type is defined with the
//! actor). Each method is one message.

use std::sync::Arc;

use actix::Actor;

use super::actor::{HostActor, ModelHost};
use super::directory::{Directory, ModelEntry};
use super::messages::*;
use super::persist::DirectoryStore;
use super::state::{FollowPlan, Listed, Slot};
use super::HostError;
use crate::service::error::ServeError;
use crate::service::runtime::{ModelRuntime, Shared, StartModel};
use crate::service::store::Store;

impl ModelHost {
    /// Starts a host with no model running yet, over the directory `store` holds (as
    /// `directory`); `starter` opens, starts and stops each model.
    pub(crate) fn start(
        shared: Shared,
        store: DirectoryStore,
        directory: Directory,
        starter: Arc<dyn StartModel>,
    ) -> Self {
        let shared = Arc::new(shared);
        let addr = HostActor::new(shared.clone(), store, directory, starter).start();
        Self { shared, addr }
    }

    /// What every model shares.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The directory as last written.
    pub(crate) async fn directory(&self) -> Directory {
        self.addr.send(GetDirectory).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the model host does not answer");
            Directory::default()
        })
    }

    /// The running model `name`: 404 naming it when unknown, 503 when it does not run.
    pub(crate) async fn state(&self, name: &str) -> Result<ModelRuntime, HostError> {
        self.addr.send(GetState(name.to_owned())).await.map_err(|_| HostError::Stopped)?
    }

    /// Every model in name order, with its state when it runs.
    pub(crate) async fn list(&self) -> Vec<Listed> {
        self.addr.send(List).await.unwrap_or_default()
    }

    /// Starts every model of the directory (at the service's start); `default` runs on
    /// `default_store`, already open. A model other than `default` that cannot start is
    /// recorded (its requests answer 503 saying why) and the others start; `default`'s
    /// failure is the service's. Dying models get their reaper.
    pub(crate) async fn start_all(&self, default_store: Store) -> Result<(), ServeError> {
        self.addr
            .send(StartAll(default_store))
            .await
            .unwrap_or_else(|source| Err(ServeError::Stopped { what: "models", source }))
    }

    /// Adds a model: the entry is checked and kept, then its store created and its
    /// provisioners started. If it cannot start, the entry is taken back out (nothing stays).
    pub(crate) async fn add(&self, entry: ModelEntry) -> Result<ModelRuntime, HostError> {
        self.addr.send(Add(entry)).await.map_err(|_| HostError::Stopped)?
    }

    /// Checks that `name` may be destroyed (`default` only with `force`), without changing
    /// anything: the model's entry.
    pub(crate) async fn may_destroy(&self, name: &str, force: bool) -> Result<ModelEntry, HostError> {
        self.addr.send(MayDestroy { name: name.to_owned(), force }).await.map_err(|_| HostError::Stopped)?
    }

    /// Marks `name` dying (kept) and starts its reaper; the engine's destruction has been asked
    /// for by the caller.
    pub(crate) async fn mark_dying(&self, name: &str, force: bool) -> Result<(), HostError> {
        self.addr.send(MarkDying { name: name.to_owned(), force }).await.map_err(|_| HostError::Stopped)?
    }

    /// Removes a model that does not run from the directory (`model destroy --force` of a
    /// model whose store could not be opened): its files are left where they are.
    pub(crate) async fn forget(&self, name: &str) -> Result<(), HostError> {
        self.addr.send(Forget(name.to_owned())).await.map_err(|_| HostError::Stopped)?
    }

    /// With replicas on PostgreSQL: every `every`, reads the directory other replicas write
    /// and follows it: a model added elsewhere is started here (its store opened, its lease
    /// contended), one removed elsewhere is stopped here, a dying one gets a reaper here too
    /// (whichever replica sees its instances gone first removes it).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn spawn_sync(&self, every: std::time::Duration) {
        let host = self.clone();
        actix_rt::spawn(async move {
            loop {
                actix_rt::time::sleep(every).await;
                let synced = host.addr.send(Resync).await.map_err(|_| HostError::Stopped).and_then(|r| r);
                if let Err(e) = synced {
                    tracing::warn!(error = %e, "cannot read the models directory; trying again");
                }
            }
        });
    }

    /// Every running model that has a lease (replicas on PostgreSQL), in name order: its name,
    /// uuid and lease actor.
    #[cfg(feature = "postgres")]
    pub(crate) async fn leases(&self) -> Vec<(String, String, actix::Addr<crate::service::lease::actor::LeaseActor>)> {
        self.addr.send(Leases).await.unwrap_or_default()
    }

    /// Every running model's state (to stop them all at shutdown).
    pub(crate) async fn running(&self) -> Vec<ModelRuntime> {
        self.addr.send(Running).await.unwrap_or_default()
    }

    /// Stops a destroyed model and removes it (another replica may have removed it first).
    pub(super) async fn remove(&self, name: &str) -> Result<(), HostError> {
        self.addr.send(Remove(name.to_owned())).await.map_err(|_| HostError::Stopped)?
    }

    pub(super) async fn set_directory(&self, d: Directory) {
        let _ = self.addr.send(SetDirectory(d)).await;
    }

    pub(super) async fn set_slot(&self, name: &str, slot: Option<Slot>) {
        let _ = self.addr.send(SetSlot(name.to_owned(), slot)).await;
    }

    pub(super) async fn follow(&self, d: Directory) -> FollowPlan {
        self.addr.send(Follow(d)).await.unwrap_or_default()
    }

    pub(super) async fn begin_reaping(&self, name: &str) -> bool {
        self.addr.send(BeginReaping(name.to_owned())).await.unwrap_or(false)
    }

    pub(super) async fn still_dying(&self, name: &str) -> bool {
        self.addr.send(StillDying(name.to_owned())).await.unwrap_or(false)
    }

    pub(super) async fn end_reaping(&self, name: &str) {
        let _ = self.addr.send(EndReaping(name.to_owned())).await;
    }
}
