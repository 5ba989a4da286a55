//! The deterministic simulator (feature `sim`): runs the real actors against the fake cloud
//! and model on virtual time, from a scenario file, and
//! reports what happened and which invariants broke.
//!
//! Same scenario + same seed = byte-identical JSON report: one thread, a paused clock, seeded
//! RNGs, ordered maps everywhere.

pub mod bench;
mod check;
mod generate;
#[cfg(feature = "mc")]
pub mod mc;
mod plan;
mod report;
mod run;
pub mod scenario;

pub use check::{check, ModeTimeline};
pub use generate::generate;
pub use plan::{plan, MachineNote, Plan, PlannedStart};
pub use report::{CallReport, FleetCost, InstanceReport, MachineReport, ModelReport, ProvisionerReport, Report};
pub use run::{run, SIM_MODEL_UUID};
pub use scenario::{Scenario, ScenarioError};
