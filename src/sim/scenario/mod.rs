//! The scenario file: a TOML or JSON description of a cloud, a model's machines and timed
//! events, which `provisioner simulate` runs on virtual time.
//!
//! - `spec.rs`: the serde types of the file format (every table refuses unknown keys);
//! - `defaults.rs`: what a left-out key means;
//! - `events.rs`: `[[events]]` and [`Action`], mapped onto each other by one table;
//! - `validate.rs`: the checks that need the whole file (ids that exist, one action per event);
//! - `location.rs`: the line of every key, from the parsers' own positions, for the errors.
//!
//! Every error names the file, the line and the field: `file.toml:3: zonez: unknown field ...`.

mod defaults;
mod events;
mod location;
mod spec;
mod units;
mod validate;

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub(crate) use defaults::default_fault_message;
use defaults::default_until;
pub use defaults::PRE_EXISTING_AGE;
pub use events::{Action, EventError, EventSpec};
pub use location::Format;
use location::Locations;
pub use spec::{
    CloudSpec, DerivedZonesSpec, DestroyModelSpec, FailCall, FailNextSpec, FaultSpec, InitFaultSpec, InitialState,
    InstanceSpec, InterruptSpec, LaunchSpec, MachineSpec, ModelSpec, ProvisionerSpec, RateLimitSpec,
    SetConstraintsSpec, SetLifeSpec, SetStatusSpec, SetZonesSpec,
};
pub use units::{format_duration, Dur, Workers};

/// A bad scenario file: which file, which line, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}{}: {field}{message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ScenarioError {
    /// The file.
    pub file: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The field (with `: ` appended), or empty.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The seed (`--seed` overrides).
    #[serde(default)]
    pub seed: u64,
    /// Virtual-time limit.
    #[serde(default = "default_until")]
    pub until: Dur,
    /// Provisioner settings.
    #[serde(default)]
    pub provisioner: ProvisionerSpec,
    /// The simulated cloud.
    #[serde(default)]
    pub cloud: CloudSpec,
    /// The simulated model (an addition to the format).
    #[serde(default, skip_serializing_if = "ModelSpec::is_default")]
    pub model: ModelSpec,
    /// The model's machines at the start.
    #[serde(default)]
    pub machines: Vec<MachineSpec>,
    /// Timed events.
    #[serde(default)]
    pub events: Vec<EventSpec>,
}

impl Scenario {
    /// Reads and validates a scenario file (`.toml` or `.json`).
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let err = |message: String| ScenarioError { file: file.clone(), line: None, field: String::new(), message };
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Format::Toml,
            Some("json") => Format::Json,
            _ => return Err(err("unknown scenario format: the file name must end in .toml or .json".into())),
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        Self::parse(&text, format, &file)
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str, format: Format, file: &str) -> Result<Self, ScenarioError> {
        let loc = Locations::index(text, format);
        let parsed = match format {
            Format::Toml => toml::from_str(text).map_err(|e| (loc.toml_error(&e), e.message().trim().to_owned())),
            Format::Json => serde_json::from_str(text).map_err(|e| {
                let msg = e.to_string();
                let msg = msg.rsplit_once(" at line ").map(|(m, _)| m.to_owned()).unwrap_or(msg);
                (loc.json_error(&e), msg)
            }),
        };
        let scenario: Scenario = parsed.map_err(|((line, key), message)| ScenarioError {
            file: file.to_owned(),
            line,
            field: key.map(|k| format!("{k}: ")).unwrap_or_default(),
            message: if message.is_empty() { format!("invalid {format}") } else { message },
        })?;
        validate::validate(&scenario, &loc, file)?;
        Ok(scenario)
    }

    /// Writes the scenario as TOML (what `--dump-scenario` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write scenario: {e}\n"))
    }

    /// The images a start used up to `at` (issue 34): `[cloud] image`, then each `set_image`
    /// at or before `at`, in order (the last is the image at `at`).
    pub fn images_until(&self, at: Duration) -> Vec<Option<String>> {
        let mut out = vec![self.cloud.image.clone()];
        for (t, a) in self.timeline() {
            if let Action::SetImage(image) = a {
                if t <= at {
                    out.push(Some(image));
                }
            }
        }
        out
    }

    /// The events sorted by time (stable: same-time events keep file order). An event without
    /// exactly one action (only a scenario built in code without validation can have one) is
    /// left out: it has no action to run.
    pub fn timeline(&self) -> Vec<(Duration, Action)> {
        let mut events: Vec<(Duration, Action)> =
            self.events.iter().filter_map(|e| Some((e.at.0, e.action().ok()?))).collect();
        events.sort_by_key(|(at, _)| *at);
        events
    }
}

#[cfg(test)]
mod tests;
