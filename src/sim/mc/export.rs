//! A counterexample as a scenario file (issue 35): `provisioner simulate` replays it on the
//! real actors, the fake cloud and the invariant checker.
//!
//! The checker's faults become the scenario's: each machine's start calls, in the order the
//! path makes them, become its `[[cloud.faults]]` (a call that lands and loses its answer a
//! `lost_response` fault, a refused call a zone-specific one), consumed by the fake cloud in
//! the same order; a crash becomes a `restart` event and a death a `set_life` event, each at
//! its step's position in the path (one second a step), an added machine an `add_machine`
//! event at its step, a batched call's faults its members' (a lost answer the first member's, a
//! refusal every member's); a warning of an interruption an
//! `interrupt` event at its step, its warning running until the path's cloud takes the instance
//! (or past the path's end); a failed listing a `fail_next` of
//! `all_instances` at its step, a change of the harvest mode a `set_harvest_mode` event at its
//! step (the configuration's first mode `[provisioner] harvest_mode`), a destruction a `destroy_model` event at its step (starts then
//! last the whole path, so that one begun before it is in flight at it), the model's refusals of records a `fail_next` of
//! `set_instance_info` from the start, a retry a `retry_provisioning` event at its step; periodic listings come every second
//! (`resync_interval`), and stops take long enough to be in flight at the next steps
//! (`stop_latency`, when the path retries a machine). The mutations carry over
//! (`[provisioner] mutations`). Timing in the simulator is the actors' own, so a path whose
//! violation depends on where a crash or a death falls between two steps is replayed as
//! closely as time allows, and the replay says so (`exact: false`). A configuration of the
//! service's protocol (`McConfig::service`: the lease, start intents, calls on the wire) has
//! no scenario: the simulator runs the engine alone.

use std::fmt::Write;

use super::action::{CallOutcome, ListOutcome, McAction};
use super::config::{Counterexample, McConfig};
use super::world::World;
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
    if config.service {
        // The simulator runs the engine alone: no lease, no replicas, no intents.
        return Err(ScenarioError {
            file: "model-check counterexample".into(),
            line: None,
            field: String::new(),
            message: format!(
                "configuration {:?} checks the service's protocol (the lease, start intents, calls on the wire), \
                 which the simulator does not run: its counterexamples are read as printed",
                config.name
            ),
        });
    }
    let mut notes = Vec::new();
    let mut toml = String::new();
    let _ = writeln!(toml, "# A counterexample of the model checker (issue 35), configuration {:?}:", config.name);
    let _ = writeln!(toml, "# property {:?} broken after {} steps.", cx.property, cx.actions.len());
    for b in &cx.broken {
        let _ = writeln!(toml, "# {b}");
    }
    let _ = writeln!(toml, "name = {:?}", format!("model check: {}", cx.property));
    let _ = writeln!(toml, "until = \"{}s\"", cx.actions.len() + 600);
    // A crash that comes after a call lost its answer and before the start called again: the
    // start's wait before its next call spans the rest of the path, so the crash falls in it.
    let waits = cx.actions.iter().enumerate().any(|(i, a)| {
        matches!(a, McAction::Crash)
            && cx.actions[..i].iter().enumerate().any(|(j, b)| match b {
                McAction::Call(m, CallOutcome::LosesAnswer) => {
                    !cx.actions[j + 1..i].iter().any(|c| matches!(c, McAction::Call(n, _) if n == m))
                }
                _ => false,
            })
    });
    let retry_delay = if waits { cx.actions.len() } else { 0 };
    if waits {
        notes.push(format!("a start waits {retry_delay}s before it calls again after a lost answer, across the crash"));
    }
    let _ = writeln!(toml, "\n[provisioner]\nretry_count = {}\nretry_delay = \"{retry_delay}s\"", config.retry_count);
    if config.batch_size > 1 {
        let _ = writeln!(toml, "batch_starts = true\nbatch_size = {}", config.batch_size);
        notes
            .push("the simulator's pool closes a batch when its start token is granted: its batches may differ".into());
    }
    if config.harvest_mode != crate::model::HarvestMode::default() {
        let _ = writeln!(toml, "harvest_mode = {:?}", config.harvest_mode.as_str());
    }
    if cx.actions.contains(&McAction::GracePasses) {
        notes.push("the grace period is one second, not the path's step at which it passes".into());
        let _ = writeln!(toml, "harvest_grace = \"1s\"");
    }
    let lists = cx.actions.iter().any(|a| matches!(a, McAction::List));
    if lists {
        notes.push("periodic listings come every second, not at the path's steps".into());
        let _ = writeln!(toml, "resync_interval = \"1s\"");
    }
    if !config.mutations.none() {
        let m = toml::to_string(&config.mutations).unwrap_or_default();
        let inline = m.trim().replace('\n', ", ");
        let _ = writeln!(toml, "mutations = {{ {inline} }}");
    }
    let zones: Vec<String> = config.zones.iter().map(|z| format!("{z:?}")).collect();
    // With a destruction in the path, starts take the whole path: a start begun before it is
    // still in flight at it, as in the path.
    let destroys = cx.actions.contains(&McAction::Destroy);
    let start_latency = if destroys { cx.actions.len() } else { 1 };
    if destroys {
        notes.push(format!("starts take {start_latency}s, in flight at the destruction"));
    }
    let _ = writeln!(toml, "\n[cloud]\nzones = [{}]\nstart_latency = \"{start_latency}s\"", zones.join(", "));
    if cx.actions.iter().any(|a| matches!(a, McAction::Retry(_))) {
        // A retry meets the stops of the path still in flight, as in the path.
        let _ = writeln!(toml, "stop_latency = \"{}s\"", cx.actions.len());
    }
    // Each machine's calls, in order: a single call its own; a batched call one for each
    // member (its answer lost: the first member's fault loses the whole call's answer, as in
    // the fake cloud; refused: every member's). The path's last step lands its call either
    // way: an answer lost there changes nothing the path shows, and is replayed as a call
    // that lands.
    let last = cx.actions.len().saturating_sub(1);
    let mut per_machine: std::collections::BTreeMap<String, Vec<CallOutcome>> = Default::default();
    let mut walk = World::new(config);
    for (i, a) in cx.actions.iter().enumerate() {
        let landed = |o: CallOutcome| if i == last && o == CallOutcome::LosesAnswer { CallOutcome::Lands } else { o };
        match a {
            McAction::Call(m, outcome) => per_machine.entry(m.to_string()).or_default().push(landed(*outcome)),
            McAction::BatchCall(b, outcome) => {
                for (k, m) in walk.batch_members(*b).iter().enumerate() {
                    let own = match landed(*outcome) {
                        CallOutcome::LosesAnswer if k > 0 => CallOutcome::Lands,
                        o => o,
                    };
                    per_machine.entry(m.to_string()).or_default().push(own);
                }
            }
            _ => {}
        }
        walk.step(a);
    }
    for m in 0..config.machines {
        let id = m.to_string();
        let calls = per_machine.remove(&id).unwrap_or_default();
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
    for m in 0..config.machines.saturating_sub(config.adds) {
        let _ = writeln!(toml, "\n[[machines]]\nid = \"{m}\"");
    }
    // The records that succeed before the path's first refusal of one, and whether each failed
    // listing is the first of its provisioner (found by walking the path: a start's step that
    // answers its record question is a record that succeeded).
    let mut records_before_refusal = 0;
    let mut refused = false;
    let mut first_listing = Vec::new();
    let mut world = World::new(config);
    for a in &cx.actions {
        match a {
            McAction::RecordFails(_) => refused = true,
            McAction::Start(m) if !refused && world.asks_record(m) => records_before_refusal += 1,
            _ => {}
        }
        first_listing.push(!world.listing_loaded());
        world.step(a);
    }
    // The events, by time and then in order (a failed first listing before its restart).
    let mut events: Vec<(usize, u8, String)> = Vec::new();
    let mut refusals_written = false;
    let mut last_crash = 0;
    for (i, a) in cx.actions.iter().enumerate() {
        let at = i + 1;
        match a {
            McAction::Crash => {
                last_crash = at;
                notes.push(format!("step {at} (a crash) is a restart at {at}s"));
                events.push((at, 1, "restart = true".into()));
            }
            McAction::BatchListingFails | McAction::Listed(ListOutcome::Fails) => {
                // The simulator's provisioner lists first for its first refresh, right as it
                // starts: a failed listing before the provisioner's first is that one.
                let when = if first_listing[i] { last_crash } else { at };
                notes.push(format!("step {at} (a failed listing) fails the next listing from {when}s"));
                let fail = "fail_next = { call = \"all_instances\", times = 1, message = \"RequestLimitExceeded: the listing failed\" }";
                events.push((when, 0, fail.into()));
            }
            // The model's refusals of records: the fake model fails the next records from the
            // start (exact while no record succeeded before the first refusal).
            McAction::RecordFails(_) if !refusals_written => {
                refusals_written = true;
                let times = cx.actions.iter().filter(|a| matches!(a, McAction::RecordFails(_))).count();
                if records_before_refusal > 0 {
                    notes.push(format!(
                        "{records_before_refusal} records succeed before the first refusal: the scenario fails the first {times}"
                    ));
                }
                let fail = format!(
                    "fail_next = {{ call = \"set_instance_info\", times = {times}, message = \"the model refused the write\" }}"
                );
                events.push((0, 0, fail));
            }
            McAction::Retry(m) => {
                notes.push(format!("step {at} (machine {m} retried) is at {at}s"));
                events.push((at, 1, format!("retry_provisioning = [{:?}]", m.as_str())));
            }
            McAction::Destroy => {
                notes.push(format!("step {at} (the model destroyed) is at {at}s"));
                events.push((at, 1, "destroy_model = { force = false }".into()));
            }
            McAction::Warn(id) => {
                // The warning runs until the path's cloud takes the instance, or past its end.
                let taken = cx.actions[i..].iter().position(|b| matches!(b, McAction::Reclaim(r) if r == id));
                let warning = taken.unwrap_or(cx.actions.len() - i + 60).max(1);
                notes.push(format!("step {at} (instance {id} warned) is at {at}s, its warning {warning}s"));
                events.push((
                    at,
                    1,
                    format!("interrupt = {{ instance = {:?}, warning = \"{warning}s\" }}", id.as_str()),
                ));
            }
            McAction::ChangeMode(mode) => {
                notes.push(format!("step {at} (the harvest mode set to {mode}) is at {at}s"));
                events.push((at, 1, format!("set_harvest_mode = {:?}", mode.as_str())));
            }
            McAction::Add(m) => {
                notes.push(format!("step {at} (machine {m} added) is at {at}s"));
                events.push((at, 1, format!("add_machine = {{ id = {:?} }}", m.as_str())));
            }
            McAction::Die(m) => {
                notes.push(format!("step {at} (machine {m} dies) is at {at}s"));
                events.push((at, 1, format!("set_life = {{ machine = {:?}, life = \"dead\" }}", m.as_str())));
            }
            _ => {}
        }
    }
    events.sort_by_key(|(at, order, _)| (*at, *order));
    for (at, _, event) in events {
        let _ = writeln!(toml, "\n[[events]]\nat = \"{at}s\"\n{event}");
    }
    let scenario = Scenario::parse(&toml, Format::Toml, "model-check counterexample")?;
    Ok(Replay { toml, scenario, exact: notes.is_empty(), notes })
}
