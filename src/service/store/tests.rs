//! Unit tests of the store core: schema, round trips, all-or-nothing requests, durability.

use super::backend::StoreBackend;
use super::state::{StoreCore, StoreError, SCHEMA_VERSION};
use crate::model::{
    Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, MachineId, MachineStatus,
};
use crate::ports::ProvisionedInstance;

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("provisioner-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ids(v: &[MachineId]) -> Vec<&str> {
    v.iter().map(MachineId::as_str).collect()
}

fn tags(uuid: &str, machine: &str) -> InstanceTags {
    InstanceTags { model: Some(uuid.into()), machine: Some(MachineId::new(machine)), start: Some("n".into()) }
}

#[test]
fn schema_is_created_versioned_and_in_wal_mode() {
    let d = dir("schema");
    let path = d.join("p.db");
    let s = StoreCore::open(&path).unwrap();
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

fn machines_round_trip_and_ids_are_never_reused(s: &mut dyn StoreBackend) {
    let zones = vec!["az1".to_owned(), "az2".to_owned()];
    let added = s.add_machines(3, Some(&zones)).unwrap();
    assert_eq!(ids(&added), ["0", "1", "2"]);
    assert_eq!(s.take_outbox(), (added.clone(), false));
    let info = s.provisioning_info(&added[..1]).unwrap();
    assert_eq!(info[0].as_ref().unwrap().constraints.zones, Some(zones));

    let m0 = MachineId::new("0");
    s.set_instance_status(&m0, &InstanceStatus::provisioning(), "starting").unwrap();
    let rec = s.machine(&m0).unwrap().unwrap();
    assert_eq!(rec.machine.instance_status, InstanceStatus::provisioning());
    assert_eq!(rec.message(), "starting");
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-1"),
        zone: Some("az2".into()),
        nonce: "machine-0:x".into(),
        display_name: "sim-i-1".into(),
        status: InstanceStatus::running(),
    };
    s.set_instance_info(&m0, &info).unwrap();
    let rec = s.machine(&m0).unwrap().unwrap();
    assert_eq!(rec.machine.instance, Some(InstanceId::new("i-1")));
    assert_eq!(rec.machine.status, MachineStatus::Started);
    assert_eq!(rec.zone.as_deref(), Some("az2"));
    assert_eq!(rec.message(), "");

    // Removal: dead, then gone; the next id is still new.
    s.remove_machines(std::slice::from_ref(&m0), false, false).unwrap();
    assert_eq!(s.take_outbox().0, vec![m0.clone()]);
    assert_eq!(s.machine(&m0).unwrap().unwrap().machine.life, Life::Dead);
    s.mark_for_removal(&m0).unwrap();
    assert!(s.machine(&m0).unwrap().is_none());
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["3"]);
    assert!(matches!(s.set_status(&m0, MachineStatus::Error, "x"), Err(StoreError::NotFound(_))));
}

fn removal_and_retry_are_all_or_nothing(s: &mut dyn StoreBackend) {
    let added = s.add_machines(2, None).unwrap();
    s.take_outbox();
    let err = s.remove_machines(&[added[0].clone(), MachineId::new("9")], false, false).unwrap_err();
    assert_eq!(err, StoreError::NotFound(MachineId::new("9")));
    assert_eq!(s.machine(&added[0]).unwrap().unwrap().machine.life, Life::Alive, "the first was removed anyway");
    assert_eq!(s.take_outbox().0, Vec::<MachineId>::new());

    // Retry needs a provisioning error.
    assert!(matches!(s.retry_machines(&added[..1]), Err(StoreError::Refused(_))));
    s.set_instance_status(&added[0], &InstanceStatus::provisioning_error(), "no capacity").unwrap();
    s.set_status(&added[0], MachineStatus::Error, "no capacity").unwrap();
    s.retry_machines(&added[..1]).unwrap();
    assert_eq!(s.take_outbox(), (Vec::new(), true));
    assert_eq!(s.transient_errors().unwrap().len(), 1);
    // The provisioner resets it to pending: the retry request ends.
    s.set_status(&added[0], MachineStatus::Pending, "").unwrap();
    assert!(!s.machine(&added[0]).unwrap().unwrap().transient);

    // A second removal needs --force.
    s.remove_machines(&added[1..], true, false).unwrap();
    assert!(s.machine(&added[1]).unwrap().unwrap().machine.keep_instance);
    assert!(matches!(s.remove_machines(&added[1..], false, false), Err(StoreError::Refused(_))));
    s.remove_machines(&added[1..], false, true).unwrap();
}

fn a_dying_model_refuses_machines_and_destroys_once(s: &mut dyn StoreBackend) {
    s.add_machines(2, None).unwrap();
    assert_eq!(s.destroy_model().unwrap().len(), 2);
    assert_eq!(s.model_life().unwrap(), Life::Dying);
    assert_eq!(s.destroy_model().unwrap_err(), StoreError::ModelDying);
    assert_eq!(s.add_machines(1, None).unwrap_err(), StoreError::ModelDying);
}

fn instances_are_idempotent_by_client_token_and_listed_by_model(s: &mut dyn StoreBackend) {
    let (a, new) = s.create_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(new);
    assert_eq!(a.instance.state, InstanceState::Pending);
    let (again, new) = s.create_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(!new);
    assert_eq!(again.instance.id, a.instance.id);
    let (b, _) = s.create_instance("1/n/1", None, &tags("other-model", "1")).unwrap();
    assert_ne!(a.instance.id, b.instance.id);
    assert_eq!(s.pending_instances().unwrap().len(), 2);
    let landed = s.land_instance(&a.instance.id).unwrap().unwrap();
    assert_eq!(landed.instance.state, InstanceState::Running);
    let live = s.live_instances("m").unwrap();
    assert_eq!(live.len(), 1, "only our model's instances are listed");
    assert_eq!(live[0].tags.machine, Some(MachineId::new("0")));
    s.terminate_instances(&[a.instance.id.clone(), InstanceId::new("i-gone")]).unwrap();
    assert!(s.live_instances("m").unwrap().is_empty());
    // A terminated instance does not come back to life when its late landing arrives.
    assert_eq!(s.land_instance(&a.instance.id).unwrap().unwrap().instance.state, InstanceState::Terminated);
    assert!(!s.retag_instance(&a.instance.id, &tags("m", "5")).unwrap());
    s.release_instances(std::slice::from_ref(&b.instance.id)).unwrap();
    assert_eq!(s.instance(&b.instance.id).unwrap().unwrap().instance.tags.model, None);
}

fn settings_round_trip(s: &mut dyn StoreBackend) {
    assert_eq!(s.settings().unwrap().workers, None);
    s.set_workers(4).unwrap();
    s.set_harvest_mode(HarvestMode::All).unwrap();
    let got = s.settings().unwrap();
    assert_eq!((got.workers, got.harvest_mode), (Some(4), Some(HarvestMode::All)));
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
        .args(["--exact", "service::store::tests::acknowledged_writes_survive_an_abrupt_end", "--nocapture"])
        .env(CHILD, &path)
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child was meant to abort");
    let reopened = StoreCore::open(&path).unwrap();
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

/// The gauges' counts kept as the store writes always equal a full recount,
/// whatever the writes (random ones, from a seeded RNG, failed ones included).
fn counts_kept_as_writes_commit_match_a_full_recount(s: &mut dyn StoreBackend) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
    let statuses = [MachineStatus::Pending, MachineStatus::Started, MachineStatus::Error, MachineStatus::Stopped];
    let mut instances: Vec<InstanceId> = Vec::new();
    for step in 0..2_000 {
        let machine = MachineId::new(rng.random_range(0..40u32).to_string());
        // Errors (unknown machines, refusals) are part of the test: they must count nothing.
        let _ = match rng.random_range(0..11) {
            0 => s.add_machines(rng.random_range(1..4), None).map(drop),
            1 => s.set_status(&machine, statuses[rng.random_range(0..statuses.len())], "x"),
            2 => s.set_instance_info(
                &machine,
                &ProvisionedInstance {
                    instance: InstanceId::new(format!("i-{step}")),
                    zone: None,
                    nonce: "n".into(),
                    display_name: String::new(),
                    status: InstanceStatus::running(),
                },
            ),
            3 => s.ensure_dead(&machine),
            4 => s.mark_for_removal(&machine),
            5 => s.remove_machines(&[machine.clone(), machine.clone()], rng.random_bool(0.5), rng.random_bool(0.5)),
            6 => s
                .create_instance(&format!("t{}", rng.random_range(0..60u32)), None, &tags("m", machine.as_str()))
                .map(|(r, _)| instances.push(r.instance.id)),
            7 if !instances.is_empty() => {
                let id = instances[rng.random_range(0..instances.len())].clone();
                s.land_instance(&id).map(drop)
            }
            8 if !instances.is_empty() => {
                let id = instances[rng.random_range(0..instances.len())].clone();
                s.terminate_instances(&[id.clone(), id, InstanceId::new("i-gone")])
            }
            9 if step > 1_500 => s.destroy_model().map(drop),
            _ => s.set_instance_status(&machine, &InstanceStatus::provisioning(), "starting"),
        };
        let recount = s.recount().unwrap();
        assert_eq!(s.counts(), &recount, "after step {step}");
    }
    assert!(s.counts().machines_by_status.values().sum::<u64>() > 0);
    assert!(s.counts().instances_by_state.get("terminated").copied().unwrap_or(0) > 0);
    assert_eq!(s.counts().model_life, "dying");
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
    let d = dir("v1");
    let path = d.join("p.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
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
        )
        .unwrap();
    }
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
    use super::state::NewMachine;
    use crate::model::Constraints;
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

/// An application's machines are its distribution group; removing it takes them to dead, all
/// at once, and a second one of the same name is refused while it exists.
fn applications_group_their_machines_and_go_with_them(s: &mut dyn StoreBackend) {
    use crate::model::Constraints;
    s.add_machines(1, None).unwrap();
    let c = Constraints::parse("cores=2").unwrap();
    let web = s.add_application("web", 3, &c).unwrap();
    assert_eq!(ids(&web), ["1", "2", "3"]);
    assert!(matches!(s.add_application("web", 1, &c), Err(StoreError::Refused(_))));
    let db = s.add_application("db", 1, &Constraints::default()).unwrap();
    let groups =
        s.distribution_groups(&[web[0].clone(), MachineId::new("0"), db[0].clone(), MachineId::new("9")]).unwrap();
    assert_eq!(groups[0].as_deref().map(ids), Some(vec!["2", "3"]));
    assert_eq!(groups[1], Some(Vec::new()), "a machine of no application has no group");
    assert_eq!(groups[2], Some(Vec::new()));
    assert_eq!(groups[3], None);
    let apps = s.applications().unwrap();
    assert_eq!(apps.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["db", "web"]);
    assert_eq!((apps[1].constraints.cores, ids(&apps[1].machines)), (Some(2), vec!["1", "2", "3"]));
    assert_eq!(s.machine(&web[1]).unwrap().unwrap().application.as_deref(), Some("web"));
    let _ = s.take_outbox();
    assert_eq!(ids(&s.remove_application("web").unwrap()), ["1", "2", "3"]);
    assert_eq!(ids(&s.take_outbox().0), ["1", "2", "3"], "the watcher hears of them");
    assert!(web.iter().all(|m| s.machine(m).unwrap().unwrap().machine.life == Life::Dead));
    assert_eq!(s.remove_application("web"), Err(StoreError::NoApplication("web".into())));
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
    // Its dying machines are no group of a new application of the same name.
    let again = s.add_application("web", 1, &c).unwrap();
    assert_eq!(s.distribution_groups(&again).unwrap()[0], Some(Vec::new()));
    s.destroy_model().unwrap();
    assert_eq!(s.add_application("late", 1, &c), Err(StoreError::ModelDying));
}

/// A version-2 database (a `constraints` table of zones alone) is upgraded in place: its rows
/// become whole constraint sets with the same ids, its machines read the same, and new machines
/// share the upgraded rows.
#[test]
fn a_version_2_database_is_upgraded() {
    let d = dir("v2");
    let path = d.join("p.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
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
        )
        .unwrap();
    }
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
    s.add_application("web", 1, &crate::model::Constraints::default()).unwrap();
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
    let s = StoreCore::open(&path).unwrap();
    assert_eq!(s.machine(&MachineId::new("0")).unwrap().unwrap().zones, zones);
}

/// Containers are numbered per host and type, never reused; a missing or dead host is refused
/// naming the `host` field, and nothing is written (no id is used up).
fn containers_are_numbered_per_host_and_type_on_alive_hosts_only(s: &mut dyn StoreBackend) {
    let hosts = s.add_machines(2, None).unwrap();
    let (h0, h1) = (&hosts[0], &hosts[1]);
    assert_eq!(ids(&s.add_containers(h0, "lxd", 2).unwrap()), ["0/lxd/0", "0/lxd/1"]);
    assert_eq!(ids(&s.add_containers(h0, "kvm", 1).unwrap()), ["0/kvm/0"]);
    assert_eq!(ids(&s.add_containers(h1, "lxd", 1).unwrap()), ["1/lxd/0"]);
    let (changed, _) = s.take_outbox();
    assert_eq!(changed.len(), 6, "the watchers hear of every new machine: {changed:?}");
    let missing = s.add_containers(&MachineId::new("7"), "lxd", 1).unwrap_err();
    assert!(matches!(&missing, StoreError::Invalid { field: "host", .. }), "{missing:?}");
    assert!(missing.to_string().contains("machine 7 does not exist"), "{missing}");
    s.remove_machines(std::slice::from_ref(h1), false, true).unwrap();
    let dead = s.add_containers(h1, "lxd", 1).unwrap_err();
    assert!(matches!(&dead, StoreError::Invalid { field: "host", .. }), "{dead:?}");
    assert_eq!(s.list_machines().unwrap().len(), 6, "nothing written by a refusal");
    // Ids are never reused, and machines keep their own numbering.
    s.ensure_dead(&MachineId::new("0/lxd/1")).unwrap();
    s.mark_for_removal(&MachineId::new("0/lxd/1")).unwrap();
    assert_eq!(ids(&s.add_containers(h0, "lxd", 1).unwrap()), ["0/lxd/2"]);
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["2"]);
    // Listed machines first (in id order), then containers in the order they came.
    let listed: Vec<String> = s.list_machines().unwrap().iter().map(|m| m.machine.id.to_string()).collect();
    assert_eq!(listed, ["0", "1", "2", "0/lxd/0", "0/kvm/0", "1/lxd/0", "0/lxd/2"]);
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
}

/// A host with live containers is not removed without force (nothing written); removed with
/// them, or with force, it is.
fn a_host_with_live_containers_is_removed_only_with_them_or_with_force(s: &mut dyn StoreBackend) {
    let hosts = s.add_machines(11, None).unwrap();
    let c = s.add_containers(&hosts[1], "lxd", 2).unwrap();
    s.add_containers(&hosts[10], "lxd", 1).unwrap();
    assert_eq!(ids(&s.live_containers_of(&hosts[1]).unwrap()), ["1/lxd/0", "1/lxd/1"], "10/lxd/0 is not 1's");
    s.take_outbox();
    let e = s.remove_machines(std::slice::from_ref(&hosts[1]), false, false).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("1/lxd/0, 1/lxd/1") && m.contains("--force")), "{e:?}");
    let e = s.remove_machines(&[hosts[1].clone(), c[0].clone()], false, false).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("1/lxd/1") && !m.contains("1/lxd/0")), "{e:?}");
    assert!(s.list_machines().unwrap().iter().all(|m| m.machine.life == Life::Alive), "nothing written");
    assert!(s.take_outbox().0.is_empty());
    // A dead container does not hold its host.
    s.remove_machines(std::slice::from_ref(&c[0]), false, false).unwrap();
    s.remove_machines(&[hosts[1].clone(), c[1].clone()], false, false).unwrap();
    s.remove_machines(std::slice::from_ref(&hosts[10]), false, true).unwrap();
    let live: Vec<String> = s
        .list_machines()
        .unwrap()
        .into_iter()
        .filter(|m| m.machine.life == Life::Alive)
        .map(|m| m.machine.id.to_string())
        .collect();
    assert!(!live.contains(&"1".to_owned()) && !live.contains(&"10".to_owned()), "{live:?}");
    assert!(live.contains(&"10/lxd/0".to_owned()), "the engine takes a dead host's containers to dead: {live:?}");
}

/// A manual machine is registered as Juju's manual provider shows it, takes a machine id, and
/// an address already a live manual machine's is refused.
fn a_manual_machine_is_registered_started_with_its_address(s: &mut dyn StoreBackend) {
    s.add_machines(1, None).unwrap();
    let id = s.add_manual("10.0.0.5").unwrap();
    assert_eq!(id.as_str(), "1");
    let m = s.machine(&id).unwrap().unwrap();
    assert!(m.machine.manual);
    assert_eq!(m.machine.status, MachineStatus::Started);
    assert_eq!(m.machine.instance, Some(InstanceId::new("manual:10.0.0.5")));
    assert_eq!(m.machine.instance_status, InstanceStatus::running());
    assert_eq!(m.address.as_deref(), Some("10.0.0.5"));
    assert_eq!(m.zone, None);
    assert!(!s.machine(&MachineId::new("0")).unwrap().unwrap().machine.manual);
    let e = s.add_manual("10.0.0.5").unwrap_err();
    assert!(matches!(&e, StoreError::Invalid { field: "address", message } if message.contains("machine 1")), "{e:?}");
    assert_eq!(ids(&s.live_manual_machines().unwrap()), ["1"]);
    s.remove_machines(std::slice::from_ref(&id), false, false).unwrap();
    assert!(s.live_manual_machines().unwrap().is_empty(), "a dead one no longer blocks a destruction");
    assert_eq!(s.add_manual("10.0.0.5").unwrap().as_str(), "2", "a dead one's address can be registered again");
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
    s.destroy_model().unwrap();
    assert_eq!(s.add_manual("host-9").unwrap_err(), StoreError::ModelDying);
    assert_eq!(s.add_containers(&MachineId::new("0"), "lxd", 1).unwrap_err(), StoreError::ModelDying);
}

/// Created API tokens: numbered ids, listed oldest first, found by hash (revoked ones too, so
/// that the API can say "revoked"), revoked once (a second revocation keeps the first time),
/// an unknown id refused by name; only the hash is kept.
fn api_tokens_are_kept_as_hashes_and_revoked_once(s: &mut dyn StoreBackend) {
    use crate::service::token::Scope;
    assert!(s.tokens().unwrap().is_empty());
    let a = s.create_token(Scope::ReadOnly, None, "aaaa", "2026-01-01T00:00:00.000Z").unwrap();
    let b = s.create_token(Scope::Admin, Some(("team-a", "uuid-a")), "bbbb", "2026-01-01T00:00:01.000Z").unwrap();
    assert_eq!((a.model.as_deref(), b.model.as_deref()), (None, Some("team-a")));
    assert_eq!((a.model_uuid.as_deref(), b.model_uuid.as_deref()), (None, Some("uuid-a")));
    assert_eq!((a.id.as_str(), a.scope, a.revoked.as_deref()), ("tok-1", Scope::ReadOnly, None));
    assert_eq!((b.id.as_str(), b.scope), ("tok-2", Scope::Admin));
    assert_eq!(s.tokens().unwrap(), [a.clone(), b.clone()]);
    assert_eq!(s.token_by_hash("bbbb").unwrap(), Some(b.clone()));
    assert_eq!(s.token_by_hash("cccc").unwrap(), None);
    let revoked = s.revoke_token("tok-1", "2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(revoked.revoked.as_deref(), Some("2026-01-02T00:00:00.000Z"));
    let again = s.revoke_token("tok-1", "2026-01-03T00:00:00.000Z").unwrap();
    assert_eq!(again, revoked, "a second revocation changes nothing");
    assert_eq!(s.token_by_hash("aaaa").unwrap(), Some(revoked));
    assert_eq!(s.revoke_token("tok-9", "x").unwrap_err(), StoreError::NoToken("tok-9".into()));
    assert!(s.create_token(Scope::Admin, None, "bbbb", "x").is_err(), "a hash is one token's");
    assert_eq!(s.create_token(Scope::Admin, None, "dddd", "x").unwrap().id, "tok-3", "ids are never reused");
    s.destroy_model().unwrap();
    assert_eq!(s.tokens().unwrap().len(), 3, "tokens outlive the model's destruction");
    // A destroyed model's tokens are revoked with it; another model's and every model's stay.
    let c = s.create_token(Scope::ReadOnly, Some(("team-a", "uuid-a")), "eeee", "x").unwrap();
    let d = s.create_token(Scope::ReadOnly, Some(("team-b", "uuid-b")), "ffff", "x").unwrap();
    let gone = s.revoke_model_tokens("team-a", "uuid-a", "2026-01-04T00:00:00.000Z").unwrap();
    assert_eq!(gone.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [b.id.as_str(), c.id.as_str()]);
    assert!(gone.iter().all(|t| t.revoked.as_deref() == Some("2026-01-04T00:00:00.000Z")));
    assert_eq!(s.token_by_hash("ffff").unwrap(), Some(d), "another model's token stays");
    assert_eq!(s.token_by_hash("dddd").unwrap().unwrap().revoked, None, "a token of every model stays");
    assert!(s.revoke_model_tokens("team-a", "uuid-a", "y").unwrap().is_empty(), "once");
}

/// Start intents: kept in the order written, a token written again keeps its first row, a
/// dropped one goes (dropping an unknown token is no error).
fn start_intents_are_kept_until_dropped(s: &mut dyn StoreBackend) {
    assert!(s.start_intents().unwrap().is_empty());
    s.put_start_intent("t-1", &MachineId::new("1"), "{\"a\":1}").unwrap();
    s.put_start_intent("t-2", &MachineId::new("2"), "{\"b\":2}").unwrap();
    s.put_start_intent("t-1", &MachineId::new("1"), "{\"changed\":true}").unwrap();
    assert_eq!(s.start_intents().unwrap(), ["{\"a\":1}", "{\"b\":2}"]);
    s.drop_start_intent("t-1").unwrap();
    s.drop_start_intent("t-9").unwrap();
    assert_eq!(s.start_intents().unwrap(), ["{\"b\":2}"]);
}

/// The machines in error, counted without a scan (SQLite: a partial index; PostgreSQL: a
/// table kept by triggers), are those a scan finds: an error status or a `provisioning error`
/// instance status; a retry or a start takes them out, and so does their removal; machines
/// added are not in error.
fn machines_in_error_are_counted_without_a_scan(s: &mut dyn StoreBackend) {
    let m = s.add_machines(4, None).unwrap();
    assert_eq!(s.machines_in_error().unwrap(), 0);
    s.set_status(&m[0], MachineStatus::Error, "no").unwrap();
    s.set_instance_status(&m[1], &InstanceStatus::provisioning_error(), "capacity").unwrap();
    let scan = |s: &mut dyn StoreBackend| {
        s.list_machines()
            .unwrap()
            .iter()
            .filter(|r| {
                r.machine.status == MachineStatus::Error
                    || r.machine.instance_status == InstanceStatus::provisioning_error()
            })
            .count() as u64
    };
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (2, 2));
    s.set_status(&m[0], MachineStatus::Pending, "").unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (1, 1));
    // In error twice over, then out of one of them: still in error.
    s.set_status(&m[1], MachineStatus::Error, "no").unwrap();
    s.set_instance_status(&m[1], &InstanceStatus::running(), "").unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (1, 1));
    s.ensure_dead(&m[1]).unwrap();
    s.mark_for_removal(&m[1]).unwrap();
    s.add_machines(2, None).unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (0, 0));
}

/// A start's record ([`StoreBackend::record_started_instance`], the model port's one write
/// per start): the machine gets its instance and becomes `started`, its attempt is counted as
/// a success (the last error cleared) and its status counts move; an unknown machine is
/// refused and changes nothing.
fn a_started_instance_is_recorded_with_its_successful_attempt(s: &mut dyn StoreBackend) {
    let m = s.add_machines(2, None).unwrap();
    s.record_start_outcome(&m[0], Some("no capacity in az1")).unwrap();
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-7"),
        zone: Some("az2".into()),
        nonce: "machine-0:n".into(),
        display_name: "sim-i-7".into(),
        status: InstanceStatus::running(),
    };
    s.record_started_instance(&m[0], &info).unwrap();
    let r = s.machine(&m[0]).unwrap().unwrap();
    assert_eq!(r.machine.instance, Some(InstanceId::new("i-7")));
    assert_eq!(
        (r.machine.status, r.machine.instance_status.clone()),
        (MachineStatus::Started, InstanceStatus::running())
    );
    assert_eq!((r.zone.as_deref(), r.message()), (Some("az2"), ""));
    assert_eq!((r.start_attempts, r.last_start_error), (2, None), "the failed attempt and the success");
    assert_eq!(s.counts().machines_by_status.get("started"), Some(&1));
    assert_eq!(s.counts().machines_by_status.get("pending"), Some(&1));
    let gone = MachineId::new("9");
    assert_eq!(s.record_started_instance(&gone, &info), Err(StoreError::NotFound(gone)));
    assert_eq!(s.machine(&m[1]).unwrap().unwrap().start_attempts, 0);
}

/// Recording an instance alone ([`StoreBackend::set_instance_info`]) does not count a start
/// attempt (nor clear the last error); the model port's record of a start
/// ([`StoreBackend::record_started_instance`]) does.
fn an_instance_recorded_alone_counts_no_start_attempt(s: &mut dyn StoreBackend) {
    let m = s.add_machines(2, None).unwrap();
    s.record_start_outcome(&m[0], Some("no capacity in az1")).unwrap();
    let info = |n: u32| ProvisionedInstance {
        instance: InstanceId::new(format!("i-{n}")),
        zone: Some("az1".into()),
        nonce: format!("machine-{n}:n"),
        display_name: format!("sim-i-{n}"),
        status: InstanceStatus::running(),
    };
    s.set_instance_info(&m[0], &info(1)).unwrap();
    s.set_instance_info(&m[1], &info(2)).unwrap();
    let attempts = |s: &mut dyn StoreBackend, id: &MachineId| {
        let r = s.machine(id).unwrap().unwrap();
        (r.start_attempts, r.last_start_error)
    };
    assert_eq!(attempts(s, &m[0]), (1, Some("no capacity in az1".to_owned())), "only the failed attempt");
    assert_eq!(attempts(s, &m[1]), (0, None));
    s.record_started_instance(&m[1], &info(3)).unwrap();
    assert_eq!(attempts(s, &m[1]), (1, None), "the start recorded counts one attempt");
    s.record_started_instance(&m[0], &info(4)).unwrap();
    assert_eq!(attempts(s, &m[0]), (2, None), "the success counted, the last error cleared");
}

/// A start without latency creates its instance running (counted as running, never as
/// pending); a repeated client token gets the instance it made as it is, pending or not, and
/// creates nothing.
fn an_instance_created_running_is_counted_running_and_kept_by_its_token(s: &mut dyn StoreBackend) {
    let (a, new) = s.create_running_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(new);
    assert_eq!((a.instance.state, a.instance.zone.as_deref()), (InstanceState::Running, Some("az1")));
    assert_eq!(s.instance(&a.instance.id).unwrap().unwrap(), a);
    let (pending, _) = s.create_instance("1/n/1", None, &tags("m", "1")).unwrap();
    let (again, new) = s.create_running_instance("1/n/1", None, &tags("m", "1")).unwrap();
    assert!(!new);
    assert_eq!(again, pending, "the token's instance, still pending");
    let (same, new) = s.create_running_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert_eq!((same, new), (a.clone(), false));
    assert_eq!(s.all_instances().unwrap().len(), 2);
    // A token's repeats take no id: the next new instance's is the next one.
    let (b, _) = s.create_running_instance("2/n/1", None, &tags("m", "2")).unwrap();
    assert_eq!((a.instance.id.as_str(), pending.instance.id.as_str()), ("i-00000001", "i-00000002"));
    assert_eq!(b.instance.id.as_str(), "i-00000003");
    s.terminate_instances(std::slice::from_ref(&b.instance.id)).unwrap();
    let counts = s.counts().clone();
    assert_eq!(counts.instances_by_state.get("running"), Some(&1));
    assert_eq!(counts.instances_by_state.get("pending"), Some(&1));
    assert_eq!(s.recount().unwrap().instances_by_state, counts.instances_by_state);
}

/// The provisioner's lean reads (its machines, what a start needs, a machine's application)
/// answer what the whole record says, for every kind of machine: plain, with constraints and a
/// placement, an application's unit, a container, a manual machine, provisioned, dead; and
/// nothing for a machine that is not there.
fn the_provisioners_lean_reads_match_the_whole_record(s: &mut dyn StoreBackend) {
    use super::state::NewMachine;
    use crate::model::Constraints;
    s.add_machines(1, Some(&["az1".to_owned(), "az3".to_owned()])).unwrap();
    let c = Constraints::parse("arch=arm64 cores=4 mem=8G root-disk=20G spaces=a,b tags=gpu,^slow").unwrap();
    let spec = NewMachine { constraints: c.clone(), placement: Some("zone=az2".into()), ..NewMachine::default() };
    let placed = s.add_new_machines(1, &spec).unwrap();
    let web = s.add_application("web", 2, &Constraints::parse("instance-type=m5.large").unwrap()).unwrap();
    let containers = s.add_containers(&MachineId::new("0"), "lxd", 1).unwrap();
    let manual = s.add_manual("10.0.0.7").unwrap();
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-3"),
        zone: Some("az1".into()),
        nonce: "n".into(),
        display_name: String::new(),
        status: InstanceStatus::running(),
    };
    s.record_started_instance(&web[0], &info).unwrap();
    s.remove_machines(std::slice::from_ref(&placed[0]), true, false).unwrap();
    let mut all = s.machine_ids().unwrap();
    assert_eq!(all.len(), 6, "{all:?}");
    assert!(all.contains(&containers[0]) && all.contains(&manual));
    all.push(MachineId::new("99"));
    for id in &all {
        let whole = s.machine(id).unwrap();
        assert_eq!(s.model_machine(id).unwrap(), whole.as_ref().map(|m| m.machine.clone()), "{id}");
        let provisioning = s.machine_provisioning(id).unwrap();
        let expected = whole.as_ref().map(|m| (m.constraints.clone(), m.placement.clone()));
        assert_eq!(provisioning.map(|p| (p.constraints, p.placement)), expected, "{id}");
        assert_eq!(s.machine_application(id).unwrap(), whole.as_ref().map(|m| m.application.clone()), "{id}");
    }
    // The same, many at once (PostgreSQL reads each kind by one statement), in request order.
    all.reverse();
    let wholes: Vec<_> = all.iter().map(|id| s.machine(id).unwrap()).collect();
    let machines: Vec<_> = wholes.iter().map(|w| w.as_ref().map(|m| m.machine.clone())).collect();
    assert_eq!(s.model_machines(&all).unwrap(), machines);
    let infos: Vec<_> =
        s.provisioning_info(&all).unwrap().into_iter().map(|p| p.map(|p| (p.constraints, p.placement))).collect();
    let expected: Vec<_> =
        wholes.iter().map(|w| w.as_ref().map(|m| (m.constraints.clone(), m.placement.clone()))).collect();
    assert_eq!(infos, expected);
    let applications: Vec<_> = wholes.iter().map(|w| w.as_ref().map(|m| m.application.clone())).collect();
    assert_eq!(s.machine_applications(&all).unwrap(), applications);
    let p = s.machine_provisioning(&placed[0]).unwrap().unwrap();
    assert_eq!((p.constraints, p.placement.as_deref()), (c, Some("zone=az2")));
    assert_eq!(s.machine_application(&web[1]).unwrap(), Some(Some("web".into())));
    let m = s.model_machine(&web[0]).unwrap().unwrap();
    assert_eq!((m.instance, m.status), (Some(InstanceId::new("i-3")), MachineStatus::Started));
    assert!(s.model_machine(&manual).unwrap().unwrap().manual);
    let dead = s.model_machine(&placed[0]).unwrap().unwrap();
    assert_eq!((dead.life, dead.keep_instance), (Life::Dead, true));
    // The batched reads (PostgreSQL's in one statement each) answer what the single ones do, in
    // the order asked, a repeated id each time.
    all.insert(0, web[1].clone());
    let one_by_one: Vec<_> = all.iter().map(|id| s.model_machine(id).unwrap()).collect();
    assert_eq!(s.model_machines(&all).unwrap(), one_by_one);
    let one_by_one: Vec<_> = all.iter().map(|id| s.machine_application(id).unwrap()).collect();
    assert_eq!(s.machine_applications(&all).unwrap(), one_by_one);
    let pairs = |v: Vec<Option<crate::model::ProvisioningInfo>>| -> Vec<_> {
        v.into_iter().map(|p| p.map(|p| (p.constraints, p.placement))).collect()
    };
    let one_by_one: Vec<_> = all.iter().map(|id| s.machine_provisioning(id).unwrap()).collect();
    assert_eq!(pairs(s.provisioning_info(&all).unwrap()), pairs(one_by_one));
}

/// The behaviour tests above, each run against SQLite (a test each, in memory) and against
/// PostgreSQL (feature `postgres`: one cluster for the lot, a fresh database per test).
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&mut super::StoreCore::in_memory().unwrap());
                }
            )*
        }
        /// The same tests against PostgreSQL.
        #[cfg(feature = "postgres")]
        pub(super) const BEHAVIOURS: &[(&str, fn(&mut dyn StoreBackend))] = &[$((stringify!($name), $name)),*];
    };
}

on_both_backends!(
    machines_round_trip_and_ids_are_never_reused,
    removal_and_retry_are_all_or_nothing,
    a_dying_model_refuses_machines_and_destroys_once,
    instances_are_idempotent_by_client_token_and_listed_by_model,
    settings_round_trip,
    counts_kept_as_writes_commit_match_a_full_recount,
    applications_group_their_machines_and_go_with_them,
    containers_are_numbered_per_host_and_type_on_alive_hosts_only,
    a_host_with_live_containers_is_removed_only_with_them_or_with_force,
    a_manual_machine_is_registered_started_with_its_address,
    api_tokens_are_kept_as_hashes_and_revoked_once,
    start_intents_are_kept_until_dropped,
    machines_in_error_are_counted_without_a_scan,
    a_started_instance_is_recorded_with_its_successful_attempt,
    an_instance_recorded_alone_counts_no_start_attempt,
    an_instance_created_running_is_counted_running_and_kept_by_its_token,
    the_provisioners_lean_reads_match_the_whole_record,
    machines_are_read_together_in_request_order,
);

/// `machines` answers each id asked, in the order asked, a repeated id each time and a missing
/// one as `None` (PostgreSQL reads them in one statement); `distribution_groups` the same.
fn machines_are_read_together_in_request_order(s: &mut dyn StoreBackend) {
    let added = s.add_machines(3, None).unwrap();
    let app = s.add_application("web", 2, &Constraints::default()).unwrap();
    let missing = MachineId::new("99");
    let asked = [added[2].clone(), missing.clone(), added[0].clone(), added[2].clone(), app[1].clone()];
    let read: Vec<Option<String>> =
        s.machines(&asked).unwrap().into_iter().map(|m| m.map(|m| m.machine.id.to_string())).collect();
    assert_eq!(read, [Some("2".to_owned()), None, Some("0".to_owned()), Some("2".to_owned()), Some("4".to_owned())]);
    assert!(s.machines(&[]).unwrap().is_empty());
    let groups = s.distribution_groups(&[app[0].clone(), missing, added[1].clone(), app[1].clone()]).unwrap();
    assert_eq!(groups, [Some(vec![app[1].clone()]), None, Some(Vec::new()), Some(vec![app[0].clone()])]);
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
    s.begin_member().unwrap();
    assert_eq!(ids(&s.add_machines(2, None).unwrap()), ["0", "1"]);
    s.end_member(true).unwrap();
    assert!(s.group_has_written());
    s.begin_member().unwrap();
    s.add_machines(1, None).unwrap();
    s.set_status(&MachineId::new("9"), MachineStatus::Started, "").unwrap_err();
    s.end_member(false).unwrap();
    s.begin_member().unwrap();
    s.set_status(&MachineId::new("1"), MachineStatus::Started, "").unwrap();
    s.end_member(true).unwrap();
    s.commit_group().unwrap();
    assert_eq!(ids(&s.machine_ids().unwrap()), ["0", "1"], "the failed write's machine is gone");
    assert_eq!(s.counts(), &s.recount().unwrap(), "the failed write is not counted");
    assert_eq!(ids(&s.take_outbox().0), ["0", "1"]);
    assert!(s.conn_for_tests().is_autocommit(), "committed");

    s.begin_group(true).unwrap();
    assert_eq!(sync(&s), 2, "a durable group is fsynced (FULL)");
    let before = s.counts().clone();
    s.begin_member().unwrap();
    s.add_machines(3, None).unwrap();
    s.end_member(true).unwrap();
    s.abort_group();
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
        let store = super::Store::start(&db).unwrap();
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
    let stamp = super::state::now_stamp();
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
