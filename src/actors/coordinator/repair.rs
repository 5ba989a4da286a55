//! Repair of unhealthy machines (issue 34), the coordinator's plain core for it: which machines
//! are unhealthy after a fresh listing, which of them get a replacement through the hand-over
//! (`handover.rs`: the replacement runs first, then the old instance is stopped), and when the
//! cap holds every repair back. Decisions are values; the coordinator performs them.
//!
//! The rules: a machine is unhealthy once its recorded instance has been listed stopped for
//! the policy's `after` (unset: never, seed 000's default: a stopped instance is expected back
//! and kept). At most `max_unhealthy` of the model's machines are repaired at a time, counting
//! those already in a repair; when more than that are unhealthy at once, nothing is repaired
//! (a zone or the cloud is probably at fault, not the machines) and the hold is said once until
//! it lifts. Keep-instance and manual machines are never repaired (manual ones are never
//! listed). Repairs begin only on a fresh listing after the first batch (never in safe mode,
//! never on a failed listing: the coordinator is told of successful listings alone).

use std::collections::BTreeMap;
use std::time::Duration;

use super::handover::NoticedInstance;
use crate::config::repair::RepairPolicy;
use crate::model::{InstanceId, MachineId};

/// A live machine whose recorded instance a fresh listing shows stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedMachine {
    /// What a hand-over of its recorded instance needs (the machine, its record, an adoptable
    /// replacement).
    pub owner: NoticedInstance,
    /// How long the listings have shown it stopped (or the cloud's status checks impaired).
    pub stopped_for: Duration,
    /// Why: `stopped` or `impaired`.
    pub reason: &'static str,
}

/// A live machine whose recorded instance has drifted from what a start would make for it
/// today (`model::drift`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftedMachine {
    /// What a hand-over of its recorded instance needs.
    pub owner: NoticedInstance,
    /// Why it drifted.
    pub reasons: Vec<crate::model::drift::DriftReason>,
}

/// One unhealthy machine, as shown and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    /// The machine.
    pub machine: MachineId,
    /// Its instance.
    pub instance: InstanceId,
    /// Why: `stopped` or `impaired`.
    pub reason: &'static str,
    /// For how long.
    pub unhealthy_for: Duration,
    /// Whether a repair may touch it (not keep-instance).
    pub repairable: bool,
}

/// Every repair held back: more machines unhealthy than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Machines unhealthy.
    pub unhealthy: usize,
    /// The cap for the model's population.
    pub cap: usize,
}

/// What a listing leaves to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairPlan {
    /// Machines to repair now (a hand-over each), in id order.
    pub repair: Vec<(NoticedInstance, Unhealthy)>,
    /// Machines that became unhealthy since the last listing (for the event stream).
    pub newly_unhealthy: Vec<Unhealthy>,
    /// The hold, when it begins (said once until it lifts).
    pub held: Option<Held>,
    /// How long until the first machine listed stopped now, and repairable, is unhealthy (a
    /// listing after that repairs it): `None` if none is waiting for it.
    pub due_in: Option<Duration>,
}

/// The repair policy and what the last listing showed.
#[derive(Debug, Clone, Default)]
pub struct RepairBook {
    policy: RepairPolicy,
    /// The unhealthy machines as of the last listing.
    unhealthy: BTreeMap<MachineId, Unhealthy>,
    /// Whether repairs are held back now.
    holding: bool,
    /// Machines whose recorded instance the cloud's status checks report impaired, since when
    /// (on the coordinator's clock) and which instance.
    impaired_since: BTreeMap<MachineId, (InstanceId, Duration)>,
    /// Drifted instances whose replacement began once: never begun again (a replacement that
    /// failed, say for constraints no type meets, is not retried every listing; the machine
    /// stays drifted in the report).
    drift_tried: std::collections::BTreeSet<(MachineId, InstanceId)>,
    /// The drifted machines by reason last said (`drift-seen`; none said yet: none drifted).
    drift_seen: Option<Vec<(&'static str, usize)>>,
    /// When (on the coordinator's clock) drift is next judged while it is only reported.
    next_drift_report: Duration,
    /// A report-only judgement is under way (none begins beside it).
    judging: bool,
}

/// How often drift is judged while the model only reports it (`replace-drifted` off): each
/// judgement reads every listed machine's provisioning info, so not at every listing.
pub const DRIFT_REPORT_EVERY: Duration = Duration::from_secs(300);

impl RepairBook {
    /// A book with this policy.
    pub fn new(policy: RepairPolicy) -> Self {
        Self { policy, ..Self::default() }
    }

    /// The policy in force.
    pub fn policy(&self) -> RepairPolicy {
        self.policy
    }

    /// A new policy, applied from the next listing.
    pub fn set_policy(&mut self, policy: RepairPolicy) {
        if policy.replace_drifted != self.policy.replace_drifted {
            self.drift_tried.clear();
        }
        self.policy = policy;
        if policy.after.is_none() {
            self.unhealthy.clear();
            self.holding = false;
        }
    }

    /// The unhealthy machines as of the last listing, in id order.
    pub fn unhealthy(&self) -> Vec<Unhealthy> {
        self.unhealthy.values().cloned().collect()
    }

    /// Whether repairs are held back now.
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// Whether the cloud's status checks reported the machine's recorded instance impaired at
    /// their last answer.
    pub fn is_impaired(&self, machine: &MachineId) -> bool {
        self.impaired_since.contains_key(machine)
    }

    /// The machines whose recorded instance the cloud reports impaired now (`owners`, what the
    /// registry knows of each impaired instance), each with how long it has been reported so
    /// (since the first report this book saw, at `now`).
    pub fn impaired(&mut self, owners: Vec<Option<NoticedInstance>>, now: Duration) -> Vec<StoppedMachine> {
        let before = std::mem::take(&mut self.impaired_since);
        let mut out = Vec::new();
        for o in owners.into_iter().flatten().filter(|o| o.alive && o.recorded) {
            let Some(instance) = o.record.instance.clone() else { continue };
            let since = match before.get(&o.machine) {
                Some((i, t)) if *i == instance => *t,
                _ => now,
            };
            self.impaired_since.insert(o.machine.clone(), (instance, since));
            out.push(StoppedMachine { owner: o, stopped_for: now.saturating_sub(since), reason: "impaired" });
        }
        out
    }

    /// Whether drift is judged after the listing made `now`: at every listing while the
    /// model replaces drifted machines; else (report-only: the metric) one judgement at a
    /// time, until one has looked at a machine, and then every [`DRIFT_REPORT_EVERY`]
    /// ([`RepairBook::drift_judged`] says how each went).
    pub fn judge_drift(&mut self, now: Duration) -> bool {
        if self.policy.replace_drifted {
            return true;
        }
        if self.judging || now < self.next_drift_report {
            return false;
        }
        self.judging = true;
        true
    }

    /// A judgement begun by [`RepairBook::judge_drift`] ended at `now`, having looked at some
    /// machines or none (the model's machines not known yet: the next listing tries again).
    pub fn drift_judged(&mut self, now: Duration, looked: bool) {
        if std::mem::take(&mut self.judging) && looked {
            self.next_drift_report = now + DRIFT_REPORT_EVERY;
        }
    }

    /// The drifted machines by reason (a machine under each of its reasons, every reason
    /// present), when they differ from the last said (at first: none drifted): said on
    /// change, not at every listing.
    pub fn drift_seen(&mut self, drifted: &[DriftedMachine]) -> Option<Vec<(&'static str, usize)>> {
        let by_reason: Vec<(&'static str, usize)> = crate::model::drift::KINDS
            .iter()
            .map(|k| (*k, drifted.iter().filter(|d| d.reasons.iter().any(|r| r.kind() == *k)).count()))
            .collect();
        let none = drifted.is_empty() && self.drift_seen.is_none();
        (!none && self.drift_seen.as_ref() != Some(&by_reason)).then(|| {
            self.drift_seen = Some(by_reason.clone());
            by_reason
        })
    }

    /// Which drifted machines begin a replacement now (issue 34): none unless the model
    /// replaces drifted machines, and none while a hand-over of another cause is on (a repair
    /// or an interruption's); else, in id order, repairable ones (not keep-instance, not in a
    /// hand-over, not tried before for this instance) up to `drift-budget` less the drift
    /// replacements on.
    /// The second value says whether a machine that could be replaced waits (for a slot, or
    /// for its or another hand-over to end): the next listing looks again.
    pub fn on_drift(
        &mut self,
        mut drifted: Vec<DriftedMachine>,
        drifting: usize,
        others_on: bool,
        busy: impl Fn(&MachineId) -> bool,
    ) -> (Vec<DriftedMachine>, bool) {
        if !self.policy.replace_drifted {
            return (Vec::new(), false);
        }
        drifted.sort_by(|a, b| a.owner.machine.cmp(&b.owner.machine));
        let mut slots = if others_on { 0 } else { self.policy.drift_budget.saturating_sub(drifting) };
        let (mut out, mut waiting) = (Vec::new(), false);
        for d in drifted {
            let (o, r) = (&d.owner, &d.owner.record);
            let Some(instance) = r.instance.clone() else { continue };
            if !o.alive || !o.recorded || r.keep_instance || r.manual {
                continue;
            }
            let key = (o.machine.clone(), instance);
            if self.drift_tried.contains(&key) {
                continue;
            }
            if slots == 0 || busy(&o.machine) {
                waiting = true;
                continue;
            }
            self.drift_tried.insert(key);
            slots -= 1;
            out.push(d);
        }
        (out, waiting)
    }

    /// Decides on a fresh listing: `stopped` are the machines it shows stopped, `population`
    /// the model's live machines with an instance, `repairing` the machines in a repair now and
    /// `busy` whether a machine is in any hand-over (a repair's or an interruption's).
    pub fn on_listing(
        &mut self,
        stopped: Vec<StoppedMachine>,
        population: usize,
        repairing: usize,
        busy: impl Fn(&MachineId) -> bool,
    ) -> RepairPlan {
        let mut plan = RepairPlan::default();
        let Some(after) = self.policy.after else {
            self.unhealthy.clear();
            self.holding = false;
            return plan;
        };
        let before = std::mem::take(&mut self.unhealthy);
        let mut candidates = Vec::new();
        let waiting = |s: &StoppedMachine| {
            let r = &s.owner.record;
            s.stopped_for < after && s.owner.alive && s.owner.recorded && !r.keep_instance && !r.manual
        };
        plan.due_in =
            stopped.iter().filter(|s| waiting(s) && !busy(&s.owner.machine)).map(|s| after - s.stopped_for).min();
        for s in stopped.into_iter().filter(|s| s.stopped_for >= after && s.owner.alive && s.owner.recorded) {
            let record = &s.owner.record;
            let Some(instance) = record.instance.clone() else { continue };
            let u = Unhealthy {
                machine: s.owner.machine.clone(),
                instance,
                reason: s.reason,
                unhealthy_for: s.stopped_for,
                repairable: !record.keep_instance && !record.manual,
            };
            if before.get(&u.machine).is_none_or(|b| b.instance != u.instance) {
                plan.newly_unhealthy.push(u.clone());
            }
            self.unhealthy.insert(u.machine.clone(), u.clone());
            if u.repairable && !busy(&u.machine) {
                candidates.push((s.owner, u));
            }
        }
        let cap = self.policy.max_unhealthy.of(population);
        let count = self.unhealthy.len().max(repairing);
        if count > cap {
            plan.due_in = None;
            if !self.holding {
                plan.held = Some(Held { unhealthy: count, cap });
            }
            self.holding = true;
            return plan;
        }
        self.holding = false;
        let slots = cap.saturating_sub(repairing);
        plan.repair = candidates.into_iter().take(slots).collect();
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::repair::MaxUnhealthy;
    use crate::model::Machine;

    fn stopped(id: &str, minutes: u64, keep: bool) -> StoppedMachine {
        let mut record = Machine::pending(id);
        record.instance = Some(InstanceId::new(format!("i-{id}")));
        record.keep_instance = keep;
        StoppedMachine {
            owner: NoticedInstance {
                machine: MachineId::new(id),
                recorded: true,
                alive: true,
                zone: None,
                instance_type: None,
                state: Some(crate::model::InstanceState::Stopped),
                record: Box::new(record),
                adoptable: None,
                leftover: None,
                replaces_recorded: false,
            },
            stopped_for: Duration::from_secs(60 * minutes),
            reason: "stopped",
        }
    }

    fn book(after_min: Option<u64>, cap: MaxUnhealthy) -> RepairBook {
        RepairBook::new(RepairPolicy {
            after: after_min.map(|m| Duration::from_secs(60 * m)),
            max_unhealthy: cap,
            ..RepairPolicy::default()
        })
    }

    fn ids(plan: &RepairPlan) -> Vec<&str> {
        plan.repair.iter().map(|(o, _)| o.machine.as_str()).collect()
    }

    #[test]
    fn off_by_default_a_stopped_instance_is_kept() {
        let mut b = RepairBook::default();
        let plan = b.on_listing(vec![stopped("0", 600, false)], 10, 0, |_| false);
        assert_eq!(plan, RepairPlan::default());
        assert!(b.unhealthy().is_empty());
    }

    #[test]
    fn a_machine_is_repaired_only_once_stopped_for_repair_after() {
        let mut b = book(Some(10), MaxUnhealthy::Count(2));
        let plan = b.on_listing(vec![stopped("0", 9, false)], 10, 0, |_| false);
        assert!(plan.repair.is_empty() && b.unhealthy().is_empty());
        assert_eq!(plan.due_in, Some(Duration::from_secs(60)), "unhealthy in a minute");
        let plan = b.on_listing(vec![stopped("0", 10, false)], 10, 0, |_| false);
        assert_eq!(ids(&plan), ["0"]);
        assert_eq!(plan.newly_unhealthy.len(), 1);
        // Seen again while its repair runs: not begun twice, not new.
        let plan = b.on_listing(vec![stopped("0", 11, false)], 10, 1, |m| m.as_str() == "0");
        assert!(plan.repair.is_empty() && plan.newly_unhealthy.is_empty());
    }

    #[test]
    fn keep_instance_machines_are_unhealthy_but_never_repaired() {
        let mut b = book(Some(1), MaxUnhealthy::Count(5));
        let plan = b.on_listing(vec![stopped("0", 5, true), stopped("1", 5, false)], 10, 0, |_| false);
        assert_eq!(ids(&plan), ["1"]);
        assert_eq!(b.unhealthy().len(), 2);
        assert!(!b.unhealthy()[0].repairable);
    }

    #[test]
    fn at_most_the_cap_at_a_time_counting_repairs_under_way() {
        let mut b = book(Some(1), MaxUnhealthy::Count(2));
        let two = vec![stopped("0", 5, false), stopped("1", 5, false)];
        let plan = b.on_listing(two.clone(), 10, 1, |m| m.as_str() == "0");
        assert_eq!(ids(&plan), ["1"], "one slot left");
        let plan = b.on_listing(two, 10, 2, |_| true);
        assert!(plan.repair.is_empty());
    }

    #[test]
    fn impaired_is_timed_from_the_first_report_and_forgotten_once_it_passes() {
        let mut b = book(Some(10), MaxUnhealthy::Count(1));
        let owner = stopped("0", 0, false).owner;
        let t = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(b.impaired(vec![Some(owner.clone()), None], t(1))[0].stopped_for, Duration::ZERO);
        let again = b.impaired(vec![Some(owner.clone())], t(12));
        assert_eq!((again[0].stopped_for, again[0].reason), (t(11), "impaired"));
        let plan = b.on_listing(again, 5, 0, |_| false);
        assert_eq!((ids(&plan), plan.repair[0].1.reason), (vec!["0"], "impaired"));
        assert!(b.impaired(Vec::new(), t(13)).is_empty());
        assert_eq!(b.impaired(vec![Some(owner)], t(14))[0].stopped_for, Duration::ZERO, "timed afresh");
    }

    #[test]
    fn drifted_machines_are_replaced_within_the_budget_once_each_and_only_when_asked() {
        let drifted = |id: &str| DriftedMachine { owner: stopped(id, 0, false).owner, reasons: Vec::new() };
        let mut b = book(None, MaxUnhealthy::Count(1));
        assert!(b.on_drift(vec![drifted("0")], 0, false, |_| false).0.is_empty(), "report-only by default");
        b.set_policy(RepairPolicy { replace_drifted: true, drift_budget: 2, ..b.policy() });
        let all = vec![drifted("2"), drifted("0"), drifted("1")];
        let ids = |got: (Vec<DriftedMachine>, bool)| {
            (got.0.iter().map(|d| d.owner.machine.to_string()).collect::<Vec<_>>(), got.1)
        };
        assert_eq!(ids(b.on_drift(all.clone(), 0, true, |_| false)), (vec![], true), "not during another hand-over");
        let got = ids(b.on_drift(all.clone(), 1, false, |_| false));
        assert_eq!(got, (vec!["0".to_owned()], true), "one slot of two left, in id order; the rest wait");
        let got = ids(b.on_drift(all.clone(), 0, false, |_| false));
        assert_eq!(got, (vec!["1".to_owned(), "2".to_owned()], false), "0 was tried for this instance already");
        assert_eq!(ids(b.on_drift(all, 0, false, |_| false)), (vec![], false), "each tried once");
        let mut kept = drifted("3");
        kept.owner.record.keep_instance = true;
        assert_eq!(ids(b.on_drift(vec![kept], 0, false, |_| false)), (vec![], false), "keep-instance: never");
    }

    #[test]
    fn drift_is_judged_at_every_listing_when_replaced_else_every_five_minutes() {
        let mut b = RepairBook::default();
        let at = |s: u64| Duration::from_secs(s);
        assert!(b.judge_drift(at(10)), "the first listing");
        assert!(!b.judge_drift(at(11)), "one at a time");
        b.drift_judged(at(12), false);
        assert!(b.judge_drift(at(13)), "none looked at yet: the next listing tries again");
        b.drift_judged(at(14), true);
        assert!(!b.judge_drift(at(100)));
        assert!(b.judge_drift(at(314)));
        b.drift_judged(at(315), true);
        assert!(!b.judge_drift(at(316)));
        b.set_policy(RepairPolicy { replace_drifted: true, ..RepairPolicy::default() });
        assert!(b.judge_drift(at(312)) && b.judge_drift(at(313)), "replacing: every listing");
    }

    #[test]
    fn drift_counts_are_said_on_change_only() {
        let mut b = RepairBook::default();
        assert_eq!(b.drift_seen(&[]), None, "none drifted is what is known at first");
        let zone = crate::model::drift::DriftReason::Zone { zone: "az1".into(), allowed: vec!["az2".into()] };
        let one = vec![DriftedMachine { owner: stopped("0", 0, false).owner, reasons: vec![zone] }];
        assert_eq!(b.drift_seen(&one), Some(vec![("instance-type", 0), ("image", 0), ("zone", 1), ("tags", 0)]));
        assert_eq!(b.drift_seen(&one), None, "unchanged");
        assert_eq!(b.drift_seen(&[]), Some(vec![("instance-type", 0), ("image", 0), ("zone", 0), ("tags", 0)]));
    }

    #[test]
    fn a_storm_holds_every_repair_and_says_so_once() {
        let mut b = book(Some(1), MaxUnhealthy::Percent(20));
        let storm: Vec<_> = (0..3).map(|i| stopped(&i.to_string(), 5, false)).collect();
        let plan = b.on_listing(storm.clone(), 9, 0, |_| false);
        assert!(plan.repair.is_empty());
        assert_eq!(plan.held, Some(Held { unhealthy: 3, cap: 1 }));
        assert!(b.holding());
        let plan = b.on_listing(storm, 9, 0, |_| false);
        assert_eq!(plan.held, None, "said once");
        // Two come back: the last one is repaired, the hold lifts.
        let plan = b.on_listing(vec![stopped("2", 6, false)], 9, 0, |_| false);
        assert_eq!(ids(&plan), ["2"]);
        assert!(!b.holding());
    }
}
