//! The fleet cost of issue 33, measured: the two example fleets (100 machines of one shape,
//! on-demand against prefer-spot) run in the simulator, and the prefer-spot fleet costs less by
//! the ratio its report's instances give (their capacity types and the shipped prices), not by
//! a constant.

use std::path::Path;

use provisioner::model::instance_types::{price_per_hour, SPOT_PRICE_RATIO};
use provisioner::sim::{run, FleetCost, Report, Scenario};

fn fleet(name: &str) -> Report {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios").join(name);
    let scenario = Scenario::load(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let report = run(&scenario, None);
    assert!(report.violations.is_empty(), "{name}: {:?}", report.violations);
    let provisioned = report.machines.values().filter(|m| m.instance.is_some() && !m.removed).count();
    assert_eq!(provisioned, 100, "{name}: every machine provisioned");
    report
}

/// The fleet's hourly price recomputed from the report's live instances, apart from
/// `FleetCost`: the shipped on-demand price of each one's type, times the spot ratio for spot.
fn recomputed(report: &Report) -> f64 {
    report
        .instances
        .values()
        .filter(|i| matches!(i.state.as_str(), "pending" | "running"))
        .map(|i| {
            let t = i.instance_type.as_deref().expect("every instance of the fleet has a type");
            let on_demand = price_per_hour(t).expect("a priced type");
            if i.capacity_type == Some(provisioner::model::CapacityType::Spot) {
                on_demand * SPOT_PRICE_RATIO
            } else {
                on_demand
            }
        })
        .sum()
}

fn cost(report: &Report) -> &FleetCost {
    report.cost.as_ref().expect("a fleet of priced instances has a cost")
}

#[test]
fn a_prefer_spot_fleet_costs_less_than_an_on_demand_one_by_its_mix() {
    let od = fleet("fleet_cost_on_demand.toml");
    let ps = fleet("fleet_cost_prefer_spot.toml");
    let (c_od, c_ps) = (cost(&od), cost(&ps));
    assert_eq!((c_od.instances, c_od.spot, c_od.on_demand, c_od.unpriced), (100, 0, 100, 0));
    assert_eq!((c_ps.instances, c_ps.spot + c_ps.on_demand, c_ps.unpriced), (100, 100, 0));
    assert!(c_ps.spot > 0, "no machine of the prefer-spot fleet got spot: {c_ps:?}");

    let (usd_od, usd_ps) = (c_od.usd_per_hour.dollars(), c_ps.usd_per_hour.dollars());
    assert!((usd_od - recomputed(&od)).abs() < 1e-6, "{usd_od} against {}", recomputed(&od));
    assert!((usd_ps - recomputed(&ps)).abs() < 1e-6, "{usd_ps} against {}", recomputed(&ps));

    // One shape, one type: the ratio is the mix's, (spot × SPOT_PRICE_RATIO + on-demand) / all.
    let expected = (c_ps.spot as f64 * SPOT_PRICE_RATIO + c_ps.on_demand as f64) / c_ps.instances as f64;
    let ratio = usd_ps / usd_od;
    eprintln!(
        "on-demand fleet ${usd_od}/h, prefer-spot fleet ${usd_ps}/h ({} spot, {} on-demand): {ratio:.4} of it",
        c_ps.spot, c_ps.on_demand
    );
    assert!(usd_ps < usd_od, "prefer-spot ${usd_ps}/h is not below on-demand ${usd_od}/h");
    assert!((ratio - expected).abs() < 1e-9, "ratio {ratio}, expected {expected} from the mix");

    // The text report carries the line; the JSON report the key.
    assert!(ps.to_human().contains(&format!("cost: ${usd_ps}/h for 100 instances")), "{}", ps.to_human());
    let json: serde_json::Value = serde_json::from_str(&ps.to_json()).unwrap();
    assert_eq!(json["cost"]["spot"], c_ps.spot);
}
