//! The coordinator actor: a thin shell. Its cores decide (the [`BatchBook`] what to batch and
//! what follows a batch, the batch planner what a batch does, `followup` what follows a job
//! or a finished start); the shell sends the messages they name, feeds the replies back and
//! holds a [`WorkGuard`](crate::actors::work::WorkGuard) for every piece of work in flight.

use actix::prelude::*;

use super::followup::{after_listing, after_start, on_jobs_done, on_mode_change, removed, AfterStartStep, Followup};
use super::handover::{HandoverBook, HandoverCause, NoticeDecision};
use super::links::{
    destroy, execute_plan, forget, plan_after_start, plan_extras, plan_sweep, reset_transient, run_batch,
    InterruptionLinks, Links,
};
use super::messages::*;
use super::state::{BatchBook, DestroyError, DestroySummary};
use crate::actors::harvest::{HarvestPlan, PlanStops, PlanUnknown, SetHarvestMode, StopsDone};
use crate::actors::interruptions::AcknowledgeNotices;
use crate::actors::lifecycle::StartsFinished;
use crate::actors::messages::{Busy, WhenIdle};
use crate::actors::registry::NoticedInstances;
use crate::actors::registry::{InstancesGone, RecordInstance, RecordInstances, StopsPlanned};
use crate::actors::work::{BusyState, WorkCount};
use crate::actors::workers::ResizePool;
use crate::actors::zones::PopulateZones;
use crate::model::events::ProvisionerEvent;
use crate::ports::InterruptionNotice;

/// How long after the interrupted instance's warning ran out a hand-over's deferred warnings
/// stop waiting for its stop (the cloud has taken it by then).
const STOP_OVERDUE: std::time::Duration = std::time::Duration::from_secs(5);

/// How many times a replacement's model reads are tried while the warning runs.
const REPLACE_READS: u32 = 6;

/// How often a hand-over's replacement not yet seen running is looked up by its start.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The provisioner's front door.
pub struct Coordinator {
    book: BatchBook,
    /// Shared with the futures it spawns (one `Arc` clone, not two dozen recipients).
    links: std::sync::Arc<Links>,
    subscribers: Vec<Recipient<ProvisionerEvent>>,
    /// Follow-up futures and one-shot timers in flight; its total is the provisioner's.
    work: WorkCount,
    /// The book's busy state (ids waiting, a batch in flight, a backoff running), in the total.
    batching: BusyState,
    /// Whether transient-retry ticks are honoured (not for container provisioners).
    retry_path: bool,
    /// Which machines this provisioner acts on.
    scope: crate::config::Scope,
    /// Hand-overs on: spot interruptions' (issue 33) and repairs' (issue 34).
    handovers: HandoverBook,
    /// The repair policy and the machines the last listing showed unhealthy (issue 34).
    repairs: super::repair::RepairBook,
    /// The time between the registry's listings: a repair due is held open (as any one-shot
    /// timer) until the first listing after it.
    resync: std::time::Duration,
    /// Until when (on the coordinator's clock) a repair due is held open already.
    repair_due: Option<std::time::Duration>,
    /// Whether a look at the hand-overs' replacements is under way or due (one at a time).
    watching: bool,
    /// Whether hand-overs a predecessor left under way were asked for (once).
    resumed: bool,
    /// Where notices are looked up and acknowledged, when the cloud warns of interruptions.
    interruptions: Option<InterruptionLinks>,
    /// The coordinator's clock (notice deadlines).
    epoch: actix_rt::time::Instant,
}

impl Coordinator {
    /// A coordinator over these links; `workers` is the pool's initial size; `work` is the
    /// count whose total its sibling actors share.
    pub fn new(
        links: Links,
        backoff: crate::config::Backoff,
        workers: usize,
        retry_path: bool,
        scope: crate::config::Scope,
        work: WorkCount,
    ) -> Self {
        let book = BatchBook::new(backoff, workers);
        let batching = BusyState::new(&work);
        Self {
            book,
            links: std::sync::Arc::new(links),
            subscribers: Vec::new(),
            work,
            batching,
            retry_path,
            scope,
            handovers: HandoverBook::new(),
            repairs: super::repair::RepairBook::default(),
            resync: crate::config::DEFAULT_RESYNC_INTERVAL,
            repair_due: None,
            watching: false,
            resumed: false,
            interruptions: None,
            epoch: actix_rt::time::Instant::now(),
        }
    }

    /// The same coordinator repairing by this policy (issue 34).
    /// `resync` is the registry's listing interval.
    pub fn with_repair(mut self, policy: crate::config::repair::RepairPolicy, resync: std::time::Duration) -> Self {
        self.repairs = super::repair::RepairBook::new(policy);
        self.resync = resync;
        self
    }

    /// After a fresh listing, with repair on: the cloud's status checks are read (impaired
    /// instances, with their machines from the registry) and joined to the stopped machines,
    /// then decided on. With repair off nothing is asked.
    fn health_after_listing(
        &mut self,
        mut stopped: Vec<super::repair::StoppedMachine>,
        population: usize,
        ctx: &mut Context<Self>,
    ) {
        let Some(links) = &self.interruptions else { return };
        if self.repairs.policy().after.is_none() {
            self.on_health(Vec::new(), population, ctx);
            return;
        }
        let (impaired, noticed) = (links.impaired.clone(), links.noticed.clone());
        let ask = async move {
            let ids = impaired.send(crate::actors::interruptions::ImpairedInstances).await.unwrap_or_default();
            if ids.is_empty() {
                return Vec::new();
            }
            noticed.send(NoticedInstances(ids)).await.unwrap_or_default()
        };
        self.spawn_counted(ask.into_actor(self), ctx, move |owners, act, ctx| {
            let impaired = act.repairs.impaired(owners, act.epoch.elapsed());
            // A machine both stopped and impaired counts once, as stopped.
            let seen: std::collections::BTreeSet<_> = stopped.iter().map(|s| s.owner.machine.clone()).collect();
            stopped.extend(impaired.into_iter().filter(|i| !seen.contains(&i.owner.machine)));
            stopped.sort_by(|a, b| a.owner.machine.cmp(&b.owner.machine));
            act.on_health(stopped, population, ctx);
        });
    }

    /// Work until the first listing after `due_in` from now (a repair due then, a drifted
    /// machine waiting): a simulation stays open for it, as for any one-shot timer (periodic
    /// listings alone would not hold it).
    fn hold_open(&mut self, due_in: std::time::Duration, ctx: &mut Context<Self>) {
        let until = self.epoch.elapsed() + due_in + self.resync + std::time::Duration::from_secs(1);
        if self.repair_due.is_none_or(|d| d < until) {
            self.repair_due = Some(until);
            let work = self.work.guard();
            ctx.run_later(until - self.epoch.elapsed(), move |act, _ctx| {
                if act.repair_due == Some(until) {
                    act.repair_due = None;
                }
                drop(work);
            });
        }
    }

    /// After a fresh listing, when the model replaces drifted machines (issue 34): the machines
    /// the registry lists an instance for have their provisioning info read, the registry
    /// judges which instances drifted from it, and the book says which begin a replacement
    /// (within `drift-budget`, never during a hand-over of another cause). Off: nothing asked.
    fn drift_after_listing(&mut self, ctx: &mut Context<Self>) {
        let Some(links) = &self.interruptions else { return };
        if !self.repairs.judge_drift(self.epoch.elapsed()) {
            return;
        }
        let (listed, drift_of, model) = (links.listed.clone(), links.drift_of.clone(), self.links.model.clone());
        let ask = async move {
            let ids = listed.send(crate::actors::registry::ListedMachines).await.unwrap_or_default();
            if ids.is_empty() {
                return (Vec::new(), false);
            }
            let Ok(infos) = model.provisioning_info(ids.clone()).await else { return (Vec::new(), false) };
            let pairs = ids.into_iter().zip(infos).filter_map(|(id, info)| Some((id, info.ok()?))).collect();
            (drift_of.send(crate::actors::registry::DriftOf(pairs)).await.unwrap_or_default(), true)
        };
        self.spawn_counted(ask.into_actor(self), ctx, |(drifted, looked), act, ctx| {
            act.repairs.drift_judged(act.epoch.elapsed(), looked);
            if !looked {
                return;
            }
            if let Some(by_reason) = act.repairs.drift_seen(&drifted) {
                act.publish(ProvisionerEvent::DriftSeen { by_reason });
            }
            // A hand-over resumed from a listing (after a restart or a fail-over) of a drifted
            // machine, confirmed by no notice: its drift replacement, labelled so from now.
            for d in &drifted {
                if act.handovers.resumed_drift(&d.owner.machine) {
                    let reasons: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
                    let (machine, instance) = (d.owner.machine.clone(), d.owner.record.instance.clone());
                    if let Some(instance) = instance {
                        act.publish(ProvisionerEvent::MachineDriftReplacing { machine, instance, reasons });
                    }
                }
            }
            let handovers = &act.handovers;
            let drifting = handovers.on_for(HandoverCause::Drift);
            let others = handovers.others_on(HandoverCause::Drift);
            let (begin, waiting) = act.repairs.on_drift(drifted, drifting, others, |m| handovers.busy(m));
            if waiting {
                act.hold_open(std::time::Duration::ZERO, ctx);
            }
            for d in begin {
                let Some(replace) = act.handovers.begin_drift(d.owner) else { continue };
                if let NoticeDecision::Replace { machine, interrupted, .. } = &replace {
                    let reasons: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
                    tracing::info!(%machine, instance = %interrupted, ?reasons, "replacing a drifted instance");
                    let (machine, instance) = (machine.clone(), interrupted.clone());
                    act.publish(ProvisionerEvent::MachineDriftReplacing { machine, instance, reasons });
                }
                act.start_replacement(replace, 0, ctx);
            }
        });
    }

    /// Decides on a fresh listing's stopped machines and begins the repairs it allows (each a
    /// hand-over), publishing who became unhealthy and when the cap holds repairs back.
    fn on_health(&mut self, stopped: Vec<super::repair::StoppedMachine>, population: usize, ctx: &mut Context<Self>) {
        let handovers = &self.handovers;
        let plan = self.repairs.on_listing(stopped, population, handovers.repairing(), |m| handovers.busy(m));
        for u in plan.newly_unhealthy {
            tracing::info!(machine = %u.machine, instance = %u.instance, reason = u.reason, unhealthy_for = ?u.unhealthy_for, "machine unhealthy");
            self.publish(ProvisionerEvent::MachineUnhealthy {
                machine: u.machine,
                instance: u.instance,
                reason: u.reason.to_owned(),
                unhealthy_for: u.unhealthy_for,
                repairable: u.repairable,
            });
        }
        if let Some(held) = plan.held {
            tracing::warn!(
                unhealthy = held.unhealthy,
                cap = held.cap,
                "repairs held back: more machines unhealthy at once than repair-max-unhealthy allows"
            );
            self.publish(ProvisionerEvent::RepairsHeld { unhealthy: held.unhealthy, cap: held.cap });
        }
        if let Some(due_in) = plan.due_in {
            self.hold_open(due_in, ctx);
        }
        for (owner, u) in plan.repair {
            if let Some(replace) = self.handovers.begin_repair(owner) {
                tracing::info!(machine = %u.machine, instance = %u.instance, "repairing: starting a replacement");
                self.begin_handover(replace, ctx);
            }
        }
    }

    /// The same coordinator, acting on interruption notices (issue 33).
    pub fn with_interruptions(mut self, links: InterruptionLinks) -> Self {
        self.interruptions = Some(links);
        self
    }

    /// Decides on notices, each with what the registry knows of its instance, and performs
    /// the decisions: a warning for a live machine's recorded instance starts a replacement.
    fn on_notices(
        &mut self,
        notices: Vec<InterruptionNotice>,
        owners: Vec<Option<super::handover::NoticedInstance>>,
        ctx: &mut Context<Self>,
    ) {
        let now = self.epoch.elapsed();
        let mut acknowledge = Vec::new();
        let mut later = Vec::new();
        for (notice, owner) in notices.into_iter().zip(owners) {
            match self.handovers.on_notice(notice, owner, now) {
                NoticeDecision::Acknowledge(receipt) => acknowledge.push(receipt),
                NoticeDecision::Later(notice) => later.push(notice),
                replace @ NoticeDecision::Replace { .. } => self.begin_handover(replace, ctx),
                NoticeDecision::StopFirst { machine, instance } => {
                    tracing::info!(%machine, %instance, "hand-over: stopping the instance a switch before a restart left, before another hand-over");
                    self.stop_interrupted(machine, instance, ctx);
                }
                NoticeDecision::Joined | NoticeDecision::Deferred => {}
            }
        }
        self.acknowledge(acknowledge);
        if !later.is_empty() {
            ctx.run_later(super::handover::LOOK_AGAIN, move |act, ctx| act.replay(later, ctx));
        }
    }

    /// A hand-over opened (from a warning, or resumed from a listing after a restart):
    /// `machine-interrupted` is published (with the warning's time left, if known) and its
    /// replacement started or adopted.
    fn begin_handover(&mut self, replace: NoticeDecision, ctx: &mut Context<Self>) {
        if let NoticeDecision::Replace { machine, interrupted, .. } = &replace {
            let (m, instance) = (machine.clone(), interrupted.clone());
            match self.handovers.of(machine).map(|h| h.cause) {
                Some(HandoverCause::Drift) => {}
                Some(HandoverCause::Repair) => {
                    let u = self.repairs.unhealthy().into_iter().find(|u| u.machine == m);
                    let unhealthy_for = u.as_ref().map(|u| u.unhealthy_for).unwrap_or_default();
                    let reason = u.map_or("stopped", |u| u.reason).to_owned();
                    self.publish(ProvisionerEvent::MachineRepairing { machine: m, instance, reason, unhealthy_for });
                }
                _ => {
                    let warning = self.handovers.warning_left(machine, self.epoch.elapsed());
                    self.publish(ProvisionerEvent::MachineInterrupted { machine: m, instance, warning });
                }
            }
        }
        self.start_replacement(replace, 0, ctx)
    }

    /// Releases notices to be handed on again at their next delivery (none: nothing sent).
    fn release(&self, receipts: Vec<String>) {
        if let (false, Some(links)) = (receipts.is_empty(), &self.interruptions) {
            links.release.do_send(crate::actors::interruptions::ReleaseNotices(receipts));
        }
    }

    /// Starts a hand-over's replacement: the lifecycle has the machine starting again, the
    /// model gives its provisioning info and distribution group, and the start is queued as
    /// any other. If the lifecycle refuses (the machine is starting, stopping or its model
    /// destroyed), the hand-over ends and its notices are acknowledged: the interrupted
    /// instance is then lost as any other. A model read that fails is tried again after 1, 2,
    /// 4... s while the warning runs ([`REPLACE_READS`] tries in all); then the hand-over ends
    /// with its notices released (looked at again at their next delivery). A replacement made
    /// before a crash (`adopt`) is adopted, not started again; a start that asks for spot
    /// first has the allocator avoid the interrupted instance's zone for the shape's spot
    /// starts (the capacity memory) where the machine allows another.
    ///
    /// The model is read first; the lifecycle is asked only if the hand-over is still
    /// replacing once the reads are back (the machine may have died and been removed
    /// meanwhile, its hand-over ended: the lifecycle, which has forgotten it, would take it for
    /// a machine it never tracked and let a replacement start for a machine that is gone;
    /// found by the model checker).
    fn start_replacement(&mut self, decision: NoticeDecision, attempt: u32, ctx: &mut Context<Self>) {
        let NoticeDecision::Replace { machine, interrupted, .. } = &decision else {
            return;
        };
        if self.interruptions.is_none() {
            return;
        }
        let how = if matches!(&decision, NoticeDecision::Replace { adopt: Some(_), .. }) {
            "adopting the replacement a listing shows"
        } else {
            "starting a replacement"
        };
        tracing::info!(%machine, %interrupted, "hand-over: {how}");
        let model = self.links.model.clone();
        let id = machine.clone();
        let reads = async move {
            let info = model.provisioning_info(vec![id.clone()]).await.ok().and_then(|mut v| v.pop());
            let group = model.distribution_groups(vec![id.clone()]).await.ok().and_then(|mut v| v.pop());
            match (info, group) {
                (Some(Ok(info)), Some(Ok(group))) => Ok((info, group)),
                _ => Err(id),
            }
        };
        self.spawn_counted(reads.into_actor(self), ctx, move |reads, act, ctx| match reads {
            Ok((info, group)) => act.begin_replacement(decision, info, group, ctx),
            Err(machine) if attempt + 1 < REPLACE_READS && act.handover_time_left(&machine, attempt) => {
                let delay = std::time::Duration::from_secs(1 << attempt);
                tracing::info!(%machine, ?delay, "cannot read the model for a replacement: trying again");
                ctx.run_later(delay, move |act, ctx| act.start_replacement(decision, attempt + 1, ctx));
            }
            Err(machine) => {
                tracing::warn!(%machine, "cannot read the model for a replacement of the interrupted instance");
                act.end_handover(&machine, false, ctx);
            }
        });
    }

    /// The replacement's reads are back: if its hand-over is still replacing, the lifecycle is
    /// asked (`BeginReplacement`) and the start queued; else nothing (the hand-over ended).
    fn begin_replacement(
        &mut self,
        decision: NoticeDecision,
        info: crate::model::ProvisioningInfo,
        group: Vec<crate::model::MachineId>,
        ctx: &mut Context<Self>,
    ) {
        let NoticeDecision::Replace { machine, interrupted, avoid_zone, avoid_type, record, adopt } = decision else {
            return;
        };
        if !self.handovers.replacing(&machine) {
            tracing::info!(%machine, "hand-over ended before its replacement started (the machine is gone)");
            return;
        }
        let Some(links) = &self.interruptions else { return };
        let machine = *record;
        let begin = links.begin.clone();
        let short = links.short.clone();
        let short_type = links.short_type.clone();
        let replaces = interrupted;
        let fut = async move {
            let id = machine.id.clone();
            let begin = begin.send(crate::actors::lifecycle::BeginReplacement { machine: id.clone() });
            if !begin.await.unwrap_or(false) {
                return Err(id);
            }
            let spot = info.capacity.first() == crate::model::CapacityType::Spot;
            if let (true, Some(instance_type)) = (spot, avoid_type) {
                let zone = avoid_zone.clone();
                short_type.do_send(crate::actors::interruptions::CapacityShort { zone, instance_type });
            }
            if let (true, Some(zone)) = (spot, avoid_zone) {
                let shape = crate::model::CapacityType::Spot.shape(&info.constraints.shape());
                let _ = short.send(crate::actors::zones::RememberCapacity { shape, zone }).await;
            }
            let (info, replaces) = (std::sync::Arc::new(info), Some(replaces));
            Ok(crate::actors::workers::StartJob {
                machine,
                info,
                group,
                adopt,
                replaces,
                trace: crate::trace::Carried::none(),
            })
        };
        self.spawn_counted(fut.into_actor(self), ctx, move |job, act, ctx| match job {
            Ok(job) => super::links::perform(&act.links, super::batch::Effect::Start(Box::new(job))),
            Err(machine) => {
                tracing::warn!(%machine, "cannot start a replacement for the interrupted instance");
                act.end_handover(&machine, true, ctx);
            }
        });
    }

    /// A hand-over ends without its switch: its notices acknowledged (`done`), or released to
    /// be handed out again; the warnings deferred while it was on looked at again (found by
    /// the model checker: dropped, they were held for ever and never acted on).
    fn end_handover(&mut self, machine: &crate::model::MachineId, done: bool, ctx: &mut Context<Self>) {
        let ended = self.handovers.end(machine);
        if done {
            self.acknowledge(ended.acknowledge);
        } else {
            self.release(ended.acknowledge);
        }
        if !ended.again.is_empty() {
            self.replay(ended.again, ctx);
        }
    }

    /// Whether the machine's hand-over is still on and its warning (if it said when) leaves
    /// time for another try after `attempt`'s delay.
    fn handover_time_left(&self, machine: &crate::model::MachineId, attempt: u32) -> bool {
        let now = self.epoch.elapsed();
        self.handovers
            .of(machine)
            .is_some_and(|h| h.deadline.is_none_or(|d| now + std::time::Duration::from_secs(1 << attempt) < d))
    }

    /// Before jobs' outcomes are followed: a hand-over's replacement that started is the switch
    /// (the registry and the lifecycle record it with the outcome; the model has it already);
    /// one that failed for good ends its hand-over.
    fn handover_outcomes(&mut self, outcomes: &[crate::actors::workers::JobOutcome]) -> super::handover::OutcomesSeen {
        let mut seen = self.handovers.on_outcomes(outcomes, self.epoch.elapsed());
        self.acknowledge(std::mem::take(&mut seen.acknowledge));
        seen
    }

    /// After the switch: the interrupted instance is stopped (as any stop: retried until done;
    /// a stopping instance is never an extra) and the hand-over's notices acknowledged.
    fn after_switches(&mut self, switches: Vec<super::handover::Switch>, ctx: &mut Context<Self>) {
        for s in switches {
            tracing::info!(machine = %s.machine, replacement = %s.replacement, interrupted = %s.interrupted, "hand-over: switched; stopping the interrupted instance");
            self.publish(ProvisionerEvent::MachineReplaced {
                machine: s.machine.clone(),
                interrupted: s.interrupted.clone(),
                replacement: s.replacement.clone(),
                cause: s.cause,
                lead: s.lead,
            });
            self.stop_interrupted(s.machine.clone(), s.interrupted, ctx);
            let receipts = self.handovers.end_switched(&s.machine);
            self.acknowledge(receipts);
            // Deferred warnings (about the replacement) are looked at again once the
            // interrupted instance's stop is done (`Followup::StopsDone`), or once its own
            // warning ran out (the cloud has taken it), whichever comes first: never a third
            // live instance meanwhile. Without a warning (a repair, a drift replacement) they
            // wait for the stop, retried until it is done.
            let Some(lead) = s.lead else { continue };
            let machine = s.machine;
            ctx.run_later(lead + STOP_OVERDUE, move |act, ctx| {
                let again = act.handovers.stop_overdue(&machine);
                if !again.is_empty() {
                    act.replay(again, ctx);
                }
            });
        }
    }

    /// Stops a hand-over's interrupted instance (as any stop: retried until done; a stopping
    /// instance is never an extra) if its machine is still alive: a machine that died meanwhile
    /// leaves its instances to the harvest policy's mode (and the cloud takes it anyway).
    fn stop_interrupted(
        &mut self,
        machine: crate::model::MachineId,
        interrupted: crate::model::InstanceId,
        ctx: &mut Context<Self>,
    ) {
        let Some(links) = &self.interruptions else { return };
        let ask = links.noticed.send(NoticedInstances(vec![interrupted.clone()]));
        self.spawn_counted(ask.into_actor(self), ctx, move |owners, act, ctx| {
            let alive = owners.ok().and_then(|mut o| o.pop()).flatten().is_some_and(|o| o.alive);
            if !alive {
                tracing::info!(%machine, %interrupted, "hand-over: the machine died meanwhile; its interrupted instance is left to the harvest mode");
                return;
            }
            let stop = Followup::PlanStops { instances: vec![interrupted], remove_after: Vec::new(), machine: Some(machine) };
            act.follow(vec![stop], ctx);
        });
    }

    /// Switched hand-overs whose replacement now runs (or whose interrupted instance's time is
    /// up) have their interrupted instance stopped; while any replacement is not yet seen
    /// running, it is looked up by its start again every [`WATCH_EVERY`] (one look at a time).
    fn look_at_replacements(&mut self, ctx: &mut Context<Self>) {
        let awaiting = self.handovers.awaiting();
        if self.watching || awaiting.is_empty() {
            return;
        }
        let Some(links) = &self.interruptions else { return };
        let starts = awaiting
            .iter()
            .map(|(m, interrupted)| {
                (m.clone(), crate::model::InstanceTags::replacement_nonce(&links.host_tag, interrupted))
            })
            .collect();
        self.watching = true;
        let ask = links.states.send(crate::actors::interruptions::ReplacementStates(starts));
        self.spawn_counted(ask.into_actor(self), ctx, move |states, act, ctx| {
            act.watching = false;
            let now = act.epoch.elapsed();
            let states = states.unwrap_or_default();
            let switches = awaiting
                .iter()
                .zip(states.into_iter().chain(std::iter::repeat(None)))
                .filter_map(|((m, _), state)| act.handovers.seen(m, state, now))
                .collect();
            act.after_switches(switches, ctx);
            if !act.handovers.awaiting().is_empty() {
                act.watching = true;
                // Work while a replacement is awaited (a simulation stays open for it: a
                // repair's, unlike an interruption's, has no warning the cloud counts).
                let work = act.work.guard();
                ctx.run_later(WATCH_EVERY, |act, ctx| {
                    act.watching = false;
                    act.look_at_replacements(ctx);
                    drop(work);
                });
            }
        });
    }

    /// Looks at notices again (deferred ones, once their machine's hand-over ended).
    fn replay(&mut self, notices: Vec<InterruptionNotice>, ctx: &mut Context<Self>) {
        let Some(links) = &self.interruptions else { return };
        let ask = links.noticed.send(NoticedInstances(notices.iter().map(|n| n.instance.clone()).collect()));
        self.spawn_counted(ask.into_actor(self), ctx, move |owners, act, ctx| {
            if let Ok(owners) = owners {
                act.on_notices(notices, owners, ctx);
            }
        });
    }

    /// Acknowledges notices (none: nothing sent).
    fn acknowledge(&self, receipts: Vec<String>) {
        if let (false, Some(links)) = (receipts.is_empty(), &self.interruptions) {
            links.acknowledge.do_send(AcknowledgeNotices(receipts));
        }
    }

    /// Machines forgotten: their hand-overs end, their notices acknowledged.
    fn end_handovers(&mut self, machines: &[crate::model::MachineId]) {
        let mut acknowledge = Vec::new();
        for m in machines {
            let ended = self.handovers.end(m);
            acknowledge.extend(ended.acknowledge);
            acknowledge.extend(ended.again.into_iter().map(|n| n.receipt));
        }
        self.acknowledge(acknowledge);
    }

    /// The same coordinator drawing its backoff jitter from this seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.book = self.book.with_seed(seed);
        self
    }

    fn publish(&self, event: ProvisionerEvent) {
        tracing::debug!(event = event.name(), "provisioner event");
        for s in &self.subscribers {
            s.do_send(event.clone());
        }
    }

    /// After the first batch (a fresh listing in the registry): hand-overs a predecessor left
    /// under way are resumed at once (later ones come with the periodic listings).
    fn resume_handovers_once(&mut self, ctx: &mut Context<Self>) {
        if self.resumed {
            return;
        }
        self.resumed = true;
        let Some(links) = &self.interruptions else { return };
        let ask = links.resumable.send(crate::actors::registry::ResumableHandovers);
        self.spawn_counted(ask.into_actor(self), ctx, |owners, act, ctx| {
            for owner in owners.unwrap_or_default() {
                let impaired = act.repairs.is_impaired(&owner.machine);
                if let Some(replace) = act.handovers.resume(owner, impaired) {
                    act.begin_handover(replace, ctx);
                }
            }
        });
    }

    /// Starts the next batch if one is due; the book's business is work in flight.
    fn kick(&mut self, ctx: &mut Context<Self>) {
        if let Some(start) = self.book.start_batch() {
            let ids = start.ids.clone();
            ctx.spawn(run_batch(self.links.clone(), start).into_actor(self).map(move |res, act, ctx| {
                match res {
                    Ok(outcome) => {
                        let next = act.book.batch_done(outcome);
                        act.follow(next, ctx);
                        act.resume_handovers_once(ctx);
                    }
                    Err(e) => {
                        let delay = act.book.batch_failed(ids);
                        tracing::warn!(error = %e, retry_in = ?delay, "processing updated machines failed; will retry");
                        ctx.run_later(delay, |act, ctx| {
                            act.book.backoff_over();
                            act.kick(ctx);
                        });
                    }
                }
                act.kick(ctx);
            }));
        }
        self.batching.set(self.book.busy() > 0);
    }

    /// Spawns `fut`, counted as work until `then` has run.
    fn spawn_counted<F, T>(&mut self, fut: F, ctx: &mut Context<Self>, then: T)
    where
        F: ActorFuture<Self> + 'static,
        T: FnOnce(F::Output, &mut Self, &mut Context<Self>) + 'static,
    {
        let work = self.work.guard();
        ctx.spawn(fut.map(move |out, act, ctx| {
            then(out, act, ctx);
            drop(work);
        }));
    }

    /// Carries out what a core decided, in order. The instances started and the starts
    /// finished go out together, one message to the registry and one to the lifecycle (sent
    /// before any other follow-up, which could reach those actors, and at the end).
    fn follow(&mut self, followups: Vec<Followup>, ctx: &mut Context<Self>) {
        let starts = followups.iter().filter(|f| matches!(f, Followup::StartFinished { .. })).count();
        let mut started = StartsEnded { records: Vec::with_capacity(starts), finished: Vec::with_capacity(starts) };
        for f in followups {
            match f {
                Followup::Record { machine, instance, constraints } => started.records.push(RecordInstance {
                    machine,
                    instance: *instance,
                    constraints: constraints.map(|c| *c),
                }),
                Followup::StartFinished { machine, instance, orphan } => {
                    started.finished.push((machine, instance, orphan))
                }
                Followup::Publish(event) => self.publish(event),
                other => {
                    self.send_started(&mut started, ctx);
                    self.follow_one(other, ctx);
                }
            }
        }
        self.send_started(&mut started, ctx);
    }

    /// Sends the records and the finished starts gathered so far: the registry records the
    /// instances; the lifecycle's answers go to [`after_start`] in order, and the harvest
    /// policy plans the rare start that found its machine dead or its model destroyed.
    fn send_started(&mut self, started: &mut StartsEnded, ctx: &mut Context<Self>) {
        if !started.records.is_empty() {
            self.links.record.do_send(RecordInstances(std::mem::take(&mut started.records)));
        }
        if started.finished.is_empty() {
            return;
        }
        let (starts, orphans): (Vec<_>, Vec<_>) = started
            .finished
            .drain(..)
            .map(|(machine, instance, orphan)| ((machine.clone(), instance), (machine, orphan)))
            .unzip();
        let fut = self.links.start_finished.send(StartsFinished { starts }).into_actor(self);
        let work = self.work.guard();
        ctx.spawn(fut.then(move |res, act, ctx| {
            let mut answers = res.ok().map(Vec::into_iter);
            let mut steps = Vec::new();
            for (machine, orphan) in orphans {
                match after_start(answers.as_mut().and_then(Iterator::next), machine, orphan) {
                    // The common case: nothing for the harvest policy to plan.
                    AfterStartStep::Then(next) => act.follow(next, ctx),
                    step => steps.push(step),
                }
            }
            let links = act.links.clone();
            let plans = async move {
                let mut plans = Vec::new();
                for step in steps {
                    plans.extend(plan_after_start(links.clone(), step).await);
                }
                plans
            };
            plans.into_actor(act).map(move |plans, act, _ctx| {
                for plan in plans {
                    act.execute(plan);
                }
                drop(work);
            })
        }));
    }

    /// Carries out one follow-up other than a record, a finished start or an event.
    fn follow_one(&mut self, f: Followup, ctx: &mut Context<Self>) {
        match f {
            Followup::Record { .. } | Followup::StartFinished { .. } | Followup::Publish(_) => {
                self.follow(vec![f], ctx)
            }
            Followup::RetryLater { delay, ids } => {
                let work = self.work.guard();
                ctx.run_later(delay, move |act, ctx| {
                    act.book.notify(ids);
                    act.kick(ctx);
                    drop(work);
                });
            }
            Followup::SweepDyingModel => {
                let fut = plan_sweep(self.links.clone()).into_actor(self);
                self.spawn_counted(fut, ctx, |res, act, _ctx| {
                    let Ok(plan) = res else { return };
                    if !plan.stop.is_empty() {
                        tracing::info!(instances = ?plan.stop, "model is dying: stopping what its destruction left running");
                    }
                    act.execute(plan);
                });
            }
            Followup::HarvestUnknown { announce, fresher_than } => {
                let fut = self.links.plan_unknown.send(PlanUnknown { fresher_than }).into_actor(self);
                self.spawn_counted(fut, ctx, move |res, act, _ctx| {
                    if let Ok(plan) = res {
                        if !plan.stop.is_empty() {
                            tracing::info!(instances = ?plan.stop, "harvesting unknown instances");
                        }
                        act.execute(plan);
                    }
                    if announce {
                        act.publish(ProvisionerEvent::ProcessedMachines);
                    }
                });
            }
            Followup::PlanStops { instances, remove_after, machine } if !instances.is_empty() => {
                tracing::info!(instances = ?instances, "stopping instances given up");
                self.links.stops_planned.do_send(StopsPlanned { ids: instances.clone(), machine: machine.clone() });
                let fut = self.links.plan_stops.send(PlanStops { instances, remove_after, machine }).into_actor(self);
                self.spawn_counted(fut, ctx, |res, act, _ctx| {
                    if let Ok(plan) = res {
                        act.execute(plan);
                    }
                });
            }
            Followup::PlanStops { .. } => {}
            Followup::StopExtras(extras) => {
                let fut = plan_extras(self.links.clone(), extras).into_actor(self);
                self.spawn_counted(fut, ctx, |res, act, _ctx| {
                    let Ok((plan, machines)) = res else { return };
                    if plan.stop.is_empty() {
                        return;
                    }
                    tracing::warn!(
                        instances = ?plan.stop,
                        machines = ?machines,
                        "stopping extra instances of live machines (made by starts whose calls went unanswered, after each machine got its instance elsewhere)"
                    );
                    let event = ProvisionerEvent::ExtraInstances { machines, instances: plan.stop.clone() };
                    act.execute(plan);
                    act.publish(event);
                });
            }
            Followup::Forget(machines) => {
                self.end_handovers(&machines);
                forget(&self.links, machines)
            }
            Followup::Populate(placements) => self.links.populate.do_send(PopulateZones { placements }),
            Followup::InstancesGone(ids) => self.links.gone.do_send(InstancesGone { ids }),
            Followup::StopsDone(instances) => {
                let again = self.handovers.stopped(&instances);
                if !again.is_empty() {
                    self.replay(again, ctx);
                }
                let fut = self.links.stops_done.send(StopsDone { instances }).into_actor(self);
                self.spawn_counted(fut, ctx, |res, act, ctx| {
                    let Ok(machines) = res else { return };
                    if !machines.is_empty() {
                        tracing::info!(machines = ?machines, "the stops dead machines waited for are seen through; removing them");
                    }
                    act.follow(removed(machines), ctx);
                });
            }
        }
    }

    /// Performs a harvest plan: stops (then removals) through the pool, removals now.
    fn execute(&mut self, plan: HarvestPlan) {
        for (m, r) in &plan.park {
            tracing::info!(machine = %m, instance = %r.instance, "parking a dead machine's instance for reuse");
        }
        let remove_now = plan.remove_now.clone();
        execute_plan(&self.links, plan);
        for m in remove_now {
            self.publish(ProvisionerEvent::MachineRemoved { machine: m });
        }
    }
}

/// The records and finished starts [`Coordinator::follow`] gathers, to send as one message
/// each.
struct StartsEnded {
    records: Vec<RecordInstance>,
    finished: Vec<(crate::model::MachineId, Option<crate::model::InstanceId>, Option<crate::model::InstanceId>)>,
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl Handler<MachinesChanged> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: MachinesChanged, ctx: &mut Self::Context) {
        self.book.notify(msg.ids);
        self.kick(ctx);
    }
}

impl Handler<RetryTick> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: RetryTick, ctx: &mut Self::Context) {
        if !self.retry_path {
            tracing::debug!("retry tick ignored: this provisioner has no transient-retry path");
            return;
        }
        let fut = reset_transient(self.links.model.clone(), self.scope.clone()).into_actor(self);
        self.spawn_counted(fut, ctx, |ids, act, ctx| {
            if ids.is_empty() {
                return;
            }
            act.book.notify(ids);
            act.kick(ctx);
            act.publish(ProvisionerEvent::RetriedMachinesWithErrors);
        });
    }
}

impl Handler<ChangeHarvestMode> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: ChangeHarvestMode, ctx: &mut Self::Context) {
        let fut = self.links.set_mode.send(SetHarvestMode(msg.0)).into_actor(self);
        self.spawn_counted(fut, ctx, |res, act, ctx| {
            if let Ok(change) = res {
                act.follow(on_mode_change(change), ctx);
            }
        });
    }
}

impl Handler<SetWorkers> for Coordinator {
    type Result = ResponseActFuture<Self, Result<(), ResizeError>>;
    fn handle(&mut self, msg: SetWorkers, _ctx: &mut Self::Context) -> Self::Result {
        let n = msg.0;
        if n == self.book.workers() {
            return Box::pin(fut::ready(Ok(())));
        }
        let ask = self.links.resize.send(ResizePool(n));
        Box::pin(ask.into_actor(self).map(move |res, act, _ctx| {
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(ResizeError::Invalid(e)),
                Err(e) => return Err(ResizeError::Stopped(e)),
            }
            if act.book.set_workers(n) {
                act.publish(ProvisionerEvent::ResizedWorkerPool { size: n });
            }
            Ok(())
        }))
    }
}

impl Handler<Subscribe> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) {
        self.subscribers.push(msg.0);
    }
}

impl Handler<ViewRefreshed> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: ViewRefreshed, ctx: &mut Self::Context) {
        self.handovers.listing_seen();
        if self.book.first_done() {
            // A hand-over's instances (the interrupted one, the replacement) are never extras.
            let mut msg = msg;
            msg.extras.retain(|(m, i)| !self.handovers.spares(m, i));
            self.follow(after_listing(std::mem::take(&mut msg.extras)), ctx);
            for owner in msg.resumes {
                let impaired = self.repairs.is_impaired(&owner.machine);
                if let Some(replace) = self.handovers.resume(owner, impaired) {
                    self.begin_handover(replace, ctx);
                }
            }
            self.health_after_listing(msg.stopped, msg.population, ctx);
            self.drift_after_listing(ctx);
            self.look_at_replacements(ctx);
        }
    }
}

impl Handler<SetRepairPolicy> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: SetRepairPolicy, _ctx: &mut Self::Context) {
        self.repairs.set_policy(msg.0);
    }
}

impl Handler<GetHealth> for Coordinator {
    type Result = Health;
    fn handle(&mut self, _msg: GetHealth, _ctx: &mut Self::Context) -> Health {
        Health {
            unhealthy: self.repairs.unhealthy(),
            held: self.repairs.holding(),
            policy: self.repairs.policy(),
            repairing: self.handovers.repairs_on(),
        }
    }
}

impl Handler<InterruptionsNoticed> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: InterruptionsNoticed, ctx: &mut Self::Context) {
        // No answer from the registry: it stopped (shutting down); the cloud hands the notices
        // out again to the next provisioner.
        self.replay(msg.0, ctx);
    }
}

impl Handler<JobsDone> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: JobsDone, ctx: &mut Self::Context) {
        let seen = self.handover_outcomes(&msg.0);
        self.follow(on_jobs_done(msg.0), ctx);
        self.after_switches(seen.switches, ctx);
        if !seen.again.is_empty() {
            self.replay(seen.again, ctx);
        }
        self.look_at_replacements(ctx);
    }
}

impl Handler<Busy> for Coordinator {
    type Result = usize;
    fn handle(&mut self, _msg: Busy, _ctx: &mut Self::Context) -> usize {
        self.book.busy() + self.work.count()
    }
}

impl Handler<WhenIdle> for Coordinator {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, _msg: WhenIdle, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.work.when_idle(tx);
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<DestroyModel> for Coordinator {
    type Result = ResponseActFuture<Self, Result<DestroySummary, DestroyError>>;

    fn handle(&mut self, msg: DestroyModel, _ctx: &mut Self::Context) -> Self::Result {
        self.book.set_model_dying();
        Box::pin(destroy(self.links.clone(), msg.force).into_actor(self))
    }
}

impl Handler<ExecutePlan> for Coordinator {
    type Result = ();
    fn handle(&mut self, msg: ExecutePlan, _ctx: &mut Self::Context) {
        self.execute(msg.0);
    }
}

impl Handler<CloseStarts> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: CloseStarts, _ctx: &mut Self::Context) {
        self.book.close_starts();
    }
}

impl Handler<ModelDestroyed> for Coordinator {
    type Result = ();
    fn handle(&mut self, _msg: ModelDestroyed, ctx: &mut Self::Context) {
        self.book.set_model_dying();
        // Before the first batch the cache is incomplete: that batch reads the model's life
        // and sweeps then.
        if self.book.first_done() {
            self.follow(vec![Followup::SweepDyingModel], ctx);
        }
    }
}
