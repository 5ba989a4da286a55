//! The coordinator's decisions outside a batch, as values: what follows a batch, a job's
//! outcome, a harvest-mode change, a finished start. Plain (no actix); the shell carries each
//! [`Followup`] out in order.

use std::time::Duration;

use crate::actors::harvest::ModeChange;
use crate::actors::lifecycle::AfterStart;
use crate::actors::workers::{GivenUp, JobOutcome};
use crate::model::events::ProvisionerEvent;
use crate::model::{CloudInstance, Constraints, DeadMachine, InstanceId, MachineId};

/// One thing to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followup {
    /// Notify these ids again after this delay (a one-shot timer).
    RetryLater {
        /// The delay.
        delay: Duration,
        /// The ids.
        ids: Vec<MachineId>,
    },
    /// Tell the subscribers.
    Publish(ProvisionerEvent),
    /// Stop every instance the dying model's destruction left running.
    SweepDyingModel,
    /// Have the harvest policy plan the unknown instances (if its mode wants them), judged on a
    /// listing at most `fresher_than` old; `announce` publishes `ProcessedMachines` after.
    HarvestUnknown {
        /// Publish `ProcessedMachines` once planned.
        announce: bool,
        /// The listing's maximum age (`None`: the harvest policy's own).
        fresher_than: Option<Duration>,
    },
    /// Stops decided outside a harvest (an orphan, a given-up parked instance): through the
    /// harvest policy into a normal stop job.
    PlanStops {
        /// The instances.
        instances: Vec<InstanceId>,
        /// Dead machines removed once they are stopped.
        remove_after: Vec<MachineId>,
        /// The machine they are tagged for.
        machine: Option<MachineId>,
    },
    /// Extra instances of live machines found on a fresh listing (issue 32): those whose
    /// machine has no start in flight (the lifecycle's say) and that are not released, parked
    /// or being stopped (the harvest policy's) are stopped, whatever the mode.
    StopExtras(Vec<(MachineId, InstanceId)>),
    /// Dead machines marked for removal: every actor forgets them.
    Forget(Vec<MachineId>),
    /// The allocator counts a placement it did not reserve.
    Populate(Vec<(MachineId, String)>),
    /// The registry records the instance a start produced.
    Record {
        /// The machine.
        machine: MachineId,
        /// Its instance (boxed: the other follow-ups are small).
        instance: Box<CloudInstance>,
        /// The constraints it was started with.
        constraints: Option<Box<Constraints>>,
    },
    /// The lifecycle hears a start returned; its answer goes to [`after_start`].
    StartFinished {
        /// The machine.
        machine: MachineId,
        /// The instance the start produced.
        instance: Option<InstanceId>,
        /// The instance it could not record.
        orphan: Option<InstanceId>,
    },
    /// The registry hears these instances are terminated.
    InstancesGone(Vec<InstanceId>),
    /// The harvest policy hears these stops are seen through; the machines that waited for
    /// them go to [`removed`].
    StopsDone(Vec<InstanceId>),
}

/// A fresh periodic listing (after the first batch): the unknown instances' harvest, then the
/// stop of the live machines' extra instances it found (those of a hand-over already left out).
pub fn after_listing(extras: Vec<(MachineId, InstanceId)>) -> Vec<Followup> {
    let mut next = vec![Followup::HarvestUnknown { announce: false, fresher_than: None }];
    if !extras.is_empty() {
        next.push(Followup::StopExtras(extras));
    }
    next
}

/// Machines marked for removal: forgotten, and announced.
pub fn removed(machines: Vec<MachineId>) -> Vec<Followup> {
    if machines.is_empty() {
        return Vec::new();
    }
    let events = machines.iter().map(|m| Followup::Publish(ProvisionerEvent::MachineRemoved { machine: m.clone() }));
    let mut out = vec![Followup::Forget(machines.clone())];
    out.extend(events);
    out
}

/// A dead machine whose parked instance was taken over is removed; one whose parked instance
/// was given up is removed once that instance is stopped.
fn retire(retired: Option<MachineId>, given_up: Option<GivenUp>) -> Vec<Followup> {
    match (retired, given_up) {
        (_, Some(GivenUp { instance, retired })) => {
            vec![Followup::PlanStops { instances: vec![instance], remove_after: vec![retired], machine: None }]
        }
        (Some(old), None) => removed(vec![old]),
        (None, None) => Vec::new(),
    }
}

/// What follows a batch of job outcomes, in their order: one vector, sized once (a start is
/// followed by three or four follow-ups), none made per outcome.
pub fn on_jobs_done(outcomes: Vec<JobOutcome>) -> Vec<Followup> {
    let mut out = Vec::with_capacity(outcomes.len() * 4);
    for outcome in outcomes {
        push_job_done(outcome, &mut out);
    }
    out
}

/// What follows a job's outcome.
#[cfg(test)]
pub fn on_job_done(outcome: JobOutcome) -> Vec<Followup> {
    on_jobs_done(vec![outcome])
}

/// What follows a job's outcome, appended to `out`.
fn push_job_done(outcome: JobOutcome, out: &mut Vec<Followup>) {
    match outcome {
        JobOutcome::Started { machine, instance, constraints, retired, reserved, given_up } => {
            out.extend(retire(retired, given_up));
            if let Some(zone) = instance.zone.as_ref().filter(|_| !reserved) {
                // Adopted and reused instances were never reserved: count them now.
                out.push(Followup::Populate(vec![(machine.clone(), zone.clone())]));
            }
            let event = ProvisionerEvent::MachineStarted {
                machine: machine.clone(),
                instance: instance.id.clone(),
                zone: instance.zone.clone(),
            };
            let id = instance.id.clone();
            out.push(Followup::Record { machine: machine.clone(), instance, constraints });
            out.push(Followup::Publish(event));
            out.push(Followup::StartFinished { machine, instance: Some(id), orphan: None });
        }
        JobOutcome::StartFailed { machine, error, retired, orphan, given_up, zone } => {
            out.extend(retire(retired, given_up));
            // The event says what the machine's status says: the error's text.
            let message = error.to_string();
            out.push(Followup::Publish(ProvisionerEvent::MachineFailed { machine: machine.clone(), message, zone }));
            out.push(Followup::StartFinished { machine, instance: None, orphan });
        }
        JobOutcome::StartAbandoned { machine, given_up } => {
            out.extend(retire(None, given_up));
            out.push(Followup::StartFinished { machine, instance: None, orphan: None });
        }
        JobOutcome::Stopped { instances, machines } => {
            out.push(Followup::InstancesGone(instances.clone()));
            out.push(Followup::StopsDone(instances.clone()));
            out.extend(removed_quietly_first(machines, ProvisionerEvent::InstancesStopped { instances }));
        }
        JobOutcome::Released { instances, machines } => {
            out.extend(removed_quietly_first(machines, ProvisionerEvent::InstancesReleased { instances }))
        }
    }
}

/// The machines forgotten, then `event`, then their removals announced (the order subscribers
/// have always heard).
fn removed_quietly_first(machines: Vec<MachineId>, event: ProvisionerEvent) -> Vec<Followup> {
    let mut out = Vec::new();
    if !machines.is_empty() {
        out.push(Followup::Forget(machines.clone()));
    }
    out.push(Followup::Publish(event));
    out.extend(machines.into_iter().map(|m| Followup::Publish(ProvisionerEvent::MachineRemoved { machine: m })));
    out
}

/// What follows a harvest-mode change the harvest policy applied.
pub fn on_mode_change(change: ModeChange) -> Vec<Followup> {
    let ModeChange::Changed { mode, harvest_unknown } = change else { return Vec::new() };
    tracing::info!(%mode, "harvest mode changed");
    let mut out = vec![Followup::Publish(ProvisionerEvent::HarvestModeChanged { mode })];
    if harvest_unknown {
        out.push(Followup::HarvestUnknown { announce: true, fresher_than: Some(Duration::ZERO) });
    }
    out
}

/// What a finished start leads to, once the lifecycle answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterStartStep {
    /// The machine died while starting: harvest it, with what the start produced.
    PlanDead(DeadMachine),
    /// The model was destroyed while it started: stop what the start produced.
    PlanDestroy(DeadMachine),
    /// Nothing, but for the orphan the start could not record (if any).
    Then(Vec<Followup>),
}

/// Decides what follows a finished start from the lifecycle's answer (`None`: it was not
/// reachable) and the orphan the start could not record: the orphan joins the machine's
/// instances if it died meanwhile (stopped, or released in a mode that keeps instances), or is
/// stopped on its own.
pub fn after_start(answer: Option<AfterStart>, machine: MachineId, orphan: Option<InstanceId>) -> AfterStartStep {
    let with_orphan = |mut d: DeadMachine| {
        if let Some(o) = orphan.clone().filter(|o| d.instance.as_ref() != Some(o) && !d.tagged.contains(o)) {
            d.tagged.push(o);
        }
        d
    };
    match answer {
        Some(AfterStart::StopDeferred { dead }) => {
            let dead = with_orphan(dead);
            tracing::info!(machine = %dead.id, instance = ?dead.instance, "machine died while starting; harvesting its instance");
            AfterStartStep::PlanDead(dead)
        }
        Some(AfterStart::DestroyDeferred { machine }) => {
            let machine = with_orphan(machine);
            tracing::info!(machine = %machine.id, instance = ?machine.instance, "model destroyed while starting; stopping the new instance");
            AfterStartStep::PlanDestroy(machine)
        }
        Some(AfterStart::Again) => {
            tracing::info!(machine = %machine, "machine was asked to start again while its start failed; looking at it again");
            let mut then: Vec<Followup> = orphan
                .map(|o| Followup::PlanStops {
                    instances: vec![o],
                    remove_after: Vec::new(),
                    machine: Some(machine.clone()),
                })
                .into_iter()
                .collect();
            then.push(Followup::RetryLater { delay: Duration::ZERO, ids: vec![machine] });
            AfterStartStep::Then(then)
        }
        Some(AfterStart::Done) | None => AfterStartStep::Then(
            orphan
                .map(|o| Followup::PlanStops { instances: vec![o], remove_after: Vec::new(), machine: Some(machine) })
                .into_iter()
                .collect(),
        ),
    }
}
