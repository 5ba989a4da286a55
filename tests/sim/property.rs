//! Random scenarios (machines, deaths at random times and at the instant a start lands, faults,
//! lost answers, restarts, zone changes, mode changes, resizes, throttling, destroys, batched
//! starts for half the seeds; containers with host deaths under them, restarts around those,
//! mode switches while they live and destroys while they start) break no invariant, and a seed
//! reproduces a run exactly.
//! `PROPERTY_SEEDS=10000` runs more seeds (in a release build:
//! `PROPERTY_SEEDS=10000 cargo test --release --features sim --test sim random_scenarios_break`).

use provisioner::sim::{generate, run};

/// How many seeds the normal test run covers (override with `PROPERTY_SEEDS`).
fn seeds() -> u64 {
    std::env::var("PROPERTY_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(500)
}

#[test]
fn random_scenarios_break_no_invariant() {
    let mut failures = Vec::new();
    let mut batched = 0;
    for seed in 0..seeds() {
        let scenario = generate(seed);
        batched += u64::from(scenario.provisioner.batch_starts);
        let report = run(&scenario, None);
        if !report.violations.is_empty() || !report.provisioner.alive {
            let batching = if scenario.provisioner.batch_starts {
                format!(" (batch_size {})", scenario.provisioner.batch_size)
            } else {
                String::new()
            };
            failures.push(format!(
                "seed {seed}{batching}: {:?}\n  reproduce: cargo run -- generate-scenario --seed {seed} > s.toml && cargo run -- simulate s.toml",
                report.violations
            ));
        }
    }
    // The generator draws batched starts with everything else (for about half the seeds).
    assert!(seeds() < 20 || batched > 0, "no seed drew batched starts");
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds(), failures.join("\n"));
}

#[test]
fn same_scenario_and_seed_give_byte_identical_reports() {
    for seed in [1, 7, 42, 99, 123, 2024] {
        let scenario = generate(seed);
        let a = run(&scenario, None).to_json();
        let b = run(&scenario, None).to_json();
        assert_eq!(a, b, "seed {seed} is not reproducible");
    }
}

#[test]
fn generated_scenarios_round_trip_through_toml() {
    for seed in 0..50 {
        let scenario = generate(seed);
        let text = scenario.to_toml();
        let back = provisioner::sim::Scenario::parse(&text, provisioner::sim::scenario::Format::Toml, "generated.toml")
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        assert_eq!(back, scenario, "seed {seed}");
    }
}

#[test]
fn the_seed_option_overrides_the_files_seed_and_changes_tie_breaks() {
    let text = r#"
        [cloud]
        zones = ["az1", "az2", "az3", "az4", "az5"]
        [[machines]]
        id = "0"
        [[machines]]
        id = "1"
    "#;
    let s = provisioner::sim::Scenario::parse(text, provisioner::sim::scenario::Format::Toml, "t.toml").unwrap();
    let zones = |seed| {
        let r = run(&s, Some(seed));
        assert_eq!(r.seed, seed);
        (r.machines["0"].zone.clone(), r.machines["1"].zone.clone())
    };
    let picks: std::collections::BTreeSet<_> = (0..8).map(zones).collect();
    assert!(picks.len() > 1, "every seed placed machines alike: {picks:?}");
    assert_eq!(zones(3), zones(3));
}

/// Crash recovery: a crash at every point of a start's life is recovered without a second
/// instance or a lost machine. Three machines start (10 s each, recorded 3 s later, a 2-start
/// burst cloud), one of them dies at 7 s; the provisioner crashes once at every 250 ms from
/// 0 to 20 s (before the calls, during them, between a start's return and its record, after),
/// then twice in a row at every such point (the second crash 0–1.5 s after the first, during
/// the recovery). Every run must break no invariant, provision the two live machines with one
/// instance each, and leave the dead machine's instance terminated.
#[test]
fn every_crash_point_is_recovered_once_or_twice() {
    use provisioner::model::Life;
    use provisioner::sim::scenario::{Action, Dur, EventSpec, MachineSpec, SetLifeSpec};
    use std::time::Duration;

    let base = provisioner::sim::Scenario::parse(
        r#"
        [provisioner]
        retry_count = 2
        retry_delay = "1s"
        [model]
        write_latency = "3s"
        [cloud]
        zones = ["az1", "az2"]
        start_latency = "10s"
        [cloud.rate_limit]
        start_burst = 2
        start_per_second = 0.5
        "#,
        provisioner::sim::scenario::Format::Toml,
        "crash.toml",
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    for step in 0..=80u64 {
        let first = Duration::from_millis(250 * step);
        for second in
            [None, Some(Duration::from_millis(0)), Some(Duration::from_millis(700)), Some(Duration::from_millis(1500))]
        {
            let mut s = base.clone();
            s.machines = ["0", "1", "2"].iter().map(|id| MachineSpec::pending(*id)).collect();
            s.events = vec![EventSpec::new(
                Duration::from_secs(7),
                Action::SetLife(SetLifeSpec { machine: "2".into(), life: Life::Dead }),
            )];
            // Events at 0s are applied before the provisioner starts: crash just after instead.
            let first = first.max(Duration::from_millis(1));
            s.events.push(EventSpec::new(first, Action::Restart));
            if let Some(gap) = second {
                s.events.push(EventSpec::new(first + gap, Action::Restart));
            }
            s.events.sort_by_key(|e| e.at);
            s.until = Dur(Duration::from_secs(3600));
            let r = run(&s, None);
            runs += 1;
            let live_ok = ["0", "1"].iter().all(|id| {
                let m = &r.machines[*id];
                m.instance.is_some() && m.status == "started"
            });
            let ours_alive: Vec<_> =
                r.instances.iter().filter(|(_, i)| i.state != "terminated").map(|(id, _)| id.clone()).collect();
            if !r.violations.is_empty() || !live_ok || ours_alive.len() != 2 {
                failures.push(format!(
                    "crash at {first:?} then {second:?}: violations {:?}, live machines provisioned: {live_ok}, running instances {ours_alive:?}",
                    r.violations
                ));
            }
        }
    }
    assert!(runs > 300);
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n{}", failures.len(), failures.join("\n"));
}
