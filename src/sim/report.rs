//! The report (`--json`) and its human rendering.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::instance_types::{self, hourly_price};
use crate::model::{CapacityType, UsdPerHour};

/// The whole report, keys as the contract fixes them (plus additions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Scenario name.
    pub name: String,
    /// Seed used.
    pub seed: u64,
    /// When the run ended.
    pub ended_at: String,
    /// The provisioner's fate.
    pub provisioner: ProvisionerReport,
    /// Every broker call in order (`all_instances`, `availability_zones`, `derive_zones`,
    /// `start_instance`, `stop_instances`).
    pub calls: Vec<CallReport>,
    /// Every machine ever in the model.
    pub machines: BTreeMap<String, MachineReport>,
    /// Every instance that ever existed.
    pub instances: BTreeMap<String, InstanceReport>,
    /// The provisioner's contract events (`processed-machines`, `retried-machines-with-errors`,
    /// `resized-worker-pool`, `harvest-mode-changed`), in order.
    pub events: Vec<String>,
    /// The model's fate.
    pub model: ModelReport,
    /// Broken invariants, one sentence each.
    pub violations: Vec<String>,
    /// Addition: the richer events (machine-started, machine-failed, instances-stopped, ...).
    pub activity: Vec<String>,
    /// Addition: instances released (our identity removed), in call order.
    pub released: Vec<String>,
    /// Addition (issue 33): what the live instances cost an hour at the end; absent when none
    /// has a known price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<FleetCost>,
    /// Addition (issue 34): live machines whose recorded instance has drifted from what a start
    /// would make for them at the end (`model::drift`), by machine id; absent when none has.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub drift: BTreeMap<String, DriftReport>,
}

/// One drifted machine (issue 34).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriftReport {
    /// Its recorded instance.
    pub instance: String,
    /// Each reason's kind (`instance-type`, `zone`, `tags`), in order.
    pub kinds: Vec<String>,
    /// Each reason, as a sentence.
    pub reasons: Vec<String>,
}

/// The fleet's hourly cost at the end (issue 33): every live (`pending`, `running`) instance
/// that is not another model's, at [`hourly_price`]: on-demand ones at the shipped catalogue's
/// on-demand price, spot ones at the cloud's spot price (the scenario's `[cloud] spot_price`,
/// else [`SPOT_PRICE_RATIO`](crate::model::instance_types::SPOT_PRICE_RATIO) of on-demand), the
/// same rule the fake cloud charges spot starts by. Instances without a known price are
/// counted, not summed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetCost {
    /// The sum of the known prices, in USD per hour.
    pub usd_per_hour: UsdPerHour,
    /// Live instances counted (`spot` + `on_demand`).
    pub instances: usize,
    /// Of them, on spot capacity.
    pub spot: usize,
    /// Of them, on on-demand capacity.
    pub on_demand: usize,
    /// Of them, those whose price is unknown (no type, or a type without a price): not in the sum.
    pub unpriced: usize,
}

impl FleetCost {
    /// The cost of the live instances among `instances` (a report's), with the cloud's spot
    /// price `spot_price` (`None`: a share of on-demand); `None` when no instance has a known
    /// price.
    pub fn of(instances: &BTreeMap<String, InstanceReport>, spot_price: Option<UsdPerHour>) -> Option<Self> {
        let catalogue = instance_types::shipped();
        let mut micros = 0u64;
        let mut cost =
            FleetCost { usd_per_hour: UsdPerHour::new(0.0)?, instances: 0, spot: 0, on_demand: 0, unpriced: 0 };
        for i in instances.values().filter(|i| !i.foreign && matches!(i.state.as_str(), "pending" | "running")) {
            let capacity = i.capacity_type.unwrap_or_default();
            cost.instances += 1;
            match capacity {
                CapacityType::Spot => cost.spot += 1,
                CapacityType::OnDemand => cost.on_demand += 1,
            }
            match hourly_price(&catalogue, i.instance_type.as_deref(), capacity, spot_price) {
                Some(p) => micros += (p.dollars() * 1e6).round() as u64,
                None => cost.unpriced += 1,
            }
        }
        if cost.unpriced == cost.instances {
            return None;
        }
        cost.usd_per_hour = UsdPerHour::new(micros as f64 / 1e6)?;
        Some(cost)
    }
}

/// `provisioner`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProvisionerReport {
    /// Whether it still runs.
    pub alive: bool,
    /// Why it died, if it did.
    pub error: Option<String>,
    /// How many `restart` events it went through.
    pub restarts: u32,
}

/// One broker call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallReport {
    /// When it began.
    pub at: String,
    /// Which call.
    pub op: String,
    /// The machine (starts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The zone (starts; `null` on a zoneless cloud).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<Option<String>>,
    /// The instances (stops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<String>>,
    /// Whether it succeeded.
    pub ok: bool,
    /// The instance a start made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Its error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Refused by the cloud's rate limit.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub throttled: bool,
    /// Addition: the instance type a start made its instance with (when one was chosen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Addition: the types a start tried first that were out of capacity in its zone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_types: Vec<String>,
    /// Version 2: the batched call this start was part of (`[provisioner] batch_starts`);
    /// absent for a single-machine call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// Addition (issue 33): `"spot"` for a start that asked for spot capacity (absent for
    /// on-demand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<crate::model::CapacityType>,
}

/// One machine's final state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineReport {
    /// Life.
    pub life: String,
    /// Marked for removal.
    pub removed: bool,
    /// Recorded instance.
    pub instance: Option<String>,
    /// That instance's zone.
    pub zone: Option<String>,
    /// Machine status.
    pub status: String,
    /// Instance status.
    pub instance_status: String,
    /// Status message.
    pub message: String,
    /// Addition (issue 33): its capacity preference (absent when `on-demand`).
    #[serde(skip_serializing_if = "crate::model::CapacityPreference::is_default")]
    pub capacity: crate::model::CapacityPreference,
    /// Addition (issue 33): the capacity its instance runs on, `spot` or `on-demand`: shown
    /// for a machine that asked for spot (`spot`, `prefer-spot`) and for any on spot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<crate::model::CapacityType>,
}

/// One instance's final state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceReport {
    /// `pending`, `running`, `stopped` or `terminated`.
    pub state: String,
    /// Zone.
    pub zone: Option<String>,
    /// The machine it was started for.
    pub machine: Option<String>,
    /// Another model's.
    pub foreign: bool,
    /// Addition: its instance type (when one was chosen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Addition (issue 33): `"spot"` for a spot instance (absent for on-demand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<crate::model::CapacityType>,
    /// Addition (issue 34): the image it was started from (only when the cloud names one,
    /// `[cloud] image`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `model`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReport {
    /// The model's life.
    pub life: String,
    /// Errors operations on the model returned, in order.
    pub errors: Vec<String>,
}

impl Report {
    /// The report as pretty JSON (byte-identical for the same scenario and seed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// A summary for people.
    pub fn to_human(&self) -> String {
        let mut out = String::new();
        let title = if self.name.is_empty() { "scenario".to_owned() } else { self.name.clone() };
        let _ = writeln!(out, "{title} (seed {}): ended at {}", self.seed, self.ended_at);
        let p = &self.provisioner;
        let _ = writeln!(
            out,
            "provisioner: {}{}",
            if p.alive { "alive" } else { "dead" },
            if p.restarts > 0 { format!(", restarted {} time(s)", p.restarts) } else { String::new() }
        );

        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        let (mut provisioned, mut failed, mut removed) = (0, 0, 0);
        for m in self.machines.values() {
            if m.removed {
                removed += 1;
            } else if m.instance.is_some() {
                provisioned += 1;
                *per_zone.entry(m.zone.clone().unwrap_or_else(|| "(no zone)".into())).or_default() += 1;
            } else if m.instance_status == "provisioning error" {
                failed += 1;
            }
        }
        let _ = writeln!(
            out,
            "machines: {} in all, {provisioned} provisioned, {failed} failed, {removed} removed",
            self.machines.len()
        );
        if !per_zone.is_empty() {
            let zones: Vec<String> = per_zone.iter().map(|(z, n)| format!("{z}: {n}")).collect();
            let _ = writeln!(out, "  per zone: {}", zones.join(", "));
        }
        let mut states: BTreeMap<&str, usize> = BTreeMap::new();
        for i in self.instances.values() {
            *states.entry(i.state.as_str()).or_default() += 1;
        }
        let states: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let _ = writeln!(
            out,
            "instances: {} ({})",
            self.instances.len(),
            if states.is_empty() { "none".into() } else { states.join(", ") }
        );
        if let Some(c) = &self.cost {
            let _ = writeln!(
                out,
                "cost: ${}/h for {} instances ({} spot, {} on-demand; {} unpriced)",
                c.usd_per_hour.dollars(),
                c.instances,
                c.spot,
                c.on_demand,
                c.unpriced
            );
        }
        let mut calls: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
        for c in &self.calls {
            let e = calls.entry(c.op.as_str()).or_default();
            e.0 += 1;
            if !c.ok {
                e.1 += 1;
            }
            if c.throttled {
                e.2 += 1;
            }
        }
        let _ = writeln!(out, "calls:");
        for (op, (n, failed, throttled)) in &calls {
            let mut line = format!("  {op}: {n}");
            if *failed > 0 {
                line.push_str(&format!(" ({failed} failed"));
                if *throttled > 0 {
                    line.push_str(&format!(", {throttled} throttled"));
                }
                line.push(')');
            }
            let _ = writeln!(out, "{line}");
        }
        let failures: Vec<(&String, &MachineReport)> =
            self.machines.iter().filter(|(_, m)| m.instance_status == "provisioning error").take(5).collect();
        if !failures.is_empty() {
            let _ = writeln!(out, "first failures:");
            for (id, m) in failures {
                let _ = writeln!(out, "  machine {id}: {}", m.message);
            }
        }
        if !self.model.errors.is_empty() {
            let _ = writeln!(out, "model errors:");
            for e in &self.model.errors {
                let _ = writeln!(out, "  {e}");
            }
        }
        if self.violations.is_empty() {
            let _ = writeln!(out, "violations: none");
        } else {
            let _ = writeln!(out, "violations ({}):", self.violations.len());
            for v in &self.violations {
                let _ = writeln!(out, "  {v}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(state: &str, instance_type: Option<&str>, spot: bool, foreign: bool) -> InstanceReport {
        InstanceReport {
            state: state.into(),
            zone: None,
            machine: None,
            foreign,
            instance_type: instance_type.map(str::to_owned),
            capacity_type: spot.then_some(CapacityType::Spot),
            image: None,
        }
    }

    #[test]
    fn the_fleet_cost_sums_live_priced_instances_and_counts_the_rest() {
        let instances: BTreeMap<String, InstanceReport> = [
            ("a", instance("running", Some("t3.medium"), false, false)),
            ("b", instance("pending", Some("t3.medium"), true, false)),
            ("c", instance("running", None, false, false)),
            ("d", instance("terminated", Some("t3.medium"), false, false)),
            ("e", instance("stopped", Some("t3.medium"), false, false)),
            ("f", instance("running", Some("t3.medium"), false, true)),
        ]
        .into_iter()
        .map(|(id, i)| (id.to_owned(), i))
        .collect();
        let cost = FleetCost::of(&instances, None).unwrap();
        assert_eq!((cost.instances, cost.spot, cost.on_demand, cost.unpriced), (3, 1, 2, 1));
        assert_eq!(cost.usd_per_hour, UsdPerHour::new(0.0416 + 0.01248).unwrap());
        // A scenario's spot price prices every spot instance.
        let cost = FleetCost::of(&instances, UsdPerHour::new(0.02)).unwrap();
        assert_eq!(cost.usd_per_hour, UsdPerHour::new(0.0616).unwrap());
        // Nothing priced: no cost (and no line in the text report).
        let typeless: BTreeMap<String, InstanceReport> =
            [("c".to_owned(), instance("running", None, false, false))].into_iter().collect();
        assert_eq!(FleetCost::of(&typeless, None), None);
    }
}
