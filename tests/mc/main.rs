//! The model checker's tests (issue 35, `model_check_*`): every interleaving of the start
//! protocol within the bounds of each configuration, explored through the engine's own plain
//! cores (`provisioner::sim::mc`). The code as shipped breaks no property; each mutation (a
//! safeguard turned off on purpose) is found, with a shortest counterexample, so the checker
//! cannot go blind unnoticed.

use provisioner::sim::mc::{check, to_scenario, CallOutcome, McAction, McConfig, McReport, Mutations, Replay};

fn report(r: &McReport) -> String {
    let mut out = format!(
        "configuration {:?}: {} states ({} distinct), depth {}\n",
        r.config.name, r.states, r.unique_states, r.max_depth
    );
    for v in &r.violations {
        out.push_str(&v.to_string());
    }
    out
}

/// Checks `config` on the code as shipped: no property broken, and enough states explored to
/// mean something.
fn assert_clean(config: &McConfig, at_least: usize) {
    let r = check(config, 2);
    eprintln!("{}", report(&r));
    assert!(r.violations.is_empty(), "{}", report(&r));
    assert!(r.unique_states > at_least, "too few states to mean anything: {}", report(&r));
}

#[test]
fn model_check_one_machine_through_crashes_and_lost_answers() {
    assert_clean(&McConfig::one_machine(), 100);
}

#[test]
fn model_check_two_machines_two_zones_with_every_fault_once() {
    assert_clean(&McConfig::small(), 1_000);
}

#[test]
fn model_check_spot_interruptions_and_their_hand_overs() {
    assert_clean(&McConfig::interruptions(), 1_000);
}

#[test]
fn model_check_batched_starts_replayed_by_their_token() {
    assert_clean(&McConfig::batched(), 1_000);
}

/// The batched configuration does batch: some path closes a batch that carries both machines
/// in one call (a search of its own, breadth first, a few thousand states).
#[test]
fn model_check_batched_configuration_reaches_a_call_of_two_machines() {
    use provisioner::sim::mc::World;
    let config = McConfig::batched();
    let mut seen = std::collections::HashSet::new();
    let mut frontier = vec![World::new(&config)];
    for _depth in 0..30 {
        let mut next = Vec::new();
        for w in frontier {
            let mut actions = Vec::new();
            w.actions(&config, &mut actions);
            for a in actions {
                if let McAction::BatchCall(b, _) = &a {
                    if w.batch_members(*b).len() == 2 {
                        return;
                    }
                }
                let mut n = w.clone();
                n.step(&a);
                if seen.insert(format!("{n:?}")) {
                    next.push(n);
                }
            }
        }
        frontier = next;
    }
    panic!("no call carries two machines within 30 steps");
}

/// Mutation: the pool replays a batched call that failed ambiguously under a new client token.
/// The call whose answer was lost made the batch's instances, the replay makes them again:
/// every member has two.
#[test]
fn model_check_finds_the_duplicates_a_batch_replayed_under_a_new_token_makes() {
    let mutations = Mutations { batch_replay_new_token: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::batched() }, "one live instance per machine");
    assert!(
        found.actions.iter().any(|a| matches!(a, McAction::BatchCall(_, CallOutcome::LosesAnswer))),
        "the counterexample loses a batch's answer: {found}"
    );
    assert!(found.broken.iter().any(|b| b.contains("has 2 live instances")), "{found}");
    replay_shows(&config, &found, "two live instances");
}

/// A longer configuration, for nightly-style runs (`MODEL_CHECK_LONG=1 cargo test --release
/// --features mc --test mc model_check_long -- --nocapture`): skipped (and says so) otherwise.
fn long(config: McConfig) {
    if std::env::var_os("MODEL_CHECK_LONG").is_none() {
        eprintln!("skipped: set MODEL_CHECK_LONG=1 to explore configuration {:?}", config.name);
        return;
    }
    let r = check(&config, 2);
    eprintln!("{}", report(&r));
    assert!(r.violations.is_empty(), "{}", report(&r));
}

#[test]
fn model_check_long_two_machines_when_asked() {
    long(McConfig::long());
}

#[test]
fn model_check_long_listings_when_asked() {
    long(McConfig::listings_long());
}

#[test]
fn model_check_long_leases_when_asked() {
    long(McConfig::leases_long());
}

#[test]
fn model_check_long_interruptions_when_asked() {
    long(McConfig::interruptions_long());
}

#[test]
fn model_check_long_harvest_all_when_asked() {
    long(McConfig::harvest_all_long());
}

/// Mutation: after an ambiguous failure the next call takes a new client token. The checker
/// finds the machine with two instances: the call whose answer was lost made one, the next
/// call with a new token another.
#[test]
fn model_check_finds_the_duplicate_a_new_token_after_an_ambiguous_failure_makes() {
    let mutations = Mutations { new_token_after_ambiguous: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::one_machine() }, "one live instance per machine");
    assert!(
        found.actions.contains(&McAction::Call("0".into(), CallOutcome::LosesAnswer)),
        "the counterexample loses an answer: {found}"
    );
    assert!(found.broken.iter().any(|b| b.contains("machine 0 has 2 live instances")), "{found}");
    // Replayed on the real actors and the fake cloud, exactly: the simulator sees the same
    // duplicate, and none without the mutation (the safeguard is what prevents it).
    let replay = replay_shows(&config, &found, "machine 0 has two live instances");
    assert!(replay.exact, "{:?}\n{}", replay.notes, replay.toml);
}

#[test]
fn model_check_listings_record_failures_and_retries() {
    assert_clean(&McConfig::listings(), 1_000);
}

#[test]
fn model_check_destroy_model_while_machines_start() {
    assert_clean(&McConfig::destroy(), 1_000);
}

#[test]
fn model_check_leases_intents_and_calls_on_the_wire() {
    assert_clean(&McConfig::leases(), 1_000);
}

/// Mutation: the fence admits every write. The lease moves; the old leader, stale, goes on
/// acting, and the store takes its writes under an epoch the lease has left.
#[test]
fn model_check_finds_the_stale_write_skipping_the_fence_check_lets_through() {
    let mutations = Mutations { skip_fence_check: true, ..Mutations::default() };
    let (_, found) = find(McConfig { mutations, ..McConfig::leases() }, "no write accepted under a stale epoch");
    assert!(found.actions.contains(&McAction::LeaseMoves), "{found}");
    assert!(found.actions.iter().any(|a| matches!(a, McAction::Stale(_))), "the stale leader acts: {found}");
    assert!(found.broken.iter().any(|b| b.contains("under epoch 1, the lease at epoch 2")), "{found}");
}

/// Mutation: no start intents. A start call still on the wire when the lease moves reaches the
/// cloud after the new leader has read the cloud and the model: here the machine died and was
/// removed meanwhile, and the late call's instance is left running for no machine (the intent,
/// repeated by the new leader before it runs, is what makes the instance visible in time).
#[test]
fn model_check_finds_the_leak_a_call_on_the_wire_makes_without_start_intents() {
    let mutations = Mutations { no_start_intents: true, ..Mutations::default() };
    let (_, found) = find(McConfig { mutations, ..McConfig::leases() }, "quiet means converged");
    assert!(found.actions.contains(&McAction::LeaseMoves), "{found}");
    assert!(found.actions.iter().any(|a| matches!(a, McAction::Late(..) | McAction::Stale(_))), "{found}");
    assert!(found.broken.iter().any(|b| b.contains("dead machine 0 still has live instances")), "{found}");
    // With the intents, the same configuration is clean: model_check_leases_intents_and_calls_on_the_wire.
}

/// Checks `config` (its mutations on) and answers the counterexample found for `property`. On
/// one thread: the search is then deterministic, and so is the counterexample (of several
/// shortest ones, which one two threads find first varies).
fn find(config: McConfig, property: &str) -> (McConfig, provisioner::sim::mc::Counterexample) {
    let r = check(&config, 1);
    eprintln!("{}", report(&r));
    let found = r.violations.iter().find(|v| v.property == property).cloned();
    let found = found.unwrap_or_else(|| panic!("{property:?} was not broken\n{}", report(&r)));
    (config, found)
}

/// Mutation: the registry adopts an instance whose stop is in flight (and starts its machine
/// without waiting for the stop). A start whose record the model refused leaves an orphan to
/// stop; the machine is retried; the orphan, still listed, is adopted and then stopped under
/// its live machine.
#[test]
fn model_check_finds_the_stop_of_a_live_machine_adopting_an_instance_being_stopped_makes() {
    let mutations = Mutations { adopt_while_stopping: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::listings() }, "no live machine's instance stopped");
    assert!(found.actions.contains(&McAction::Retry("0".into())), "the machine is retried: {found}");
    assert!(found.broken.iter().any(|b| b.contains("of live machine 0 was stopped")), "{found}");
    replay_shows(&config, &found, "which the provisioner stopped");
}

/// Mutation: a listing that failed is taken for the whole cloud (empty). After a crash, the
/// first refresh's listing fails; the instance the crashed provisioner made (its answer lost)
/// is not seen, not adopted, and the machine is started again: two instances.
#[test]
fn model_check_finds_the_duplicate_judging_an_incomplete_listing_makes() {
    let mutations = Mutations { judge_incomplete_listing: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::listings() }, "one live instance per machine");
    assert!(found.actions.contains(&McAction::Crash), "{found}");
    assert!(found.broken.iter().any(|b| b.contains("machine 0 has 2 live instances")), "{found}");
    replay_shows(&config, &found, "machine 0 has two live instances");
}

/// The counterexample's scenario, replayed on the real actors and the fake cloud, shows
/// `violation`; and the same scenario without the mutation is clean.
fn replay_shows(config: &McConfig, found: &provisioner::sim::mc::Counterexample, violation: &str) -> Replay {
    let replay = to_scenario(config, found).expect("the counterexample is a valid scenario");
    eprintln!("{}\n{:?}", replay.toml, replay.notes);
    let sim = provisioner::sim::run(&replay.scenario, None);
    assert!(
        sim.violations.iter().any(|v| v.contains(violation)),
        "the replay does not show {violation:?}: {:?}\n{}",
        sim.violations,
        replay.toml
    );
    let mut clean = replay.scenario.clone();
    clean.provisioner.mutations = Mutations::default();
    let sim = provisioner::sim::run(&clean, None);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    replay
}

/// Mutation: the lifecycle keeps a starting machine wanted through the model's destruction. A
/// start the destruction found in flight is told it is still wanted, calls the cloud, and
/// what it makes is never stopped; the replay shows the instance left running.
#[test]
fn model_check_finds_the_start_a_destruction_lets_through_when_starts_are_not_deferred() {
    let mutations = Mutations { start_through_destroy: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::destroy() }, "nothing started after destroy_model");
    assert!(found.actions.contains(&McAction::Destroy), "{found}");
    assert!(found.broken.iter().any(|b| b.contains("after the model's destruction, and called")), "{found}");
    replay_shows(&config, &found, "model destroyed at 8s but instance");
}

#[test]
fn model_check_harvest_modes_that_release_and_a_change_of_mode() {
    assert_clean(&McConfig::harvest_modes(), 1_000);
    assert_clean(
        &McConfig {
            name: "harvest-none",
            harvest_mode: provisioner::model::HarvestMode::None,
            mode_change: Some(provisioner::model::HarvestMode::All),
            ..McConfig::harvest_modes()
        },
        1_000,
    );
}

#[test]
fn model_check_harvest_mode_all_with_the_grace_period() {
    assert_clean(&McConfig::harvest_all(), 1_000);
}

/// Mutation: a warning about a machine's recorded instance opens its hand-over even while
/// another instance of the machine is still there. A crash after a hand-over's switch was
/// recorded and before the interrupted instance's stop was decided loses that stop; a warning
/// about the replacement (now recorded) then starts a third instance beside the two. (The
/// scenario it writes is not an exact replay: in the simulator the record's answer, the switch
/// and the stop come in the same instant, which a restart at a whole second cannot split.)
#[test]
fn model_check_finds_the_third_instance_a_hand_over_ignoring_a_leftover_makes() {
    let mutations = Mutations { handover_ignores_leftovers: true, ..Mutations::default() };
    let (config, found) = find(McConfig { mutations, ..McConfig::interruptions() }, "one live instance per machine");
    assert!(found.actions.contains(&McAction::Crash), "{found}");
    assert!(found.actions.iter().filter(|a| matches!(a, McAction::Warn(_))).count() == 2, "{found}");
    assert!(found.broken.iter().any(|b| b.contains("machine 0 has 3 live instances")), "{found}");
    let replay = to_scenario(&config, &found).expect("the counterexample is a valid scenario");
    assert!(replay.toml.contains("interrupt = { instance = \"i-2\""), "{}", replay.toml);
}

/// The export writes the model's events of the hand-overs and the harvest modes as the
/// scenario's: a warning an `interrupt` event (its warning running until the path's cloud takes
/// the instance), a change of mode a `set_harvest_mode` event, the first mode the
/// provisioner's.
#[test]
fn model_check_counterexamples_export_warnings_and_changes_of_mode() {
    use provisioner::model::{HarvestMode, InstanceId};
    let config = McConfig { interruptions: 1, ..McConfig::harvest_modes() };
    let i1 = InstanceId::new("i-1");
    let cx = provisioner::sim::mc::Counterexample {
        property: "quiet means converged",
        actions: vec![
            McAction::Batch,
            McAction::Warn(i1.clone()),
            McAction::ChangeMode(HarvestMode::Destroyed),
            McAction::Reclaim(i1),
        ],
        broken: Vec::new(),
    };
    let replay = to_scenario(&config, &cx).expect("a valid scenario");
    let toml = &replay.toml;
    assert!(toml.contains("harvest_mode = \"unknown\""), "{toml}");
    assert!(toml.contains("at = \"2s\"\ninterrupt = { instance = \"i-1\", warning = \"2s\" }"), "{toml}");
    assert!(toml.contains("at = \"3s\"\nset_harvest_mode = \"destroyed\""), "{toml}");
    assert_eq!(replay.scenario.provisioner.harvest_mode, HarvestMode::Unknown);
}
