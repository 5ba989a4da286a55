//! The harvest policy actor: owns the harvest mode, safe mode and the set of released
//! instances, and decides which instances to stop by harvest mode.
//!
//! Live machines' extra instances (issue 32: made by a start whose call went unanswered, after
//! the machine got its instance elsewhere) are stopped whatever the mode (`PlanExtras`): the
//! modes govern instances the provisioner does not know, and it knows these for duplicates of
//! its own making. Released and parked instances are never among them.
//!
//! Safe mode: until the first full machine notification has been processed the cache is incomplete,
//! so nothing unknown is harvested and a mode change waits (Juju's safe mode before the first
//! batch).

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::HarvestPolicy;
pub use messages::{
    ClaimReusable, EndSafeMode, GetHarvestMode, PlanDeadMachines, PlanDestroy, PlanExtras, PlanStops, PlanUnknown,
    SetHarvestMode, StopsDone,
};
pub use state::{HarvestBook, HarvestPlan, HarvestSafety, ModeChange, UnknownInstance};
