//! Batched starts (issue 17, point 1) under the property test's random scenarios and at every
//! crash point of a batch's life: the same invariants hold with `batch_starts` on.

use std::time::Duration;

use provisioner::model::Life;
use provisioner::sim::scenario::{Action, Dur, EventSpec, Format, MachineSpec, SetLifeSpec};
use provisioner::sim::{generate, run, Scenario};

/// How many seeds the normal test run covers (override with `BATCH_PROPERTY_SEEDS`).
fn seeds() -> u64 {
    std::env::var("BATCH_PROPERTY_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200)
}

/// The property test's random scenarios (faults, lost answers, restarts, deaths, throttling,
/// zone and mode changes, containers) with batching on, in batches of up to 3 for even seeds
/// (so that several calls of one zone and shape meet) and of the default 100 for odd ones: no
/// invariant is broken.
#[test]
fn random_scenarios_with_batched_starts_break_no_invariant() {
    let mut failures = Vec::new();
    let mut batched = 0;
    for seed in 0..seeds() {
        let mut scenario = generate(seed);
        scenario.provisioner.batch_starts = true;
        scenario.provisioner.batch_size = if seed % 2 == 0 { 3 } else { 100 };
        let report = run(&scenario, None);
        batched += report.calls.iter().filter(|c| c.batch.is_some()).count();
        if !report.violations.is_empty() || !report.provisioner.alive {
            failures.push(format!("seed {seed}: {:?}", report.violations));
        }
    }
    assert!(batched > 0, "no start was batched");
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds(), failures.join("\n"));
}

/// A crash at every 250 ms of a batch's life (before the call, during it, between its return
/// and the records, after), once or twice in a row: three machines in one zone share one
/// 10 s call, their records take 3 s, machine 2 dies at 7 s. Every run breaks no invariant,
/// provisions the two live machines with one instance each and leaves no other running.
#[test]
fn every_crash_point_of_a_batch_is_recovered() {
    let base = Scenario::parse(
        r#"
        [provisioner]
        batch_starts = true
        retry_count = 2
        retry_delay = "1s"
        [model]
        write_latency = "3s"
        [cloud]
        zones = ["az1"]
        start_latency = "10s"
        [cloud.rate_limit]
        start_burst = 2
        start_per_second = 0.5
        "#,
        Format::Toml,
        "crash.toml",
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    for step in 0..=80u64 {
        let first = Duration::from_millis(250 * step).max(Duration::from_millis(1));
        for second in [None, Some(Duration::ZERO), Some(Duration::from_millis(700))] {
            let mut s = base.clone();
            s.machines = ["0", "1", "2"].iter().map(|id| MachineSpec::pending(*id)).collect();
            s.events = vec![
                EventSpec::new(
                    Duration::from_secs(7),
                    Action::SetLife(SetLifeSpec { machine: "2".into(), life: Life::Dead }),
                ),
                EventSpec::new(first, Action::Restart),
            ];
            if let Some(gap) = second {
                s.events.push(EventSpec::new(first + gap, Action::Restart));
            }
            s.events.sort_by_key(|e| e.at);
            s.until = Dur(Duration::from_secs(3600));
            runs += 1;
            if let Err(why) = recovered(&run(&s, None)) {
                failures.push(format!("crash at {first:?} then {second:?}: {why}"));
            }
        }
    }
    assert!(runs > 200);
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n{}", failures.len(), failures.join("\n"));
}

/// Whether a crash run ended well: no invariant broken, machines 0 and 1 started with one
/// instance each, nothing else left running (machine 2 died).
fn recovered(r: &provisioner::sim::Report) -> Result<(), String> {
    let unstarted: Vec<&str> = ["0", "1"]
        .into_iter()
        .filter(|id| r.machines[*id].instance.is_none() || r.machines[*id].status != "started")
        .collect();
    let running = r.instances.values().filter(|i| i.state != "terminated").count();
    match (r.violations.is_empty(), unstarted.is_empty(), running) {
        (true, true, 2) => Ok(()),
        _ => Err(format!("{:?}, not started {unstarted:?}, {running} running", r.violations)),
    }
}

/// A seed still reproduces a run byte for byte with batching on.
#[test]
fn batched_runs_are_reproducible() {
    for seed in [1, 7, 42, 99] {
        let mut scenario = generate(seed);
        scenario.provisioner.batch_starts = true;
        let a = run(&scenario, None).to_json();
        assert_eq!(a, run(&scenario, None).to_json(), "seed {seed} is not reproducible");
        assert!(a.contains("\"batch\""), "seed {seed} batched nothing");
    }
}
