//! The replica role and the listener against a real PostgreSQL (`TempPostgres`): two replicas
//! on one lease, a release handing over at once, a database that goes away making the leader
//! step down by its renew deadline, and LISTEN delivering a notification.

use std::time::Duration;

use actix::prelude::*;
use actix_rt::time::{timeout, Instant};
use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::StreamExt;

use super::actor::{GetLeaseStatus, LeaseActor, LeaseConfig, ReleaseLease, RoleHooks};
use super::listen::{listen, Changed, NoticeHub, Subscribe};
use super::sql::LeaseSql;
use super::state::{Transition, Why};
use crate::service::settings::LeaseTimings;
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
        schema: None,
        replica: id.into(),
        timings: timings(),
        spread: false,
        beat: None,
    };
    LeaseActor::start(config, Box::new(Hooks(id, events.clone()))).unwrap()
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

/// Events of many models: `(model, event)`.
struct ModelHooks(&'static str, &'static str, UnboundedSender<(&'static str, Event)>);

impl RoleHooks for ModelHooks {
    fn lead(&mut self, epoch: i64, _t: Transition) {
        let _ = self.2.unbounded_send((self.1, Event::Lead(self.0, epoch)));
    }
    fn follow(&mut self, why: Why, _t: Transition) {
        let _ = self.2.unbounded_send((self.1, Event::Follow(self.0, why)));
    }
}

// The runtime's thread is held on purpose (std's sleep) while a burst of notices arrives.
#[allow(clippy::disallowed_methods)]
#[test]
fn one_lease_thread_and_one_listener_serve_every_model_of_a_replica() {
    let pg = TempPostgres::start("lease-shared").unwrap();
    let mut c = postgres::Client::connect(pg.url(), postgres::NoTls).unwrap();
    c.batch_execute("CREATE SCHEMA model_one; CREATE SCHEMA model_two;").unwrap();
    const MODELS: [(&str, &str, &str); 2] = [("one", "model_one", "uuid-one"), ("two", "model_two", "uuid-two")];
    let url = pg.url().to_owned();
    actix_rt::System::new().block_on(async move {
        // Each replica: one lease thread and one lease arbiter for both models.
        let (tx, mut rx) = unbounded();
        let start = |id: &'static str| {
            let sql = LeaseSql::start(url.clone(), id.into(), timings().retry(), timings().lease()).unwrap();
            let arbiter = actix_rt::Arbiter::new().handle();
            let beat = actix_rt::time::Instant::now();
            MODELS
                .iter()
                .map(|(name, schema, uuid)| {
                    let config = LeaseConfig {
                        url: url.clone(),
                        model_uuid: (*uuid).into(),
                        schema: Some((*schema).into()),
                        replica: id.into(),
                        timings: timings(),
                        spread: false,
                        // The replica's models tick together, as in the service.
                        beat: Some(beat),
                    };
                    LeaseActor::start_on(&arbiter, config, Box::new(ModelHooks(id, name, tx.clone())), sql.clone())
                })
                .collect::<Vec<_>>()
        };
        let a = start("a");
        let mut led: Vec<_> = vec![next_of(&mut rx).await, next_of(&mut rx).await];
        led.sort_by_key(|(m, _)| *m);
        assert_eq!(led, vec![("one", Event::Lead("a", 1)), ("two", Event::Lead("a", 1))]);
        // Each lease is in its model's schema, and nowhere else.
        let rows = |c: &mut postgres::Client, schema: &str| -> Vec<(String, String, i64)> {
            c.query(&format!("SELECT model_uuid, holder, epoch FROM {schema}.leader_lease"), &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect()
        };
        let (url2, check) = (url.clone(), rows);
        let (one, two) = actix_rt::task::spawn_blocking(move || {
            let mut c = postgres::Client::connect(&url2, postgres::NoTls).unwrap();
            (check(&mut c, "model_one"), check(&mut c, "model_two"))
        })
        .await
        .unwrap();
        assert_eq!(one, vec![("uuid-one".to_owned(), "a".to_owned(), 1)]);
        assert_eq!(two, vec![("uuid-two".to_owned(), "a".to_owned(), 1)]);

        // A second replica follows on both; the leases stay renewed (several lease periods
        // pass with no transition), then a's release hands both over at epoch 2.
        let b = start("b");
        actix_rt::time::sleep(Duration::from_millis(2500)).await;
        assert!(rx.try_recv().is_err(), "both leases renewed over one connection, none lost");
        for l in &b {
            let s = l.send(GetLeaseStatus).await.unwrap();
            assert_eq!((s.role, s.leader.as_deref(), s.epoch), ("follower", Some("a"), Some(1)));
        }
        for l in &a {
            timeout(Duration::from_secs(5), l.send(ReleaseLease)).await.unwrap().unwrap();
        }
        let mut moved = Vec::new();
        for _ in 0..4 {
            moved.push(next_of(&mut rx).await);
        }
        moved.sort_by_key(|(m, e)| (*m, format!("{e:?}")));
        assert_eq!(
            moved,
            vec![
                ("one", Event::Follow("a", Why::Released)),
                ("one", Event::Lead("b", 2)),
                ("two", Event::Follow("a", Why::Released)),
                ("two", Event::Lead("b", 2)),
            ]
        );

        // One listener: a notice reaches the model it names only; a subscriber learns at once
        // to read afresh.
        let hub = NoticeHub::start_listening(url.clone(), Duration::from_millis(200)).unwrap();
        let (one_tx, mut one_rx) = unbounded();
        let (two_tx, mut two_rx) = unbounded();
        hub.do_send(Subscribe { model_uuid: "uuid-one".into(), to: Forward(one_tx).start().recipient() });
        hub.do_send(Subscribe { model_uuid: "uuid-two".into(), to: Forward(two_tx).start().recipient() });
        for rx in [&mut one_rx, &mut two_rx] {
            let first = timeout(Duration::from_secs(10), rx.next()).await.unwrap().unwrap();
            assert!(first.resync, "{first:?}");
        }
        let url2 = url.clone();
        actix_rt::task::spawn_blocking(move || {
            let mut c = postgres::Client::connect(&url2, postgres::NoTls).unwrap();
            // Repeated: the hub's LISTEN may connect after the first notices.
            for _ in 0..20 {
                c.batch_execute("NOTIFY provisioner_changes, '{\"model_uuid\":\"uuid-two\",\"kind\":\"machines\"}'")
                    .unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .await
        .unwrap();
        let got = loop {
            let m = timeout(Duration::from_secs(10), two_rx.next()).await.unwrap().unwrap();
            if !m.resync {
                break m;
            }
        };
        assert!(got.payload.contains("uuid-two"), "{got:?}");
        while let Ok(m) = one_rx.try_recv() {
            assert!(m.resync, "model one hears no notice of model two: {m:?}");
        }
        while two_rx.try_recv().is_ok() {}
        // A burst (one commit of 100 changes) while this thread is busy: every notice reaches
        // its model, none dropped for a full mailbox.
        let url2 = url.clone();
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url2, postgres::NoTls).unwrap();
            let mut tx = c.transaction().unwrap();
            for i in 0..100 {
                tx.batch_execute(&format!(
                    "NOTIFY provisioner_changes, '{{\"model_uuid\":\"uuid-one\",\"kind\":\"machines\",\"ids\":[\"{i}\"]}}'"
                ))
                .unwrap();
            }
            tx.commit().unwrap();
        })
        .join()
        .unwrap();
        // The runtime's thread held while the notices arrive (nothing drains the mailboxes).
        std::thread::sleep(Duration::from_millis(1500));
        let mut heard = std::collections::BTreeSet::new();
        while heard.len() < 100 {
            match timeout(Duration::from_secs(5), one_rx.next()).await {
                Ok(Some(m)) if !m.resync => {
                    heard.insert(m.payload);
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        assert_eq!(heard.len(), 100, "every notice of the burst heard");
    });
}

async fn next_of(rx: &mut UnboundedReceiver<(&'static str, Event)>) -> (&'static str, Event) {
    timeout(Duration::from_secs(10), rx.next()).await.expect("an event within 10 s").expect("events go on")
}
