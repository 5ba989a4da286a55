//! The event stream (`GET /v1/events`, server-sent events): every provisioner event as one
//! `data:` line of JSON, to every connected client.
//!
//! [`event_view`] and [`sse_frame`] are the plain core; [`EventHub`] the actor that keeps the
//! connected streams (one channel each), fans events out, drops streams whose client went
//! away (a comment line every 15 s finds them), and closes them all at shutdown so that the
//! HTTP server can stop without waiting for streams that never end.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use serde::{Deserialize, Serialize};

use crate::events::ProvisionerEvent;

/// How often an idle stream gets a comment line (to find clients that went away).
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// One event, as the stream carries it. Fields that do not apply are left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
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
}

/// The stream's view of an event.
pub fn event_view(e: &ProvisionerEvent) -> EventView {
    let mut v = EventView {
        event: e.name().to_owned(),
        machine: None,
        instance: None,
        zone: None,
        instances: Vec::new(),
        message: None,
        size: None,
        mode: None,
    };
    match e {
        ProvisionerEvent::ProcessedMachines | ProvisionerEvent::RetriedMachinesWithErrors => {}
        ProvisionerEvent::ResizedWorkerPool { size } => v.size = Some(*size),
        ProvisionerEvent::HarvestModeChanged { mode } => v.mode = Some(mode.to_string()),
        ProvisionerEvent::MachineStarted { machine, instance, zone } => {
            v.machine = Some(machine.to_string());
            v.instance = Some(instance.to_string());
            v.zone = zone.clone();
        }
        ProvisionerEvent::MachineFailed { machine, message } => {
            v.machine = Some(machine.to_string());
            v.message = Some(message.clone());
        }
        ProvisionerEvent::InstancesStopped { instances } | ProvisionerEvent::InstancesReleased { instances } => {
            v.instances = instances.iter().map(ToString::to_string).collect();
        }
        ProvisionerEvent::MachineRemoved { machine } => v.machine = Some(machine.to_string()),
    }
    v
}

/// One server-sent event: `event: NAME`, `data: JSON`, a blank line.
pub fn sse_frame(v: &EventView) -> String {
    let json = serde_json::to_string(v).unwrap_or_else(|_| "{}".into());
    format!("event: {}\ndata: {json}\n\n", v.event)
}

/// Keeps the connected streams.
#[derive(Default)]
pub struct EventHub {
    streams: BTreeMap<u64, UnboundedSender<String>>,
    next: u64,
    /// Shutting down: new streams end at once.
    closed: bool,
}

impl EventHub {
    fn broadcast(&mut self, frame: &str) {
        self.streams.retain(|_, tx| tx.unbounded_send(frame.to_owned()).is_ok());
    }
}

impl Actor for EventHub {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(HEARTBEAT, |hub, _ctx| hub.broadcast(": keep-alive\n\n"));
    }
}

/// Opens a stream: the receiver gets every event from now on.
#[derive(Message)]
#[rtype(result = "UnboundedReceiver<String>")]
pub struct OpenStream;

/// Ends every stream (shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseStreams;

impl Handler<OpenStream> for EventHub {
    type Result = MessageResult<OpenStream>;
    fn handle(&mut self, _msg: OpenStream, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = unbounded();
        if self.closed {
            return MessageResult(rx);
        }
        // A first comment line: the client sees the stream is open before any event.
        let _ = tx.unbounded_send(": connected\n\n".to_owned());
        self.next += 1;
        self.streams.insert(self.next, tx);
        MessageResult(rx)
    }
}

impl Handler<CloseStreams> for EventHub {
    type Result = ();
    fn handle(&mut self, _msg: CloseStreams, _ctx: &mut Self::Context) {
        self.closed = true;
        self.streams.clear();
    }
}

impl Handler<ProvisionerEvent> for EventHub {
    type Result = ();
    fn handle(&mut self, e: ProvisionerEvent, _ctx: &mut Self::Context) {
        if !self.streams.is_empty() {
            self.broadcast(&sse_frame(&event_view(&e)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{HarvestMode, InstanceId, MachineId};

    #[test]
    fn events_become_one_json_data_line_each() {
        let started = ProvisionerEvent::MachineStarted {
            machine: MachineId::new("3"),
            instance: InstanceId::new("i-1"),
            zone: Some("az2".into()),
        };
        let frame = sse_frame(&event_view(&started));
        assert_eq!(
            frame,
            "event: machine-started\ndata: {\"event\":\"machine-started\",\"machine\":\"3\",\"instance\":\"i-1\",\"zone\":\"az2\"}\n\n"
        );
        let mode = event_view(&ProvisionerEvent::HarvestModeChanged { mode: HarvestMode::All });
        assert_eq!(mode.mode.as_deref(), Some("all"));
        let stopped = event_view(&ProvisionerEvent::InstancesStopped { instances: vec![InstanceId::new("i-9")] });
        assert_eq!(stopped.instances, ["i-9"]);
        let failed = ProvisionerEvent::MachineFailed { machine: MachineId::new("1"), message: "no\nroom".into() };
        let frame = sse_frame(&event_view(&failed));
        assert_eq!(frame.matches('\n').count(), 3, "a message's newline must not break the frame: {frame:?}");
    }
}
