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
}

impl HarvestPolicy {
    /// A policy starting in safe mode with this mode; `unknown` answers which instances no
    /// live machine owns.
    /// Unknown instances are judged on a cloud listing at most `listing_max_age` old.
    pub fn new(mode: HarvestMode, unknown: Recipient<UnknownInstances>, listing_max_age: std::time::Duration) -> Self {
        Self { book: HarvestBook::new(mode), unknown, listing_max_age }
    }

    fn plan_with_unknown(
        &mut self,
        dead: Vec<crate::registry::DeadMachine>,
        fresher_than: Option<std::time::Duration>,
    ) -> ResponseActFuture<Self, HarvestPlan> {
        if !self.book.wants_unknown() {
            return Box::pin(fut::ready(self.book.plan(&dead, &[])));
        }
        let ask = self.unknown.send(UnknownInstances { fresher_than });
        Box::pin(ask.into_actor(self).map(move |res, act, _ctx| {
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
            act.book.plan(&dead, &unknown)
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
