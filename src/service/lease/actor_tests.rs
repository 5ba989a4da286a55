//! The replica role and the listener against a real PostgreSQL (`TempPostgres`): two replicas
//! on one lease, a release handing over at once, a database that goes away making the leader
//! step down by its renew deadline, and LISTEN delivering a notification.

use std::time::Duration;

use actix::prelude::*;
use actix_rt::time::{timeout, Instant};
use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::StreamExt;

use super::actor::{GetLeaseStatus, LeaseActor, LeaseConfig, ReleaseLease, RoleHooks};
use super::listen::{listen, Changed};
use super::state::{LeaseTimings, Transition, Why};
use crate::testing::TempPostgres;

const MODEL: &str = "3b7f0c2e-0000-4000-8000-00000000abcd";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Lead(&'static str, i64),
    Follow(&'static str, Why),
}

struct Hooks(&'static str, UnboundedSender<Event>);

impl RoleHooks for Hooks {
    fn lead(&mut self, epoch: i64, _t: Transition) {
        let _ = self.1.unbounded_send(Event::Lead(self.0, epoch));
    }
    fn follow(&mut self, why: Why, _t: Transition) {
        let _ = self.1.unbounded_send(Event::Follow(self.0, why));
    }
}

fn timings() -> LeaseTimings {
    LeaseTimings::new(Duration::from_millis(1000), Duration::from_millis(800), Duration::from_millis(200)).unwrap()
}

fn replica(pg: &TempPostgres, id: &'static str, events: &UnboundedSender<Event>) -> Addr<LeaseActor> {
    let config = LeaseConfig {
        url: pg.url().to_owned(),
        model_uuid: MODEL.into(),
        replica: id.into(),
        timings: timings(),
        spread: false,
    };
    LeaseActor::start(config, Box::new(Hooks(id, events.clone())))
}

async fn next(rx: &mut UnboundedReceiver<Event>) -> Event {
    timeout(Duration::from_secs(10), rx.next()).await.expect("an event within 10 s").expect("events go on")
}

struct Forward(UnboundedSender<Changed>);

impl Actor for Forward {
    type Context = Context<Self>;
}

impl Handler<Changed> for Forward {
    type Result = ();
    fn handle(&mut self, msg: Changed, _ctx: &mut Self::Context) {
        let _ = self.0.unbounded_send(msg);
    }
}

#[test]
fn replicas_share_one_lease_hand_it_over_and_step_down_without_the_database() {
    let pg = TempPostgres::start("lease-actor").unwrap();
    actix_rt::System::new().block_on(async move {
        // LISTEN: a notification reaches the recipient, without polling.
        let (ctx, mut crx) = unbounded();
        let fwd = Forward(ctx).start();
        listen(pg.url().to_owned(), Duration::from_millis(200), fwd.recipient()).unwrap();
        let first = timeout(Duration::from_secs(10), crx.next()).await.unwrap().unwrap();
        assert!(first.resync, "the first message after connecting says to read afresh: {first:?}");
        let url = pg.url().to_owned();
        let pid = actix_rt::task::spawn_blocking(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.batch_execute("NOTIFY provisioner_changes, '{\"kind\":\"machines\"}'").unwrap();
            c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get::<_, i32>(0)
        })
        .await
        .unwrap();
        let got = timeout(Duration::from_secs(10), crx.next()).await.unwrap().unwrap();
        // The notice names the session that sent it (a store tells its own from others').
        assert_eq!(got, Changed { payload: "{\"kind\":\"machines\"}".into(), resync: false, sender: pid });

        // Two replicas: the first leads at epoch 1, the second follows and knows who leads.
        let (tx, mut rx) = unbounded();
        let a = replica(&pg, "a", &tx);
        assert_eq!(next(&mut rx).await, Event::Lead("a", 1));
        let b = replica(&pg, "b", &tx);
        actix_rt::time::sleep(Duration::from_millis(600)).await;
        let s = b.send(GetLeaseStatus).await.unwrap();
        assert_eq!((s.role, s.leader.as_deref(), s.epoch, s.replica.as_str()), ("follower", Some("a"), Some(1), "b"));
        let s = a.send(GetLeaseStatus).await.unwrap();
        assert_eq!((s.role, s.leader.as_deref(), s.epoch, s.transitions), ("leader", Some("a"), Some(1), 1));
        assert_eq!(s.last_transition.map(|t| (t.0, t.1, t.2)), Some(("follower", "leader", "acquired")));

        // A clean shutdown of the leader releases the lease: the follower takes it within a
        // retry period, at epoch 2.
        let released_at = Instant::now();
        timeout(Duration::from_secs(5), a.send(ReleaseLease)).await.unwrap().unwrap();
        assert_eq!(next(&mut rx).await, Event::Follow("a", Why::Released));
        assert_eq!(next(&mut rx).await, Event::Lead("b", 2));
        let handover = released_at.elapsed();
        eprintln!("handover after a release: {handover:?}");
        assert!(handover < Duration::from_secs(2), "within a retry period (and slack): {handover:?}");

        // The database goes away: the leader steps down at its renew deadline, before its
        // lease could expire for anyone else; when the database is back, it leads again at
        // epoch 3 (the released replica asks no more).
        let mut pg = pg;
        let stopped_at = Instant::now();
        let mut pg = actix_rt::task::spawn_blocking(move || {
            pg.stop().unwrap();
            pg
        })
        .await
        .unwrap();
        assert_eq!(next(&mut rx).await, Event::Follow("b", Why::DeadlinePassed));
        let stepped_down = stopped_at.elapsed();
        eprintln!("stepped down {stepped_down:?} after the database stopped");
        assert!(stepped_down <= Duration::from_millis(1000) + Duration::from_millis(500), "{stepped_down:?}");
        let s = b.send(GetLeaseStatus).await.unwrap();
        assert_eq!(s.role, "follower");
        let _pg = actix_rt::task::spawn_blocking(move || {
            pg.restart().unwrap();
            pg
        })
        .await
        .unwrap();
        assert_eq!(next(&mut rx).await, Event::Lead("b", 3));
        assert!(rx.try_recv().is_err(), "no other transition");
    });
}
