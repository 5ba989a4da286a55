use super::state::*;
use crate::model::DeadMachine;
use crate::model::{InstanceId, MachineId};

fn mid(s: &str) -> MachineId {
    MachineId::new(s)
}

fn iid(s: &str) -> InstanceId {
    InstanceId::new(s)
}

fn dead(id: &str) -> DeadMachine {
    DeadMachine { id: mid(id), instance: None, keep_instance: false, manual: false, tagged: Vec::new(), reusable: None }
}

/// A book with machine `id` running instance `instance`.
fn running(id: &str, instance: &str) -> LifecycleBook {
    let mut b = LifecycleBook::new();
    assert!(b.want_start(&mid(id)));
    assert_eq!(b.start_finished(&mid(id), Some(iid(instance))), AfterStart::Done);
    b
}

#[test]
fn want_start_is_true_once_then_false_while_starting() {
    let mut b = LifecycleBook::new();
    assert!(b.want_start(&mid("0")));
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Starting));
    assert!(b.still_wanted(&mid("0")));
    assert!(!b.want_start(&mid("0")));
    assert!(!b.want_start(&mid("0")));
    // Other machines are independent.
    assert!(b.want_start(&mid("1")));
}

#[test]
fn want_start_is_false_while_running() {
    let mut b = running("0", "i-0");
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Running { instance: iid("i-0") }));
    assert!(!b.want_start(&mid("0")));
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Running { instance: iid("i-0") }));
}

#[test]
fn want_start_is_false_while_stopping() {
    let mut b = LifecycleBook::new();
    assert_eq!(b.on_death(&dead("0")), DeathDecision::StopNow);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
    assert!(!b.want_start(&mid("0")));
}

#[test]
fn want_start_is_false_while_stop_deferred() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    b.on_death(&dead("0"));
    assert!(!b.want_start(&mid("0")));
}

#[test]
fn death_while_starting_is_deferred_and_start_no_longer_wanted() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    let d = DeadMachine { keep_instance: true, ..dead("0") };
    assert_eq!(b.on_death(&d), DeathDecision::Deferred);
    assert!(!b.still_wanted(&mid("0")));
    assert_eq!(b.phase(&mid("0")), Some(&Phase::StopDeferred(Box::new(d.clone()))));
    // Seen dead again before the start returns: still deferred.
    assert_eq!(b.on_death(&d), DeathDecision::Deferred);
    assert!(!b.still_wanted(&mid("0")));
}

#[test]
fn start_finished_on_deferred_machine_stops_the_produced_instance() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    b.on_death(&DeadMachine { keep_instance: true, ..dead("0") });

    let after = b.start_finished(&mid("0"), Some(iid("i-new")));
    let expected = DeadMachine {
        id: mid("0"),
        instance: Some(iid("i-new")),
        keep_instance: true,
        manual: false,
        tagged: Vec::new(),
        reusable: None,
    };
    assert_eq!(after, AfterStart::StopDeferred { dead: expected });
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
    assert!(!b.want_start(&mid("0")));
    // A second death report is ignored while the deferred stop runs.
    assert_eq!(b.on_death(&dead("0")), DeathDecision::AlreadyStopping);
}

#[test]
fn start_finished_without_instance_on_deferred_machine_keeps_known_instance() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    let d = DeadMachine { instance: Some(iid("i-old")), manual: true, ..dead("0") };
    b.on_death(&d);
    assert_eq!(b.start_finished(&mid("0"), None), AfterStart::StopDeferred { dead: d });

    let mut b = LifecycleBook::new();
    b.want_start(&mid("1"));
    b.on_death(&dead("1"));
    assert_eq!(b.start_finished(&mid("1"), None), AfterStart::StopDeferred { dead: dead("1") });
}

#[test]
fn start_finished_success_runs_the_machine_without_a_second_start() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    assert_eq!(b.start_finished(&mid("0"), Some(iid("i-0"))), AfterStart::Done);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Running { instance: iid("i-0") }));
    assert!(!b.still_wanted(&mid("0")));
    assert!(!b.want_start(&mid("0")));
}

#[test]
fn start_finished_failure_returns_the_machine_to_idle() {
    let mut b = LifecycleBook::new();
    b.want_start(&mid("0"));
    assert_eq!(b.start_finished(&mid("0"), None), AfterStart::Done);
    assert_eq!(b.phase(&mid("0")), None);
    assert!(!b.still_wanted(&mid("0")));
    assert!(b.want_start(&mid("0")), "a failed start may be tried again later");
}

#[test]
fn start_finished_does_not_disturb_a_stopping_or_unknown_machine() {
    let mut b = LifecycleBook::new();
    b.on_death(&dead("0"));
    assert_eq!(b.start_finished(&mid("0"), Some(iid("i-0"))), AfterStart::Done);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));

    assert_eq!(b.start_finished(&mid("9"), Some(iid("i-9"))), AfterStart::Done);
    assert_eq!(b.phase(&mid("9")), None);
}

#[test]
fn death_while_stopping_is_already_stopping() {
    let mut b = LifecycleBook::new();
    assert_eq!(b.on_death(&dead("0")), DeathDecision::StopNow);
    assert_eq!(b.on_death(&dead("0")), DeathDecision::AlreadyStopping);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
}

#[test]
fn death_while_running_stops_now() {
    let mut b = running("0", "i-0");
    assert_eq!(b.on_death(&DeadMachine { instance: Some(iid("i-0")), ..dead("0") }), DeathDecision::StopNow);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
}

#[test]
fn death_of_idle_machine_stops_now() {
    let mut b = LifecycleBook::new();
    assert_eq!(b.on_death(&dead("0")), DeathDecision::StopNow);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
}

#[test]
fn on_deaths_sorts_a_batch_by_decision() {
    let mut b = running("run", "i-run");
    b.want_start(&mid("start"));
    b.on_death(&dead("stop"));
    let run = DeadMachine { instance: Some(iid("i-run")), ..dead("run") };
    let batch = [run.clone(), dead("start"), dead("stop"), dead("idle")];
    let deaths = b.on_deaths(&batch);
    assert_eq!(deaths.stop_now, vec![run, dead("idle")]);
    assert_eq!(deaths.deferred, vec![mid("start")]);
    assert!(matches!(b.phase(&mid("start")), Some(Phase::StopDeferred(_))));
    assert_eq!(b.phase(&mid("run")), Some(&Phase::Stopping));
    assert_eq!(b.phase(&mid("idle")), Some(&Phase::Stopping));
}

#[test]
fn forget_returns_the_machine_to_idle() {
    let mut b = LifecycleBook::new();
    b.on_death(&dead("0"));
    b.forget(&mid("0"));
    assert_eq!(b.phase(&mid("0")), None);
    assert!(b.want_start(&mid("0")));
}

#[test]
fn phases_iterate_in_id_order() {
    let mut b = LifecycleBook::new();
    for id in ["2", "0", "1"] {
        b.want_start(&mid(id));
    }
    let ids: Vec<&str> = b.phases().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["0", "1", "2"]);
}

#[test]
fn destroy_defers_starting_machines_and_hands_back_the_others() {
    let mut b = LifecycleBook::new();
    assert!(b.want_start(&mid("0")));
    assert!(b.want_start(&mid("1")));
    b.start_finished(&mid("1"), Some(iid("i-1")));
    let d0 = dead("0");
    let d1 = DeadMachine { instance: Some(iid("i-1")), ..dead("1") };
    let out = b.on_destroy(&[d0.clone(), d1.clone(), dead("2")]);
    assert_eq!(out.deferred, vec![mid("0")]);
    assert_eq!(out.stop_now, vec![d1, dead("2")]);
    assert!(!b.still_wanted(&mid("0")), "a start kept going in a destroyed model");
    // The start lands: its instance is stopped whatever the mode.
    let after = b.start_finished(&mid("0"), Some(iid("i-0")));
    assert_eq!(after, AfterStart::DestroyDeferred { machine: DeadMachine { instance: Some(iid("i-0")), ..d0 } });
}

#[test]
fn nothing_starts_after_the_model_is_destroyed() {
    // A batch read before the destruction may still ask to start a machine (contract
    // nothing new in a dying model).
    let mut b = LifecycleBook::new();
    b.on_destroy(&[dead("0")]);
    assert!(!b.want_start(&mid("1")), "a machine started after the model was destroyed");
}

/// The destruction wins over releases: a start that landed at the instant of the destruction is
/// running in the lifecycle before the registry has its instance: the destruction stops it.
#[test]
fn destroy_of_a_machine_whose_start_just_landed_stops_the_instance_it_landed() {
    let mut b = running("0", "i-1");
    let out = b.on_destroy(&[dead("0")]);
    assert_eq!(out.stop_now.len(), 1);
    assert_eq!(out.stop_now[0].instances().cloned().collect::<Vec<_>>(), vec![iid("i-1")]);
    // Known to the registry already: not named twice.
    let mut b = running("0", "i-1");
    let known = DeadMachine { instance: Some(iid("i-1")), ..dead("0") };
    let out = b.on_destroy(&[known]);
    assert_eq!(out.stop_now[0].instances().cloned().collect::<Vec<_>>(), vec![iid("i-1")]);
    assert!(out.stop_now[0].tagged.is_empty());
}

/// A death read before the registry recorded the instance of a start that landed at that very
/// instant (batched starts make it likely: issue 30 item 13): the lifecycle has the instance
/// (`Running`), and it goes with the dead machine, stopped or released by the mode, never left
/// unowned to be harvested later as unknown (or never, in mode destroyed).
#[test]
fn death_of_a_machine_whose_start_just_landed_carries_the_instance_it_landed() {
    let mut b = running("0", "i-1");
    let out = b.on_deaths(&[dead("0")]);
    assert_eq!(out.stop_now, vec![DeadMachine { instance: Some(iid("i-1")), ..dead("0") }]);
    assert_eq!(b.phase(&mid("0")), Some(&Phase::Stopping));
    // Known to the registry already: named once, as it is.
    let mut b = running("0", "i-1");
    let known = DeadMachine { instance: Some(iid("i-1")), ..dead("0") };
    assert_eq!(b.on_deaths(std::slice::from_ref(&known)).stop_now, vec![known]);
    // The registry records another instance (say a reused one): the landed one joins its tagged.
    let mut b = running("0", "i-1");
    let other = DeadMachine { instance: Some(iid("i-0")), keep_instance: true, ..dead("0") };
    let out = b.on_deaths(&[other]);
    assert_eq!(out.stop_now[0].instances().cloned().collect::<Vec<_>>(), vec![iid("i-0"), iid("i-1")]);
    assert!(out.stop_now[0].keep_instance);
    // A machine that was never started: as it is.
    let mut b = LifecycleBook::new();
    assert_eq!(b.on_deaths(&[dead("0")]).stop_now, vec![dead("0")]);
}

#[test]
fn extra_instances_of_machines_with_a_start_in_flight_are_left_alone() {
    let mut b = running("0", "i-0");
    assert!(b.want_start(&mid("1")));
    assert!(b.want_start(&mid("2")));
    assert_eq!(b.on_death(&dead("2")), DeathDecision::Deferred);
    let extras = vec![
        (mid("0"), iid("x0")),
        (mid("0"), iid("i-0")),
        (mid("1"), iid("x1")),
        (mid("2"), iid("x2")),
        (mid("9"), iid("x9")),
    ];
    // Running: its extra, never its start's product; starting or stop-deferred: nothing; idle
    // (a machine provisioned before this incarnation): its extra.
    assert_eq!(b.without_start(extras), vec![(mid("0"), iid("x0")), (mid("9"), iid("x9"))]);
}

#[test]
fn a_replacement_starts_a_running_or_untracked_machine_again_and_nothing_else() {
    let mut book = LifecycleBook::new();
    let m = MachineId::new("0");
    assert!(book.want_start(&m));
    assert!(!book.begin_replacement(&m), "already starting");
    book.start_finished(&m, Some(crate::model::InstanceId::new("i-1")));
    assert!(book.begin_replacement(&m));
    assert!(book.still_wanted(&m));
    book.start_finished(&m, Some(crate::model::InstanceId::new("i-2")));
    assert!(matches!(book.phase(&m), Some(Phase::Running { instance }) if instance.as_str() == "i-2"));
    assert!(book.begin_replacement(&MachineId::new("5")), "a provisioned machine not started here");
}

#[test]
fn a_machine_asked_to_start_while_its_start_fails_is_looked_at_again() {
    // Found by the model checker (issue 35): a retry of a machine in error, read while its
    // failing start was still finishing, was refused (a start in flight) and then lost.
    let mut b = LifecycleBook::new();
    assert!(b.want_start(&mid("0")));
    assert!(!b.want_start(&mid("0")), "a start is in flight");
    assert_eq!(b.start_finished(&mid("0"), None), AfterStart::Again);
    assert!(b.want_start(&mid("0")), "cleared to start again");
    // Asked again while starting, but the start made an instance: nothing more.
    assert!(!b.want_start(&mid("0")));
    assert_eq!(b.start_finished(&mid("0"), Some(iid("i-0"))), AfterStart::Done);
    // Not asked again: a failed start ends there.
    let mut b = LifecycleBook::new();
    assert!(b.want_start(&mid("1")));
    assert_eq!(b.start_finished(&mid("1"), None), AfterStart::Done);
}
