//! The harvest policy actor: a thin shell over [`HarvestBook`] that asks the registry for
//! unknown instances when the mode wants them.

use actix::prelude::*;

use super::messages::*;
use super::state::{HarvestBook, HarvestPlan, HarvestSafety, ModeChange, UnknownInstance};
use crate::actors::coordinator::ExecutePlan;
use crate::actors::messages::Subscribe;
use crate::actors::registry::{RegistryError, UnknownInstances};
use crate::actors::work::{BusyState, WorkCount, WorkGuard};
use crate::model::events::ProvisionerEvent;
use crate::model::HarvestMode;

/// What can fail in the harvest policy: asking the registry for unknown instances (then none
/// is harvested this time).
#[derive(Debug, thiserror::Error)]
enum HarvestError {
    /// The registry answered with an error (its view is stale, or its listing failed).
    #[error("cannot list unknown instances: {0}")]
    Registry(#[source] RegistryError),
    /// The provisioner stopped: the registry no longer takes messages.
    #[error("registry unavailable: {0}")]
    Stopped(#[source] MailboxError),
}

/// Owns the harvest mode, safe mode and released instances.
pub struct HarvestPolicy {
    book: HarvestBook,
    unknown: Recipient<UnknownInstances>,
    listing_max_age: std::time::Duration,
    reuse_window: std::time::Duration,
    /// Where plans made on its own (expired parkings, rechecks of unknown instances) go to be
    /// executed.
    executor: Recipient<ExecutePlan>,
    /// The pending recheck of unknown instances: when it is due, its timer, and the work it is.
    recheck: Option<(actix_rt::time::Instant, SpawnHandle, WorkGuard)>,
    /// Counts the recheck in the provisioner's total.
    work: WorkCount,
    /// Instances parked for reuse (each waits out its window), in the provisioner's total.
    parked: BusyState,
    /// The book's clock starts here.
    epoch: actix_rt::time::Instant,
    /// Who hears of the unknown instances a plan left for later ([`ProvisionerEvent::HarvestDeferred`]).
    subscribers: Vec<Recipient<ProvisionerEvent>>,
}

/// Time to plan the unknown instances again (young ones grew old, or the cap held some back).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
struct Recheck;

impl HarvestPolicy {
    /// A policy starting in safe mode with this mode; `unknown` answers which instances no
    /// live machine owns, `executor` carries out the plans it makes on its own.
    /// Unknown instances are judged on a cloud listing at most `listing_max_age` old.
    pub fn new(
        mode: HarvestMode,
        unknown: Recipient<UnknownInstances>,
        listing_max_age: std::time::Duration,
        executor: Recipient<ExecutePlan>,
    ) -> Self {
        let work = WorkCount::new();
        Self {
            parked: BusyState::new(&work),
            work,
            book: HarvestBook::new(mode),
            unknown,
            listing_max_age,
            reuse_window: std::time::Duration::from_secs(300),
            executor,
            recheck: None,
            epoch: actix_rt::time::Instant::now(),
            subscribers: Vec::new(),
        }
    }

    /// The same policy counting its work in `work`'s total (its provisioner's).
    pub fn with_work(mut self, work: WorkCount) -> Self {
        self.parked = BusyState::new(&work);
        self.work = work;
        self
    }

    /// Turns machine reuse on: parked instances wait `window`, then they are stopped.
    pub fn with_reuse(mut self, window: std::time::Duration) -> Self {
        self.book = self.book.with_reuse(true);
        self.reuse_window = window;
        self
    }

    /// Sets the grace period and the cap on stops per pass for unknown instances.
    pub fn with_safety(mut self, safety: HarvestSafety) -> Self {
        self.book = self.book.with_safety(safety);
        self
    }

    /// Arms (or brings forward) the recheck the plan asks for.
    fn arm_recheck(&mut self, plan: &HarvestPlan, ctx: &mut Context<Self>) {
        let Some(after) = plan.recheck_in else { return };
        let due = actix_rt::time::Instant::now() + after;
        if let Some((at, handle, _)) = &self.recheck {
            if *at <= due {
                return;
            }
            ctx.cancel_future(*handle);
        }
        let handle = ctx.notify_later(Recheck, after);
        self.recheck = Some((due, handle, self.work.guard()));
    }

    /// Starts the reuse window of every instance the plan parks.
    fn arm(&mut self, plan: &HarvestPlan, ctx: &mut Context<Self>) {
        for (_, r) in &plan.park {
            ctx.notify_later(ParkExpired(r.instance.clone()), self.reuse_window);
        }
        self.sync_parked();
    }

    /// Tells the subscribers what the plan left for later, if anything.
    fn announce(&self, plan: &HarvestPlan) {
        if plan.spared_by_grace == 0 && plan.held_back_by_cap == 0 {
            return;
        }
        let event = ProvisionerEvent::HarvestDeferred {
            spared_by_grace: plan.spared_by_grace,
            held_back_by_cap: plan.held_back_by_cap,
        };
        for s in &self.subscribers {
            s.do_send(event.clone());
        }
    }

    /// Parked instances are work until claimed or expired.
    fn sync_parked(&mut self) {
        self.parked.set(self.book.parked().next().is_some());
    }

    fn plan_with_unknown(
        &mut self,
        dead: Vec<crate::model::DeadMachine>,
        fresher_than: Option<std::time::Duration>,
    ) -> ResponseActFuture<Self, HarvestPlan> {
        if !self.book.wants_unknown() {
            self.book.set_clock(self.epoch.elapsed());
            let plan = self.book.plan(&dead, &[]);
            return Box::pin(fut::ready(plan).into_actor(self).map(|plan, act, ctx| {
                act.arm(&plan, ctx);
                plan
            }));
        }
        let ask = self.unknown.send(UnknownInstances { fresher_than });
        self.book.ask_sent();
        Box::pin(ask.into_actor(self).map(move |res, act, ctx| {
            let unknown: Vec<UnknownInstance> =
                match res.map_err(HarvestError::Stopped).and_then(|r| r.map_err(HarvestError::Registry)) {
                    Ok(list) => list.into_iter().map(|(id, age)| UnknownInstance { id, age }).collect(),
                    Err(error) => {
                        tracing::warn!(%error, "not harvesting unknown instances");
                        Vec::new()
                    }
                };
            let unknown = act.book.ask_answered(unknown);
            act.book.set_clock(act.epoch.elapsed());
            let plan = act.book.plan(&dead, &unknown);
            act.arm(&plan, ctx);
            act.arm_recheck(&plan, ctx);
            act.announce(&plan);
            plan
        }))
    }
}

impl Handler<Recheck> for HarvestPolicy {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _msg: Recheck, _ctx: &mut Self::Context) -> Self::Result {
        self.recheck = None;
        let max_age = Some(self.listing_max_age);
        Box::pin(self.plan_with_unknown(Vec::new(), max_age).map(|plan, act, _ctx| {
            if !plan.is_empty() {
                tracing::info!(instances = ?plan.stop, "harvesting unknown instances that outgrew the grace period or waited for the cap");
                act.executor.do_send(ExecutePlan(plan));
            }
        }))
    }
}

impl Actor for HarvestPolicy {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl Handler<Subscribe> for HarvestPolicy {
    type Result = ();
    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) {
        self.subscribers.push(msg.0);
    }
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
    type Result = MessageResult<StopsDone>;
    fn handle(&mut self, msg: StopsDone, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.stops_done(&msg.instances))
    }
}

impl Handler<PlanDestroy> for HarvestPolicy {
    type Result = MessageResult<PlanDestroy>;
    fn handle(&mut self, msg: PlanDestroy, _ctx: &mut Self::Context) -> Self::Result {
        self.book.set_clock(self.epoch.elapsed());
        MessageResult(self.book.plan_destroy(&msg.machines))
    }
}

impl Handler<PlanStops> for HarvestPolicy {
    type Result = MessageResult<PlanStops>;
    fn handle(&mut self, msg: PlanStops, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.plan_stops(&msg.instances, &msg.remove_after, msg.machine.as_ref()))
    }
}

impl Handler<PlanExtras> for HarvestPolicy {
    type Result = MessageResult<PlanExtras>;
    fn handle(&mut self, msg: PlanExtras, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.plan_extras(&msg.instances))
    }
}

impl Handler<ClaimReusable> for HarvestPolicy {
    type Result = MessageResult<ClaimReusable>;
    fn handle(&mut self, msg: ClaimReusable, _ctx: &mut Self::Context) -> Self::Result {
        let claimed = self.book.claim(&msg.constraints, &msg.derived);
        self.sync_parked();
        MessageResult(claimed)
    }
}

impl Handler<ParkExpired> for HarvestPolicy {
    type Result = ();
    fn handle(&mut self, msg: ParkExpired, _ctx: &mut Self::Context) {
        self.book.set_clock(self.epoch.elapsed());
        let plan = self.book.expire(&msg.0);
        self.sync_parked();
        if plan.is_empty() {
            return;
        }
        tracing::info!(instance = %msg.0, "no machine reused the parked instance in time; stopping it");
        self.executor.do_send(ExecutePlan(plan));
    }
}

impl Handler<crate::actors::messages::Busy> for HarvestPolicy {
    type Result = usize;
    fn handle(&mut self, _msg: crate::actors::messages::Busy, _ctx: &mut Self::Context) -> usize {
        // A parked instance, or a recheck, is a one-shot timer pending.
        self.book.parked().count() + usize::from(self.recheck.is_some())
    }
}
