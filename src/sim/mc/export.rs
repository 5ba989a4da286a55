//! A counterexample as a scenario file (issue 35): `provisioner simulate` replays it on the
//! real actors, the fake cloud and the invariant checker.
//!
//! The checker's faults become the scenario's: each machine's start calls, in the order the
//! path makes them, become its `[[cloud.faults]]` (a call that lands and loses its answer a
//! `lost_response` fault, a refused call a zone-specific one), consumed by the fake cloud in
//! the same order; a crash becomes a `restart` event and a death a `set_life` event, each at
//! its step's position in the path (one second a step). The mutations carry over
//! (`[provisioner] mutations`). Timing in the simulator is the actors' own, so a path whose
//! violation depends on where a crash or a death falls between two steps is replayed as
//! closely as time allows, and the replay says so (`exact: false`).

use std::fmt::Write;

use super::action::{CallOutcome, McAction};
use super::config::{Counterexample, McConfig};
use crate::sim::scenario::{Format, Scenario, ScenarioError};

/// A counterexample's scenario.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The scenario file's text (TOML).
    pub toml: String,
    /// The scenario.
    pub scenario: Scenario,
    /// Whether the scenario makes the path's faults exactly (else: as closely as time allows,
    /// with the reasons in `notes`).
    pub exact: bool,
    /// Where the replay may part from the path.
    pub notes: Vec<String>,
}

/// The scenario that replays `cx`, found under `config`.
pub fn to_scenario(config: &McConfig, cx: &Counterexample) -> Result<Replay, ScenarioError> {
    let mut notes = Vec::new();
    let mut toml = String::new();
    let _ = writeln!(toml, "# A counterexample of the model checker (issue 35), configuration {:?}:", config.name);
    let _ = writeln!(toml, "# property {:?} broken after {} steps.", cx.property, cx.actions.len());
    for b in &cx.broken {
        let _ = writeln!(toml, "# {b}");
    }
    let _ = writeln!(toml, "name = {:?}", format!("model check: {}", cx.property));
    let _ = writeln!(toml, "until = \"{}s\"", cx.actions.len() + 600);
    let _ = writeln!(toml, "\n[provisioner]\nretry_count = {}\nretry_delay = \"0s\"", config.retry_count);
    if !config.mutations.none() {
        let m = toml::to_string(&config.mutations).unwrap_or_default();
        let inline = m.trim().replace('\n', ", ");
        let _ = writeln!(toml, "mutations = {{ {inline} }}");
    }
    let zones: Vec<String> = config.zones.iter().map(|z| format!("{z:?}")).collect();
    let _ = writeln!(toml, "\n[cloud]\nzones = [{}]\nstart_latency = \"1s\"", zones.join(", "));
    // Each machine's calls, in order: runs of one outcome become one fault each.
    for m in 0..config.machines {
        let id = m.to_string();
        let calls: Vec<CallOutcome> = cx
            .actions
            .iter()
            .filter_map(|a| match a {
                McAction::Call(mid, outcome) if mid.as_str() == id => Some(*outcome),
                _ => None,
            })
            .collect();
        let mut runs: Vec<(CallOutcome, u32)> = Vec::new();
        for c in calls {
            match runs.last_mut() {
                Some((o, n)) if *o == c => *n += 1,
                _ => runs.push((c, 1)),
            }
        }
        // A call that lands before a later fault: the fake cloud would fault it instead.
        let last_fault = runs.iter().rposition(|(o, _)| *o != CallOutcome::Lands);
        if runs.iter().take(last_fault.unwrap_or(0)).any(|(o, _)| *o == CallOutcome::Lands) {
            notes.push(format!("machine {id}'s calls land between faults: the scenario faults its first calls"));
        }
        for (outcome, times) in runs {
            match outcome {
                CallOutcome::Lands => {}
                CallOutcome::LosesAnswer => {
                    let _ = writeln!(
                        toml,
                        "\n[[cloud.faults]]\nmachine = {id:?}\ntimes = {times}\nlost_response = true\nmessage = \"RequestTimeout: the answer was lost\""
                    );
                }
                CallOutcome::Refused => {
                    let _ = writeln!(
                        toml,
                        "\n[[cloud.faults]]\nmachine = {id:?}\ntimes = {times}\nmessage = \"InsufficientInstanceCapacity: no capacity in the zone\""
                    );
                }
            }
        }
    }
    for m in 0..config.machines {
        let _ = writeln!(toml, "\n[[machines]]\nid = \"{m}\"");
    }
    for (i, a) in cx.actions.iter().enumerate() {
        let at = i + 1;
        match a {
            McAction::Crash => {
                notes.push(format!("step {at} (a crash) is a restart at {at}s"));
                let _ = writeln!(toml, "\n[[events]]\nat = \"{at}s\"\nrestart = true");
            }
            McAction::Die(m) => {
                notes.push(format!("step {at} (machine {m} dies) is at {at}s"));
                let _ = writeln!(
                    toml,
                    "\n[[events]]\nat = \"{at}s\"\nset_life = {{ machine = {:?}, life = \"dead\" }}",
                    m.as_str()
                );
            }
            _ => {}
        }
    }
    let scenario = Scenario::parse(&toml, Format::Toml, "model-check counterexample")?;
    Ok(Replay { toml, scenario, exact: notes.is_empty(), notes })
}
