//! Spot interruption hand-overs (issue 33), the coordinator's plain core for them: which notice
//! starts a replacement, when the machine's recorded instance switches, when the interrupted one
//! is stopped and the notices acknowledged. Decisions are values; the coordinator performs them.
//!
//! The rule, per machine: a live machine whose recorded instance is warned of an interruption
//! gets one replacement start, the interrupted instance staying recorded and marked interrupted
//! meanwhile; once the replacement is started, the machine records it (the switch); once it is
//! seen running (or the interrupted one's time is up), the interrupted instance is stopped
//! (unless already gone) and the notices about it acknowledged. So a machine has at most two
//! live instances, and only while a hand-over is on: a notice about the replacement itself,
//! while the hand-over is on, waits for it to end (no third instance); it is looked at again
//! then.
//!
//! Crash safety: the replacement's start has a nonce of its own that names the interrupted
//! instance (`InstanceTags::replacement_nonce`), the same for every provisioner, so a start
//! repeated after a crash or a leader's fail-over sends the same client token; and a listing
//! that shows a replacement of a live machine's recorded instance resumes the hand-over with it
//! ([`HandoverBook::resume`]) before the cloud hands the notice out again.

use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::model::events::HandoverCause;
use crate::model::{InstanceId, MachineId};
use crate::ports::{InterruptionNotice, NoticeKind};

/// What the registry knows of the instance a notice is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticedInstance {
    /// The machine that owns it.
    pub machine: MachineId,
    /// Whether it is the machine's recorded instance.
    pub recorded: bool,
    /// Whether the machine is alive.
    pub alive: bool,
    /// Its zone, if any: a spot replacement avoids it where the machine allows others.
    pub zone: Option<String>,
    /// Its instance type, if known: likewise avoided for spot.
    pub instance_type: Option<String>,
    /// Its state in the last listing, if listed.
    pub state: Option<crate::model::InstanceState>,
    /// The machine as cached (what a replacement start is made of).
    pub record: Box<crate::model::Machine>,
    /// Another live instance tagged for the machine and free (not this one, owned by no other
    /// machine, not being stopped): a replacement started before a crash, which a replacement
    /// adopts rather than starting a third instance.
    pub adoptable: Option<Box<crate::model::CloudInstance>>,
    /// Another live instance of ours tagged for the machine, when this one is its recorded
    /// instance: owned by no machine and not a replacement of this one (the interrupted
    /// instance of a switch whose stop a crash lost, or an orphan or extra to stop). A warning
    /// about this one waits for its stop (never a third live instance).
    pub leftover: Option<InstanceId>,
    /// Whether this instance was started to replace the machine's recorded instance (a
    /// hand-over's replacement, not recorded yet: a hand-over resumed after a crash adopts it).
    pub replaces_recorded: bool,
}

/// What to do about one notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeDecision {
    /// Nothing to do (not ours, not a live machine's recorded instance, a rebalance
    /// recommendation, a termination of an instance not being handed over): acknowledge it.
    Acknowledge(String),
    /// Start a replacement for the machine, avoiding the interrupted instance's zone and type
    /// for spot where the machine allows others.
    Replace {
        /// The machine.
        machine: MachineId,
        /// Its interrupted (still recorded) instance.
        interrupted: InstanceId,
        /// The zone to avoid.
        avoid_zone: Option<String>,
        /// The instance type to avoid.
        avoid_type: Option<String>,
        /// The machine as cached.
        record: Box<crate::model::Machine>,
        /// An instance to adopt as the replacement (see [`NoticedInstance::adoptable`]).
        adopt: Option<Box<crate::model::CloudInstance>>,
    },
    /// Part of a hand-over already on: its receipt is acknowledged with the hand-over's.
    Joined,
    /// About a machine's replacement while its hand-over is on: looked at again once it ends.
    Deferred,
    /// About a machine's recorded instance while another instance of the machine is still
    /// there ([`NoticedInstance::leftover`]): that one is to be stopped first (`instance`), and
    /// the notice is looked at again once its stop is done.
    StopFirst {
        /// The machine.
        machine: MachineId,
        /// The other instance, to stop first.
        instance: InstanceId,
    },
    /// About an instance no machine records yet (a start still in flight made it, or its
    /// record has not landed, or the registry has not listed it since): held, and looked at
    /// again after [`LOOK_AGAIN`]; see [`HandoverBook::on_notice`] for how long.
    Later(InterruptionNotice),
}

/// How far one machine's hand-over is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverPhase {
    /// The replacement is starting; the interrupted instance is recorded.
    Replacing,
    /// The replacement is started and recorded; the interrupted instance is stopped once the
    /// replacement is seen running, or its own time is up.
    Switched {
        /// The replacement.
        replacement: InstanceId,
    },
}

/// One machine's hand-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// Why.
    pub cause: HandoverCause,
    /// The interrupted instance.
    pub interrupted: InstanceId,
    /// When (on the coordinator's clock) the cloud takes it, if the notice said.
    pub deadline: Option<Duration>,
    /// The receipts of the notices about it, acknowledged when the hand-over ends.
    pub receipts: Vec<String>,
    /// How far it is.
    pub phase: HandoverPhase,
    /// Resumed from a listing with its instance running, its cause not known for sure (an
    /// interruption, or a drift replacement): a notice joining it confirms the interruption,
    /// a drift judgement of its machine makes it a drift replacement
    /// ([`HandoverBook::resumed_drift`]).
    pub resumed: bool,
}

impl Handover {
    fn switch(&self, machine: &MachineId, replacement: &InstanceId, now: Duration) -> Switch {
        Switch {
            machine: machine.clone(),
            replacement: replacement.clone(),
            interrupted: self.interrupted.clone(),
            lead: self.deadline.map(|d| d.saturating_sub(now)),
            cause: self.cause,
        }
    }
}

/// A switch to perform: record `replacement` as the machine's instance, then stop `interrupted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// The machine.
    pub machine: MachineId,
    /// Its new instance.
    pub replacement: InstanceId,
    /// The one to stop.
    pub interrupted: InstanceId,
    /// Why the machine's instance was handed over.
    pub cause: HandoverCause,
    /// The lead time (see `ProvisionerEvent::MachineReplaced`), if the warning said when.
    pub lead: Option<Duration>,
}

/// What the pool's outcomes leave to do ([`HandoverBook::on_outcomes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomesSeen {
    /// Switches whose interrupted instance is to be stopped now.
    pub switches: Vec<Switch>,
    /// Receipts of hand-overs that ended, to acknowledge.
    pub acknowledge: Vec<String>,
    /// Warnings deferred while those hand-overs were on, to look at again.
    pub again: Vec<InterruptionNotice>,
}

/// What ending a hand-over leaves to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandoverEnded {
    /// Receipts to acknowledge.
    pub acknowledge: Vec<String>,
    /// Deferred notices about the machine, to look at again.
    pub again: Vec<InterruptionNotice>,
}

/// Every hand-over on, by machine.
#[derive(Debug, Clone, Default)]
pub struct HandoverBook {
    on: BTreeMap<MachineId, Handover>,
    deferred: BTreeMap<MachineId, Vec<InterruptionNotice>>,
    /// Instances interrupted in a hand-over that ended: a redelivery of its warning, the
    /// instance gone and forgotten, is acknowledged at once. Cleared when it grows past
    /// [`LOOKED_CAP`].
    ended: std::collections::BTreeSet<InstanceId>,
    /// Notices held ([`NoticeDecision::Later`]), by instance: when each was first held, and
    /// how many listings had been seen then.
    held: BTreeMap<InstanceId, Held>,
    /// Listings of the cloud the coordinator has seen ([`HandoverBook::listing_seen`]).
    listings: u64,
    /// Machines whose hand-over ended with the interrupted instance's stop still under way:
    /// a warning about the machine's (new) instance waits for it (never three live instances).
    stopping: BTreeMap<MachineId, InstanceId>,
    /// Replacements made but not recorded (their start failed), being stopped: never adopted
    /// by a later hand-over of the machine. Cleared past [`LOOKED_CAP`].
    orphans: std::collections::BTreeSet<InstanceId>,
}

/// How many instances [`HandoverBook`] remembers.
const LOOKED_CAP: usize = 10_000;

/// How long after a look a held notice is looked at again.
pub const LOOK_AGAIN: Duration = Duration::from_secs(5);

/// Listings after which a notice about an instance no machine is known to own is
/// acknowledged: the second listing since it was held was sent after it came, and shows no
/// machine's instance by that id (not ours, or gone).
pub const UNKNOWN_FOR_LISTINGS: u64 = 2;

/// When a notice was first held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// On the coordinator's clock: the warning's deadline counts from here.
    since: Duration,
    /// Listings seen by then.
    listings: u64,
}

impl HandoverBook {
    /// No hand-over.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides on a notice received at `now`, given what the registry knows of its instance
    /// (`None`: not an instance of ours that a machine owns).
    ///
    /// A warning about an instance no machine records yet is held, never given up on a timer:
    /// an instance tagged for a live machine that records none (its start has not answered,
    /// or its record has not landed) is held until the machine records it (then it is handed
    /// over, its deadline counted from when it first came) or is gone; one the registry does
    /// not know at all, until it does, or until [`UNKNOWN_FOR_LISTINGS`] listings since it
    /// was held show no machine's instance by that id. A start slower than any timer would
    /// otherwise leave its machine's instance to be taken with no replacement (found by the
    /// model checker).
    pub fn on_notice(
        &mut self,
        notice: InterruptionNotice,
        owner: Option<NoticedInstance>,
        now: Duration,
    ) -> NoticeDecision {
        let Some(owner) = owner else {
            let hold = notice.kind == NoticeKind::Interruption && self.hold_unknown(&notice.instance, now);
            return if hold { NoticeDecision::Later(notice) } else { self.acknowledged(notice) };
        };
        if let Some(h) = self.on.get_mut(&owner.machine) {
            if h.interrupted == notice.instance {
                // A hand-over resumed from a listing learns the warning's end from its notice.
                if h.deadline.is_none() {
                    h.deadline = notice.deadline.map(|d| now + d);
                }
                h.receipts.push(notice.receipt);
                h.resumed = false;
                return NoticeDecision::Joined;
            }
            if notice.kind == NoticeKind::Interruption {
                self.deferred.entry(owner.machine).or_default().push(notice);
                return NoticeDecision::Deferred;
            }
            return NoticeDecision::Acknowledge(notice.receipt);
        }
        if notice.kind == NoticeKind::Interruption
            && self.stopping.get(&owner.machine).is_some_and(|i| *i != notice.instance)
        {
            self.deferred.entry(owner.machine).or_default().push(notice);
            return NoticeDecision::Deferred;
        }
        // Another instance of the machine is still there (a switch's whose stop a crash lost, an
        // orphan's whose stop is under way): that one is stopped first, and the warning waits
        // for it (never a third).
        if let (NoticeKind::Interruption, true, true, Some(left)) =
            (notice.kind, owner.alive, owner.recorded, owner.leftover.clone())
        {
            self.stopping.insert(owner.machine.clone(), left.clone());
            self.deferred.entry(owner.machine.clone()).or_default().push(notice);
            return NoticeDecision::StopFirst { machine: owner.machine, instance: left };
        }
        // Tagged for a live machine that records no instance yet (its start has not answered,
        // or its record has not landed), or a replacement of its recorded instance that a
        // hand-over has not recorded yet (a crash came between): held until it is recorded.
        let unrecorded = owner.alive && !owner.recorded && (owner.record.instance.is_none() || owner.replaces_recorded);
        if notice.kind == NoticeKind::Interruption && unrecorded && !self.ended(&notice.instance) {
            self.hold(&notice.instance, now);
            return NoticeDecision::Later(notice);
        }
        if notice.kind != NoticeKind::Interruption || !owner.alive || !owner.recorded {
            return self.acknowledged(notice);
        }
        let since = self.held.remove(&notice.instance).map_or(now, |h| h.since);
        let deadline = notice.deadline.map(|d| since + d);
        self.open(owner, notice.instance, deadline, vec![notice.receipt], HandoverCause::Interruption)
    }

    /// Resumes a hand-over a listing shows under way (a replacement of the machine's recorded
    /// instance, started before a crash or a leader's fail-over; `owner` is what a notice about
    /// the recorded instance would find, the replacement adoptable): the replacement is
    /// adopted, not started again. `None` if the machine's hand-over is on already. The notice,
    /// when the cloud hands it out again, joins it. The cause is read off what the listing
    /// shows: the recorded instance stopped, or reported `impaired`: a repair; running: an
    /// interruption until a drift judgement says otherwise ([`HandoverBook::resumed_drift`]).
    pub fn resume(&mut self, owner: NoticedInstance, impaired: bool) -> Option<NoticeDecision> {
        let orphan = owner.adoptable.as_ref().is_some_and(|a| self.orphans.contains(&a.id));
        if self.on.contains_key(&owner.machine)
            || !owner.alive
            || !owner.recorded
            || owner.adoptable.is_none()
            || orphan
        {
            return None;
        }
        let interrupted = owner.record.instance.clone()?;
        // A recorded instance listed stopped (or impaired) was being repaired; else it was
        // warned of, or had drifted.
        let stopped = owner.state == Some(crate::model::InstanceState::Stopped);
        let cause = if stopped || impaired { HandoverCause::Repair } else { HandoverCause::Interruption };
        let machine = owner.machine.clone();
        let decision = self.open(owner, interrupted, None, Vec::new(), cause);
        if let Some(h) = self.on.get_mut(&machine) {
            h.resumed = cause == HandoverCause::Interruption;
        }
        Some(decision)
    }

    /// A drift judgement found `machine` drifted: a hand-over of it resumed from a listing and
    /// not confirmed by a notice since was the replacement of its drifted instance, and is
    /// labelled so from now on. Whether it was.
    pub fn resumed_drift(&mut self, machine: &MachineId) -> bool {
        match self.on.get_mut(machine) {
            Some(h) if h.resumed && h.cause == HandoverCause::Interruption => {
                h.cause = HandoverCause::Drift;
                h.resumed = false;
                true
            }
            _ => false,
        }
    }

    /// Opens a repair of the machine's recorded instance (issue 34): a replacement is started
    /// (or the free one a listing shows adopted), then the old instance stopped once the
    /// replacement runs. `None` if the machine is in a hand-over already, or its last one's
    /// stop is under way, or it is not a live machine's recorded instance.
    pub fn begin_repair(&mut self, owner: NoticedInstance) -> Option<NoticeDecision> {
        self.begin(owner, HandoverCause::Repair)
    }

    /// Opens the replacement of a drifted machine's recorded instance (issue 34), as
    /// [`HandoverBook::begin_repair`] does a repair.
    pub fn begin_drift(&mut self, owner: NoticedInstance) -> Option<NoticeDecision> {
        self.begin(owner, HandoverCause::Drift)
    }

    fn begin(&mut self, owner: NoticedInstance, cause: HandoverCause) -> Option<NoticeDecision> {
        if self.busy(&owner.machine) || !owner.alive || !owner.recorded {
            return None;
        }
        let instance = owner.record.instance.clone()?;
        Some(self.open(owner, instance, None, Vec::new(), cause))
    }

    /// Whether the machine's hand-over is on and its replacement not started yet.
    pub fn replacing(&self, machine: &MachineId) -> bool {
        self.on.get(machine).is_some_and(|h| h.phase == HandoverPhase::Replacing)
    }

    /// How many hand-overs of this cause are on.
    pub fn on_for(&self, cause: HandoverCause) -> usize {
        self.on.values().filter(|h| h.cause == cause).count()
    }

    /// Whether a hand-over of another cause than `cause` is on.
    pub fn others_on(&self, cause: HandoverCause) -> bool {
        self.on.values().any(|h| h.cause != cause)
    }

    /// Whether the machine is in a hand-over, or its last one's old instance is still being
    /// stopped.
    pub fn busy(&self, machine: &MachineId) -> bool {
        self.on.contains_key(machine) || self.stopping.contains_key(machine)
    }

    /// How many repairs are on.
    pub fn repairing(&self) -> usize {
        self.on.values().filter(|h| h.cause == HandoverCause::Repair).count()
    }

    /// The machines in a repair now, in id order.
    pub fn repairs_on(&self) -> Vec<MachineId> {
        self.on.iter().filter(|(_, h)| h.cause == HandoverCause::Repair).map(|(m, _)| m.clone()).collect()
    }

    /// A replacement the machine's start made but could not record: it is being stopped.
    pub fn orphaned(&mut self, instance: &InstanceId) {
        if self.orphans.len() >= LOOKED_CAP {
            self.orphans.clear();
        }
        self.orphans.insert(instance.clone());
    }

    fn open(
        &mut self,
        mut owner: NoticedInstance,
        interrupted: InstanceId,
        deadline: Option<Duration>,
        receipts: Vec<String>,
        cause: HandoverCause,
    ) -> NoticeDecision {
        if owner.adoptable.as_ref().is_some_and(|a| self.orphans.contains(&a.id)) {
            owner.adoptable = None;
        }
        let phase = HandoverPhase::Replacing;
        let handover = Handover { cause, interrupted: interrupted.clone(), deadline, receipts, phase, resumed: false };
        self.on.insert(owner.machine.clone(), handover);
        // A repair has nothing to avoid: its instance stopped, not for want of capacity.
        let spot = cause == HandoverCause::Interruption;
        NoticeDecision::Replace {
            machine: owner.machine,
            interrupted,
            avoid_zone: owner.zone.filter(|_| spot),
            avoid_type: owner.instance_type.filter(|_| spot),
            record: owner.record,
            adopt: owner.adoptable,
        }
    }

    /// The machine's replacement started (the model records it): the switch. The interrupted
    /// instance is to be stopped now if the replacement is `running` already, else once it is
    /// seen running ([`HandoverBook::seen`]). `None`: nothing to stop yet, or no hand-over is
    /// replacing for the machine, or the "replacement" is the interrupted instance itself.
    pub fn replacement_started(
        &mut self,
        machine: &MachineId,
        replacement: &InstanceId,
        running: bool,
        now: Duration,
    ) -> Option<Switch> {
        let h = self.on.get_mut(machine)?;
        if h.phase != HandoverPhase::Replacing || &h.interrupted == replacement {
            return None;
        }
        h.phase = HandoverPhase::Switched { replacement: replacement.clone() };
        running.then(|| h.switch(machine, replacement, now))
    }

    /// Switched hand-overs whose replacement is not yet seen running: (machine, interrupted
    /// instance), the replacement's start being known by the interrupted instance
    /// (`InstanceTags::replacement_nonce`).
    pub fn awaiting(&self) -> Vec<(MachineId, InstanceId)> {
        self.on
            .iter()
            .filter_map(|(m, h)| match &h.phase {
                HandoverPhase::Switched { .. } => Some((m.clone(), h.interrupted.clone())),
                HandoverPhase::Replacing => None,
            })
            .collect()
    }

    /// A listing at `now` saw the machine's replacement in `state` (`None`: not listed): the
    /// interrupted instance is stopped once the replacement runs, or once the interrupted one's
    /// time is up whatever the replacement's state (the cloud takes it then anyway).
    pub fn seen(
        &self,
        machine: &MachineId,
        state: Option<crate::model::InstanceState>,
        now: Duration,
    ) -> Option<Switch> {
        let h = self.on.get(machine)?;
        let HandoverPhase::Switched { replacement } = &h.phase else { return None };
        let due = state == Some(crate::model::InstanceState::Running) || h.deadline.is_some_and(|d| now >= d);
        due.then(|| h.switch(machine, replacement, now))
    }

    /// The hand-over ends: the interrupted instance is stopped (or gone), or every start of the
    /// replacement failed (the interrupted instance stays recorded until the cloud takes it, and
    /// the machine is then a lost instance's), or the machine died or was forgotten.
    pub fn end(&mut self, machine: &MachineId) -> HandoverEnded {
        let acknowledge = match self.on.remove(machine) {
            Some(h) => {
                self.mark_ended(&h.interrupted);
                h.receipts
            }
            None => Vec::new(),
        };
        self.stopping.remove(machine);
        let again = self.deferred.remove(machine).unwrap_or_default();
        HandoverEnded { acknowledge, again }
    }

    /// The hand-over ended at its switch, the interrupted instance's stop under way: warnings
    /// about the machine wait until [`HandoverBook::stopped`] (or [`HandoverBook::stop_overdue`]).
    pub fn end_switched(&mut self, machine: &MachineId) -> Vec<String> {
        let Some(h) = self.on.remove(machine) else { return Vec::new() };
        self.mark_ended(&h.interrupted);
        self.stopping.insert(machine.clone(), h.interrupted);
        h.receipts
    }

    /// These instances' stops are done: the deferred warnings of the machines whose interrupted
    /// instance they were, to look at again.
    pub fn stopped(&mut self, instances: &[InstanceId]) -> Vec<InterruptionNotice> {
        let done: Vec<MachineId> =
            self.stopping.iter().filter(|(_, i)| instances.contains(i)).map(|(m, _)| m.clone()).collect();
        done.iter().flat_map(|m| self.stop_overdue(m)).collect()
    }

    /// The machine's interrupted instance's stop is done or overdue: its deferred warnings, to
    /// look at again (none if it was not stopping).
    pub fn stop_overdue(&mut self, machine: &MachineId) -> Vec<InterruptionNotice> {
        if self.stopping.remove(machine).is_none() || self.on.contains_key(machine) {
            return Vec::new();
        }
        self.deferred.remove(machine).unwrap_or_default()
    }

    /// A listing of the cloud reached the registry (`ViewRefreshed`): held notices about
    /// instances it does not show as a machine's count it. (Only the listings since a notice
    /// was held count: none is counted while none is held.)
    pub fn listing_seen(&mut self) {
        if !self.held.is_empty() {
            self.listings += 1;
        }
    }

    /// Whether a notice about an instance no machine is known to own is held: not one
    /// interrupted in a hand-over that ended, and fewer than [`UNKNOWN_FOR_LISTINGS`] listings
    /// seen since it was first held.
    fn hold_unknown(&mut self, instance: &InstanceId, now: Duration) -> bool {
        if self.ended(instance) {
            return false;
        }
        let held = self.hold(instance, now);
        self.listings < held.listings + UNKNOWN_FOR_LISTINGS
    }

    /// Holds a notice about `instance` (once: the first hold is kept).
    fn hold(&mut self, instance: &InstanceId, now: Duration) -> Held {
        if self.held.len() >= LOOKED_CAP {
            self.held.clear();
        }
        *self.held.entry(instance.clone()).or_insert(Held { since: now, listings: self.listings })
    }

    /// A notice acknowledged: no longer held.
    fn acknowledged(&mut self, notice: InterruptionNotice) -> NoticeDecision {
        self.held.remove(&notice.instance);
        NoticeDecision::Acknowledge(notice.receipt)
    }

    /// Whether `instance` was interrupted in a hand-over that ended.
    fn ended(&self, instance: &InstanceId) -> bool {
        self.ended.contains(instance)
    }

    /// What the pool's outcomes mean for the hand-overs at `now`: a replacement started is the
    /// switch (the interrupted instance to stop now if the replacement runs); one that failed
    /// for good ends its hand-over (its receipts to acknowledge), a replacement it made but
    /// could not record never adopted later (it is being stopped as an orphan).
    pub fn on_outcomes(&mut self, outcomes: &[crate::actors::workers::JobOutcome], now: Duration) -> OutcomesSeen {
        use crate::actors::workers::JobOutcome;
        let mut seen = OutcomesSeen::default();
        for o in outcomes {
            match o {
                JobOutcome::Started { machine, instance, .. } => {
                    let running = instance.state == crate::model::InstanceState::Running;
                    seen.switches.extend(self.replacement_started(machine, &instance.id, running, now));
                }
                JobOutcome::StartFailed { machine, orphan, .. } if self.on.contains_key(machine) => {
                    if let Some(orphan) = orphan {
                        self.orphaned(orphan);
                    }
                    let ended = self.end(machine);
                    seen.acknowledge.extend(ended.acknowledge);
                    seen.again.extend(ended.again);
                }
                _ => {}
            }
        }
        seen
    }

    /// How long the machine's hand-over's warning has left at `now`, if it said when.
    pub fn warning_left(&self, machine: &MachineId, now: Duration) -> Option<Duration> {
        self.on.get(machine)?.deadline.map(|d| d.saturating_sub(now))
    }

    /// Marks `instance` interrupted in a hand-over that ended.
    fn mark_ended(&mut self, instance: &InstanceId) {
        if self.ended.len() >= LOOKED_CAP {
            self.ended.clear();
        }
        self.ended.insert(instance.clone());
    }

    /// The machine's hand-over, if one is on.
    pub fn of(&self, machine: &MachineId) -> Option<&Handover> {
        self.on.get(machine)
    }

    /// Whether `instance` is part of the machine's hand-over (the interrupted one or the
    /// replacement): never an extra instance to stop on its own.
    pub fn spares(&self, machine: &MachineId, instance: &InstanceId) -> bool {
        self.on.get(machine).is_some_and(|h| {
            &h.interrupted == instance
                || matches!(&h.phase, HandoverPhase::Switched { replacement } if replacement == instance)
        })
    }

    /// Whether any hand-over is on (work in flight).
    #[cfg(test)]
    pub fn is_busy(&self) -> bool {
        !self.on.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(id: &str, kind: NoticeKind, receipt: &str) -> InterruptionNotice {
        InterruptionNotice {
            instance: InstanceId::new(id),
            kind,
            deadline: (kind == NoticeKind::Interruption).then_some(Duration::from_secs(120)),
            receipt: receipt.into(),
        }
    }

    fn owner(machine: &str, recorded: bool, alive: bool) -> Option<NoticedInstance> {
        Some(NoticedInstance {
            machine: MachineId::new(machine),
            recorded,
            alive,
            zone: Some("az1".into()),
            instance_type: Some("m5.large".into()),
            state: Some(crate::model::InstanceState::Running),
            record: Box::new(crate::model::Machine::pending(machine)),
            adoptable: None,
            leftover: None,
            replaces_recorded: false,
        })
    }

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn a_warning_for_a_live_machines_recorded_instance_starts_one_replacement() {
        let mut book = HandoverBook::new();
        let d = book.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T);
        assert_eq!(
            d,
            NoticeDecision::Replace {
                machine: MachineId::new("0"),
                interrupted: InstanceId::new("i-1"),
                avoid_zone: Some("az1".into()),
                avoid_type: Some("m5.large".into()),
                record: Box::new(crate::model::Machine::pending("0")),
                adopt: None,
            }
        );
        assert_eq!(book.of(&MachineId::new("0")).unwrap().deadline, Some(T + Duration::from_secs(120)));
        // The same warning again (another receipt): part of it, no second replacement.
        let again = book.on_notice(notice("i-1", NoticeKind::Interruption, "r2"), owner("0", true, true), T);
        assert_eq!(again, NoticeDecision::Joined);
        assert!(book.is_busy());
    }

    #[test]
    fn a_warning_about_a_replacement_whose_interrupted_instance_is_left_stops_that_one_first() {
        let mut book = HandoverBook::new();
        let m = MachineId::new("0");
        let mut o = owner("0", true, true);
        if let Some(o) = o.as_mut() {
            o.leftover = Some(InstanceId::new("i-1"));
        }
        let w = notice("i-2", NoticeKind::Interruption, "r2");
        let d = book.on_notice(w.clone(), o, T);
        assert_eq!(d, NoticeDecision::StopFirst { machine: m.clone(), instance: InstanceId::new("i-1") });
        assert!(book.busy(&m), "its stop is under way");
        assert_eq!(book.stopped(&[InstanceId::new("i-1")]), vec![w.clone()], "looked at again once it is stopped");
        assert!(matches!(book.on_notice(w, owner("0", true, true), T), NoticeDecision::Replace { .. }));
    }

    #[test]
    fn a_warning_that_came_before_its_machines_record_is_handed_over_once_it_lands() {
        let mut book = HandoverBook::new();
        let n = notice("i-1", NoticeKind::Interruption, "r1");
        // Before the start answered: the registry does not know the instance; then the listing
        // shows it tagged for the machine, which records none yet.
        assert_eq!(book.on_notice(n.clone(), None, T), NoticeDecision::Later(n.clone()));
        book.listing_seen();
        book.listing_seen();
        let later = T + Duration::from_secs(90);
        assert_eq!(book.on_notice(n.clone(), owner("0", false, true), later), NoticeDecision::Later(n.clone()));
        // The record landed, long after: the hand-over opens, its deadline from when it came.
        let d = book.on_notice(n, owner("0", true, true), later + Duration::from_secs(60));
        assert!(matches!(d, NoticeDecision::Replace { .. }), "{d:?}");
        assert_eq!(book.of(&MachineId::new("0")).unwrap().deadline, Some(T + Duration::from_secs(120)));
    }

    #[test]
    fn notices_with_nothing_to_do_are_acknowledged() {
        let mut book = HandoverBook::new();
        let ack = |r: &str| NoticeDecision::Acknowledge(r.into());
        // An instance the registry does not know: held, however often it is looked at and
        // whatever its warning says, until two listings since it came show no machine owns it.
        let unknown = notice("i-9", NoticeKind::Interruption, "a");
        let later = |n: &InterruptionNotice| NoticeDecision::Later(n.clone());
        for _ in 0..20 {
            assert_eq!(book.on_notice(unknown.clone(), None, T), later(&unknown));
        }
        let mut expired = unknown.clone();
        expired.deadline = Some(Duration::ZERO);
        assert_eq!(book.on_notice(expired.clone(), None, T), later(&expired), "held past its warning");
        book.listing_seen();
        assert_eq!(
            book.on_notice(unknown.clone(), None, T),
            later(&unknown),
            "one listing may have been sent before it"
        );
        // Held after the first listing: it counts from there.
        let late = notice("i-8", NoticeKind::Interruption, "a3");
        assert_eq!(book.on_notice(late.clone(), None, T), later(&late));
        book.listing_seen();
        assert_eq!(book.on_notice(unknown, None, T), ack("a"), "two listings since: not a machine's");
        assert_eq!(book.on_notice(late.clone(), None, T), later(&late));
        book.listing_seen();
        assert_eq!(book.on_notice(late, None, T), ack("a3"));
        // Not the machine's recorded instance (it records another): nothing to hand over.
        let mut other = owner("0", false, true);
        if let Some(o) = other.as_mut() {
            o.record.instance = Some(InstanceId::new("i-0"));
        }
        assert_eq!(book.on_notice(notice("i-1", NoticeKind::Interruption, "b"), other, T), ack("b"));
        // Tagged for a machine that records none yet (its record has not landed): held, however
        // many listings pass.
        let unrecorded = notice("i-7", NoticeKind::Interruption, "b2");
        for _ in 0..3 {
            book.listing_seen();
            assert_eq!(book.on_notice(unrecorded.clone(), owner("0", false, true), T), later(&unrecorded));
        }
        assert_eq!(book.on_notice(notice("i-1", NoticeKind::Interruption, "c"), owner("0", true, false), T), ack("c"));
        assert_eq!(book.on_notice(notice("i-1", NoticeKind::Rebalance, "d"), owner("0", true, true), T), ack("d"));
        assert_eq!(book.on_notice(notice("i-1", NoticeKind::Terminating, "e"), owner("0", true, true), T), ack("e"));
        assert!(!book.is_busy());
    }

    #[test]
    fn the_switch_then_the_end_acknowledges_every_receipt_and_replays_deferred_notices() {
        let mut book = HandoverBook::new();
        let m = MachineId::new("0");
        book.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T);
        assert!(book.replacement_started(&m, &InstanceId::new("i-1"), true, T).is_none(), "not its own replacement");
        // The replacement is warned too before the switch: deferred (never a third instance).
        let d = book.on_notice(notice("i-2", NoticeKind::Interruption, "r2"), owner("0", false, true), T);
        assert_eq!(d, NoticeDecision::Deferred);
        // Started but not running yet: switched, nothing stopped until a listing sees it run.
        assert!(book.replacement_started(&m, &InstanceId::new("i-2"), false, T).is_none());
        assert_eq!(book.awaiting(), vec![(m.clone(), InstanceId::new("i-1"))]);
        assert!(book.seen(&m, Some(crate::model::InstanceState::Pending), T).is_none());
        let switch = book.seen(&m, Some(crate::model::InstanceState::Running), T).unwrap();
        assert_eq!(
            switch,
            Switch {
                machine: m.clone(),
                replacement: InstanceId::new("i-2"),
                interrupted: InstanceId::new("i-1"),
                lead: Some(Duration::from_secs(120)),
                cause: HandoverCause::Interruption,
            }
        );
        assert!(book.replacement_started(&m, &InstanceId::new("i-3"), true, T).is_none(), "one switch per hand-over");
        assert!(book.spares(&m, &InstanceId::new("i-1")) && book.spares(&m, &InstanceId::new("i-2")));
        assert!(!book.spares(&m, &InstanceId::new("i-3")));
        // The cloud's termination of the interrupted one joins the hand-over.
        let t = book.on_notice(notice("i-1", NoticeKind::Terminating, "r3"), owner("0", false, true), T);
        assert_eq!(t, NoticeDecision::Joined);
        let ended = book.end(&m);
        assert_eq!(ended.acknowledge, vec!["r1".to_owned(), "r3".to_owned()]);
        assert_eq!(ended.again, vec![notice("i-2", NoticeKind::Interruption, "r2")]);
        assert!(!book.is_busy());
        // Looked at again, the replacement now recorded: a hand-over of its own.
        let again = book.on_notice(ended.again[0].clone(), owner("0", true, true), T);
        assert!(matches!(again, NoticeDecision::Replace { .. }));
    }

    #[test]
    fn the_interrupted_instance_goes_when_its_time_is_up_whatever_the_replacements_state() {
        let mut book = HandoverBook::new();
        let m = MachineId::new("0");
        book.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T);
        assert!(book.replacement_started(&m, &InstanceId::new("i-2"), false, T).is_none());
        let due = T + Duration::from_secs(120);
        assert!(book.seen(&m, None, due - Duration::from_secs(1)).is_none());
        assert_eq!(book.seen(&m, None, due).map(|s| s.interrupted), Some(InstanceId::new("i-1")));
    }

    #[test]
    fn a_listed_replacement_resumes_its_hand_over_once_and_the_notice_joins_it() {
        let mut book = HandoverBook::new();
        let m = MachineId::new("0");
        let mut o = owner("0", true, true).unwrap();
        o.record.instance = Some(InstanceId::new("i-1"));
        let tags = crate::model::InstanceTags { model: Some("m".into()), machine: Some(m.clone()), start: None };
        let replacement =
            crate::model::CloudInstance::tagged(InstanceId::new("i-2"), crate::model::InstanceState::Running, tags);
        let without = o.clone();
        assert!(book.resume(without, false).is_none(), "nothing to adopt: nothing to resume");
        o.adoptable = Some(Box::new(replacement.clone()));
        let d = book.resume(o.clone(), false).unwrap();
        assert!(matches!(&d, NoticeDecision::Replace { adopt: Some(a), interrupted, .. }
            if a.id == replacement.id && interrupted.as_str() == "i-1"));
        assert!(book.resume(o, false).is_none(), "resumed once");
        let n = book.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T);
        assert_eq!(n, NoticeDecision::Joined);
        assert_eq!(book.end(&m).acknowledge, vec!["r1".to_owned()]);
    }

    #[test]
    fn a_resumed_hand_over_is_labelled_by_what_the_listing_and_later_judgements_show() {
        let resumed = |state, impaired| {
            let mut book = HandoverBook::new();
            let mut o = owner("0", true, true).unwrap();
            o.record.instance = Some(InstanceId::new("i-1"));
            o.state = Some(state);
            let tags =
                crate::model::InstanceTags { model: Some("m".into()), machine: Some(o.machine.clone()), start: None };
            o.adoptable = Some(Box::new(crate::model::CloudInstance::tagged(
                InstanceId::new("i-2"),
                crate::model::InstanceState::Running,
                tags,
            )));
            book.resume(o, impaired).unwrap();
            book
        };
        let m = MachineId::new("0");
        let cause = |b: &HandoverBook| b.of(&m).map(|h| h.cause);
        use crate::model::InstanceState::{Running, Stopped};
        assert_eq!(cause(&resumed(Stopped, false)), Some(HandoverCause::Repair), "stopped: a repair");
        assert_eq!(cause(&resumed(Running, true)), Some(HandoverCause::Repair), "impaired: a repair");
        let mut b = resumed(Running, false);
        assert_eq!(cause(&b), Some(HandoverCause::Interruption));
        assert!(b.resumed_drift(&m), "a drift judgement relabels it");
        assert_eq!(cause(&b), Some(HandoverCause::Drift));
        assert!(!b.resumed_drift(&m), "once");
        // A notice that joins it confirms the interruption: no drift judgement relabels it.
        let mut b = resumed(Running, false);
        assert_eq!(
            b.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T),
            NoticeDecision::Joined
        );
        assert!(!b.resumed_drift(&m));
        assert_eq!(cause(&b), Some(HandoverCause::Interruption));
        // A repair is never relabelled.
        let mut b = resumed(Stopped, false);
        assert!(!b.resumed_drift(&m));
    }

    #[test]
    fn a_warning_about_the_replacement_waits_for_the_interrupted_instances_stop() {
        let mut book = HandoverBook::new();
        let m = MachineId::new("0");
        book.on_notice(notice("i-1", NoticeKind::Interruption, "r1"), owner("0", true, true), T);
        assert!(book.replacement_started(&m, &InstanceId::new("i-2"), true, T).is_some());
        assert_eq!(book.end_switched(&m), vec!["r1".to_owned()]);
        // i-1's stop is under way: a warning about i-2, now recorded, waits (no third instance).
        let w = notice("i-2", NoticeKind::Interruption, "r2");
        assert_eq!(book.on_notice(w.clone(), owner("0", true, true), T), NoticeDecision::Deferred);
        assert!(book.stopped(&[InstanceId::new("i-9")]).is_empty(), "another instance's stop");
        assert_eq!(book.stopped(&[InstanceId::new("i-1")]), vec![w.clone()]);
        assert!(matches!(book.on_notice(w, owner("0", true, true), T), NoticeDecision::Replace { .. }));
        assert!(book.stop_overdue(&m).is_empty(), "nothing left once replayed");
    }
}
