//! The event stream (`GET /v1/events`, server-sent events): every provisioner event as one
//! `data:` line of JSON, to every connected client.
//!
//! [`event_view`] and [`sse_frame`] are the plain core; [`EventHub`] the actor that keeps the
//! connected streams (one channel each), fans events out, drops streams whose client went
//! away (a comment line every 15 s finds them), and closes them all at shutdown so that the
//! HTTP server can stop without waiting for streams that never end.
//!
//! Each client's queue is bounded ([`QUEUE_LIMIT`] frames not yet taken by its connection): a
//! client that stops reading is dropped once its queue is full, or once frames have waited for
//! it and none could be written for `[events] idle_timeout` (60 s), with a last
//! `stream-dropped` event telling it to reconnect, so that it costs at most that many frames of
//! memory.
//!
//! [`StreamGate`] is the replica's one gate of every model's streams: it admits a stream only
//! within the caps (`[events] max_streams_per_token`, `max_streams`; beyond them the API
//! answers 429), and ends the streams of a revoked token with a last `token-revoked` event: at
//! once for a revocation made through this replica, and within [`REVOCATION_CHECK`] for one
//! made through another (it re-reads the tokens holding streams that often). The decisions are
//! [`crate::service::streams`]'s.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::prelude::*;
use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::channel::oneshot;
use futures::{FutureExt, Stream};
use serde::{Deserialize, Serialize};

use crate::model::events::ProvisionerEvent;
use crate::service::settings::EventsSettings;
use crate::service::store::Store;
use crate::service::streams::{IdleWatch, StreamBook, StreamRefused};

/// How often an idle stream gets a comment line (to find clients that went away).
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// The most frames queued for one client (about 150 bytes each) before it is dropped.
pub const QUEUE_LIMIT: usize = 1024;
/// The name of the last event a dropped client gets.
pub const DROPPED: &str = "stream-dropped";
/// The name of the last event of a stream whose token was revoked.
pub const REVOKED: &str = "token-revoked";
/// How often the gate re-reads the tokens that hold streams (to end a revoked one's streams
/// when it was revoked through another replica).
pub const REVOCATION_CHECK: Duration = Duration::from_millis(500);

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

/// The last frame of a client none of whose waiting frames could be written for `idle`.
pub fn idle_frame(idle: Duration) -> String {
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
pub fn revoked_frame(token: &str) -> String {
    sse_frame(&EventView {
        message: Some(format!(
            "the API token {token} was revoked: this stream ends, and every request with the token is refused"
        )),
        ..EventView::named(REVOKED)
    })
}

/// One client's queue: the channel, how many frames in it its connection has not taken, how
/// many were queued in all, and whether it takes them.
struct Client {
    tx: UnboundedSender<String>,
    queued: Arc<AtomicUsize>,
    sent: u64,
    watch: IdleWatch,
}

impl Client {
    fn new(tx: UnboundedSender<String>, queued: Arc<AtomicUsize>) -> Self {
        Self { tx, queued, sent: 0, watch: IdleWatch::new(actix_rt::time::Instant::now()) }
    }

    /// Queues a frame; `false` when the client is gone, or was dropped because its queue is
    /// full (then its last frame says so).
    fn send(&mut self, frame: &str) -> bool {
        if self.queued.load(Ordering::SeqCst) >= QUEUE_LIMIT {
            self.last(dropped_frame());
            return false;
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.unbounded_send(frame.to_owned()).is_ok();
        self.sent += u64::from(sent);
        sent
    }

    /// Queues the last frame, past the limit.
    fn last(&self, frame: String) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.unbounded_send(frame);
    }

    /// Whether none of the frames waiting for the client was taken for `limit`.
    fn idle(&mut self, now: actix_rt::time::Instant, limit: Duration) -> bool {
        let waiting = self.queued.load(Ordering::SeqCst);
        let taken = self.sent.saturating_sub(waiting as u64);
        self.watch.idle(taken, waiting, now, limit)
    }
}

/// A client's side of its stream: the frames, each counted off its queue as it is taken; the
/// gate's word to end it (a revoked token), and its place in the gate's count (let go with it).
pub struct EventStream {
    rx: UnboundedReceiver<String>,
    queued: Arc<AtomicUsize>,
    end: Option<oneshot::Receiver<String>>,
    ended: bool,
    _ticket: Option<Ticket>,
}

impl EventStream {
    fn new(rx: UnboundedReceiver<String>, queued: Arc<AtomicUsize>, ticket: Option<Ticket>) -> Self {
        let (end, ticket) = match ticket {
            Some(mut t) => (t.end.take(), Some(t)),
            None => (None, None),
        };
        Self { rx, queued, end, ended: false, _ticket: ticket }
    }
}

impl Stream for EventStream {
    type Item = String;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<String>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(end) = self.end.as_mut() {
            match end.poll_unpin(cx) {
                // Its last frame, then the end (whatever is still queued is not sent).
                Poll::Ready(Ok(last)) => {
                    self.ended = true;
                    return Poll::Ready(Some(last));
                }
                Poll::Ready(Err(oneshot::Canceled)) => self.end = None,
                Poll::Pending => {}
            }
        }
        let polled = Pin::new(&mut self.rx).poll_next(cx);
        if let Poll::Ready(Some(_)) = &polled {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        polled
    }
}

/// Keeps the connected streams.
pub struct EventHub {
    streams: BTreeMap<u64, Client>,
    next: u64,
    /// Shutting down: new streams end at once.
    closed: bool,
    /// Clients dropped for falling behind (shared with the metrics).
    dropped: Arc<AtomicU64>,
    /// How long frames may wait with none taken before the client is dropped.
    idle: Duration,
}

impl EventHub {
    /// No stream yet; a client none of whose waiting frames is taken for `idle` is dropped.
    pub fn new(idle: Duration) -> Self {
        Self { streams: BTreeMap::new(), next: 0, closed: false, dropped: Arc::default(), idle }
    }

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

    /// Drops the clients that took none of their waiting frames for the idle limit.
    fn drop_idle(&mut self) {
        let (now, idle, dropped) = (actix_rt::time::Instant::now(), self.idle, &self.dropped);
        self.streams.retain(|_, client| {
            if !client.idle(now, idle) {
                return !client.tx.is_closed();
            }
            client.last(idle_frame(idle));
            dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(idle = %humantime::format_duration(idle), "an idle event-stream client was dropped");
            false
        });
    }
}

impl Actor for EventHub {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(HEARTBEAT, |hub, _ctx| hub.broadcast(": keep-alive\n\n"));
        // Checked four times per limit, at least every second (a client is found idle within
        // one check of the limit).
        let every = (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        ctx.run_interval(every, |hub, _ctx| hub.drop_idle());
    }
}

/// Opens a stream: it gets every event from now on (unless it falls too far behind, or the
/// gate ends it); the ticket is its place in the gate's count.
#[derive(Message)]
#[rtype(result = "EventStream")]
pub struct OpenStream(pub Option<Ticket>);

/// Ends every stream (shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseStreams;

impl Handler<OpenStream> for EventHub {
    type Result = MessageResult<OpenStream>;
    fn handle(&mut self, OpenStream(ticket): OpenStream, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let stream = EventStream::new(rx, queued.clone(), ticket);
        if self.closed {
            return MessageResult(stream);
        }
        let mut client = Client::new(tx, queued);
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

/// A stream's place in the gate's count: let go (its stream dropped) it makes room.
pub struct Ticket {
    id: u64,
    gate: Recipient<Release>,
    end: Option<oneshot::Receiver<String>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.do_send(Release(self.id));
    }
}

/// The replica's gate of every model's event streams (see the module's documentation).
pub struct StreamGate {
    book: StreamBook,
    /// Each open stream's word to end (given once).
    ends: BTreeMap<u64, oneshot::Sender<String>>,
    /// The service's store, where the tokens are.
    store: Store,
    /// A re-read of the tokens is in flight.
    checking: bool,
}

impl StreamGate {
    /// No stream open; the caps are `limits`'; tokens are read from `store`.
    pub fn new(limits: EventsSettings, store: Store) -> Self {
        Self { book: StreamBook::new(limits), ends: BTreeMap::new(), store, checking: false }
    }

    /// Ends the streams of the tokens in `revoked`, each with its last frame.
    fn end(&mut self, revoked: &std::collections::BTreeSet<String>) {
        for (id, token) in self.book.end_revoked(revoked) {
            if let Some(end) = self.ends.remove(&id) {
                let _ = end.send(revoked_frame(&token));
            }
        }
    }

    /// Re-reads the tokens that hold streams (one read at a time, bounded).
    fn check(&mut self, ctx: &mut Context<Self>) {
        let holding = self.book.tokens_to_check();
        if self.checking || holding.is_empty() {
            return;
        }
        self.checking = true;
        let read = self.store.read(|s| s.tokens());
        let bounded = actix_rt::time::timeout(REVOCATION_CHECK * 4, read);
        ctx.spawn(bounded.into_actor(self).map(move |read, gate, _ctx| {
            gate.checking = false;
            match read {
                Ok(Ok(tokens)) => {
                    let revoked =
                        tokens.into_iter().filter(|t| t.revoked.is_some() && holding.contains(&t.id)).map(|t| t.id);
                    gate.end(&revoked.collect());
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "event streams: the tokens could not be read"),
                Err(_) => tracing::debug!("event streams: the tokens' read timed out"),
            }
        }));
    }
}

impl Actor for StreamGate {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(REVOCATION_CHECK, StreamGate::check);
    }
}

/// Admits a stream for the token with this id, within the caps.
#[derive(Message)]
#[rtype(result = "Result<Ticket, StreamRefused>")]
pub struct Admit(pub String);

/// A stream is gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release(pub u64);

/// The token with this id was revoked (through this replica): its streams end now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Revoked(pub String);

impl Handler<Admit> for StreamGate {
    type Result = Result<Ticket, StreamRefused>;
    fn handle(&mut self, Admit(token): Admit, ctx: &mut Self::Context) -> Self::Result {
        let id = self.book.admit(&token)?;
        let (tx, rx) = oneshot::channel();
        self.ends.insert(id, tx);
        Ok(Ticket { id, gate: ctx.address().recipient(), end: Some(rx) })
    }
}

impl Handler<Release> for StreamGate {
    type Result = ();
    fn handle(&mut self, Release(id): Release, _ctx: &mut Self::Context) {
        self.book.release(id);
        self.ends.remove(&id);
    }
}

impl Handler<Revoked> for StreamGate {
    type Result = ();
    fn handle(&mut self, Revoked(token): Revoked, _ctx: &mut Self::Context) {
        self.end(&std::collections::BTreeSet::from([token]));
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
        let mut client = Client::new(tx, queued.clone());
        let mut stream = EventStream::new(rx, queued, None);
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

    #[actix_rt::test]
    async fn a_client_that_takes_no_waiting_frame_for_the_idle_limit_is_dropped_with_a_last_event() {
        use futures::StreamExt;
        tokio::time::pause();
        let idle = Duration::from_secs(60);
        let mut hub = EventHub::new(idle);
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        hub.streams.insert(1, Client::new(tx, queued.clone()));
        let mut stream = EventStream::new(rx, queued, None);
        // Nothing waits for it: never idle.
        tokio::time::advance(idle * 2).await;
        hub.drop_idle();
        hub.broadcast("frame 1\n\n");
        tokio::time::advance(idle / 2).await;
        hub.drop_idle();
        // It takes a frame: the clock starts again at the next check.
        assert_eq!(stream.next().await.as_deref(), Some("frame 1\n\n"));
        hub.broadcast("frame 2\n\n");
        tokio::time::advance(idle / 2).await;
        hub.drop_idle();
        tokio::time::advance(idle - Duration::from_secs(1)).await;
        hub.drop_idle();
        assert_eq!(hub.streams.len(), 1, "frame 2 waited less than the limit");
        assert_eq!(hub.dropped.load(Ordering::Relaxed), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        hub.drop_idle();
        assert!(hub.streams.is_empty(), "frame 2 waited the limit with nothing taken");
        assert_eq!(hub.dropped.load(Ordering::Relaxed), 1);
        let rest: Vec<String> = stream.collect().await;
        assert_eq!(rest.len(), 2, "{rest:?}");
        assert_eq!(rest[0], "frame 2\n\n");
        assert!(
            rest[1].starts_with("event: stream-dropped\n")
                && rest[1].contains("for 1m")
                && rest[1].contains("reconnect")
        );
    }

    /// Keeps the ids of the tickets let go.
    #[derive(Default)]
    struct Sink(Vec<u64>);
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<Release> for Sink {
        type Result = ();
        fn handle(&mut self, Release(id): Release, _ctx: &mut Self::Context) {
            self.0.push(id);
        }
    }
    #[derive(Message)]
    #[rtype(result = "Vec<u64>")]
    struct Released;
    impl Handler<Released> for Sink {
        type Result = MessageResult<Released>;
        fn handle(&mut self, _msg: Released, _ctx: &mut Self::Context) -> Self::Result {
            MessageResult(self.0.clone())
        }
    }

    #[actix_rt::test]
    async fn a_stream_told_to_end_sends_its_last_frame_ends_and_lets_its_place_go() {
        use futures::StreamExt;
        let sink = Sink::default().start();
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let mut client = Client::new(tx, queued.clone());
        let (end, told) = oneshot::channel();
        let ticket = Ticket { id: 7, gate: sink.clone().recipient(), end: Some(told) };
        let mut stream = EventStream::new(rx, queued, Some(ticket));
        assert!(client.send("frame 1\n\n"));
        assert_eq!(stream.next().await.as_deref(), Some("frame 1\n\n"));
        assert!(client.send("frame 2\n\n"));
        end.send(revoked_frame("tok-4")).unwrap();
        let rest: Vec<String> = stream.collect().await;
        assert_eq!(rest.len(), 1, "the last frame first, then the end: {rest:?}");
        assert!(rest[0].starts_with("event: token-revoked\n") && rest[0].contains("tok-4 was revoked"), "{rest:?}");
        assert!(!client.send("frame 3\n\n"), "the hub finds the stream gone");
        assert_eq!(sink.send(Released).await.unwrap(), [7], "its place let go with it");
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
