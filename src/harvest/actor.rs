//! The harvest policy actor: a thin shell over [`HarvestBook`] that asks the registry for
//! unknown instances when the mode wants them.

use actix::prelude::*;

use super::messages::*;
use super::state::{HarvestBook, HarvestPlan, ModeChange};
use crate::registry::{RegistryError, UnknownInstances};
use crate::types::{HarvestMode, InstanceId};

/// Owns the harvest mode, safe mode and released instances.
pub struct HarvestPolicy {
    book: HarvestBook,
    unknown: Recipient<UnknownInstances>,
    listing_max_age: std::time::Duration,
    reuse_window: std::time::Duration,
    /// Where plans made on its own (expired parkings) go to be executed.
    executor: Option<Recipient<ExecutePlan>>,
}

/// A plan the harvest policy made on its own (a parked instance's window ran out), for the
/// coordinator to execute.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ExecutePlan(pub HarvestPlan);

impl HarvestPolicy {
    /// A policy starting in safe mode with this mode; `unknown` answers which instances no
    /// live machine owns.
    /// Unknown instances are judged on a cloud listing at most `listing_max_age` old.
    pub fn new(mode: HarvestMode, unknown: Recipient<UnknownInstances>, listing_max_age: std::time::Duration) -> Self {
        Self {
            book: HarvestBook::new(mode),
            unknown,
            listing_max_age,
            reuse_window: std::time::Duration::from_secs(300),
            executor: None,
        }
    }

    /// Turns machine reuse on: parked instances wait `window`, then their stop is sent to
    /// `executor`.
    pub fn with_reuse(mut self, window: std::time::Duration, executor: Recipient<ExecutePlan>) -> Self {
        self.book = self.book.with_reuse(true);
        self.reuse_window = window;
        self.executor = Some(executor);
        self
    }

    /// Starts the reuse window of every instance the plan parks.
    fn arm(&self, plan: &HarvestPlan, ctx: &mut Context<Self>) {
        for (_, r) in &plan.park {
            ctx.notify_later(ParkExpired(r.instance.clone()), self.reuse_window);
        }
    }

    fn plan_with_unknown(
        &mut self,
        dead: Vec<crate::registry::DeadMachine>,
        fresher_than: Option<std::time::Duration>,
    ) -> ResponseActFuture<Self, HarvestPlan> {
        if !self.book.wants_unknown() {
            let plan = self.book.plan(&dead, &[]);
            return Box::pin(fut::ready(plan).into_actor(self).map(|plan, act, ctx| {
                act.arm(&plan, ctx);
                plan
            }));
        }
        let ask = self.unknown.send(UnknownInstances { fresher_than });
        Box::pin(ask.into_actor(self).map(move |res, act, ctx| {
            let unknown: Vec<InstanceId> = match res {
                Ok(Ok(list)) => list,
                Ok(Err(RegistryError::ViewStale)) => {
                    tracing::warn!("instance view is stale; not harvesting unknown instances");
                    Vec::new()
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot list unknown instances");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registry unreachable; not harvesting unknown instances");
                    Vec::new()
                }
            };
            let plan = act.book.plan(&dead, &unknown);
            act.arm(&plan, ctx);
            plan
        }))
    }
}

impl Actor for HarvestPolicy {
    type Context = Context<Self>;
}

impl Handler<PlanDeadMachines> for HarvestPolicy {
    type Result = ResponseActFuture<Self, HarvestPlan>;
    fn handle(&mut self, msg: PlanDeadMachines, _ctx: &mut Self::Context) -> Self::Result {
        let max_age = Some(self.listing_max_age);
        self.plan_with_unknown(msg.dead, max_age)
    }
}

impl Handler<PlanUnknown> for HarvestPolicy {
    type Result = ResponseActFuture<Self, HarvestPlan>;
    fn handle(&mut self, msg: PlanUnknown, _ctx: &mut Self::Context) -> Self::Result {
        self.plan_with_unknown(Vec::new(), msg.fresher_than)
    }
}

impl Handler<SetHarvestMode> for HarvestPolicy {
    type Result = MessageResult<SetHarvestMode>;
    fn handle(&mut self, msg: SetHarvestMode, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.set_mode(msg.0))
    }
}

impl Handler<EndSafeMode> for HarvestPolicy {
    type Result = MessageResult<EndSafeMode>;
    fn handle(&mut self, _msg: EndSafeMode, _ctx: &mut Self::Context) -> Self::Result {
        let change: ModeChange = self.book.end_safe_mode();
        MessageResult(change)
    }
}

impl Handler<GetHarvestMode> for HarvestPolicy {
    type Result = MessageResult<GetHarvestMode>;
    fn handle(&mut self, _msg: GetHarvestMode, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.mode())
    }
}

impl Handler<StopsDone> for HarvestPolicy {
    type Result = ();
    fn handle(&mut self, msg: StopsDone, _ctx: &mut Self::Context) {
        self.book.stops_done(&msg.instances);
    }
}

impl Handler<PlanDestroy> for HarvestPolicy {
    type Result = MessageResult<PlanDestroy>;
    fn handle(&mut self, msg: PlanDestroy, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.plan_destroy(&msg.machines))
    }
}

impl Handler<ClaimReusable> for HarvestPolicy {
    type Result = MessageResult<ClaimReusable>;
    fn handle(&mut self, msg: ClaimReusable, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.claim(&msg.constraints, &msg.derived))
    }
}

impl Handler<ParkExpired> for HarvestPolicy {
    type Result = ();
    fn handle(&mut self, msg: ParkExpired, _ctx: &mut Self::Context) {
        let plan = self.book.expire(&msg.0);
        if plan.is_empty() {
            return;
        }
        tracing::info!(instance = %msg.0, "no machine reused the parked instance in time; stopping it");
        if let Some(e) = &self.executor {
            e.do_send(ExecutePlan(plan));
        }
    }
}

impl Handler<crate::Busy> for HarvestPolicy {
    type Result = usize;
    fn handle(&mut self, _msg: crate::Busy, _ctx: &mut Self::Context) -> usize {
        // A parked instance is a one-shot timer pending.
        self.book.parked().count()
    }
}
