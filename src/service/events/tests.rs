//! The event streams: frames, the hub's queues, the gate's caps and revocations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::mpsc::unbounded;
use futures::channel::oneshot;

use super::gate::{Release, Ticket};
use super::hub::Client;
use super::hub::EventStream;
use super::view::{event_view, revoked_frame, role_view, sse_frame, RoleChanged, QUEUE_LIMIT};
use super::*;
use crate::model::events::ProvisionerEvent;
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
        rest[1].starts_with("event: stream-dropped\n") && rest[1].contains("for 1m") && rest[1].contains("reconnect")
    );
}

/// A hub with no stream holds no timer (an idle model wakes for nothing); a stream arms the
/// heartbeat and the idle check, and they are cancelled once its client is gone.
#[actix_rt::test]
async fn a_hub_without_streams_holds_no_timer() {
    use super::hub::{Armed, OpenStream};
    tokio::time::pause();
    let hub = EventHub::new(Duration::from_secs(4)).start();
    assert!(!hub.send(Armed).await.unwrap(), "no stream: no timer");
    let stream = hub.send(OpenStream(None)).await.unwrap();
    assert!(hub.send(Armed).await.unwrap(), "a stream: the heartbeat and the idle check");
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(hub.send(Armed).await.unwrap(), "still open");
    drop(stream);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
    }
    assert!(!hub.send(Armed).await.unwrap(), "its client gone: the timers are cancelled");
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
    let extra = event_view(&ProvisionerEvent::ExtraInstances {
        machines: vec![MachineId::new("0")],
        instances: vec![InstanceId::new("i-a")],
    });
    assert_eq!((extra.event.as_str(), extra.instances.as_slice()), ("extra-instances", &["i-a".to_string()][..]));
    assert_eq!(extra.message.as_deref(), Some("stopping extra instances of live machines 0"));
    // A hand-over's events: each one's frame with its time known, its message without.
    let interrupted = |warning| ProvisionerEvent::MachineInterrupted {
        machine: MachineId::new("4"),
        instance: InstanceId::new("i-s"),
        warning,
    };
    let replaced = |lead| ProvisionerEvent::MachineReplaced {
        cause: crate::model::events::HandoverCause::Interruption,
        machine: MachineId::new("4"),
        interrupted: InstanceId::new("i-s"),
        replacement: InstanceId::new("i-r"),
        lead,
    };
    for (timed, frame, untimed, message) in [
        (
            interrupted(Some(Duration::from_secs(120))),
            "event: machine-interrupted\ndata: {\"event\":\"machine-interrupted\",\"machine\":\"4\",\"instance\":\"i-s\",\
             \"message\":\"the cloud takes instance i-s away in 120s: starting a replacement\"}\n\n",
            interrupted(None),
            "the cloud takes instance i-s away: starting a replacement",
        ),
        (
            replaced(Some(Duration::from_millis(97_500))),
            "event: machine-replaced\ndata: {\"event\":\"machine-replaced\",\"machine\":\"4\",\"instance\":\"i-r\",\
             \"instances\":[\"i-s\"],\"message\":\"replacement i-r runs 97.5s before the cloud takes i-s; stopping it\"}\n\n",
            replaced(None),
            "replacement i-r runs; stopping interrupted instance i-s",
        ),
    ] {
        assert_eq!(sse_frame(&event_view(&timed)), frame);
        assert_eq!(event_view(&untimed).message.as_deref(), Some(message));
    }
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
