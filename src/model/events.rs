//! Events the provisioner publishes to its subscribers.
//!
//! The four Juju events (`processed-machines`, `retried-machines-with-errors`,
//! `resized-worker-pool`, `harvest-mode-changed`) fire after the work they name has been
//! queued, as in Juju; the richer events fire when the cloud or model work is done.

use actix::Message;

use crate::model::{HarvestMode, InstanceId, MachineId};

/// One thing the provisioner did.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum ProvisionerEvent {
    /// A batch of machine changes was processed (its starts and stops queued).
    ProcessedMachines,
    /// Machines with transient errors were queued for another start.
    RetriedMachinesWithErrors,
    /// The broker worker pool was resized.
    ResizedWorkerPool {
        /// The new size.
        size: usize,
    },
    /// The harvest mode changed.
    HarvestModeChanged {
        /// The new mode.
        mode: HarvestMode,
    },
    /// A machine got its instance.
    MachineStarted {
        /// The machine.
        machine: MachineId,
        /// Its instance.
        instance: InstanceId,
        /// The instance's zone.
        zone: Option<String>,
    },
    /// A machine's start failed for good; its status says why.
    MachineFailed {
        /// The machine.
        machine: MachineId,
        /// The error message written to its instance status.
        message: String,
        /// The zone of the cloud call that failed last, when the start ended on one.
        zone: Option<String>,
    },
    /// Instances were terminated.
    InstancesStopped {
        /// The instances.
        instances: Vec<InstanceId>,
    },
    /// Instances were released: left running on purpose and stripped of our identity.
    InstancesReleased {
        /// The instances.
        instances: Vec<InstanceId>,
    },
    /// A dead machine was marked for removal.
    MachineRemoved {
        /// The machine.
        machine: MachineId,
    },
    /// Extra instances of live machines are being stopped (issue 32): each tagged for a live
    /// machine that records another instance (made by a start whose call went unanswered,
    /// after the machine got its instance elsewhere). Stopped whatever the harvest mode;
    /// `instances-stopped` follows once the stop is done.
    ExtraInstances {
        /// The machines they are tagged for, in id order, without repeats.
        machines: Vec<MachineId>,
        /// The instances.
        instances: Vec<InstanceId>,
    },
    /// A harvest pass left unknown instances for later: younger than the grace period, or
    /// beyond the cap on stops per pass (published by the harvest policy with its plan).
    HarvestDeferred {
        /// Unknown instances spared as younger than the grace period.
        spared_by_grace: usize,
        /// Unknown instances held back by the cap on stops per pass.
        held_back_by_cap: usize,
    },
    /// The cloud warned that it takes a machine's instance away (a spot interruption, issue
    /// 33): a replacement is being started (the hand-over).
    MachineInterrupted {
        /// The machine.
        machine: MachineId,
        /// Its interrupted instance.
        instance: InstanceId,
        /// How long the warning gave, if it said.
        warning: Option<std::time::Duration>,
    },
    /// A hand-over's replacement runs: the machine records it, and its interrupted instance is
    /// being stopped (issue 33).
    MachineReplaced {
        /// The machine.
        machine: MachineId,
        /// The interrupted (or, for a repair, the stopped) instance.
        interrupted: InstanceId,
        /// The replacement.
        replacement: InstanceId,
        /// Why it was replaced.
        cause: HandoverCause,
        /// The lead time: from the replacement running to the moment the cloud would take the
        /// interrupted instance (the warning's end), if the warning said when; zero if the
        /// replacement ran only after that.
        lead: Option<std::time::Duration>,
    },
    /// A live machine's recorded instance has been stopped for the model's `repair-after`
    /// (issue 34): the machine is unhealthy (published once per instance).
    MachineUnhealthy {
        /// The machine.
        machine: MachineId,
        /// Its instance.
        instance: InstanceId,
        /// Why: `stopped`.
        reason: String,
        /// For how long, as of the listing that showed it.
        unhealthy_for: std::time::Duration,
        /// Whether a repair may touch it (keep-instance machines are never repaired).
        repairable: bool,
    },
    /// An unhealthy machine's repair began (issue 34): a replacement starts through the
    /// hand-over; `machine-replaced` follows once it runs and the old instance is being stopped.
    MachineRepairing {
        /// The machine.
        machine: MachineId,
        /// Its unhealthy instance.
        instance: InstanceId,
        /// Why it is unhealthy.
        reason: String,
        /// For how long.
        unhealthy_for: std::time::Duration,
    },
    /// A drifted machine's replacement began (issue 34, `replace-drifted`): a replacement
    /// starts through the hand-over; `machine-replaced` follows once it runs.
    MachineDriftReplacing {
        /// The machine.
        machine: MachineId,
        /// Its drifted instance.
        instance: InstanceId,
        /// Why it drifted, each reason as a sentence.
        reasons: Vec<String>,
    },
    /// The drifted machines a listing showed, by reason (issue 34): published when the counts
    /// change while the model replaces drifted machines (the leader judges drift after each
    /// listing then); a machine counts under each of its reasons.
    DriftSeen {
        /// Machines by reason (`instance-type`, `zone`, `tags`), every reason present.
        by_reason: Vec<(&'static str, usize)>,
    },
    /// More machines are unhealthy at once than `repair-max-unhealthy` allows: every repair is
    /// held back (the cloud, not the machines, is probably at fault). Published when the hold
    /// begins, again only after it lifted.
    RepairsHeld {
        /// Machines unhealthy.
        unhealthy: usize,
        /// The cap for the model's machines.
        cap: usize,
    },
}

/// Why a machine's instance was handed over to a replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandoverCause {
    /// The cloud warned it takes the instance away (issue 33).
    Interruption,
    /// The instance stayed stopped past the model's `repair-after` (issue 34).
    Repair,
    /// The instance drifted from what a start would make, and the model replaces drifted
    /// machines (issue 34).
    Drift,
}

impl HandoverCause {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            HandoverCause::Interruption => "interruption",
            HandoverCause::Repair => "repair",
            HandoverCause::Drift => "drift",
        }
    }
}

impl ProvisionerEvent {
    /// The event's name: Juju's for the four Juju events, kebab-case for the others.
    pub fn name(&self) -> &'static str {
        match self {
            ProvisionerEvent::ProcessedMachines => "processed-machines",
            ProvisionerEvent::RetriedMachinesWithErrors => "retried-machines-with-errors",
            ProvisionerEvent::ResizedWorkerPool { .. } => "resized-worker-pool",
            ProvisionerEvent::HarvestModeChanged { .. } => "harvest-mode-changed",
            ProvisionerEvent::MachineStarted { .. } => "machine-started",
            ProvisionerEvent::MachineFailed { .. } => "machine-failed",
            ProvisionerEvent::InstancesStopped { .. } => "instances-stopped",
            ProvisionerEvent::InstancesReleased { .. } => "instances-released",
            ProvisionerEvent::MachineRemoved { .. } => "machine-removed",
            ProvisionerEvent::HarvestDeferred { .. } => "harvest-deferred",
            ProvisionerEvent::ExtraInstances { .. } => "extra-instances",
            ProvisionerEvent::MachineInterrupted { .. } => "machine-interrupted",
            ProvisionerEvent::MachineReplaced { .. } => "machine-replaced",
            ProvisionerEvent::MachineUnhealthy { .. } => "machine-unhealthy",
            ProvisionerEvent::MachineRepairing { .. } => "machine-repairing",
            ProvisionerEvent::RepairsHeld { .. } => "repairs-held",
            ProvisionerEvent::DriftSeen { .. } => "drift-seen",
            ProvisionerEvent::MachineDriftReplacing { .. } => "machine-drift-replacing",
        }
    }
}
