//! The model host's actor: the thin shell that owns the plain core ([`HostState`]) and answers
//! the reads from it at once, and runs the directory's changes one at a time ([`Turns`]): a
//! change asked for while another is under way waits its turn; each runs as a future spawned
//! on the actor's context (not `ctx.wait`), so that the actor goes on answering reads and the
//! change's own steps while a model's store opens or its provisioners stop, and no change can
//! wait for itself.

use std::sync::Arc;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, MessageResult, ResponseFuture, WrapFuture};
use futures::future::LocalBoxFuture;

use super::changes::{self, Link};
use super::directory::Directory;
use super::messages::*;
use super::persist::DirectoryStore;
use super::state::{HostState, Turns};
use super::{HostError, ModelHost};
use crate::service::error::ServeError;
use crate::service::runtime::{Shared, StartModel};

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
    pub fn new(shared: Arc<Shared>, store: DirectoryStore, directory: Directory, starter: Arc<dyn StartModel>) -> Self {
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
        let rx = self.ask(ctx, move |link| Box::pin(async move { changes::start_all(&link, msg.0).await }));
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(ServeError::Stopped { what: "models", source: actix::MailboxError::Closed }))
        })
    }
}

impl Handler<Add> for HostActor {
    type Result = ResponseFuture<Result<crate::service::runtime::ModelRuntime, HostError>>;
    fn handle(&mut self, msg: Add, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { changes::add(&link, msg.0).await })))
    }
}

impl Handler<MarkDying> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: MarkDying, ctx: &mut Context<Self>) -> Self::Result {
        let MarkDying { name, force } = msg;
        answer(self.ask(ctx, move |link| Box::pin(async move { changes::mark_dying(&link, name, force).await })))
    }
}

impl Handler<Forget> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: Forget, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { changes::forget(&link, msg.0).await })))
    }
}

impl Handler<Resync> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, _: Resync, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { changes::sync(&link).await })))
    }
}

impl Handler<Remove> for HostActor {
    type Result = ResponseFuture<Result<(), HostError>>;
    fn handle(&mut self, msg: Remove, ctx: &mut Context<Self>) -> Self::Result {
        answer(self.ask(ctx, move |link| Box::pin(async move { changes::remove(&link, msg.0).await })))
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
