//! The lifecycle actor: a thin shell over [`LifecycleBook`].

use actix::prelude::*;

use super::messages::*;
use super::state::LifecycleBook;

/// Owns every machine's phase.
#[derive(Default)]
pub struct MachineLifecycle {
    book: LifecycleBook,
}

impl MachineLifecycle {
    /// No machine in any phase.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same lifecycle with `mutations` on (the model checker's tests and replays only).
    pub fn with_mutations(mut self, mutations: crate::config::Mutations) -> Self {
        self.book = std::mem::take(&mut self.book).with_mutations(mutations);
        self
    }
}

impl Actor for MachineLifecycle {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl Handler<ObservePending> for MachineLifecycle {
    type Result = MessageResult<ObservePending>;
    fn handle(&mut self, msg: ObservePending, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(msg.ids.into_iter().filter(|id| self.book.want_start(id)).collect())
    }
}

impl Handler<BeginReplacement> for MachineLifecycle {
    type Result = bool;
    fn handle(&mut self, msg: BeginReplacement, _ctx: &mut Self::Context) -> bool {
        self.book.begin_replacement(&msg.machine)
    }
}

impl Handler<ObserveDead> for MachineLifecycle {
    type Result = MessageResult<ObserveDead>;
    fn handle(&mut self, msg: ObserveDead, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.on_deaths(&msg.dead))
    }
}

impl Handler<StartsFinished> for MachineLifecycle {
    type Result = MessageResult<StartsFinished>;
    fn handle(&mut self, msg: StartsFinished, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(
            msg.starts.into_iter().map(|(machine, instance)| self.book.start_finished(&machine, instance)).collect(),
        )
    }
}

impl Handler<StillWanted> for MachineLifecycle {
    type Result = bool;
    fn handle(&mut self, msg: StillWanted, _ctx: &mut Self::Context) -> bool {
        self.book.still_wanted(&msg.machine)
    }
}

impl Handler<WithoutStart> for MachineLifecycle {
    type Result = MessageResult<WithoutStart>;
    fn handle(&mut self, msg: WithoutStart, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.without_start(msg.extras))
    }
}

impl Handler<ForgetLifecycle> for MachineLifecycle {
    type Result = ();
    fn handle(&mut self, msg: ForgetLifecycle, _ctx: &mut Self::Context) {
        for id in &msg.ids {
            self.book.forget(id);
        }
    }
}

impl Handler<GetPhases> for MachineLifecycle {
    type Result = MessageResult<GetPhases>;
    fn handle(&mut self, _msg: GetPhases, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.phases().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

impl Handler<ObserveDestroy> for MachineLifecycle {
    type Result = MessageResult<ObserveDestroy>;
    fn handle(&mut self, msg: ObserveDestroy, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.on_destroy(&msg.machines))
    }
}
