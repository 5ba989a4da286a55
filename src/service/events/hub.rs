//! [`EventHub`], the actor that keeps a model's connected streams (one bounded queue each),
//! fans events out, drops streams whose client went away or fell behind, and closes them all
//! at shutdown.

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

use super::gate::Ticket;
use super::state::IdleWatch;
use super::view::{dropped_frame, event_view, idle_frame, role_view, sse_frame, RoleChanged, HEARTBEAT, QUEUE_LIMIT};
use crate::model::events::ProvisionerEvent;

/// One client's queue: the channel, how many frames in it its connection has not taken, how
/// many were queued in all, and whether it takes them.
pub(super) struct Client {
    tx: UnboundedSender<String>,
    queued: Arc<AtomicUsize>,
    sent: u64,
    watch: IdleWatch,
}

impl Client {
    pub(super) fn new(tx: UnboundedSender<String>, queued: Arc<AtomicUsize>) -> Self {
        Self { tx, queued, sent: 0, watch: IdleWatch::new(actix_rt::time::Instant::now()) }
    }

    /// Queues a frame; `false` when the client is gone, or was dropped because its queue is
    /// full (then its last frame says so).
    pub(super) fn send(&mut self, frame: &str) -> bool {
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
    pub(super) fn last(&self, frame: String) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.unbounded_send(frame);
    }

    /// Whether none of the frames waiting for the client was taken for `limit`.
    pub(super) fn idle(&mut self, now: actix_rt::time::Instant, limit: Duration) -> bool {
        let waiting = self.queued.load(Ordering::SeqCst);
        let taken = self.sent.saturating_sub(waiting as u64);
        self.watch.idle(taken, waiting, now, limit)
    }
}

/// A client's side of its stream: the frames, each counted off its queue as it is taken; the
/// gate's word to end it (a revoked token), and its place in the gate's count (let go with it).
pub(crate) struct EventStream {
    rx: UnboundedReceiver<String>,
    queued: Arc<AtomicUsize>,
    end: Option<oneshot::Receiver<String>>,
    ended: bool,
    _ticket: Option<Ticket>,
}

impl EventStream {
    pub(super) fn new(rx: UnboundedReceiver<String>, queued: Arc<AtomicUsize>, ticket: Option<Ticket>) -> Self {
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
pub(crate) struct EventHub {
    pub(super) streams: BTreeMap<u64, Client>,
    next: u64,
    /// Shutting down: new streams end at once.
    closed: bool,
    /// Clients dropped for falling behind (shared with the metrics).
    pub(super) dropped: Arc<AtomicU64>,
    /// How long frames may wait with none taken before the client is dropped.
    idle: Duration,
    /// The heartbeat's and the idle check's timers, armed while a stream is open (an idle
    /// model with no client wakes for nothing: issue 36).
    timers: Option<(SpawnHandle, SpawnHandle)>,
}

impl EventHub {
    /// No stream yet; a client none of whose waiting frames is taken for `idle` is dropped.
    pub(crate) fn new(idle: Duration) -> Self {
        Self { streams: BTreeMap::new(), next: 0, closed: false, dropped: Arc::default(), idle, timers: None }
    }

    /// The count of clients dropped for falling behind, as it grows.
    pub(crate) fn dropped_counter(&self) -> Arc<AtomicU64> {
        self.dropped.clone()
    }

    pub(super) fn broadcast(&mut self, frame: &str) {
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
    pub(super) fn drop_idle(&mut self) {
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

impl EventHub {
    /// Arms the heartbeat and the idle check, if they are not: a stream opened.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        if self.timers.is_some() {
            return;
        }
        let heartbeat = ctx.run_interval(HEARTBEAT, |hub, ctx| {
            hub.broadcast(": keep-alive\n\n");
            hub.disarm_if_unused(ctx);
        });
        // Checked four times per limit, at least every second (a client is found idle within
        // one check of the limit).
        let every = (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let check = ctx.run_interval(every, |hub, ctx| {
            hub.drop_idle();
            hub.disarm_if_unused(ctx);
        });
        self.timers = Some((heartbeat, check));
    }

    /// Cancels the timers once no stream is left (the idle check drops closed ones).
    fn disarm_if_unused(&mut self, ctx: &mut Context<Self>) {
        if self.streams.is_empty() {
            if let Some((heartbeat, check)) = self.timers.take() {
                ctx.cancel_future(heartbeat);
                ctx.cancel_future(check);
            }
        }
    }
}

impl Actor for EventHub {
    type Context = Context<Self>;
}

/// Opens a stream: it gets every event from now on (unless it falls too far behind, or the
/// gate ends it); the ticket is its place in the gate's count.
#[derive(Message)]
#[rtype(result = "EventStream")]
pub(crate) struct OpenStream(pub Option<Ticket>);

/// Whether the hub's timers are armed (tests).
#[cfg(test)]
#[derive(Message)]
#[rtype(result = "bool")]
pub(super) struct Armed;

#[cfg(test)]
impl Handler<Armed> for EventHub {
    type Result = bool;
    fn handle(&mut self, _msg: Armed, _ctx: &mut Self::Context) -> bool {
        self.timers.is_some()
    }
}

/// Ends every stream (shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct CloseStreams;

impl Handler<OpenStream> for EventHub {
    type Result = MessageResult<OpenStream>;
    fn handle(&mut self, OpenStream(ticket): OpenStream, ctx: &mut Self::Context) -> Self::Result {
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
        self.arm(ctx);
        MessageResult(stream)
    }
}

impl Handler<CloseStreams> for EventHub {
    type Result = ();
    fn handle(&mut self, _msg: CloseStreams, ctx: &mut Self::Context) {
        self.closed = true;
        self.streams.clear();
        self.disarm_if_unused(ctx);
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

impl Handler<RoleChanged> for EventHub {
    type Result = ();
    fn handle(&mut self, e: RoleChanged, _ctx: &mut Self::Context) {
        if !self.streams.is_empty() {
            self.broadcast(&sse_frame(&role_view(e)));
        }
    }
}
