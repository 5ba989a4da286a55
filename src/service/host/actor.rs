//! The model host's actor: the thin shell that owns the plain core ([`HostState`]) and answers
//! the reads from it at once, and runs the directory's changes one at a time ([`Turns`]): a
//! change asked for while another is under way waits its turn; each runs as a future spawned
//! on the actor's context (not `ctx.wait`), so that the actor goes on answering reads and the
//! change's own steps while a model's store opens or its provisioners stop, and no change can
//! wait for itself.
//!
//! The changes themselves are here too, each a sequence of steps: starting every model, adding
//! one (its directory entry kept first, then its store opened and its provisioners started),
//! marking one dying and reaping it once its instances are gone and the provisioner is idle,
//! forgetting or removing one, and a replica following the directory another wrote. The
//! models are opened, started and stopped by the injected [`StartModel`]; the core's state is
//! read and written by messages ([`ModelHost`]'s, whose type is defined here and whose methods
//! are in `handle.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, MessageResult, ResponseFuture, WrapFuture};
use futures::future::LocalBoxFuture;

use super::cloud::{broker_of, model_settings};
use super::directory::{Directory, ModelEntry, ModelLife, DEFAULT_MODEL};
use super::messages::*;
use super::persist::DirectoryStore;
use super::state::{HostState, Slot, Turns};
use super::HostError;
use crate::service::error::ServeError;
use crate::service::runtime::{model_db, ModelRuntime, ModelToStart, Shared, StartModel};
use crate::service::settings::StoreUrl;
use crate::service::store::Store;

/// The models of a service (cheap to clone): the model host's actor, reached by messages.
#[derive(Clone)]
pub(crate) struct ModelHost {
    pub(super) shared: Arc<Shared>,
    pub(super) addr: Addr<HostActor>,
}

/// A queued change, given what it works with.
type Change = Box<dyn FnOnce(Link) -> LocalBoxFuture<'static, ()>>;

/// The model host.
pub(super) struct HostActor {
    state: HostState,
    turns: Turns<Change>,
    shared: Arc<Shared>,
    store: DirectoryStore,
    starter: Arc<dyn StartModel>,
}

impl Actor for HostActor {
    type Context = Context<Self>;
}

impl HostActor {
    pub(super) fn new(
        shared: Arc<Shared>,
        store: DirectoryStore,
        directory: Directory,
        starter: Arc<dyn StartModel>,
    ) -> Self {
        Self { state: HostState::new(directory), turns: Turns::default(), shared, store, starter }
    }

    /// Queues `change`; its answer comes on the receiver when it is done.
    fn ask<T: 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        change: impl FnOnce(Link) -> LocalBoxFuture<'static, T> + 'static,
    ) -> futures::channel::oneshot::Receiver<T> {
        let (tx, rx) = futures::channel::oneshot::channel();
        let job: Change = Box::new(move |link| {
            Box::pin(async move {
                let _ = tx.send(change(link).await);
            })
        });
        if let Some(now) = self.turns.ask(job) {
            self.run(now, ctx);
        }
        rx
    }

    fn run(&mut self, change: Change, ctx: &mut Context<Self>) {
        let link = Link {
            host: ModelHost { shared: self.shared.clone(), addr: ctx.address() },
            store: self.store.clone(),
            starter: self.starter.clone(),
        };
        ctx.spawn(change(link).into_actor(self).map(|(), act, ctx| {
            if let Some(next) = act.turns.done() {
                act.run(next, ctx);
            }
        }));
    }
}

/// The answer of a queued change (an error if the host stopped before it ran).
fn answer<T: 'static>(
    rx: futures::channel::oneshot::Receiver<Result<T, HostError>>,
) -> ResponseFuture<Result<T, HostError>> {
    Box::pin(async move { rx.await.unwrap_or_else(|_| Err(HostError::Stopped)) })
}

impl Handler<GetDirectory> for HostActor {
    type Result = MessageResult<GetDirectory>;
    fn handle(&mut self, _: GetDirectory, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.directory().clone())
    }
}

impl Handler<GetState> for HostActor {
    type Result = Result<crate::service::runtime::ModelRuntime, HostError>;
    fn handle(&mut self, msg: GetState, _: &mut Context<Self>) -> Self::Result {
        self.state.state(&msg.0)
    }
}

impl Handler<List> for HostActor {
    type Result = MessageResult<List>;
    fn handle(&mut self, _: List, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.list())
    }
}

impl Handler<MayDestroy> for HostActor {
    type Result = Result<super::directory::ModelEntry, HostError>;
    fn handle(&mut self, msg: MayDestroy, _: &mut Context<Self>) -> Self::Result {
        self.state.may_destroy(&msg.name, msg.force)
    }
}

impl Handler<Running> for HostActor {
    type Result = MessageResult<Running>;
    fn handle(&mut self, _: Running, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.running())
    }
}

#[cfg(feature = "postgres")]
impl Handler<Leases> for HostActor {
    type Result = MessageResult<Leases>;
    fn handle(&mut self, _: Leases, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.leases())
    }
}

impl Handler<StartAll> for HostActor {
    type Result = ResponseFuture<Result<(), ServeError>>;
    fn handle(&mut self, msg: StartAll, ctx: &mut Context<Self>) -> Self::Result {
        let rx = self.ask(ctx, move |link| Box::pin(async move { start_all(&link, msg.0).await }));
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(ServeError::Stopped { what: "models", source: actix::MailboxError::Closed }))
        })
    }
}

impl Handler<Add> for HostActor {
    type Result = ResponseFuture<Result<crate::service::runtime::ModelRuntime, HostError>>;
    fn handle(&mut self, msg: Add, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { add(&link, msg.0).await })))
    }
}

impl Handler<MarkDying> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: MarkDying, ctx: &mut Context<Self>) -> Self::Result {
        let MarkDying { name, force } = msg;
        answer(self.ask(ctx, move |link| Box::pin(async move { mark_dying(&link, name, force).await })))
    }
}

impl Handler<Forget> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: Forget, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { forget(&link, msg.0).await })))
    }
}

impl Handler<Resync> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, _: Resync, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { sync(&link).await })))
    }
}

impl Handler<Remove> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: Remove, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { remove(&link, msg.0).await })))
    }
}

impl Handler<SetDirectory> for HostActor {
    type Result = ();
    fn handle(&mut self, msg: SetDirectory, _: &mut Context<Self>) {
        self.state.set_directory(msg.0);
    }
}

impl Handler<SetSlot> for HostActor {
    type Result = ();
    fn handle(&mut self, msg: SetSlot, _: &mut Context<Self>) {
        self.state.set_slot(&msg.0, msg.1);
    }
}

impl Handler<Follow> for HostActor {
    type Result = MessageResult<Follow>;
    fn handle(&mut self, msg: Follow, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.follow(msg.0))
    }
}

impl Handler<BeginReaping> for HostActor {
    type Result = bool;
    fn handle(&mut self, msg: BeginReaping, _: &mut Context<Self>) -> bool {
        self.state.begin_reaping(&msg.0)
    }
}

impl Handler<StillDying> for HostActor {
    type Result = bool;
    fn handle(&mut self, msg: StillDying, _: &mut Context<Self>) -> bool {
        self.state.still_dying(&msg.0)
    }
}

impl Handler<EndReaping> for HostActor {
    type Result = ();
    fn handle(&mut self, msg: EndReaping, _: &mut Context<Self>) {
        self.state.end_reaping(&msg.0);
    }
}

/// How often the reaper looks at a dying model.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// What a change works with: the host (its state, by messages), where the directory is kept,
/// and the model starter.
pub(super) struct Link {
    pub host: ModelHost,
    pub store: DirectoryStore,
    pub starter: Arc<dyn StartModel>,
}

/// Starts every model of the directory; `default` on `default_store` (see
/// [`ModelHost::start_all`]).
pub(super) async fn start_all(link: &Link, default_store: Store) -> Result<(), ServeError> {
    for entry in link.host.directory().await.models.into_values() {
        let store = if entry.name == DEFAULT_MODEL { Some(default_store.clone()) } else { None };
        match start_one(link, &entry, store, false).await {
            Ok(_) => {}
            Err(e) if entry.name == DEFAULT_MODEL => return Err(e),
            Err(e) => {
                tracing::error!(model = %entry.name, error = %e, "the model cannot start; the others run");
                link.host.set_slot(&entry.name, Some(Slot::Failed(e.to_string()))).await;
                continue;
            }
        }
        if entry.life == ModelLife::Dying {
            spawn_reaper(&link.host, entry.name.clone());
        }
    }
    Ok(())
}

/// Opens the model's store (unless given) and starts it; records its uuid.
async fn start_one(
    link: &Link,
    entry: &ModelEntry,
    store: Option<Store>,
    new: bool,
) -> Result<ModelRuntime, ServeError> {
    let shared = link.host.shared();
    let opts = model_settings(&shared.opts, entry);
    let model = ModelToStart { name: &entry.name, opts: &opts, account: entry.cloud.account.as_deref(), store, new };
    let state = link.starter.start(shared, model).await?;
    link.host.set_slot(&entry.name, Some(Slot::Running(Box::new(state.clone())))).await;
    if entry.uuid.as_deref() != Some(state.model_uuid.as_str()) {
        let (name, uuid) = (entry.name.clone(), state.model_uuid.clone());
        match link.store.update(move |d| d.set_uuid(&name, &uuid)).await {
            Ok(((), d)) => link.host.set_directory(d).await,
            Err(e) => tracing::warn!(model = %entry.name, error = %e, "cannot record the model's uuid"),
        }
    }
    // At start, the service's "ready" line says how many run (and nothing may be printed
    // before a failed bind's one sentence).
    tracing::debug!(model = %entry.name, uuid = %state.model_uuid, "model running");
    Ok(state)
}

/// Adds a model (see [`ModelHost::add`]).
pub(super) async fn add(link: &Link, entry: ModelEntry) -> Result<ModelRuntime, HostError> {
    let broker = broker_of(&link.host.shared().opts, &entry.cloud);
    #[cfg(not(feature = "ec2"))]
    if broker == "ec2" {
        return Err(super::directory::ModelsError::Cloud(
            "this build has no EC2 broker: build with `--features serve,ec2`, or use --broker sim".into(),
        )
        .into());
    }
    let added = entry.clone();
    let ((), d) = link.store.update(move |d| d.add(added, &broker)).await?;
    link.host.set_directory(d).await;
    match start_one(link, &entry, None, true).await {
        Ok(state) => {
            tracing::info!(model = %entry.name, uuid = %state.model_uuid, "model added");
            Ok(state)
        }
        Err(e) => {
            let name = entry.name.clone();
            link.host.set_slot(&name, None).await;
            if let Ok((_, d)) = link.store.update(move |d| Ok(d.remove(&name))).await {
                link.host.set_directory(d).await;
            }
            Err(HostError::Start { name: entry.name, source: Box::new(e) })
        }
    }
}

/// Marks `name` dying (kept) and starts its reaper (see [`ModelHost::mark_dying`]).
pub(super) async fn mark_dying(link: &Link, name: String, force: bool) -> Result<(), HostError> {
    let n = name.clone();
    let (was_alive, d) = link.store.update(move |d| d.destroy(&n, force)).await?;
    link.host.set_directory(d).await;
    if was_alive {
        spawn_reaper(&link.host, name);
    }
    Ok(())
}

/// Takes a model that does not run out of the directory (see [`ModelHost::forget`]).
pub(super) async fn forget(link: &Link, name: String) -> Result<(), HostError> {
    let n = name.clone();
    let (_, d) = link.store.update(move |d| Ok(d.remove(&n))).await?;
    link.host.set_directory(d).await;
    link.host.set_slot(&name, None).await;
    Ok(())
}

/// Follows the directory other replicas write (see [`ModelHost::spawn_sync`]).
pub(super) async fn sync(link: &Link) -> Result<(), HostError> {
    let d = link.store.load().await?;
    let plan = link.host.follow(d).await;
    for (gone, state) in plan.stop {
        if let Some(st) = state {
            link.starter.stop(vec![st], &link.host.shared().opts).await;
        }
        link.host.set_slot(&gone, None).await;
        tracing::info!(model = %gone, "model removed by another replica: stopped here");
    }
    for entry in plan.start {
        match start_one(link, &entry, None, false).await {
            Ok(_) => tracing::info!(model = %entry.name, "model added by another replica: running here"),
            Err(e) => {
                tracing::error!(model = %entry.name, error = %e, "the model cannot start here");
                link.host.set_slot(&entry.name, Some(Slot::Failed(e.to_string()))).await;
            }
        }
    }
    for name in plan.reap {
        spawn_reaper(&link.host, name);
    }
    Ok(())
}

/// Stops a destroyed model and removes it (another replica may have removed it first).
pub(super) async fn remove(link: &Link, name: String) -> Result<(), HostError> {
    let Ok(state) = link.host.state(&name).await else { return Ok(()) };
    link.starter.stop(vec![state], &link.host.shared().opts).await;
    link.host.set_slot(&name, None).await;
    let n = name.clone();
    let (_, d) = link.store.update(move |d| Ok(d.remove(&n))).await?;
    link.host.set_directory(d).await;
    if name != DEFAULT_MODEL {
        drop_store(link.host.shared(), &name).await;
    }
    tracing::info!(model = %name, "model destroyed and removed");
    Ok(())
}

/// Watches a dying model until its provisioner is idle and the cloud lists none of its
/// instances (twice in a row, [`REAP_EVERY`] apart: a start answered in between would show),
/// then stops it and removes it: the directory's entry, then its store (the SQLite file, or
/// the PostgreSQL schema; `default`'s is kept: it holds the service's tokens).
fn spawn_reaper(host: &ModelHost, name: String) {
    let host = host.clone();
    actix_rt::spawn(async move {
        if !host.begin_reaping(&name).await {
            return; // one reaper per model
        }
        let mut clear = 0;
        loop {
            actix_rt::time::sleep(REAP_EVERY).await;
            let Ok(st) = host.state(&name).await else { break };
            if !host.still_dying(&name).await {
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
        host.end_reaping(&name).await;
    });
}

/// Deletes a removed model's store: its SQLite file (and WAL), or its schema.
async fn drop_store(shared: &crate::service::runtime::Shared, name: &str) {
    match shared.opts.store.url() {
        StoreUrl::Sqlite => {
            let db = model_db(shared.opts.data_dir(), name);
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
            use crate::service::runtime::location::{pg_schema, SchemaOp};
            use crate::service::runtime::schema_name;
            let schema = schema_name(name);
            if let Err(e) = pg_schema(&url, &schema, SchemaOp::Drop).await {
                tracing::warn!(model = %name, error = %e, "cannot drop a removed model's schema");
            }
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => {}
    }
}
