use std::time::Duration;

use super::state::*;
use crate::config::Backoff;
use crate::model::MachineId;

fn ids(v: &[&str]) -> Vec<MachineId> {
    v.iter().map(|s| MachineId::new(*s)).collect()
}

fn backoff() -> Backoff {
    Backoff { initial: Duration::from_millis(100), max: Duration::from_millis(1000) }
}

fn book() -> BatchBook {
    BatchBook::new(backoff(), 16)
}

/// A book whose first batch already succeeded.
fn after_first_batch() -> BatchBook {
    let mut b = book();
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), Some(vec![]));
    assert!(b.batch_succeeded());
    b
}

#[test]
fn take_batch_is_none_before_any_notification() {
    let mut b = book();
    assert_eq!(b.take_batch(), None);
    assert!(!b.first_done());
}

#[test]
fn first_empty_notification_still_yields_a_batch() {
    let mut b = book();
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), Some(vec![]));
    assert_eq!(b.take_batch(), None, "one batch at a time");
    assert!(b.batch_succeeded());
    assert!(b.first_done());
    // Later empty notifications yield nothing.
    b.notify(Vec::new());
    assert_eq!(b.take_batch(), None);
}

#[test]
fn take_batch_returns_notified_ids_sorted_and_deduplicated() {
    let mut b = after_first_batch();
    b.notify(ids(&["2", "0"]));
    b.notify(ids(&["0", "1"]));
    assert_eq!(b.take_batch(), Some(ids(&["0", "1", "2"])));
}

#[test]
fn notifications_during_a_batch_are_coalesced_into_the_next() {
    let mut b = book();
    b.notify(ids(&["1", "2"]));
    assert_eq!(b.take_batch(), Some(ids(&["1", "2"])));

    b.notify(ids(&["3"]));
    b.notify(ids(&["2", "3", "4"]));
    assert_eq!(b.take_batch(), None, "a batch is in flight");
    assert_eq!(b.take_batch(), None);

    assert!(b.batch_succeeded());
    assert_eq!(b.take_batch(), Some(ids(&["2", "3", "4"])));
    assert_eq!(b.take_batch(), None);
    assert!(!b.batch_succeeded());
    assert_eq!(b.take_batch(), None, "nothing waiting");
}

/// Fails the batch in flight, waits out the backoff and answers its delay.
fn fail_and_wait(b: &mut BatchBook, batch: Vec<MachineId>) -> Duration {
    let d = b.batch_failed(batch);
    b.backoff_over();
    d
}

#[test]
fn batch_failed_puts_ids_back_and_backoff_grows() {
    // Delays are drawn with full jitter under a ceiling that doubles up to the cap.
    let mut b = after_first_batch();
    b.notify(ids(&["1"]));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(100));

    b.notify(ids(&["2"]));
    let batch = b.take_batch().expect("the failed batch is retried");
    assert_eq!(batch, ids(&["1", "2"]), "failed ids wait with new ones");
    assert!(b.retry_later_delay() <= Duration::from_millis(200));
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(200));

    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(400));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(800));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(1000), "capped");
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(1000));

    // Success resets the backoff.
    let batch = b.take_batch().unwrap();
    assert_eq!(batch, ids(&["1", "2"]));
    assert!(!b.batch_succeeded());
    // Full jitter under a 100 ms ceiling again (under the old 1 s one, ten draws would not all
    // stay below 100 ms).
    assert!((0..10).all(|_| b.retry_later_delay() <= Duration::from_millis(100)));
    b.notify(ids(&["3"]));
    let batch = b.take_batch().unwrap();
    assert!(fail_and_wait(&mut b, batch) <= Duration::from_millis(100));
}

#[test]
fn no_batch_is_taken_while_backing_off() {
    let mut b = after_first_batch();
    b.notify(ids(&["1"]));
    let batch = b.take_batch().unwrap();
    b.batch_failed(batch);
    assert_eq!(b.take_batch(), None, "the failed batch waits for its backoff");
    b.notify(ids(&["2"]));
    assert_eq!(b.take_batch(), None, "new notifications wait too");
    b.backoff_over();
    assert_eq!(b.take_batch(), Some(ids(&["1", "2"])));
    assert_eq!(b.take_batch(), None, "in flight again");
}

#[test]
fn backoff_over_without_a_failure_changes_nothing() {
    let mut b = book();
    b.backoff_over();
    assert_eq!(b.take_batch(), None);
    b.notify(ids(&["1"]));
    assert_eq!(b.take_batch(), Some(ids(&["1"])));
    b.backoff_over();
    assert_eq!(b.take_batch(), None, "still in flight");
}

#[test]
fn failed_first_batch_is_retried_even_when_empty() {
    let mut b = book();
    b.notify(Vec::new());
    let batch = b.take_batch().unwrap();
    fail_and_wait(&mut b, batch);
    assert!(!b.first_done());
    assert_eq!(b.take_batch(), Some(vec![]), "the first batch must still happen to end safe mode");
    assert!(b.batch_succeeded());
}

#[test]
fn batch_succeeded_returns_true_only_the_first_time() {
    let mut b = book();
    b.notify(ids(&["0"]));
    b.take_batch().unwrap();
    assert!(b.batch_succeeded());
    for i in 1..4 {
        b.notify(ids(&[&i.to_string()]));
        b.take_batch().unwrap();
        assert!(!b.batch_succeeded());
    }
    assert!(b.first_done());
}

#[test]
fn failed_batch_does_not_count_as_first() {
    let mut b = book();
    b.notify(ids(&["0"]));
    let batch = b.take_batch().unwrap();
    fail_and_wait(&mut b, batch);
    b.take_batch().unwrap();
    assert!(b.batch_succeeded(), "the first successful batch is the first");
}

#[test]
fn set_workers_reports_change_only_when_different() {
    let mut b = book();
    assert_eq!(b.workers(), 16);
    assert!(!b.set_workers(16));
    assert!(b.set_workers(8));
    assert_eq!(b.workers(), 8);
    assert!(!b.set_workers(8));
    assert!(b.set_workers(16));
    assert_eq!(b.workers(), 16);
}

#[test]
fn zones_loaded_is_remembered() {
    let mut b = book();
    assert!(!b.zones_loaded());
    b.set_zones_loaded();
    assert!(b.zones_loaded());
}

/// The batch planner, driven without a runtime: its questions answered by a script, its
/// effects and questions logged in the order the shell would carry them out.
mod planner {
    use super::super::batch::*;
    use crate::actors::harvest::{HarvestPlan, ModeChange};
    use crate::actors::lifecycle::Deaths;
    use crate::actors::registry::{Refreshed, RegistryError};
    use crate::model::{
        CloudInstance, DeadMachine, InstanceId, InstanceState, InstanceTags, Life, Machine, MachineId, ProvisioningInfo,
    };
    use crate::ports::{BrokerError, ModelError};

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Log {
        Ask(Ask),
        Effect(Effect),
    }

    fn mid(s: &str) -> MachineId {
        MachineId::new(s)
    }

    fn dead(id: &str, instance: &str) -> DeadMachine {
        let mut m = Machine::pending(id);
        m.life = Life::Dead;
        m.instance = Some(InstanceId::from(instance));
        DeadMachine::of(&m)
    }

    fn later(first: bool) -> BatchStart {
        BatchStart { ids: vec![mid("0"), mid("1")], first, need_zones: first, ..BatchStart::default() }
    }

    fn started(log: &[Log]) -> Vec<String> {
        log.iter()
            .filter_map(|l| match l {
                Log::Effect(Effect::Start(job)) => Some(job.machine.id.to_string()),
                _ => None,
            })
            .collect()
    }

    fn asked(log: &[Log], pred: impl Fn(&Ask) -> bool) -> bool {
        log.iter().any(|l| matches!(l, Log::Ask(a) if pred(a)))
    }

    fn position(log: &[Log], pred: impl Fn(&Log) -> bool) -> usize {
        log.iter().position(pred).expect("logged")
    }

    /// Answers every question from `world`; the batch's log and outcome.
    fn drive(
        start: BatchStart,
        mut world: impl FnMut(&Ask) -> Answer,
    ) -> (Vec<Log>, Result<BatchOutcome, BatchFailure>) {
        let (mut run, mut steps) = BatchRun::new(start);
        let mut log = Vec::new();
        loop {
            log.extend(steps.effects.drain(..).map(Log::Effect));
            let ask = match steps.next {
                Next::Done(outcome) => return (log, Ok(outcome)),
                Next::Ask(ask) => ask,
            };
            let answer = world(&ask);
            log.push(Log::Ask(ask));
            match run.answer(answer) {
                Ok(next) => steps = next,
                Err(e) => return (log, Err(e)),
            }
        }
    }

    /// A world where everything succeeds: the batch classifies as `refreshed`, the lifecycle
    /// clears every pending machine, deaths are harvested now, and plans stop what they are given.
    fn world(refreshed: Refreshed, life: Life) -> impl FnMut(&Ask) -> Answer {
        move |ask| match ask {
            Ask::ModelLife => Answer::Life(Ok(life)),
            Ask::DestroyWins => Answer::Plan(HarvestPlan::default()),
            Ask::RefreshZones => Answer::Zones(Ok(())),
            Ask::Refresh(_) => Answer::Refreshed(Ok(refreshed.clone())),
            Ask::EndSafeMode => Answer::ModeChange(ModeChange::Unchanged),
            Ask::PlanOrphanStops(ids) => Answer::Plan(HarvestPlan { stop: ids.clone(), ..HarvestPlan::default() }),
            Ask::ObserveDead(d) => Answer::Deaths(Deaths { stop_now: d.clone(), deferred: Vec::new() }),
            Ask::PlanDead(d) => Answer::Plan(HarvestPlan {
                stop: d.iter().flat_map(|m| m.instances().cloned()).collect(),
                remove_after_stop: d.iter().map(|m| m.id.clone()).collect(),
                ..HarvestPlan::default()
            }),
            Ask::ObservePending(ids) => Answer::ToStart(ids.clone()),
            Ask::StartInfo(ids) => Answer::StartInfo {
                infos: Ok(ids.iter().map(|_| Ok(ProvisioningInfo::default())).collect()),
                groups: Ok(ids.iter().map(|_| Ok(Vec::new())).collect()),
            },
            Ask::WriteError { .. } => Answer::Written,
        }
    }

    fn pending(ids: &[&str]) -> Refreshed {
        Refreshed { pending: ids.iter().map(|i| Machine::pending(*i)).collect(), ..Refreshed::default() }
    }

    #[test]
    fn a_first_batch_reads_the_life_loads_zones_classifies_then_ends_safe_mode() {
        let (log, out) = drive(later(true), world(pending(&["0"]), Life::Alive));
        let asks: Vec<&Ask> = log.iter().filter_map(|l| if let Log::Ask(a) = l { Some(a) } else { None }).collect();
        assert_eq!(asks[0], &Ask::ModelLife);
        assert_eq!(asks[1], &Ask::RefreshZones);
        assert_eq!(asks[2], &Ask::Refresh(vec![mid("0"), mid("1")]));
        assert_eq!(asks[3], &Ask::EndSafeMode);
        let out = out.unwrap();
        assert!(out.zones_loaded && !out.model_dying);
        assert_eq!(out.mode_change, Some(ModeChange::Unchanged));
        // The zones were loaded this batch: not reloaded before the starts.
        assert_eq!(asks.iter().filter(|a| ***a == Ask::RefreshZones).count(), 1);
        assert_eq!(started(&log), vec!["0"]);
    }

    #[test]
    fn a_dying_model_starts_nothing_and_the_destruction_wins_over_releases() {
        let mut r = pending(&["1"]);
        r.dead = vec![dead("0", "i-0")];
        let (log, out) = drive(later(true), world(r, Life::Dying));
        assert_eq!(log[1], Log::Ask(Ask::DestroyWins), "right after the life: {log:?}");
        assert!(started(&log).is_empty(), "{log:?}");
        assert!(!asked(&log, |a| matches!(a, Ask::ObservePending(_) | Ask::StartInfo(_))));
        // Dead machines are still harvested.
        assert!(asked(&log, |a| matches!(a, Ask::PlanDead(_))));
        assert!(out.unwrap().model_dying);
    }

    #[test]
    fn closed_starts_or_a_known_dying_model_start_nothing() {
        for start in
            [BatchStart { starts_closed: true, ..later(false) }, BatchStart { model_dying: true, ..later(false) }]
        {
            let (log, out) = drive(start, world(pending(&["0", "1"]), Life::Alive));
            assert!(started(&log).is_empty(), "{log:?}");
            assert!(!asked(&log, |a| matches!(a, Ask::ObservePending(_) | Ask::ModelLife)));
            assert!(out.is_ok());
        }
    }

    #[test]
    fn dead_machines_are_harvested_before_any_start_is_queued() {
        let mut r = pending(&["1"]);
        r.dead = vec![dead("0", "i-0")];
        let (log, _) = drive(later(false), world(r, Life::Alive));
        let stop =
            position(&log, |l| matches!(l, Log::Effect(Effect::Execute(p)) if p.stop == vec![InstanceId::from("i-0")]));
        let observe = position(&log, |l| matches!(l, Log::Ask(Ask::ObservePending(_))));
        let start = position(&log, |l| matches!(l, Log::Effect(Effect::Start(_))));
        assert!(stop < observe && observe < start, "{log:?}");
    }

    #[test]
    fn a_machine_the_lifecycle_does_not_clear_is_not_started_again() {
        // "1" is already starting: the lifecycle clears only "0" (no duplicate start).
        let mut w = world(pending(&["0", "1"]), Life::Alive);
        let (log, _) = drive(later(false), move |ask| match ask {
            Ask::ObservePending(_) => Answer::ToStart(vec![mid("0")]),
            Ask::StartInfo(ids) => {
                assert_eq!(ids, &vec![mid("0")], "only the cleared machine is looked up");
                w(ask)
            }
            _ => w(ask),
        });
        assert_eq!(started(&log), vec!["0"]);
    }

    #[test]
    fn zones_are_reloaded_once_before_the_starts_and_a_failure_keeps_the_last_list() {
        let mut w = world(pending(&["0", "1"]), Life::Alive);
        let (log, out) = drive(later(false), move |ask| match ask {
            Ask::RefreshZones => Answer::Zones(Err(BrokerError::transient("zones down"))),
            _ => w(ask),
        });
        let reload = position(&log, |l| matches!(l, Log::Ask(Ask::RefreshZones)));
        let info = position(&log, |l| matches!(l, Log::Ask(Ask::StartInfo(_))));
        assert!(reload < info);
        assert_eq!(started(&log), vec!["0", "1"]);
        assert!(!out.unwrap().zones_loaded);
    }

    #[test]
    fn the_first_zone_load_failing_fails_the_batch() {
        let mut w = world(pending(&["0"]), Life::Alive);
        let (log, out) = drive(later(true), move |ask| match ask {
            Ask::RefreshZones => Answer::Zones(Err(BrokerError::transient("zones down"))),
            _ => w(ask),
        });
        assert!(matches!(out, Err(BatchFailure::Zones(_))), "{out:?}");
        assert!(!asked(&log, |a| matches!(a, Ask::Refresh(_))));
    }

    #[test]
    fn a_failed_classification_fails_the_batch() {
        let mut w = world(pending(&["0"]), Life::Alive);
        let (_, out) = drive(later(false), move |ask| match ask {
            Ask::Refresh(_) => Answer::Refreshed(Err(RegistryError::ViewStale)),
            _ => w(ask),
        });
        assert!(matches!(out, Err(BatchFailure::Registry(RegistryError::ViewStale))), "{out:?}");
    }

    #[test]
    fn an_adopter_needs_no_lookup_and_is_queued_first() {
        let mut r = pending(&["0", "1"]);
        let inst = CloudInstance {
            id: InstanceId::from("lost-1"),
            state: InstanceState::Running,
            zone: None,
            tags: InstanceTags::default(),
            age: None,
            instance_type: None,
            capacity_type: None,
            image: None,
        };
        r.adopt = vec![(mid("1"), inst.clone())];
        let mut w = world(r, Life::Alive);
        let (log, _) = drive(later(false), move |ask| {
            if let Ask::StartInfo(ids) = ask {
                assert_eq!(ids, &vec![mid("0")], "the adopter is not looked up");
            }
            w(ask)
        });
        assert_eq!(started(&log), vec!["1", "0"]);
        let adopted = log.iter().find_map(|l| match l {
            Log::Effect(Effect::Start(job)) if job.machine.id == mid("1") => Some(job.adopt.as_deref().cloned()),
            _ => None,
        });
        assert_eq!(adopted, Some(Some(inst)));
    }

    #[test]
    fn a_per_machine_lookup_failure_writes_its_error_status_and_the_others_start() {
        let mut w = world(pending(&["0", "1", "2"]), Life::Alive);
        let (log, out) = drive(later(false), move |ask| match ask {
            Ask::StartInfo(_) => Answer::StartInfo {
                infos: Ok(vec![
                    Ok(ProvisioningInfo::default()),
                    Err(ModelError::Other("no info".into())),
                    Ok(ProvisioningInfo::default()),
                ]),
                groups: Ok(vec![Ok(Vec::new()), Ok(Vec::new()), Err(ModelError::Other("no group".into()))]),
            },
            _ => w(ask),
        });
        let writes: Vec<(String, String)> = log
            .iter()
            .filter_map(|l| match l {
                Log::Ask(Ask::WriteError { machine, message }) => Some((machine.to_string(), message.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(writes, vec![("1".into(), "no info".into()), ("2".into(), "no group".into())]);
        assert_eq!(started(&log), vec!["0"]);
        assert_eq!(log.last(), Some(&Log::Effect(Effect::ForgetLifecycle(vec![mid("1"), mid("2")]))));
        assert!(out.unwrap().retry_later.is_empty(), "a per-machine failure is not retried");
    }

    #[test]
    fn a_failed_lookup_call_retries_the_lot_later() {
        let mut r = pending(&["0", "1"]);
        r.retry_later = vec![mid("7")];
        let mut w = world(r, Life::Alive);
        let (log, out) = drive(later(false), move |ask| match ask {
            Ask::StartInfo(_) => Answer::StartInfo {
                infos: Err(ModelError::Other("model down".into())),
                groups: Ok(vec![Ok(Vec::new()), Ok(Vec::new())]),
            },
            _ => w(ask),
        });
        assert!(started(&log).is_empty());
        assert!(!asked(&log, |a| matches!(a, Ask::WriteError { .. })), "no status written");
        assert_eq!(log.last(), Some(&Log::Effect(Effect::ForgetLifecycle(vec![mid("0"), mid("1")]))));
        assert_eq!(out.unwrap().retry_later, vec![mid("7"), mid("0"), mid("1")]);
    }

    #[test]
    fn orphans_are_stopped_before_the_dead_and_a_pending_machines_only_once_it_is_cleared() {
        let mut r = pending(&["1", "2"]);
        r.dead = vec![dead("0", "i-0")];
        r.orphans = vec![
            (mid("1"), InstanceId::from("o-1")),
            (mid("2"), InstanceId::from("o-2")),
            (mid("3"), InstanceId::from("o-3")),
        ];
        let mut w = world(r, Life::Alive);
        let (log, _) = drive(later(false), move |ask| match ask {
            // "2" is starting: its orphan waits.
            Ask::ObservePending(_) => Answer::ToStart(vec![mid("1")]),
            _ => w(ask),
        });
        let orphan_stops: Vec<&Vec<InstanceId>> =
            log.iter().filter_map(|l| if let Log::Ask(Ask::PlanOrphanStops(i)) = l { Some(i) } else { None }).collect();
        assert_eq!(orphan_stops, vec![&vec![InstanceId::from("o-3")], &vec![InstanceId::from("o-1")]]);
        let first = position(&log, |l| matches!(l, Log::Ask(Ask::PlanOrphanStops(_))));
        let dead = position(&log, |l| matches!(l, Log::Ask(Ask::ObserveDead(_))));
        assert!(first < dead);
        // The registry hears of each orphan's stop, with its machine, before the plan is asked.
        assert_eq!(
            log[first - 1],
            Log::Effect(Effect::StopsPlanned { ids: vec![InstanceId::from("o-3")], machine: Some(mid("3")) })
        );
    }

    #[test]
    fn a_start_carries_the_zone_request_with_its_shape() {
        let mut w = world(pending(&["0"]), Life::Alive);
        let (log, _) = drive(later(false), move |ask| match ask {
            Ask::StartInfo(_) => {
                let mut info = ProvisioningInfo::default();
                info.constraints.zones = Some(vec!["az2".into()]);
                info.constraints.instance_type = Some("m5.large".into());
                Answer::StartInfo { infos: Ok(vec![Ok(info)]), groups: Ok(vec![Ok(vec![mid("9")])]) }
            }
            _ => w(ask),
        });
        let job = log
            .iter()
            .find_map(|l| if let Log::Effect(Effect::Start(j)) = l { Some(j.clone()) } else { None })
            .expect("a start");
        let req = job.zone_request(vec!["az2".into()]);
        assert_eq!(req.allowed, Some(vec!["az2".to_string()]));
        assert_eq!(req.group, Some(vec![mid("9")]));
        assert_eq!(req.shape.as_deref(), Some("arch=amd64 instance-type=m5.large"));
    }

    #[test]
    fn placements_and_gone_machines_are_passed_on_before_any_question_after_the_refresh() {
        let mut r = pending(&[]);
        r.placements = vec![(mid("5"), "az1".into())];
        r.gone = vec![mid("6")];
        let (log, out) = drive(later(false), world(r, Life::Alive));
        assert_eq!(
            log,
            vec![
                Log::Ask(Ask::Refresh(vec![mid("0"), mid("1")])),
                Log::Effect(Effect::Populate(vec![(mid("5"), "az1".into())])),
                Log::Effect(Effect::Gone(vec![mid("6")])),
            ]
        );
        assert_eq!(out.unwrap(), BatchOutcome::default());
    }

    #[test]
    fn an_answer_to_another_question_is_an_error_not_a_panic() {
        let (mut run, steps) = BatchRun::new(later(false));
        assert_eq!(steps.next, Next::Ask(Ask::Refresh(vec![mid("0"), mid("1")])));
        let err = run.answer(Answer::Written).unwrap_err();
        assert!(matches!(err, BatchFailure::Unexpected { .. }), "{err}");
        // The question still stands.
        assert!(run.answer(Answer::Refreshed(Ok(Refreshed::default()))).is_ok());
    }
}

/// What follows a batch, a job and a finished start, without a runtime.
mod followups {
    use super::super::batch::BatchOutcome;
    use super::super::followup::*;
    use super::{after_first_batch, book, ids};
    use crate::actors::harvest::ModeChange;
    use crate::actors::lifecycle::AfterStart;
    use crate::actors::workers::{GivenUp, JobOutcome};
    use crate::model::events::ProvisionerEvent;
    use crate::model::{
        CloudInstance, DeadMachine, HarvestMode, InstanceId, InstanceState, InstanceTags, Machine, MachineId,
    };

    fn iid(s: &str) -> InstanceId {
        InstanceId::from(s)
    }

    fn removed_event(m: &str) -> Followup {
        Followup::Publish(ProvisionerEvent::MachineRemoved { machine: MachineId::new(m) })
    }

    #[test]
    fn the_first_batch_tells_the_planner_to_load_zones_and_read_the_life() {
        let mut b = book();
        b.notify(ids(&["1", "0", "1"]));
        let start = b.start_batch().unwrap();
        assert_eq!(start.ids, ids(&["0", "1"]), "sorted and deduplicated");
        assert!(start.first && start.need_zones && !start.model_dying && !start.starts_closed);
        assert!(b.start_batch().is_none(), "one batch at a time");
    }

    #[test]
    fn a_batch_after_the_first_knows_the_zones_the_dying_model_and_closed_starts() {
        let mut b = book();
        b.notify(ids(&["0"]));
        b.start_batch().unwrap();
        b.batch_done(BatchOutcome { zones_loaded: true, model_dying: true, ..BatchOutcome::default() });
        b.close_starts();
        b.notify(ids(&["1"]));
        let start = b.start_batch().unwrap();
        assert!(!start.first && !start.need_zones && start.model_dying && start.starts_closed);
    }

    #[test]
    fn the_first_batch_done_sweeps_a_dying_model_then_harvests_unknown_instances() {
        let mut b = book();
        b.notify(ids(&[]));
        b.start_batch().unwrap();
        let change = ModeChange::Changed { mode: HarvestMode::All, harvest_unknown: true };
        let next = b.batch_done(BatchOutcome {
            mode_change: Some(change),
            model_dying: true,
            retry_later: ids(&["7"]),
            ..BatchOutcome::default()
        });
        assert!(matches!(&next[0], Followup::RetryLater { ids: later, .. } if *later == super::ids(&["7"])));
        assert_eq!(
            next[1..],
            [
                Followup::Publish(ProvisionerEvent::ProcessedMachines),
                Followup::SweepDyingModel,
                Followup::Publish(ProvisionerEvent::HarvestModeChanged { mode: HarvestMode::All }),
                Followup::HarvestUnknown { announce: false, fresher_than: None },
            ]
        );
        assert!(b.first_done());
        assert_eq!(b.busy(), 0, "the retry is the timer's work, not the book's");
    }

    #[test]
    fn a_later_batch_done_only_announces() {
        let mut b = after_first_batch();
        b.notify(ids(&["0"]));
        b.start_batch().unwrap();
        assert_eq!(b.batch_done(BatchOutcome::default()), vec![Followup::Publish(ProvisionerEvent::ProcessedMachines)]);
    }

    #[test]
    fn a_started_machine_is_recorded_announced_and_told_to_the_lifecycle_after_its_retiree() {
        let instance = CloudInstance {
            id: iid("i-1"),
            state: InstanceState::Running,
            zone: Some("az1".into()),
            tags: InstanceTags::default(),
            age: None,
            instance_type: None,
            capacity_type: None,
            image: None,
        };
        let outcome = JobOutcome::Started {
            machine: MachineId::new("1"),
            instance: Box::new(instance.clone()),
            constraints: None,
            retired: Some(MachineId::new("old")),
            reserved: false,
            given_up: None,
        };
        let next = on_job_done(outcome);
        assert_eq!(
            next,
            vec![
                Followup::Forget(ids(&["old"])),
                removed_event("old"),
                // Not reserved (reused): the allocator counts it now.
                Followup::Populate(vec![(MachineId::new("1"), "az1".into())]),
                Followup::Record { machine: MachineId::new("1"), instance: Box::new(instance), constraints: None },
                Followup::Publish(ProvisionerEvent::MachineStarted {
                    machine: MachineId::new("1"),
                    instance: iid("i-1"),
                    zone: Some("az1".into()),
                }),
                Followup::StartFinished { machine: MachineId::new("1"), instance: Some(iid("i-1")), orphan: None },
            ]
        );
    }

    #[test]
    fn a_given_up_parked_instance_is_stopped_before_its_machine_is_removed() {
        let given_up = Some(GivenUp { instance: iid("parked"), retired: MachineId::new("old") });
        let next = on_job_done(JobOutcome::StartAbandoned { machine: MachineId::new("1"), given_up });
        assert_eq!(
            next[0],
            Followup::PlanStops { instances: vec![iid("parked")], remove_after: ids(&["old"]), machine: None }
        );
        assert!(!next.iter().any(|f| matches!(f, Followup::Forget(_))), "removed only once stopped: {next:?}");
    }

    #[test]
    fn a_stop_tells_the_registry_and_the_harvest_then_removes_its_machines() {
        let next = on_job_done(JobOutcome::Stopped { instances: vec![iid("i-0")], machines: ids(&["0"]) });
        assert_eq!(
            next,
            vec![
                Followup::InstancesGone(vec![iid("i-0")]),
                Followup::StopsDone(vec![iid("i-0")]),
                Followup::Forget(ids(&["0"])),
                Followup::Publish(ProvisionerEvent::InstancesStopped { instances: vec![iid("i-0")] }),
                removed_event("0"),
            ]
        );
    }

    #[test]
    fn a_mode_change_that_harvests_unknown_instances_does_so_on_a_fresh_listing() {
        assert!(on_mode_change(ModeChange::Unchanged).is_empty());
        assert!(on_mode_change(ModeChange::Deferred).is_empty());
        let next = on_mode_change(ModeChange::Changed { mode: HarvestMode::Unknown, harvest_unknown: true });
        assert_eq!(
            next,
            vec![
                Followup::Publish(ProvisionerEvent::HarvestModeChanged { mode: HarvestMode::Unknown }),
                Followup::HarvestUnknown { announce: true, fresher_than: Some(std::time::Duration::ZERO) },
            ]
        );
    }

    fn dead(id: &str, instance: Option<&str>) -> DeadMachine {
        let mut m = Machine::pending(id);
        m.instance = instance.map(InstanceId::from);
        DeadMachine::of(&m)
    }

    #[test]
    fn a_start_that_failed_while_its_machine_was_asked_again_is_followed_by_a_look_at_it() {
        let m = MachineId::new("0");
        let step = after_start(Some(AfterStart::Again), m.clone(), Some(iid("o-1")));
        let AfterStartStep::Then(next) = step else { panic!("{step:?}") };
        assert!(matches!(&next[0], Followup::PlanStops { instances, .. } if instances == &vec![iid("o-1")]));
        assert!(
            matches!(&next[1], Followup::RetryLater { delay, ids } if delay.is_zero() && ids == &vec![m.clone()]),
            "{next:?}"
        );
    }

    #[test]
    fn an_orphan_joins_its_machine_if_it_died_meanwhile_or_is_stopped_on_its_own() {
        let m = MachineId::new("1");
        let step =
            after_start(Some(AfterStart::StopDeferred { dead: dead("1", Some("i-1")) }), m.clone(), Some(iid("o-1")));
        let AfterStartStep::PlanDead(d) = step else { panic!("{step:?}") };
        assert_eq!(d.tagged, vec![iid("o-1")]);
        // Not twice: the orphan is already the machine's instance.
        let step = after_start(
            Some(AfterStart::DestroyDeferred { machine: dead("1", Some("o-1")) }),
            m.clone(),
            Some(iid("o-1")),
        );
        let AfterStartStep::PlanDestroy(d) = step else { panic!("{step:?}") };
        assert!(d.tagged.is_empty());
        // The lifecycle unreachable or done: the orphan is stopped on its own, tagged for its machine.
        for answer in [None, Some(AfterStart::Done)] {
            assert_eq!(
                after_start(answer, m.clone(), Some(iid("o-1"))),
                AfterStartStep::Then(vec![Followup::PlanStops {
                    instances: vec![iid("o-1")],
                    remove_after: Vec::new(),
                    machine: Some(m.clone()),
                }])
            );
        }
        assert_eq!(after_start(Some(AfterStart::Done), m, None), AfterStartStep::Then(Vec::new()));
    }
}

#[test]
fn the_machines_cleared_to_start_keep_their_order_whatever_the_answers_order() {
    use super::batch::cleared_of;
    use crate::model::Machine;
    let pending = || ["1", "2", "3", "10", "11"].into_iter().map(Machine::pending).collect::<Vec<_>>();
    let names = |v: Vec<Machine>| v.into_iter().map(|m| m.id.as_str().to_owned()).collect::<Vec<_>>();
    // In the order asked (the lifecycle's way): one walk.
    assert_eq!(names(cleared_of(pending(), &ids(&["1", "3", "11"]))), ["1", "3", "11"]);
    assert_eq!(names(cleared_of(pending(), &ids(&[]))), Vec::<String>::new());
    assert_eq!(names(cleared_of(pending(), &ids(&["1", "2", "3", "10", "11"]))).len(), 5);
    // In another order, or naming a machine not pending: by look-up, in the pending order.
    assert_eq!(names(cleared_of(pending(), &ids(&["11", "2"]))), ["2", "11"]);
    assert_eq!(names(cleared_of(pending(), &ids(&["3", "99", "10"]))), ["3", "10"]);
}
