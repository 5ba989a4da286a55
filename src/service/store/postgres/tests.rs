//! Unit tests of the PostgreSQL backend: the shared behaviour tests, then what only it has
//! (migrations under a lock, a too-new schema, the fence, change notifications, reconnection,
//! deadlines, TLS); its group commits and write-behind units are `group_tests.rs`'s.
//! One throwaway cluster is shared by the tests running at the same time (started by the first,
//! stopped when the last lets go); every test gets a fresh database of its own.
// A real server on the wall clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Duration;

use super::StoreError;
use super::{Notice, PgStore, CHANGES_CHANNEL, PG_SCHEMA_VERSION};
use crate::model::{InstanceStatus, InstanceTags, Life, MachineId, MachineStatus};
use crate::ports::ProvisionedInstance;
use crate::service::store::backend::{Fence, StoreBackend};
use crate::testing::TempPostgres;

use crate::testing::postgres::tls_certificates;
pub(super) use crate::testing::postgres::{cluster, fresh_db};

/// A store on a fresh database of the shared cluster: the cluster (held for the test), the
/// database's URL and the store.
pub(super) fn opened() -> (Arc<TempPostgres>, String, PgStore) {
    let pg = cluster();
    let url = fresh_db(&pg);
    let s = PgStore::open(&url).unwrap();
    (pg, url, s)
}

pub(super) fn raw(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect")
}

/// Every behaviour test SQLite passes, against PostgreSQL, each in a database of its own.
#[test]
fn the_behaviour_tests_pass_on_postgres() {
    let pg = cluster();
    let mut failed = Vec::new();
    for (name, test) in crate::service::store::behaviour::BEHAVIOURS {
        let url = fresh_db(&pg);
        let result = std::panic::catch_unwind(|| {
            let mut s = PgStore::open(&url).expect("open the store");
            test(&mut s);
        });
        if result.is_err() {
            failed.push(*name);
        }
    }
    assert!(failed.is_empty(), "failed on PostgreSQL: {failed:?}");
}

#[test]
fn migrations_are_versioned_and_the_model_kept_across_opens() {
    let pg = cluster();
    let url = fresh_db(&pg);
    let first = PgStore::open(&url).unwrap();
    assert!(first.created_model(), "the first store on an empty database creates the model");
    let mut first = first;
    let uuid = first.model_uuid().unwrap();
    assert_eq!(uuid.len(), 36, "{uuid}");
    let mut second = PgStore::open(&url).unwrap();
    assert!(!second.created_model(), "the next ones find it");
    assert_eq!(second.model_uuid().unwrap(), uuid);
    let versions: Vec<i64> = raw(&url)
        .query("SELECT version FROM schema_migrations ORDER BY version", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=PG_SCHEMA_VERSION).collect::<Vec<_>>());
    // The database stamps each machine's change.
    let id = first.add_machines(1, None).unwrap().remove(0);
    let stamp = second.machine(&id).unwrap().unwrap().changed_at.expect("stamped at insert");
    assert!(stamp.ends_with('Z') && stamp.len() == 24, "{stamp}");
}

/// Replicas starting together on an empty database: the advisory lock makes one of them
/// migrate and create the model, and every one then sees the same model.
#[test]
fn replicas_starting_together_migrate_once() {
    let pg = cluster();
    let url = fresh_db(&pg);
    let opened: Vec<(bool, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let mut s = PgStore::open(&url).expect("open");
                    (s.created_model(), s.model_uuid().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(opened.iter().filter(|(created, _)| *created).count(), 1, "{opened:?}");
    assert!(opened.iter().all(|(_, u)| *u == opened[0].1), "{opened:?}");
}

/// A schema newer than the binary is refused, and the message names both versions.
#[test]
fn a_newer_schema_is_refused_naming_both_versions() {
    let pg = cluster();
    let url = fresh_db(&pg);
    drop(PgStore::open(&url).unwrap());
    raw(&url).execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[&(PG_SCHEMA_VERSION + 7)]).unwrap();
    let err = PgStore::open(&url).err().expect("a newer schema was opened");
    assert_eq!(err, StoreError::TooNew { found: PG_SCHEMA_VERSION + 7, supported: PG_SCHEMA_VERSION });
    let text = err.to_string();
    assert!(
        text.contains(&(PG_SCHEMA_VERSION + 7).to_string()) && text.contains(&PG_SCHEMA_VERSION.to_string()),
        "{text}"
    );
}

pub(super) fn lease(url: &str, model: &str, holder: &str, epoch: i64, secs: i64) {
    raw(url)
        .execute(
            "INSERT INTO leader_lease (model_uuid, holder, epoch, expires_at) \
             VALUES ($1, $2, $3, now() + make_interval(secs => $4)) ON CONFLICT (model_uuid) DO UPDATE \
             SET holder = excluded.holder, epoch = excluded.epoch, expires_at = excluded.expires_at",
            &[&model, &holder, &epoch, &(secs as f64)],
        )
        .unwrap();
}

/// With a fence set, the provisioner's writes commit only under the lease it names: a wrong
/// epoch, another holder or an expired lease refuses them with `Fenced`, and nothing is
/// written; the API's writes of desired state are not fenced.
#[test]
fn fenced_writes_commit_only_under_the_lease() {
    let (_pg, url, mut s) = opened();
    let model = s.model_uuid().unwrap();
    let m = s.add_machines(2, None).unwrap();
    lease(&url, &model, "replica-a", 3, 30);
    s.set_fence(Some(Fence::new(model.clone(), "replica-a", 3))).unwrap();
    s.set_fenced(true);
    s.set_status(&m[0], MachineStatus::Error, "under the lease").unwrap();
    assert_eq!(s.machine(&m[0]).unwrap().unwrap().status_message, "under the lease");

    // Another replica took the lease (epoch 4): every provisioner write is refused, unwritten.
    lease(&url, &model, "replica-b", 4, 30);
    let info = ProvisionedInstance {
        instance: crate::model::InstanceId::new("i-1"),
        zone: None,
        nonce: "n".into(),
        display_name: String::new(),
        status: InstanceStatus::running(),
        capacity_type: None,
    };
    let tags = InstanceTags { model: Some(model.clone()), machine: Some(m[1].clone()), start: Some("n".into()) };
    let fenced = StoreError::Fenced { model_uuid: model.clone(), holder: "replica-a".into(), epoch: 3 };
    assert_eq!(s.set_status(&m[0], MachineStatus::Started, "stale"), Err(fenced.clone()));
    assert_eq!(s.set_instance_info(&m[1], &info), Err(fenced.clone()));
    assert_eq!(s.set_instance_status(&m[1], &InstanceStatus::provisioning(), "x"), Err(fenced.clone()));
    assert_eq!(s.create_instance("tok", None, &tags).map(|_| ()), Err(fenced.clone()));
    assert_eq!(s.ensure_dead(&m[1]), Err(fenced.clone()));
    let before = s.recount().unwrap();
    assert_eq!(s.counts(), &before, "a refused write counts nothing");
    let rec = s.machine(&m[0]).unwrap().unwrap();
    assert_eq!((rec.status_message.as_str(), rec.machine.status), ("under the lease", MachineStatus::Error));
    let m1 = s.machine(&m[1]).unwrap().unwrap();
    assert_eq!((m1.machine.instance, m1.machine.life), (None, Life::Alive), "nothing written");
    assert!(s.all_instances().unwrap().is_empty(), "no instance created");

    // Writes of desired state from the API are not fenced.
    s.set_fenced(false);
    s.add_machines(1, None).unwrap();
    s.remove_machines(&m[1..], false, false).unwrap();

    // Our own lease again, but expired: still refused.
    lease(&url, &model, "replica-a", 3, -1);
    s.set_fenced(true);
    assert_eq!(s.mark_for_removal(&m[1]), Err(fenced));
    // No fence at all: the provisioner's writes go through.
    s.set_fence(None).unwrap();
    s.mark_for_removal(&m[1]).unwrap();
}

/// A store on a fresh database with machines, two lease clients (`replica-a`, which acquired
/// epoch `first`, and `replica-b`), the store fenced on `replica-a`'s lease.
pub(super) struct Leading {
    pub(super) _pg: Arc<TempPostgres>,
    pub(super) url: String,
    pub(super) s: PgStore,
    pub(super) model: String,
    pub(super) m: Vec<MachineId>,
    pub(super) a: crate::service::lease::pg::PgLease,
    pub(super) b: crate::service::lease::pg::PgLease,
    pub(super) first: i64,
}

pub(super) fn leading(machines: usize) -> Leading {
    use crate::service::lease::pg::PgLease;
    use crate::service::lease::state::Answer;
    let (pg, url, mut s) = opened();
    let model = s.model_uuid().unwrap();
    let m = s.add_machines(machines, None).unwrap();
    let lease_for = |holder: &str| PgLease::connect(&url, Duration::from_secs(10), &model, holder).unwrap();
    let (mut a, b) = (lease_for("replica-a"), lease_for("replica-b"));
    let Answer::Acquired { epoch: first } = a.acquire(Duration::from_secs(30)).unwrap() else { panic!("a leads") };
    s.set_fence(Some(Fence::new(model.clone(), "replica-a", first))).unwrap();
    Leading { _pg: pg, url, s, model, m, a, b, first }
}

/// Every write that passes the fence records its epoch, and each acquisition records its own:
/// the audit finds no stale write when fencing holds, and flags one that skipped the fence
/// (the mutation `skip_fence_check` on the store's fence).
#[test]
fn the_epochs_record_proves_no_write_committed_under_a_stale_epoch() {
    use crate::service::lease::pg::{audit_epochs, StaleWrite};
    use crate::service::lease::state::Answer;
    let Leading { _pg, url, mut s, model, m, mut a, mut b, first } = leading(1);
    s.set_fenced(true);
    s.set_status(&m[0], MachineStatus::Error, "one").unwrap();
    s.set_status(&m[0], MachineStatus::Error, "two").unwrap();
    a.release(first).unwrap();
    let Answer::Acquired { epoch: second } = b.acquire(Duration::from_secs(30)).unwrap() else { panic!("b leads") };
    assert_eq!(second, first + 1);
    assert!(matches!(s.set_status(&m[0], MachineStatus::Error, "stale"), Err(StoreError::Fenced { .. })));

    let mut client = raw(&url);
    let audit = audit_epochs(&mut client, &model).unwrap();
    assert_eq!(audit.acquisitions, vec![(first, "replica-a".to_owned()), (second, "replica-b".to_owned())]);
    assert_eq!(audit.writes, 2, "the two writes under the lease, not the refused one");
    assert!(audit.stale.is_empty(), "{audit:?}");

    // A write that skips the fence after the takeover is what the audit exists to catch: the
    // model checker's mutation `skip_fence_check`, on the store's own fence (the decision the
    // store and the checker share, `model::Fence::admits`), lets it commit.
    let unchecked = Fence { skip_check: true, ..Fence::new(model.clone(), "replica-a", first) };
    s.set_fence(Some(unchecked)).unwrap();
    s.set_status(&m[0], MachineStatus::Error, "stale, unfenced").unwrap();
    let audit = audit_epochs(&mut client, &model).unwrap();
    assert_eq!(audit.stale, vec![StaleWrite { epoch: first, holder: "replica-a".into(), superseded_by: second }]);
    // So is a write under an epoch by another holder than the epoch's.
    client.execute(super::schema::RECORD_WRITE_SQL, &[&model, &"replica-c", &second]).unwrap();
    let stale = audit_epochs(&mut client, &model).unwrap().stale;
    assert!(
        stale.contains(&StaleWrite { epoch: second, holder: "replica-c".into(), superseded_by: second }),
        "{stale:?}"
    );

    // Epochs never repeat, even when the lease row is deleted by hand.
    client.execute("DELETE FROM leader_lease WHERE model_uuid = $1", &[&model]).unwrap();
    assert_eq!(a.acquire(Duration::from_secs(30)).unwrap(), Answer::Acquired { epoch: second + 1 });
}

/// A store's session left idle inside a transaction (a partition swallowed its COMMIT) is ended
/// by the server within [`IDLE_IN_TRANSACTION`]: its share lock on the lease row goes with it,
/// so another replica can take the lease (seen failing without it: a partitioned leader's open
/// transaction held every acquisition off until the test gave up).
#[test]
fn a_transaction_left_open_is_ended_by_the_server_and_frees_the_lease_row() {
    use super::IDLE_IN_TRANSACTION;
    let (_pg, url, mut s) = opened();
    let model = s.model_uuid().unwrap();
    lease(&url, &model, "replica-a", 1, 30);
    let mut stuck = PgStore::config(&url).unwrap().0.connect(postgres::NoTls).unwrap();
    let mut tx = stuck.transaction().unwrap();
    tx.query("SELECT 1 FROM leader_lease WHERE model_uuid = $1 FOR SHARE", &[&model]).unwrap();
    // The lease row cannot be taken over while the share lock is held...
    let mut other = raw(&url);
    other.batch_execute("SET lock_timeout = 200").unwrap();
    let update = "UPDATE leader_lease SET epoch = epoch + 1 WHERE model_uuid = $1";
    assert!(other.execute(update, &[&model]).is_err(), "the share lock holds the row");
    // ...and is once the server ended the idle transaction.
    std::thread::sleep(IDLE_IN_TRANSACTION + Duration::from_millis(500));
    assert_eq!(other.execute(update, &[&model]).unwrap(), 1);
    assert!(tx.query("SELECT 1", &[]).is_err(), "the idle session was ended");
}

/// A store on a fresh database, its model, and a session listening to its notices.
pub(super) fn listening() -> (Arc<TempPostgres>, String, PgStore, String, postgres::Client) {
    let (pg, url, mut s) = opened();
    let model = s.model_uuid().unwrap();
    let mut listener = raw(&url);
    listener.batch_execute(&format!("LISTEN {CHANGES_CHANNEL}")).unwrap();
    (pg, url, s, model, listener)
}

/// Each commit that changes machines notifies `provisioner_changes` with the model and the ids,
/// delivered at the commit; a refused write notifies nothing.
#[test]
fn changes_are_notified_at_commit() {
    let (_pg, _url, mut s, model, mut listener) = listening();
    let added = s.add_machines(2, None).unwrap();
    let _ = s.remove_machines(&[added[0].clone(), MachineId::new("77")], false, false).unwrap_err();
    s.set_status(&added[1], MachineStatus::Error, "x").unwrap();
    s.set_workers(3).unwrap();
    let got = notices(&mut listener, Duration::from_secs(1));
    let notice = |kind: &str, ids: &[&str]| Notice {
        model_uuid: model.clone(),
        kind: kind.into(),
        ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        all: false,
    };
    assert_eq!(got, [notice("machines", &["0", "1"]), notice("machines", &["1"]), notice("settings", &[])]);
}

/// An unreachable server: operations answer `Unavailable` (never stale data) with the reason,
/// attempts back off, and the store reconnects by itself once the server is back.
#[test]
fn a_lost_database_is_unavailable_then_reconnected() {
    let mut pg = TempPostgres::start("store-unit-lost").unwrap();
    let url = fresh_db(&pg);
    let mut s = PgStore::open(&url).unwrap();
    s.add_machines(1, None).unwrap();
    pg.stop().unwrap();
    let first = s.list_machines().unwrap_err();
    s.note_damage(&first);
    let second = s.list_machines().unwrap_err();
    assert!(matches!(second, StoreError::Unavailable(_)), "{first:?} then {second:?}");
    assert!(matches!(s.check_readable(), Err(StoreError::Unavailable(_))));
    pg.restart().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match s.list_machines() {
            Ok(list) => {
                assert_eq!(list.len(), 1);
                break;
            }
            Err(e) => {
                s.note_damage(&e);
                assert!(std::time::Instant::now() < deadline, "never reconnected: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
    assert_eq!(s.check_readable(), Ok(()));
}

/// A fresh database whose model's lease `replica-a` holds at epoch 7 (for 30 s), for a test of
/// the store actor: the cluster (held for the test), the database's URL and the model. (The sync
/// client may not run on the runtime's thread: the lease is written before the actor starts.)
pub(super) fn leased_before_the_actor() -> (Arc<TempPostgres>, String, String) {
    let pg = cluster();
    let url = fresh_db(&pg);
    let model = PgStore::open(&url).unwrap().model_uuid().unwrap();
    lease(&url, &model, "replica-a", 7, 30);
    (pg, url, model)
}

/// Through the store actor, as the service and the lease use it: `Store::set_fence` fences the
/// provisioner's writes (`exec_lazy`: the model port, the simulated cloud) and not the API's
/// (`exec`); SQLite refuses a fence.
#[test]
fn the_store_actor_fences_exec_lazy_and_not_exec() {
    let (_pg, url, model) = leased_before_the_actor();
    actix::System::new().block_on(async move {
        let store = crate::service::store::actor::Store::start_postgres(&url).unwrap();
        let ids = store.exec(|s| s.add_machines(1, None)).await.unwrap();
        let fence = |epoch| Some(Fence::new(model.clone(), "replica-a", epoch));
        store.set_fence(fence(7)).await.unwrap();
        let id = ids[0].clone();
        store.exec_lazy(move |s| s.set_status(&id, MachineStatus::Error, "under the lease")).await.unwrap();
        store.set_fence(fence(6)).await.unwrap();
        let id = ids[0].clone();
        let refused = store.exec_lazy(move |s| s.set_status(&id, MachineStatus::Started, "stale")).await;
        assert!(matches!(refused, Err(StoreError::Fenced { epoch: 6, .. })), "{refused:?}");
        let id = ids[0].clone();
        let rec = store.exec(move |s| s.machine(&id)).await.unwrap().unwrap();
        assert_eq!(rec.status_message, "under the lease", "the fenced write wrote nothing");
        // The API's writes of desired state are not fenced.
        let id = ids[0].clone();
        store.exec(move |s| s.remove_machines(&[id], false, false)).await.unwrap();
        store.exec(|s| s.set_workers(3)).await.unwrap();

        let dir = std::env::temp_dir().join(format!("provisioner-pg-fence-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sqlite = crate::service::store::actor::Store::start(&dir.join("p.db")).unwrap();
        assert!(matches!(sqlite.set_fence(fence(7)).await, Err(StoreError::Refused(_))));
        let _ = std::fs::remove_dir_all(&dir);
    });
}

pub(super) fn ids(v: &[MachineId]) -> Vec<&str> {
    v.iter().map(MachineId::as_str).collect()
}

/// The notices delivered to `listener` within `wait` of the last one.
pub(super) fn notices(listener: &mut postgres::Client, wait: Duration) -> Vec<Notice> {
    use postgres::fallible_iterator::FallibleIterator;
    let mut got = Vec::new();
    let mut n = listener.notifications();
    let mut it = n.timeout_iter(wait);
    while let Some(note) = it.next().unwrap() {
        got.push(serde_json::from_str::<Notice>(note.payload()).unwrap());
    }
    got
}

/// A statement that waits on a lock another session never lets go (the wedge of issue 30: a
/// leader's store parked for ever inside one call) is ended within the store's deadline, with an
/// error that says the database did not answer in time; once the lock goes, the store works
/// again, on the same store, with nothing lost.
#[test]
fn a_statement_stuck_on_a_lock_is_bounded_and_the_store_recovers() {
    use super::{CALL_SLACK, STATEMENT_DEADLINE};
    let (_pg, url, mut s) = opened();
    let ids = s.add_new_machines(2, &Default::default()).unwrap();
    // Another session holds the machines table for ever (a transaction that is not idle: it
    // is not ended by the server's idle timeout).
    let mut holder = raw(&url);
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("LOCK TABLE machines IN ACCESS EXCLUSIVE MODE").unwrap();
    let began = std::time::Instant::now();
    let e = s.list_machines().expect_err("the table is locked");
    let took = began.elapsed();
    assert!(took < STATEMENT_DEADLINE + CALL_SLACK + Duration::from_secs(2), "{took:?}");
    assert!(took >= STATEMENT_DEADLINE - Duration::from_millis(500), "bounded by the deadline, {took:?}");
    let text = e.to_string();
    assert!(text.contains("statement timeout") || text.contains("lock timeout"), "{text}");
    assert!(matches!(&e, StoreError::Postgres { source, .. } if source.timed_out()), "{e:?}");
    tx.rollback().unwrap();
    // The store answers again (reconnecting first if it gave the connection up).
    let listed = loop {
        match s.list_machines() {
            Ok(l) => break l,
            Err(StoreError::Unavailable(_)) if began.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(listed.iter().map(|m| m.machine.id.clone()).collect::<Vec<_>>(), ids);
}

/// The client's own bound, for a server that cannot even cancel (here: a statement the server
/// is told to let run): past its deadline the call answers `TimedOut` and the connection is
/// given up (closed), not waited on.
#[test]
fn a_call_past_the_clients_deadline_times_out_and_gives_the_connection_up() {
    use super::client::{CallError, PgClient};
    let pg = cluster();
    let url = fresh_db(&pg);
    let config: tokio_postgres::Config = url.parse().unwrap();
    let mut c = PgClient::connect(
        &config,
        &crate::service::pgtls::PgTls::disabled(),
        Duration::from_secs(10),
        Duration::from_millis(300),
    )
    .unwrap();
    assert_eq!(c.deadline(), Duration::from_millis(300));
    c.batch_execute("SELECT 1").unwrap();
    let began = std::time::Instant::now();
    let e = c.batch_execute("SELECT pg_sleep(5)").expect_err("past the deadline");
    assert!(matches!(e, CallError::TimedOut(d) if d == Duration::from_millis(300)), "{e:?}");
    assert!(began.elapsed() < Duration::from_secs(3), "{:?}", began.elapsed());
    assert!(c.is_closed(), "a connection whose call timed out is given up");
    assert!(matches!(c.batch_execute("SELECT 1"), Err(CallError::TimedOut(_))), "and not used again");
}

/// Issue 30, item 7: the URL's `sslmode` and `sslrootcert` as libpq reads them, for the store
/// and the lease: `verify-full` connects over TLS (in a URL and in a key=value string), a wrong
/// CA and a wrong host name are refused saying so, `verify-ca` does not check the name,
/// `require` does not check the certificate (unless given `sslrootcert`), `disable` and
/// `prefer` still work, and `require` against a server without TLS fails saying so.
#[test]
fn the_store_and_the_lease_honour_sslmode_and_sslrootcert() {
    use crate::service::lease::pg::PgLease;
    let (ca, cert, key) = tls_certificates("provisioner test CA");
    let (other_ca, _, _) = tls_certificates("another CA");
    let pg = TempPostgres::start_tls("store-tls", &cert, &key).expect("start a PostgreSQL cluster with TLS");
    let dir = std::env::temp_dir().join(format!("provisioner-pgtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_file, other_file) = (dir.join("ca.pem"), dir.join("other-ca.pem"));
    std::fs::write(&ca_file, ca).unwrap();
    std::fs::write(&other_file, other_ca).unwrap();
    let port = pg.port();
    let with = |query: String| format!("{}?{query}", pg.url());
    let ssl = |url: &str| -> Result<String, StoreError> {
        let mut s = PgStore::open(url)?;
        let rows = s.on_session("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
        Ok(rows[0][0].clone().unwrap_or_default())
    };

    let full = with(format!("sslmode=verify-full&sslrootcert={}", ca_file.display()));
    assert_eq!(ssl(&full).unwrap(), "true", "verify-full with the right CA: over TLS");
    let kv = format!(
        "host=localhost port={port} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{}'",
        ca_file.display()
    );
    assert_eq!(ssl(&kv).unwrap(), "true", "a key=value string, the host by name");

    let wrong = with(format!("sslmode=verify-full&sslrootcert={}", other_file.display()));
    let e = ssl(&wrong).unwrap_err().to_string();
    let says = format!("the database's certificate is not signed by the CA in {} (sslrootcert)", other_file.display());
    assert!(e.contains(&says), "{e}");

    // A name the certificate does not hold (the address given apart).
    let named = |mode: &str| {
        format!(
            "postgres://postgres@db.example:{port}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            ca_file.display()
        )
    };
    let e = ssl(&named("verify-full")).unwrap_err().to_string();
    assert!(e.contains("not valid for host \"db.example\" (sslmode=verify-full)"), "{e}");
    assert_eq!(ssl(&named("verify-ca")).unwrap(), "true", "verify-ca checks the chain, not the name");
    let e = ssl(&with(format!("sslmode=verify-ca&sslrootcert={}", other_file.display()))).unwrap_err().to_string();
    assert!(e.contains(&says), "verify-ca checks the chain: {e}");

    assert_eq!(ssl(&with("sslmode=require".into())).unwrap(), "true", "require: TLS, unchecked");
    let e = ssl(&with(format!("sslmode=require&sslrootcert={}", other_file.display()))).unwrap_err().to_string();
    assert!(e.contains(&says), "require with sslrootcert checks it, as libpq: {e}");
    assert_eq!(ssl(pg.url()).unwrap(), "true", "prefer, the default: TLS when offered");
    assert_eq!(ssl(&with("sslmode=disable".into())).unwrap(), "false", "disable: plain");

    // The lease (and the members, the listener: the same connector) over the same settings.
    let mut lease = PgLease::connect(&full, Duration::from_secs(10), "m-tls", "a").expect("the lease over TLS");
    assert!(matches!(
        lease.acquire(Duration::from_secs(30)).unwrap(),
        crate::service::lease::state::Answer::Acquired { .. }
    ));
    let e = PgLease::connect(&wrong, Duration::from_secs(10), "m-tls", "b").unwrap_err().to_string();
    assert!(e.contains(&says), "{e}");

    // A server without TLS: `require` fails saying so, `prefer` falls back to plain.
    let plain = cluster();
    let e = ssl(&format!("{}?sslmode=require", plain.url())).unwrap_err().to_string();
    assert!(e.contains("server does not support TLS"), "{e}");
    assert_eq!(ssl(plain.url()).unwrap(), "false");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stores of one pool (a replica's models, each in a schema of its own) share their lanes'
/// connections: forty models, written to at once, each see only their own machines and model,
/// and the database sees at most one connection per lane; when the stores are gone, so are the
/// connections.
#[test]
fn the_models_of_a_pool_share_one_connection_per_lane_each_in_its_own_schema() {
    let pg = cluster();
    let url = fresh_db(&pg);
    const MODELS: usize = 40;
    let mut admin = raw(&url);
    for i in 0..MODELS {
        admin.batch_execute(&format!("CREATE SCHEMA m{i}")).unwrap();
    }
    let sessions = move |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'provisioner'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let lanes = crate::service::store::lanes::count() as i64;
    let at_work = url.clone();
    let (seen, uuids, busy) = actix::System::new().block_on(async move {
        use crate::service::store::actor::Store;
        let base = Store::start_postgres(&url).unwrap();
        let base_uuid = base.exec(|s| s.model_uuid()).await.unwrap();
        let models: Vec<Store> = (0..MODELS).map(|i| base.start_postgres_beside(&format!("m{i}")).unwrap()).collect();
        // Every model's adds at once, in two rounds: the lanes serve them in turns.
        for _ in 0..2 {
            let adds = models.iter().enumerate().map(|(i, m)| m.exec(move |s| s.add_machines(i + 1, None)));
            for added in futures::future::join_all(adds).await {
                added.unwrap();
            }
        }
        let counts = models.iter().map(|m| m.read(|s| s.machine_ids().map(|ids| ids.len())));
        let seen: Vec<usize> = futures::future::join_all(counts).await.into_iter().map(Result::unwrap).collect();
        // (The blocking client on a thread of its own: not on the runtime's.)
        let busy = std::thread::spawn(move || sessions(&mut raw(&at_work))).join().unwrap();
        let uuids = models.iter().map(|m| m.read(|s| s.model_uuid()));
        let mut uuids: Vec<String> = futures::future::join_all(uuids).await.into_iter().map(Result::unwrap).collect();
        uuids.push(base_uuid);
        (seen, uuids, busy)
    });
    assert!((1..=lanes).contains(&busy), "{busy} connections for {} stores on {lanes} lanes", MODELS + 1);
    assert_eq!(seen, (0..MODELS).map(|i| 2 * (i + 1)).collect::<Vec<_>>(), "each model its own machines");
    let distinct: std::collections::BTreeSet<&String> = uuids.iter().collect();
    assert_eq!(distinct.len(), MODELS + 1, "each schema its own model");
    // The stores are dropped with their system: their connections close.
    let mut open = sessions(&mut admin);
    for _ in 0..100 {
        if open == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        open = sessions(&mut admin);
    }
    assert_eq!(open, 0, "the pool's connections close with its last store");
}

/// When PostgreSQL refuses one more connection (SQLSTATE 53300, `max_connections` reached), a
/// store's operation says so and what to change, waits out its backoff, and connects once a
/// connection is free.
#[test]
fn a_server_that_refuses_more_connections_is_named_with_what_to_change() {
    let pg = TempPostgres::start("too-many").unwrap();
    let url = pg.url().to_owned();
    let mut held = Vec::new();
    loop {
        match postgres::Client::connect(&url, postgres::NoTls) {
            Ok(c) => held.push(c),
            Err(e) => {
                assert_eq!(e.code().map(|c| c.code()), Some("53300"), "{e}");
                break;
            }
        }
        assert!(held.len() < 1000, "the server took a thousand connections");
    }
    let (config, tls) = PgStore::store_config(&url).unwrap();
    let mut store = PgStore::pooled(config, tls, super::new_pool(), None);
    let refused = store.model_uuid();
    let Err(StoreError::Unavailable(why)) = &refused else { panic!("{refused:?}") };
    for part in ["53300", "max_connections", "--store-threads"] {
        assert!(why.contains(part), "{why:?} names {part}");
    }
    drop(held.pop());
    let mut connected = store.model_uuid();
    for _ in 0..50 {
        if connected.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        connected = store.model_uuid();
    }
    assert!(connected.is_ok(), "{connected:?}");
}

/// A connection shared by the stores of a pool keeps each schema's statements prepared: two
/// models taking turns on one session each read through a statement of their own (one
/// prepared under another `search_path` would be parsed and planned again at each turn), and
/// each sees its own machines.
#[test]
fn a_shared_connection_keeps_each_schemas_statements_prepared() {
    let pg = cluster();
    let url = fresh_db(&pg);
    raw(&url).batch_execute("CREATE SCHEMA s_a; CREATE SCHEMA s_b").unwrap();
    let (config, tls) = PgStore::store_config(&url).unwrap();
    let pool = super::new_pool();
    // Both on this thread: the same lane's slot.
    let mut a = PgStore::pooled(config.clone(), tls.clone(), pool, Some("s_a".into()));
    let mut b = PgStore::pooled(config, tls, pool, Some("s_b".into()));
    a.add_machines(1, None).unwrap();
    a.release();
    b.add_machines(2, None).unwrap();
    b.release();
    for _ in 0..10 {
        assert_eq!(a.machine_ids().unwrap().len(), 1);
        a.release();
        assert_eq!(b.machine_ids().unwrap().len(), 2);
        b.release();
    }
    assert_eq!(a.session_pid(), b.session_pid(), "one session served both");
    let prepared = a.on_session(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT id FROM machines ORDER BY seq'",
    );
    assert_eq!(prepared[0][0].as_deref(), Some("2"), "one prepared statement a schema");
}

/// A connection the server ended while it sat idle (a restart, `pg_terminate_backend`) is
/// found gone before a store runs a unit of work on it, and replaced: the unit succeeds (it
/// failed with "terminating connection due to administrator command" before, the first call
/// after a restart through a replica that had been idle since). Pooled and own connections alike.
#[test]
fn a_connection_ended_while_idle_is_replaced_before_a_unit_runs_on_it() {
    let pg = cluster();
    let url = fresh_db(&pg);
    let (config, tls) = PgStore::store_config(&url).unwrap();
    let mut pooled = PgStore::pooled(config, tls, super::new_pool(), None);
    let mut own = PgStore::open(&url).unwrap();
    pooled.add_machines(1, None).unwrap();
    pooled.release();
    own.add_machines(1, None).unwrap();
    let pids = [pooled.session_pid().unwrap(), own.session_pid().unwrap()];
    let mut admin = raw(&url);
    for pid in pids {
        admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    }
    // Soon after (well within `CHECK_AFTER`): what the server said is read, no round trip.
    std::thread::sleep(super::pool::QUIET_AFTER + Duration::from_millis(200));
    assert_eq!(pooled.add_machines(1, None).map(|ids| ids.len()), Ok(1), "the pooled store's add");
    assert_eq!(own.add_machines(1, None).map(|ids| ids.len()), Ok(1), "the store's own connection's add");
    assert_ne!(pooled.session_pid(), Some(pids[0]), "a new session");
    assert_ne!(own.session_pid(), Some(pids[1]), "a new session");
    // Again, found by the empty statement past `CHECK_AFTER`.
    pooled.release();
    let pids = [pooled.session_pid().unwrap(), own.session_pid().unwrap()];
    for pid in pids {
        admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    }
    std::thread::sleep(super::pool::CHECK_AFTER + Duration::from_millis(100));
    assert_eq!(pooled.add_machines(1, None).map(|ids| ids.len()), Ok(1), "the pooled store's add");
    assert_eq!(own.add_machines(1, None).map(|ids| ids.len()), Ok(1), "the store's own connection's add");
    assert_eq!(own.machine_ids().unwrap().len(), 6, "both stores write the one database");
}
