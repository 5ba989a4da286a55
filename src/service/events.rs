//! The event stream (`GET /v1/events`, server-sent events): every provisioner event as one
//! `data:` line of JSON, to every connected client.
//!
//! [`event_view`] and [`sse_frame`] are the plain core; [`EventHub`] the actor that keeps the
//! connected streams (one channel each), fans events out, drops streams whose client went
//! away (a comment line every 15 s finds them), and closes them all at shutdown so that the
//! HTTP server can stop without waiting for streams that never end.
//!
//! Each client's queue is bounded ([`QUEUE_LIMIT`] frames not yet taken by its connection): a
//! client that stops reading is dropped once its queue is full, with a last `stream-dropped`
//! event telling it to reconnect, so that it costs at most that many frames of memory.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::prelude::*;
use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::model::events::ProvisionerEvent;

/// How often an idle stream gets a comment line (to find clients that went away).
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// The most frames queued for one client (about 150 bytes each) before it is dropped.
pub const QUEUE_LIMIT: usize = 1024;
/// The name of the last event a dropped client gets.
pub const DROPPED: &str = "stream-dropped";

/// One event, as the stream carries it. Fields that do not apply are left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
pub const ROLE_CHANGED: &str = "role-changed";

/// A replica's change of role, sent on its event stream (`message` says why: `acquired`,
/// `refused`, `renew_deadline`, `released`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RoleChanged {
    /// `leader` or `follower`.
    pub role: &'static str,
    /// The epoch.
    pub epoch: Option<i64>,
    /// This replica's id.
    pub replica: String,
    /// Why.
    pub why: &'static str,
}

impl Handler<RoleChanged> for EventHub {
    type Result = ();
    fn handle(&mut self, e: RoleChanged, _ctx: &mut Self::Context) {
        if !self.streams.is_empty() {
            self.broadcast(&sse_frame(&role_view(e)));
        }
    }
}

/// The stream's view of a change of role.
pub fn role_view(e: RoleChanged) -> EventView {
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
    pub fn named(event: &str) -> Self {
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
pub fn event_view(e: &ProvisionerEvent) -> EventView {
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
pub fn sse_frame(v: &EventView) -> String {
    let json = serde_json::to_string(v).unwrap_or_else(|_| "{}".into());
    format!("event: {}\ndata: {json}\n\n", v.event)
}

/// The last frame of a client that fell [`QUEUE_LIMIT`] frames behind.
pub fn dropped_frame() -> String {
    sse_frame(&EventView {
        message: Some(format!(
            "this client fell {QUEUE_LIMIT} events behind and was dropped; reconnect (the events in between are lost)"
        )),
        ..EventView::named(DROPPED)
    })
}

/// One client's queue: the channel, and how many frames in it its connection has not taken.
struct Client {
    tx: UnboundedSender<String>,
    queued: Arc<AtomicUsize>,
}

impl Client {
    /// Queues a frame; `false` when the client is gone, or was dropped because its queue is
    /// full (then its last frame says so).
    fn send(&self, frame: &str) -> bool {
        if self.queued.load(Ordering::SeqCst) >= QUEUE_LIMIT {
            self.queued.fetch_add(1, Ordering::SeqCst);
            let _ = self.tx.unbounded_send(dropped_frame());
            return false;
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.tx.unbounded_send(frame.to_owned()).is_ok()
    }
}

/// A client's side of its stream: the frames, each counted off its queue as it is taken.
pub struct EventStream {
    rx: UnboundedReceiver<String>,
    queued: Arc<AtomicUsize>,
}

impl Stream for EventStream {
    type Item = String;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<String>> {
        let polled = Pin::new(&mut self.rx).poll_next(cx);
        if let Poll::Ready(Some(_)) = &polled {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        polled
    }
}

/// Keeps the connected streams.
#[derive(Default)]
pub struct EventHub {
    streams: BTreeMap<u64, Client>,
    next: u64,
    /// Shutting down: new streams end at once.
    closed: bool,
    /// Clients dropped for falling behind (shared with the metrics).
    dropped: Arc<AtomicU64>,
}

impl EventHub {
    /// The count of clients dropped for falling behind, as it grows.
    pub fn dropped_counter(&self) -> Arc<AtomicU64> {
        self.dropped.clone()
    }

    fn broadcast(&mut self, frame: &str) {
        let dropped = &self.dropped;
        self.streams.retain(|_, client| {
            let kept = client.send(frame);
            if !kept && !client.tx.is_closed() {
                dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(limit = QUEUE_LIMIT, "an event-stream client fell behind and was dropped");
            }
            kept
        });
    }
}

impl Actor for EventHub {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(HEARTBEAT, |hub, _ctx| hub.broadcast(": keep-alive\n\n"));
    }
}

/// Opens a stream: it gets every event from now on (unless it falls too far behind).
#[derive(Message)]
#[rtype(result = "EventStream")]
pub struct OpenStream;

/// Ends every stream (shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseStreams;

impl Handler<OpenStream> for EventHub {
    type Result = MessageResult<OpenStream>;
    fn handle(&mut self, _msg: OpenStream, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let stream = EventStream { rx, queued: queued.clone() };
        if self.closed {
            return MessageResult(stream);
        }
        let client = Client { tx, queued };
        // A first comment line: the client sees the stream is open before any event.
        client.send(": connected\n\n");
        self.next += 1;
        self.streams.insert(self.next, client);
        MessageResult(stream)
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
    use crate::model::{HarvestMode, InstanceId, MachineId};

    #[test]
    fn a_client_that_stops_reading_is_dropped_with_a_last_event() {
        use futures::StreamExt;
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let client = Client { tx, queued: queued.clone() };
        let mut stream = EventStream { rx, queued };
        for i in 0..QUEUE_LIMIT {
            assert!(client.send(&format!("frame {i}\n\n")), "dropped at {i}");
        }
        // Reading one frame makes room for one more.
        assert_eq!(futures::executor::block_on(stream.next()).as_deref(), Some("frame 0\n\n"));
        assert!(client.send("one more\n\n"));
        assert!(!client.send("too many\n\n"), "a full queue drops the client");
        drop(client);
        let rest: Vec<String> = futures::executor::block_on(stream.collect());
        assert_eq!(rest.len(), QUEUE_LIMIT + 1, "the queue held at most its limit, then the last event");
        let last = rest.last().unwrap();
        assert!(last.starts_with("event: stream-dropped\n") && last.contains("reconnect"), "{last}");
    }

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
        let failed =
            ProvisionerEvent::MachineFailed { machine: MachineId::new("1"), message: "no\nroom".into(), zone: None };
        let frame = sse_frame(&event_view(&failed));
        assert_eq!(frame.matches('\n').count(), 3, "a message's newline must not break the frame: {frame:?}");
    }

    #[test]
    fn a_change_of_role_is_one_event_naming_role_epoch_replica_and_why() {
        let e = RoleChanged { role: "leader", epoch: Some(4), replica: "b".into(), why: "acquired" };
        assert_eq!(
            sse_frame(&role_view(e)),
            "event: role-changed\ndata: {\"event\":\"role-changed\",\"message\":\"acquired\",\"role\":\"leader\",\"epoch\":4,\"replica\":\"b\"}\n\n"
        );
    }
}
