//! Unit tests of what only the SQLite backend has: its file (schema versions and upgrades, WAL,
//! one process at a time, damage found at open), fsynced commits, group commits and the
//! `changed_at` stamps. The behaviour both backends share is `store/behaviour.rs`'s.

use super::StoreCore;
use super::SCHEMA_VERSION;
use crate::model::{Life, MachineId, MachineStatus};
use crate::ports::ProvisionedInstance;
use crate::service::store::backend::StoreBackend;
use crate::service::store::behaviour::{a_good_unit_then_a_failed_one, ids, tags, three_machines_then_abort};
use crate::service::store::errors::StoreError;

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("provisioner-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A database file `p.db` in a fresh `dir(name)`, made by `sql` (an older version's schema and
/// rows) without the store: its path.
fn old_database(name: &str, sql: &str) -> std::path::PathBuf {
    let path = dir(name).join("p.db");
    rusqlite::Connection::open(&path).unwrap().execute_batch(sql).unwrap();
    path
}

#[test]
fn schema_is_created_versioned_and_in_wal_mode() {
    let d = dir("schema");
    let path = d.join("p.db");
    let mut s = StoreCore::open(&path).unwrap();
    let uuid = s.model_uuid().unwrap();
    assert_eq!(uuid.len(), 36, "{uuid}");
    assert_eq!(s.model_life().unwrap(), Life::Alive);
    drop(s);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    // A newer schema is refused, not misread.
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    drop(conn);
    assert!(matches!(StoreCore::open(&path), Err(StoreError::TooNew { .. })));
}

#[test]
fn one_process_at_a_time() {
    let d = dir("lock");
    let first = StoreCore::open(&d.join("p.db")).unwrap();
    assert!(matches!(StoreCore::open(&d.join("p.db")), Err(StoreError::InUse)));
    drop(first);
    assert!(StoreCore::open(&d.join("p.db")).is_ok(), "the lock goes with the connection");
}

#[test]
fn model_uuid_is_kept_across_opens() {
    let d = dir("uuid");
    let a = StoreCore::open(&d.join("p.db")).unwrap().model_uuid().unwrap();
    let b = StoreCore::open(&d.join("p.db")).unwrap().model_uuid().unwrap();
    assert_eq!(a, b);
}

/// Acknowledged writes survive the process dying abruptly: a child process (this very test,
/// re-run with an environment variable) writes, then aborts without closing anything, as
/// after `kill -9`; the parent reopens the database and finds every write, the unsynced one
/// included (it was in the operating system's hands).
#[test]
fn acknowledged_writes_survive_an_abrupt_end() {
    const CHILD: &str = "PROVISIONER_STORE_ABORT_CHILD";
    if let Ok(path) = std::env::var(CHILD) {
        let mut s = StoreCore::open(std::path::Path::new(&path)).unwrap();
        s.add_machines(3, None).unwrap();
        s.set_workers(7).unwrap();
        s.set_durable(false).unwrap();
        s.create_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
        std::process::abort();
    }
    let d = dir("durable");
    let path = d.join("p.db");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "service::store::sqlite::tests::acknowledged_writes_survive_an_abrupt_end", "--nocapture"])
        .env(CHILD, &path)
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child was meant to abort");
    let mut reopened = StoreCore::open(&path).unwrap();
    assert_eq!(ids(&reopened.machine_ids().unwrap()), ["0", "1", "2"]);
    assert_eq!(reopened.settings().unwrap().workers, Some(7));
    assert_eq!(reopened.pending_instances().unwrap().len(), 1);
}

#[test]
fn commits_are_fsynced_unless_asked_otherwise() {
    let mut s = StoreCore::in_memory().unwrap();
    let sync =
        |s: &StoreCore| -> i64 { s.conn_for_tests().pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap() };
    assert!(s.is_durable());
    assert_eq!(sync(&s), 2, "FULL");
    s.set_durable(false).unwrap();
    assert_eq!(sync(&s), 1, "NORMAL");
    s.set_durable(true).unwrap();
    assert_eq!(sync(&s), 2, "FULL");
}

/// A database with a corrupt page is refused at open (not opened as if
/// whole), and a database that lost its model's identity is not given a new one.
#[test]
fn a_damaged_database_is_refused_at_open() {
    let d = dir("damaged");
    let path = d.join("p.db");
    {
        let mut s = StoreCore::open(&path).unwrap();
        s.add_machines(200, Some(&["az1".to_owned()])).unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 3 * 4096);
    for b in &mut bytes[2 * 4096 + 8..2 * 4096 + 2000] {
        *b = 0xa5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = StoreCore::open(&path).err().expect("a damaged database was opened");
    assert!(matches!(err, StoreError::Damaged { .. }), "{err:?}");

    let path = d.join("no-uuid.db");
    drop(StoreCore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("DELETE FROM meta WHERE key = 'model_uuid'", []).unwrap();
    drop(conn);
    assert!(matches!(StoreCore::open(&path), Err(StoreError::Damaged { .. })), "a lost identity got a new uuid");

    // Damage seen by a later call makes the store unreadable for good (/healthz).
    let mut s = StoreCore::in_memory().unwrap();
    assert_eq!(s.check_readable(), Ok(()));
    s.note_damage(&StoreError::Damaged { context: "reading a machine", message: "malformed".into() });
    assert!(matches!(s.check_readable(), Err(StoreError::Damaged { .. })));
}

/// A constraint shared by many machines is stored once.
#[test]
fn shared_constraints_are_stored_once() {
    let mut s = StoreCore::in_memory().unwrap();
    let zones = vec!["az1".to_owned(), "az2".to_owned()];
    let a = s.add_machines(100, Some(&zones)).unwrap();
    s.add_machines(50, Some(&zones)).unwrap();
    s.add_machines(5, Some(&["az3".to_owned()])).unwrap();
    s.add_machines(5, None).unwrap();
    let rows: i64 = s.conn_for_tests().query_row("SELECT count(*) FROM constraints", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 2, "one row per distinct constraint");
    let per_machine: i64 = s
        .conn_for_tests()
        .query_row("SELECT count(*) FROM machines WHERE zones IS NOT NULL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(per_machine, 0, "no machine keeps a copy");
    assert_eq!(s.machine(&a[99]).unwrap().unwrap().zones, Some(zones.clone()));
    assert_eq!(s.list_machines().unwrap().iter().filter(|m| m.zones.as_ref() == Some(&zones)).count(), 150);
    assert_eq!(s.provisioning_info(&a[..1]).unwrap()[0].as_ref().unwrap().constraints.zones, Some(zones));
}

/// A version-1 database (zones in a column of each machine) is upgraded in place and reads the
/// same.
#[test]
fn a_version_1_database_is_upgraded() {
    let path = old_database(
        "v1",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
             CREATE TABLE machines (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,
                 life TEXT NOT NULL DEFAULT 'alive', status TEXT NOT NULL DEFAULT 'pending',
                 status_message TEXT NOT NULL DEFAULT '', instance_status TEXT NOT NULL DEFAULT '',
                 instance_status_message TEXT NOT NULL DEFAULT '', instance TEXT, zone TEXT, nonce TEXT,
                 display_name TEXT NOT NULL DEFAULT '', zones TEXT, keep_instance INTEGER NOT NULL DEFAULT 0,
                 transient INTEGER NOT NULL DEFAULT 0);
             INSERT INTO meta VALUES ('model_uuid', 'u-1'), ('model_life', 'alive'), ('next_machine', '1');
             INSERT INTO machines (seq, id, zones) VALUES (0, '0', 'az1,az3');
             PRAGMA user_version = 1;",
    );
    let mut s = StoreCore::open(&path).unwrap();
    assert_eq!(s.model_uuid().unwrap(), "u-1");
    let zones = s.machine(&MachineId::new("0")).unwrap().unwrap().zones;
    assert_eq!(zones, Some(vec!["az1".to_owned(), "az3".to_owned()]));
    assert_eq!(ids(&s.add_machines(1, Some(&["az2".to_owned()])).unwrap()), ["1"]);
    assert_eq!(s.machine(&MachineId::new("1")).unwrap().unwrap().zones, Some(vec!["az2".to_owned()]));
    assert_eq!(s.counts().machines_by_status.get("pending"), Some(&2));
}

/// Every constraint key round-trips through the store, a set shared by many machines is one
/// row, and the placement and the time of the last change are kept per machine.
#[test]
fn whole_constraint_sets_and_placements_are_stored() {
    use crate::model::Constraints;
    use crate::service::store::records::NewMachine;
    let mut s = StoreCore::in_memory().unwrap();
    let c = Constraints::parse(
        "arch=arm64 cores=4 mem=16G root-disk=64G instance-type=m5.large zones=az1,az2 spaces=db,^dmz tags=ssd,^gpu",
    )
    .unwrap();
    let spec = NewMachine { constraints: c.clone(), placement: Some("zone=az2".into()), ..NewMachine::default() };
    let a = s.add_new_machines(3, &spec).unwrap();
    s.add_new_machines(2, &NewMachine { placement: None, ..spec.clone() }).unwrap();
    s.add_machines(1, Some(&["az1".to_owned(), "az2".to_owned()])).unwrap();
    let rows: i64 = s.conn_for_tests().query_row("SELECT count(*) FROM constraints", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 2, "one row per distinct constraint set");
    let m = s.machine(&a[0]).unwrap().unwrap();
    assert_eq!(m.constraints, c);
    assert_eq!(m.zones, c.zones);
    assert_eq!(m.placement.as_deref(), Some("zone=az2"));
    assert_eq!(m.application, None);
    let stamp = m.changed_at.clone().expect("stamped at insert");
    assert!(stamp.ends_with('Z') && stamp.len() == 24, "{stamp}");
    let info = s.provisioning_info(&a[..1]).unwrap()[0].clone().unwrap();
    assert_eq!((info.constraints, info.placement.as_deref()), (c, Some("zone=az2")));
    // A write stamps it again (the database does it, whoever writes).
    s.conn_for_tests()
        .execute("UPDATE machines SET changed_at = '2000-01-01T00:00:00.000Z' WHERE id = '0'", [])
        .unwrap();
    s.set_status(&a[0], MachineStatus::Error, "x").unwrap();
    let later = s.machine(&a[0]).unwrap().unwrap().changed_at.unwrap();
    assert!(later.as_str() > "2000-01-01T00:00:00.000Z", "{later}");
}

/// A version-2 database (a `constraints` table of zones alone) is upgraded in place: its rows
/// become whole constraint sets with the same ids, its machines read the same, and new machines
/// share the upgraded rows.
#[test]
fn a_version_2_database_is_upgraded() {
    let path = old_database(
        "v2",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
             CREATE TABLE constraints (id INTEGER PRIMARY KEY, zones TEXT NOT NULL UNIQUE);
             CREATE TABLE machines (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,
                 life TEXT NOT NULL DEFAULT 'alive', status TEXT NOT NULL DEFAULT 'pending',
                 status_message TEXT NOT NULL DEFAULT '', instance_status TEXT NOT NULL DEFAULT '',
                 instance_status_message TEXT NOT NULL DEFAULT '', instance TEXT, zone TEXT, nonce TEXT,
                 display_name TEXT NOT NULL DEFAULT '', zones TEXT, keep_instance INTEGER NOT NULL DEFAULT 0,
                 transient INTEGER NOT NULL DEFAULT 0, constraints_id INTEGER REFERENCES constraints(id));
             CREATE TABLE instances (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, state TEXT NOT NULL,
                 zone TEXT, model TEXT, machine TEXT, start TEXT, client_token TEXT UNIQUE);
             INSERT INTO meta VALUES ('model_uuid', 'u-2'), ('model_life', 'alive'), ('next_machine', '2');
             INSERT INTO constraints VALUES (7, 'az1,az3');
             INSERT INTO machines (seq, id, constraints_id) VALUES (0, '0', 7), (1, '1', NULL);
             PRAGMA user_version = 2;",
    );
    let mut s = StoreCore::open(&path).unwrap();
    assert_eq!(s.model_uuid().unwrap(), "u-2");
    let zones = Some(vec!["az1".to_owned(), "az3".to_owned()]);
    let m0 = s.machine(&MachineId::new("0")).unwrap().unwrap();
    assert_eq!((m0.zones.clone(), m0.constraints.zones.clone()), (zones.clone(), zones.clone()));
    assert_eq!((m0.placement, m0.application), (None, None));
    assert_eq!(s.machine(&MachineId::new("1")).unwrap().unwrap().zones, None);
    assert_eq!(ids(&s.add_machines(1, zones.as_deref()).unwrap()), ["2"]);
    let shared: i64 = s
        .conn_for_tests()
        .query_row("SELECT count(DISTINCT constraints_id) FROM machines WHERE constraints_id IS NOT NULL", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(shared, 1, "the new machine shares the upgraded row");
    let fk: i64 = s.conn_for_tests().pragma_query_value(None, "foreign_keys", |r| r.get(0)).unwrap();
    assert_eq!(fk, 1, "foreign keys are on again");
    let problems: i64 =
        s.conn_for_tests().query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0)).unwrap();
    assert_eq!(problems, 0);
    s.add_application("web", 1, &crate::model::Constraints::default(), Default::default()).unwrap();
    // It gained the manual machines' columns too.
    assert!(!s.machine(&MachineId::new("0")).unwrap().unwrap().machine.manual);
    let manual = s.add_manual("db-1").unwrap();
    let m = s.machine(&manual).unwrap().unwrap();
    assert!(m.machine.manual && m.address.as_deref() == Some("db-1"), "{m:?}");
    drop(s);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    drop(conn);
    // Opening it again changes nothing.
    let mut s = StoreCore::open(&path).unwrap();
    assert_eq!(s.machine(&MachineId::new("0")).unwrap().unwrap().zones, zones);
}

/// Start attempts: each reported outcome counts one, a failure keeps its error, a success
/// clears it; a version-3 database without the columns gains them when opened (its machines
/// at zero attempts), and opening it again changes nothing.
#[test]
fn start_attempts_are_counted_with_the_last_error_and_added_to_older_databases() {
    let d = dir("attempts");
    let path = d.join("p.db");
    let zero = MachineId::new("0");
    {
        let mut s = StoreCore::open(&path).unwrap();
        s.add_machines(2, None).unwrap();
        let m = s.machine(&zero).unwrap().unwrap();
        assert_eq!((m.start_attempts, m.last_start_error), (0, None));
        s.record_start_outcome(&zero, Some("boom")).unwrap();
        s.record_start_outcome(&zero, Some("bang")).unwrap();
        let m = s.machine(&zero).unwrap().unwrap();
        assert_eq!((m.start_attempts, m.last_start_error.as_deref()), (2, Some("bang")));
        s.record_start_outcome(&zero, None).unwrap();
        let m = s.machine(&zero).unwrap().unwrap();
        assert_eq!((m.start_attempts, m.last_start_error), (3, None));
        assert_eq!(s.record_start_outcome(&MachineId::new("9"), None), Err(StoreError::NotFound(MachineId::new("9"))));
        // As a version-3 database written before the columns existed.
        s.conn_for_tests()
            .execute_batch(
                "ALTER TABLE machines DROP COLUMN start_attempts; ALTER TABLE machines DROP COLUMN last_start_error;",
            )
            .unwrap();
    }
    for _ in 0..2 {
        let mut s = StoreCore::open(&path).unwrap();
        let m = s.machine(&zero).unwrap().unwrap();
        assert_eq!((m.start_attempts, m.last_start_error.clone()), (0, None), "{m:?}");
        assert_eq!(s.machine(&MachineId::new("1")).unwrap().unwrap().start_attempts, 0);
        s.record_start_outcome(&MachineId::new("1"), Some("x")).unwrap();
        let v: i64 = s.conn_for_tests().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        s.conn_for_tests().execute_batch("UPDATE machines SET start_attempts = 0, last_start_error = NULL").unwrap();
    }
}

/// A group commit on the core: a write that fails inside it is rolled back alone (its machine
/// and its counts with it), the others commit together; an aborted group leaves nothing, and
/// the book (outbox, counts) as before it.
#[test]
fn a_group_commit_keeps_its_good_writes_and_drops_a_failed_one() {
    let mut s = StoreCore::in_memory().unwrap();
    let sync =
        |s: &StoreCore| -> i64 { s.conn_for_tests().pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap() };
    s.begin_group(false).unwrap();
    assert_eq!(sync(&s), 1, "a lazy group commits without fsync (NORMAL)");
    assert!(!s.group_has_written());
    a_good_unit_then_a_failed_one(&mut s);
    s.begin_member().unwrap();
    s.set_status(&MachineId::new("1"), MachineStatus::Started, "").unwrap();
    s.end_member(true).unwrap();
    s.commit_group().unwrap();
    assert_eq!(ids(&s.machine_ids().unwrap()), ["0", "1"], "the failed write's machine is gone");
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount, "the failed write is not counted");
    assert_eq!(ids(&s.take_outbox().0), ["0", "1"]);
    assert!(s.conn_for_tests().is_autocommit(), "committed");

    s.begin_group(true).unwrap();
    assert_eq!(sync(&s), 2, "a durable group is fsynced (FULL)");
    let before = s.counts().clone();
    three_machines_then_abort(&mut s);
    assert_eq!(ids(&s.machine_ids().unwrap()), ["0", "1"], "nothing of an aborted group is written");
    assert_eq!(s.counts(), &before);
    assert!(s.take_outbox().0.is_empty(), "nor heard of");
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["2"], "outside a group, a write commits alone");
}

/// The store actor's group commit: writes sent while the store is busy commit together (one
/// group), a failing one among them (it adds a machine, then fails) changes nothing and fails
/// alone, and no write is answered before the group's commit.
#[test]
// The last write waits a while on the store's thread, for early answers to show.
#[allow(clippy::disallowed_methods)]
fn writes_waiting_together_commit_as_one_group_answered_after_its_commit() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let d = dir("group");
    let db = d.join("p.db");
    actix_rt::System::new().block_on(async move {
        let store = crate::service::store::actor::Store::start(&db).unwrap();
        let commits = store.group_commits();
        // The store's thread is held by a first unit of work until every write is queued.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = store.exec(move |_| {
            held.recv().unwrap();
            Ok(())
        });
        let answered = Arc::new(AtomicUsize::new(0));
        let mut writes = Vec::new();
        for i in 0..8 {
            let answered = answered.clone();
            let w = store.exec(move |s| {
                let ids = s.add_machines(1, None)?;
                match i {
                    3 => Err(StoreError::Refused("bad write".into())),
                    _ => Ok(ids),
                }
            });
            writes.push(actix_rt::spawn(async move {
                let r = w.await;
                answered.fetch_add(1, Ordering::SeqCst);
                r
            }));
        }
        // The last write looks, a while after the others ran, for an answer sent before the
        // commit.
        let early = answered.clone();
        let last = store.exec(move |s| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            s.add_machines(1, None)?;
            Ok(early.load(Ordering::SeqCst))
        });
        release.send(()).unwrap();
        first.await.unwrap();
        assert_eq!(last.await.unwrap(), 0, "no write of the group was answered before its commit");
        let mut added = Vec::new();
        for (i, w) in writes.into_iter().enumerate() {
            match w.await.unwrap() {
                Ok(ids) => added.extend(ids),
                Err(e) => assert!(i == 3 && e == StoreError::Refused("bad write".into()), "write {i}: {e}"),
            }
        }
        assert_eq!(ids(&added), ["0", "1", "2", "3", "4", "5", "6"], "the bad write took no id");
        assert_eq!(store.group_commits() - commits, 1, "one commit for all of them");
        let (machines, counts) = store.read(|s| Ok((s.machine_ids()?, s.counts().clone()))).await.unwrap();
        assert_eq!(machines.len(), 8, "seven good writes and the last one");
        assert_eq!(counts.machines_by_status.get("pending"), Some(&8));
    });
}

/// The provisioner's writes at every start stamp `changed_at` in their own statement: the row
/// is written once, not a second time by the stamping trigger (which still stamps every other
/// write).
#[test]
fn the_hot_machine_writes_stamp_their_row_once() {
    let mut s = StoreCore::in_memory().unwrap();
    let id = s.add_machines(1, None).unwrap().remove(0);
    let old = "2000-01-01T00:00:00.000Z";
    let reset = |s: &StoreCore| s.conn_for_tests().execute("UPDATE machines SET changed_at = ?1", [old]).unwrap();
    let info = ProvisionedInstance {
        instance: crate::model::InstanceId::new("i-1"),
        zone: Some("az1".into()),
        nonce: "n".into(),
        display_name: String::new(),
        status: crate::model::InstanceStatus::running(),
        capacity_type: None,
    };
    type Write<'a> = (&'a str, Box<dyn Fn(&mut StoreCore) + 'a>);
    let writes: [Write<'_>; 5] = [
        ("set_status", Box::new(|s| s.set_status(&id, MachineStatus::Pending, "").unwrap())),
        ("set_instance_status", Box::new(|s| s.set_instance_status(&id, &info.status, "up").unwrap())),
        ("record_start_outcome", Box::new(|s| s.record_start_outcome(&id, None).unwrap())),
        ("set_instance_info", Box::new(|s| s.set_instance_info(&id, &info).unwrap())),
        ("record_started_instance", Box::new(|s| s.record_started_instance(&id, &info).unwrap())),
    ];
    for (name, write) in &writes {
        reset(&s);
        let before = s.conn_for_tests().total_changes();
        write(&mut s);
        assert_eq!(s.conn_for_tests().total_changes() - before, 1, "{name} wrote its row more than once");
        let stamp = s.machine(&id).unwrap().unwrap().changed_at.unwrap();
        assert!(stamp.as_str() > old, "{name} did not stamp the row: {stamp}");
    }
    // Any other write is still stamped, by the trigger.
    reset(&s);
    s.ensure_dead(&id).unwrap();
    assert!(s.machine(&id).unwrap().unwrap().changed_at.unwrap().as_str() > old);
}

/// The stamp the provisioner's writes bind as `changed_at` is what SQLite's stamping triggers
/// write (`strftime('%Y-%m-%dT%H:%M:%fZ', ...)`) for the same instant, character for
/// character; the writes of one unit of work in a group share its stamp, the next unit takes
/// its own.
#[test]
#[allow(clippy::disallowed_methods)] // the stamps are the wall clock's: real time must pass
fn the_bound_stamp_is_the_one_sqlite_would_write() {
    let mut s = StoreCore::in_memory().unwrap();
    let stamp = super::rows::now_stamp();
    let sqlite: String =
        s.conn_for_tests().query_row("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', ?1)", [&stamp], |r| r.get(0)).unwrap();
    assert_eq!(sqlite, stamp);
    let now: String =
        s.conn_for_tests().query_row("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')", [], |r| r.get(0)).unwrap();
    assert_eq!((now.len(), &now[..10]), (stamp.len(), &stamp[..10]), "{now} and {stamp}");

    // Each step a few milliseconds after the last, so that no write finds its row's stamp
    // unchanged (the stamping trigger would then stamp it again).
    let wait = std::time::Duration::from_millis(3);
    let m = s.add_machines(3, None).unwrap();
    std::thread::sleep(wait);
    s.begin_group(false).unwrap();
    s.begin_member().unwrap();
    s.set_status(&m[0], MachineStatus::Started, "").unwrap();
    s.set_status(&m[1], MachineStatus::Started, "").unwrap();
    s.end_member(true).unwrap();
    std::thread::sleep(wait);
    s.begin_member().unwrap();
    s.set_status(&m[2], MachineStatus::Started, "").unwrap();
    s.end_member(true).unwrap();
    s.commit_group().unwrap();
    let stamps: Vec<String> = m.iter().map(|id| s.machine(id).unwrap().unwrap().changed_at.unwrap()).collect();
    assert_eq!(stamps[0], stamps[1], "one stamp for a unit of work");
    assert!(stamps[2] > stamps[1], "the next unit's own: {stamps:?}");
}

/// An add writes each new machine's row once (no stamping trigger runs after it) and takes its
/// ids from the counter at once: 1,000 machines are 1,000 row changes and one counter's, their
/// ids consecutive and never reused.
#[test]
fn an_add_writes_each_row_once_and_takes_its_ids_at_once() {
    let mut s = StoreCore::in_memory().unwrap();
    assert_eq!(ids(&s.add_machines(2, None).unwrap()), ["0", "1"]);
    let before = s.conn_for_tests().total_changes();
    let added = s.add_machines(1000, None).unwrap();
    assert_eq!(s.conn_for_tests().total_changes() - before, 1001, "each row once, and the counter");
    let expected: Vec<String> = (2..1002).map(|n: u32| n.to_string()).collect();
    assert_eq!(ids(&added), expected.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(s.machine(&added[999]).unwrap().unwrap().changed_at.is_some(), "stamped");
    assert_eq!(s.machine_ids().unwrap().len(), 1002);
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["1002"]);
    assert!(s.add_machines(0, None).unwrap().is_empty());
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["1003"]);
}
