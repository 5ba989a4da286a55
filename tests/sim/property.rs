//! Random scenarios (machines, deaths at random times, faults, restarts, zone changes, mode
//! changes, resizes, throttling) break no invariant, and a seed reproduces a run exactly.

use provisioner::sim::{generate, run};

/// How many seeds the normal test run covers (override with `PROPERTY_SEEDS`).
fn seeds() -> u64 {
    std::env::var("PROPERTY_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(500)
}

#[test]
fn random_scenarios_break_no_invariant() {
    let mut failures = Vec::new();
    for seed in 0..seeds() {
        let scenario = generate(seed);
        let report = run(&scenario, None);
        if !report.violations.is_empty() || !report.provisioner.alive {
            failures.push(format!(
                "seed {seed}: {:?}\n  reproduce: cargo run -- generate-scenario --seed {seed} > s.toml && cargo run -- simulate s.toml",
                report.violations
            ));
        }
    }
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
