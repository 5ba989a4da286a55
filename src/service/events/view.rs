//! What an event stream carries: [`EventView`], one event as JSON, and the server-sent
//! frames around it (an event, the last frame of a dropped stream, of an idle one, of a
//! revoked token's). Plain: no actor here.

use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::model::events::{HandoverCause, ProvisionerEvent};

/// How often an idle stream gets a comment line (to find clients that went away).
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(15);
/// The most frames queued for one client (about 150 bytes each) before it is dropped.
pub(crate) const QUEUE_LIMIT: usize = 1024;
/// The name of the last event a dropped client gets.
pub(crate) const DROPPED: &str = "stream-dropped";
/// The name of the last event of a stream whose token was revoked.
pub(crate) const REVOKED: &str = "token-revoked";
/// One event, as the stream carries it. Fields that do not apply are left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct EventView {
    /// `machine-started`, `machine-failed`, `instances-stopped`, ...
    pub event: String,
    /// The machine it concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The instance it produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The instance's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The instances it stopped or released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
    /// Why a start failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The pool's new size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// The new harvest mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `role-changed` (replicas): this replica's new role, `leader` or `follower`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `role-changed`: the lease's epoch (the new one when leading, the lost one otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// `role-changed`: this replica's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// The name of the event a replica's change of role sends.
pub(crate) const ROLE_CHANGED: &str = "role-changed";

/// A replica's change of role, sent on its event stream (`message` says why: `acquired`,
/// `refused`, `renew_deadline`, `released`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub(crate) struct RoleChanged {
    /// `leader` or `follower`.
    pub role: &'static str,
    /// The epoch.
    pub epoch: Option<i64>,
    /// This replica's id.
    pub replica: String,
    /// Why.
    pub why: &'static str,
}

/// The stream's view of a change of role.
pub(crate) fn role_view(e: RoleChanged) -> EventView {
    EventView {
        role: Some(e.role.to_owned()),
        epoch: e.epoch,
        replica: Some(e.replica),
        message: Some(e.why.to_owned()),
        ..EventView::named(ROLE_CHANGED)
    }
}

impl EventView {
    /// An event with this name and no other field.
    pub(crate) fn named(event: &str) -> Self {
        Self {
            event: event.to_owned(),
            machine: None,
            instance: None,
            zone: None,
            instances: Vec::new(),
            message: None,
            size: None,
            mode: None,
            role: None,
            epoch: None,
            replica: None,
        }
    }
}

/// The stream's view of an event.
pub(crate) fn event_view(e: &ProvisionerEvent) -> EventView {
    let mut v = EventView::named(e.name());
    match e {
        ProvisionerEvent::ProcessedMachines | ProvisionerEvent::RetriedMachinesWithErrors => {}
        ProvisionerEvent::ResizedWorkerPool { size } => v.size = Some(*size),
        ProvisionerEvent::HarvestModeChanged { mode } => v.mode = Some(mode.to_string()),
        ProvisionerEvent::MachineStarted { machine, instance, zone } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            v.zone = zone.clone();
        }
        ProvisionerEvent::MachineFailed { machine, message, zone } => {
            v.machine = Some(machine.to_string());
            v.message = Some(message.clone());
            v.zone = zone.clone();
        }
        ProvisionerEvent::InstancesStopped { instances } | ProvisionerEvent::InstancesReleased { instances } => {
            v.instances = instances.iter().map(ToString::to_string).collect();
        }
        ProvisionerEvent::MachineRemoved { machine } => v.machine = Some(machine.to_string()),
        ProvisionerEvent::ExtraInstances { machines, instances } => {
            v.instances = instances.iter().map(ToString::to_string).collect();
            let machines: Vec<&str> = machines.iter().map(|m| m.as_str()).collect();
            v.message = Some(format!("stopping extra instances of live machines {}", machines.join(", ")));
        }
        ProvisionerEvent::MachineInterrupted { machine, instance, warning } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            v.message = Some(match warning {
                Some(w) => {
                    format!("the cloud takes instance {instance} away in {}s: starting a replacement", w.as_secs())
                }
                None => format!("the cloud takes instance {instance} away: starting a replacement"),
            });
        }
        ProvisionerEvent::MachineReplaced { machine, interrupted, replacement, lead, cause } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(replacement.to_string());
            v.instances = vec![interrupted.to_string()];
            v.message = Some(match lead {
                _ if *cause == HandoverCause::Repair => {
                    format!("replacement {replacement} runs; stopping unhealthy instance {interrupted}")
                }
                _ if *cause == HandoverCause::Drift => {
                    format!("replacement {replacement} runs; stopping drifted instance {interrupted}")
                }
                Some(l) => format!(
                    "replacement {replacement} runs {:.1}s before the cloud takes {interrupted}; stopping it",
                    l.as_secs_f64()
                ),
                None => format!("replacement {replacement} runs; stopping interrupted instance {interrupted}"),
            });
        }
        ProvisionerEvent::MachineUnhealthy { machine, instance, reason, unhealthy_for, repairable } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            let what = if *repairable { "" } else { " (keep-instance: never repaired)" };
            v.message = Some(format!(
                "unhealthy: instance {instance} {reason} for {}{what}",
                humantime::format_duration(std::time::Duration::from_secs(unhealthy_for.as_secs()))
            ));
        }
        ProvisionerEvent::MachineRepairing { machine, instance, reason, unhealthy_for } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            v.message = Some(format!(
                "repairing: instance {instance} {reason} for {}; starting a replacement",
                humantime::format_duration(std::time::Duration::from_secs(unhealthy_for.as_secs()))
            ));
        }
        ProvisionerEvent::MachineDriftReplacing { machine, instance, reasons } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            v.message = Some(format!("replacing drifted instance {instance}: {}", reasons.join("; ")));
        }
        ProvisionerEvent::DriftSeen { by_reason } => {
            let parts: Vec<String> = by_reason.iter().map(|(k, n)| format!("{n} {k}")).collect();
            v.message = Some(format!("drifted machines by reason: {}", parts.join(", ")));
        }
        ProvisionerEvent::RepairsHeld { unhealthy, cap } => {
            v.message = Some(format!(
                "repairs held back: {unhealthy} machines unhealthy at once, more than repair-max-unhealthy allows \
                 ({cap}); the cloud, not the machines, is probably at fault"
            ));
        }
        ProvisionerEvent::HarvestDeferred { spared_by_grace, held_back_by_cap } => {
            v.message = Some(format!(
                "{spared_by_grace} unknown instances spared (younger than the grace period), {held_back_by_cap} held \
                 back by the cap on stops per pass"
            ));
        }
    }
    v
}

/// One server-sent event: `event: NAME`, `data: JSON`, a blank line.
pub(crate) fn sse_frame(v: &EventView) -> String {
    let json = serde_json::to_string(v).unwrap_or_else(|_| "{}".into());
    format!("event: {}\ndata: {json}\n\n", v.event)
}

/// The last frame of a client that fell [`QUEUE_LIMIT`] frames behind.
pub(crate) fn dropped_frame() -> String {
    sse_frame(&EventView {
        message: Some(format!(
            "this client fell {QUEUE_LIMIT} events behind and was dropped; reconnect (the events in between are lost)"
        )),
        ..EventView::named(DROPPED)
    })
}

/// The last frame of a client none of whose waiting frames could be written for `idle`.
pub(crate) fn idle_frame(idle: Duration) -> String {
    sse_frame(&EventView {
        message: Some(format!(
            "no event could be written to this client for {}, so it was dropped; reconnect (the events in between \
             are lost)",
            humantime::format_duration(idle)
        )),
        ..EventView::named(DROPPED)
    })
}

/// The last frame of a stream whose token was revoked.
pub(crate) fn revoked_frame(token: &str) -> String {
    sse_frame(&EventView {
        message: Some(format!(
            "the API token {token} was revoked: this stream ends, and every request with the token is refused"
        )),
        ..EventView::named(REVOKED)
    })
}
