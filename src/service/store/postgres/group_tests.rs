//! Unit tests of the PostgreSQL backend's group commits: units of work in savepoints, the fence
//! checked once a group, a failed commit failing every unit, write-behind units as set-based
//! statements (their plans, their stamps, the indexes they leave alone). On the cluster and the
//! helpers of `tests.rs`.
// A real server on the wall clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::time::Duration;

use super::tests::{
    cluster, fresh_db, ids, leading, lease, leased_before_the_actor, listening, notices, opened, raw, Leading,
};
use super::StoreError;
use super::{Notice, PgStore, CHANGES_CHANNEL};
use crate::model::{InstanceStatus, InstanceTags, Life, MachineId, MachineStatus};
use crate::ports::ProvisionedInstance;
use crate::service::store::backend::{Fence, StoreBackend};
use crate::service::store::behaviour::{a_good_unit_then_a_failed_one, three_machines_then_abort};

/// A group commit on PostgreSQL: its units of work share one transaction, nothing of it is
/// visible (nor notified) before its commit; a unit of work that fails is rolled back alone (its
/// machine, its notice and its counts with it), and so is a failed write inside a unit of work
/// that goes on; an aborted group leaves nothing, and the book as before it.
#[test]
fn a_postgres_group_commit_keeps_its_good_writes_and_notifies_only_what_committed() {
    let (_pg, url, mut s, model, mut listener) = listening();
    let mut other = raw(&url);
    let count = |c: &mut postgres::Client| -> i64 { c.query_one("SELECT count(*) FROM machines", &[]).unwrap().get(0) };

    assert!(s.begin_group(false).unwrap(), "PostgreSQL groups");
    s.begin_member().unwrap();
    assert!(s.machine_ids().unwrap().is_empty());
    s.end_member(true).unwrap();
    assert!(!s.group_has_written(), "a read writes nothing");
    a_good_unit_then_a_failed_one(&mut s);
    // A write that fails halfway (its first machine updated) in a unit of work that goes on.
    s.begin_member().unwrap();
    s.remove_machines(&[MachineId::new("1"), MachineId::new("77")], false, false).unwrap_err();
    s.set_status(&MachineId::new("1"), MachineStatus::Error, "kept").unwrap();
    s.end_member(true).unwrap();
    assert_eq!(count(&mut other), 0, "nothing is visible before the commit");
    assert!(notices(&mut listener, Duration::from_millis(300)).is_empty(), "nor notified");
    s.commit_group().unwrap();

    assert_eq!(count(&mut other), 2, "the failed unit's machine is gone");
    let one = s.machine(&MachineId::new("1")).unwrap().unwrap();
    assert_eq!((one.machine.life, one.status_message.as_str()), (Life::Alive, "kept"), "the failed removal undone");
    let recounted = s.recount().unwrap();
    assert_eq!(s.counts(), &recounted, "the failed writes are not counted");
    assert_eq!(ids(&s.take_outbox().0), ["0", "1"]);
    let notice = |ids: &[&str]| Notice {
        model_uuid: model.clone(),
        kind: "machines".into(),
        ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        all: false,
    };
    assert_eq!(notices(&mut listener, Duration::from_secs(1)), [notice(&["0", "1"]), notice(&["1"])]);

    s.begin_group(true).unwrap();
    let before = s.counts().clone();
    three_machines_then_abort(&mut s);
    assert_eq!(count(&mut other), 2, "nothing of an aborted group is written");
    assert_eq!(s.counts(), &before);
    assert!(s.take_outbox().0.is_empty(), "nor heard of");
    assert!(notices(&mut listener, Duration::from_millis(300)).is_empty(), "nor notified");
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["2"], "outside a group, a write commits alone");
}

/// A session that gives up waiting for a lock after 200 ms, and the statement a takeover of the
/// lease row would run (`$1` the model): it fails while a group holds the row share-locked.
fn takeover_session(url: &str) -> (postgres::Client, &'static str) {
    let mut other = raw(url);
    other.batch_execute("SET lock_timeout = 200").unwrap();
    (other, "UPDATE leader_lease SET epoch = epoch WHERE model_uuid = $1")
}

/// The fence in a group commit: checked once, its share lock on the lease row held until the
/// group commits (no takeover in between), the group's fenced writes recorded at once under
/// it; a group fenced out commits none of its fenced writes (the API's unfenced write in it
/// commits), and the audit finds no stale write.
#[test]
fn a_fenced_out_group_commits_nothing_and_a_fenced_group_holds_the_lease_row_until_its_commit() {
    use crate::service::lease::pg::audit_epochs;
    use crate::service::lease::state::Answer;
    let Leading { _pg, url, mut s, model, m, mut a, mut b, first } = leading(2);

    s.begin_group(false).unwrap();
    for message in ["one", "two", "three"] {
        s.set_fenced(true);
        s.begin_member().unwrap();
        s.set_status(&m[0], MachineStatus::Error, message).unwrap();
        s.end_member(true).unwrap();
    }
    let (mut other, takeover) = takeover_session(&url);
    assert!(other.execute(takeover, &[&model]).is_err(), "the group holds the lease row");
    s.commit_group().unwrap();
    assert_eq!(other.execute(takeover, &[&model]).unwrap(), 1, "until its commit");
    assert_eq!(s.machine(&m[0]).unwrap().unwrap().status_message, "three");

    a.release(first).unwrap();
    let Answer::Acquired { epoch: second } = b.acquire(Duration::from_secs(30)).unwrap() else { panic!("b leads") };
    let fenced = StoreError::Fenced { model_uuid: model.clone(), holder: "replica-a".into(), epoch: first };
    let tags = InstanceTags { model: Some(model.clone()), machine: Some(m[1].clone()), start: Some("n".into()) };
    let before = s.counts().clone();
    s.begin_group(false).unwrap();
    s.set_fenced(true);
    s.begin_member().unwrap();
    assert_eq!(s.set_status(&m[0], MachineStatus::Started, "stale"), Err(fenced.clone()));
    s.end_member(false).unwrap();
    s.set_fenced(false);
    s.begin_member().unwrap();
    s.set_workers(5).unwrap();
    s.end_member(true).unwrap();
    s.set_fenced(true);
    s.begin_member().unwrap();
    assert_eq!(s.create_instance("tok", None, &tags).map(|_| ()), Err(fenced.clone()));
    assert_eq!(s.ensure_dead(&m[1]), Err(fenced));
    s.end_member(false).unwrap();
    s.commit_group().unwrap();
    assert_eq!(s.counts(), &before, "a refused write counts nothing");
    let m0 = s.machine(&m[0]).unwrap().unwrap();
    assert_eq!((m0.status_message.as_str(), m0.machine.status), ("three", MachineStatus::Error), "nothing written");
    assert_eq!(s.machine(&m[1]).unwrap().unwrap().machine.life, Life::Alive);
    assert!(s.all_instances().unwrap().is_empty(), "no instance created");
    assert_eq!(s.settings().unwrap().workers, Some(5), "the API's write in the same group committed");

    let audit = audit_epochs(&mut raw(&url), &model).unwrap();
    assert_eq!(audit.acquisitions, vec![(first, "replica-a".to_owned()), (second, "replica-b".to_owned())]);
    assert_eq!(audit.writes, 3, "the group's three writes under the lease, recorded once");
    assert!(audit.stale.is_empty(), "{audit:?}");
}

/// A unit of work's first write has no savepoint of its own: when it fails halfway (its first
/// machine removed), the unit's savepoint is rolled back to, undoing it alone; the unit's next
/// write is kept, and the fence, checked inside the unit's savepoint (the group's transaction
/// was begun by an earlier unit), is checked again: the lease row stays locked until the commit.
#[test]
fn a_unit_whose_first_write_fails_keeps_its_later_writes_and_the_lease_row_locked() {
    use crate::service::lease::pg::audit_epochs;
    let Leading { _pg, url, mut s, model, m, .. } = leading(2);
    s.begin_group(false).unwrap();
    s.begin_member().unwrap();
    s.set_workers(3).unwrap(); // the API's: not fenced, it begins the group's transaction
    s.end_member(true).unwrap();
    s.set_fenced(true);
    s.begin_member().unwrap();
    let failed = s.remove_machines(&[m[0].clone(), MachineId::new("77")], false, false);
    assert_eq!(failed, Err(StoreError::NotFound(MachineId::new("77"))));
    s.set_status(&m[1], MachineStatus::Error, "kept").unwrap();
    s.end_member(true).unwrap();
    let (mut other, takeover) = takeover_session(&url);
    assert!(other.execute(takeover, &[&model]).is_err(), "the group holds the lease row");
    s.commit_group().unwrap();
    assert_eq!(s.machine(&m[0]).unwrap().unwrap().machine.life, Life::Alive, "the failed removal undone");
    assert_eq!(s.machine(&m[1]).unwrap().unwrap().status_message, "kept");
    assert_eq!(s.settings().unwrap().workers, Some(3));
    let audit = audit_epochs(&mut raw(&url), &model).unwrap();
    assert_eq!(audit.writes, 1, "the kept fenced write");
    assert!(audit.stale.is_empty(), "{audit:?}");
}

/// The group's savepoints and releases go out with the next statement: one of them that fails
/// (here a release of the first unit of work, replaced by one that fails) fails the whole group.
/// Were the second unit's rollback then sent, it would roll back to the first unit's savepoint,
/// undo the first unit's write and let the group commit without it: the first unit would be
/// answered "committed" with nothing written.
#[test]
fn a_failed_savepoint_statement_fails_the_whole_group() {
    let (_pg, url, mut s) = opened();
    s.begin_group(false).unwrap();
    s.begin_member().unwrap();
    s.add_machines(1, None).unwrap();
    s.end_member(true).unwrap();
    s.replace_queued("RELEASE SAVEPOINT nowhere");
    s.begin_member().unwrap();
    s.add_machines(1, None).unwrap_err();
    let broken = s.end_member(false);
    assert!(matches!(broken, Err(StoreError::Postgres { .. })), "{broken:?}");
    let committed = s.commit_group();
    assert!(committed.is_err(), "{committed:?}");
    let left: i64 = raw(&url).query_one("SELECT count(*) FROM machines", &[]).unwrap().get(0);
    assert_eq!(left, 0, "none of the group's writes");
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["0"], "the store goes on");
}

/// Through the store actor: writes sent while the store is busy commit as one PostgreSQL group
/// (durable and lazy ones together), a failing one among them fails alone having written
/// nothing; a group whose commit fails (its connection killed before the commit) answers every
/// one of its writes with the error and writes none of them, and the store reconnects.
#[test]
fn writes_waiting_together_commit_as_one_postgres_group_and_a_failed_commit_fails_them_all() {
    let pg = cluster();
    let url = fresh_db(&pg);
    actix::System::new().block_on(async move {
        let store = crate::service::store::actor::Store::start_postgres(&url).unwrap();
        store.exec(|s| s.add_machines(1, None)).await.unwrap();
        let commits = store.group_commits();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = store.exec(move |_| {
            held.recv().unwrap();
            Ok(())
        });
        let mut writes = Vec::new();
        for i in 0..8 {
            let work = move |s: &mut dyn StoreBackend| {
                let ids = s.add_machines(1, None)?;
                match i {
                    3 => Err(StoreError::Refused("bad write".into())),
                    _ => Ok(ids),
                }
            };
            writes.push(if i % 2 == 0 {
                futures::future::Either::Left(store.exec(work))
            } else {
                futures::future::Either::Right(store.exec_lazy(work))
            });
        }
        release.send(()).unwrap();
        first.await.unwrap();
        let mut added = Vec::new();
        for (i, w) in writes.into_iter().enumerate() {
            match w.await {
                Ok(ids) => added.extend(ids),
                Err(e) => assert!(i == 3 && e == StoreError::Refused("bad write".into()), "write {i}: {e}"),
            }
        }
        assert_eq!(ids(&added), ["1", "2", "3", "4", "5", "6", "7"], "the bad write took no id");
        // One group, or a few: a group takes units in for at most 10 ms (a loaded machine's
        // debug build may take longer for the eight).
        let made = store.group_commits() - commits;
        assert!((1..8).contains(&made), "{made} commits for eight writes: they did not group");

        // The last write of a group kills the store's session: the commit fails.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = store.exec(move |_| {
            held.recv().unwrap();
            Ok(())
        });
        let doomed: Vec<_> = (0..3).map(|_| store.exec(|s| s.add_machines(1, None))).collect();
        let admin = url.clone();
        let killer = store.exec(move |s| {
            s.add_machines(1, None)?;
            let mut c = raw(&admin);
            c.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'provisioner'",
                &[],
            )
            .unwrap();
            Ok(())
        });
        release.send(()).unwrap();
        first.await.unwrap();
        for w in doomed {
            let e = w.await.expect_err("a write of a group whose commit failed");
            assert!(matches!(e, StoreError::Postgres { .. }), "{e:?}");
        }
        killer.await.expect_err("the write that killed the session");
        let machines = store.read(|s| s.machine_ids()).await.unwrap();
        assert_eq!(machines.len(), 8, "none of the failed group's machines: {machines:?}");
    });
}

fn started(n: u32) -> ProvisionedInstance {
    ProvisionedInstance {
        instance: crate::model::InstanceId::new(format!("i-{n}")),
        zone: Some("az1".into()),
        nonce: format!("n-{n}"),
        display_name: format!("sim-i-{n}"),
        status: InstanceStatus::running(),
        capacity_type: None,
    }
}

/// Write-behind units ([`Write`](crate::service::store::Write)) queued in a group go out with its commit: once the
/// statements are prepared, a group of them and its commit is one round trip. Each is
/// answered alone: a missing machine is `NotFound` (nothing written), a repeated client token
/// gets the instance its first start made. One whose statement fails aborts the pipeline: the
/// group is rolled back to before the units (the group's other unit of work kept) and the units
/// run again one at a time, so the failing one fails alone and the others are written once
/// (a failed attempt counted once, not twice).
#[test]
fn write_behind_units_commit_in_one_round_trip_and_a_failing_one_fails_alone() {
    use super::{Write, Written};
    let group = fenced_group;
    let (_pg, _url, mut s) = opened();
    let m = s.add_machines(4, None).unwrap();
    let model = s.model_uuid().unwrap();
    let tags = |machine: &MachineId| start_tags(&model, machine);
    // A start with no latency: its instance created running, in zone az1.
    let running = |token: &str, machine: &MachineId| Write::NewInstance {
        client_token: token.into(),
        zone: Some("az1".into()),
        tags: tags(machine),
        running: true,
    };
    let failed = |id: &MachineId, error: &str| Write::InstanceStatus {
        id: id.clone(),
        status: InstanceStatus::provisioning(),
        message: error.into(),
        failed_attempt: Some(error.into()),
    };
    // Warm: the statements prepared, the session's settings made.
    let first = group(
        &mut s,
        vec![
            failed(&m[0], "boom"),
            Write::StartedInstance { id: m[3].clone(), info: started(3) },
            Write::MachineStatus { id: m[3].clone(), status: MachineStatus::Started, message: String::new() },
            Write::InstanceStatus {
                id: m[3].clone(),
                status: InstanceStatus::running(),
                message: String::new(),
                failed_attempt: None,
            },
            running("t0", &m[3]),
            running("t0", &m[3]),
        ],
    );
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let before = s.round_trips();
    let answers = group(
        &mut s,
        vec![
            failed(&m[1], "bang"),
            Write::StartedInstance { id: m[2].clone(), info: started(2) },
            Write::MachineStatus { id: MachineId::new("99"), status: MachineStatus::Started, message: String::new() },
            running("t1", &m[2]),
            running("t1", &m[2]),
        ],
    );
    assert_eq!(s.round_trips() - before, 2, "one for the group and its commit, one to read the repeated token's");
    assert_eq!(answers[0], Ok(Written::Done));
    assert_eq!(answers[1], Ok(Written::Done));
    assert_eq!(answers[2], Err(StoreError::NotFound(MachineId::new("99"))));
    let Ok(Written::Instance(made, true)) = &answers[3] else { panic!("{:?}", answers[3]) };
    assert_eq!(answers[4], Ok(Written::Instance(made.clone(), false)), "the token's instance");
    let r = s.machine(&m[2]).unwrap().unwrap();
    assert_eq!(
        (r.machine.status, r.start_attempts, r.machine.instance),
        (MachineStatus::Started, 1, Some(started(2).instance))
    );
    let r = s.machine(&m[1]).unwrap().unwrap();
    assert_eq!((r.start_attempts, r.last_start_error.as_deref()), (1, Some("bang")));

    // A unit whose statement fails (a NUL byte the server refuses) in a group with a unit of
    // work of its own and other write-behind units.
    assert!(s.begin_group(false).unwrap());
    s.begin_member().unwrap();
    let kept = s.add_machines(1, None);
    s.end_member(kept.is_ok()).unwrap();
    s.set_fenced(true);
    for w in [
        failed(&m[1], "again"),
        Write::MachineStatus { id: m[0].clone(), status: MachineStatus::Error, message: "bad\0byte".into() },
        Write::NewInstance { client_token: "t2".into(), zone: None, tags: tags(&m[0]), running: true },
        Write::StartedInstance { id: m[0].clone(), info: started(9) },
    ] {
        assert!(s.defer(w).is_none());
    }
    s.commit_group().unwrap();
    let answers = s.take_deferred();
    assert_eq!(answers[0], Ok(Written::Done));
    assert!(matches!(answers[1], Err(StoreError::Postgres { .. })), "{:?}", answers[1]);
    assert!(matches!(answers[2], Ok(Written::Instance(_, true))), "{:?}", answers[2]);
    assert_eq!(answers[3], Ok(Written::Done));
    let kept = kept.unwrap();
    assert!(s.machine(&kept[0]).unwrap().is_some(), "the group's unit of work kept");
    let r = s.machine(&m[1]).unwrap().unwrap();
    assert_eq!((r.start_attempts, r.last_start_error.as_deref()), (2, Some("again")), "counted once more, not twice");
    let r = s.machine(&m[0]).unwrap().unwrap();
    assert_eq!((r.machine.status, r.start_attempts), (MachineStatus::Started, 2), "the failed status wrote nothing");
    let instances = s.all_instances().unwrap();
    assert_eq!(instances.len(), 3, "one instance per token, none twice: {instances:?}");
    assert_eq!(s.counts().instances_by_state.get("running"), Some(&3));
    assert_eq!(s.recount().unwrap(), s.counts().clone(), "the counts kept match a recount");
}

/// The simulated cloud's two writes of a start with a latency (an instance created pending,
/// later landed) are write-behind units too: a group of them is one round trip, a repeated
/// token gets its instance as it is, an unknown instance lands as none, and the counts (the
/// instances by state, and the machines in error the same group's units move) match a recount.
#[test]
fn pending_instances_and_their_landings_commit_in_one_round_trip() {
    use super::{Write, Written};
    let group = fenced_group;
    use crate::model::{CloudInstance, InstanceId, InstanceState};
    let (_pg, _url, mut s) = opened();
    let m = s.add_machines(3, None).unwrap();
    let model = s.model_uuid().unwrap();
    let tags = |machine: &MachineId| start_tags(&model, machine);
    let new = |token: &str, machine: &MachineId| Write::NewInstance {
        client_token: token.into(),
        zone: Some("az2".into()),
        tags: tags(machine),
        running: false,
    };
    let in_error = |id: &MachineId| Write::InstanceStatus {
        id: id.clone(),
        status: InstanceStatus::provisioning_error(),
        message: "no capacity".into(),
        failed_attempt: Some("no capacity".into()),
    };
    let answers = group(&mut s, vec![new("t0", &m[0]), new("t1", &m[1]), in_error(&m[2]), in_error(&m[1])]);
    let instance = |a: &Result<Written, StoreError>| match a {
        Ok(Written::Instance(r, true)) => r.clone(),
        other => panic!("{other:?}"),
    };
    let (a, b) = (instance(&answers[0]), instance(&answers[1]));
    assert_eq!((a.instance.state, a.instance.zone.as_deref()), (InstanceState::Pending, Some("az2")));
    assert_eq!(s.counts().instances_by_state.get("pending"), Some(&2));
    assert_eq!(s.counts().machines_in_error, 2);
    assert_eq!(s.recount().unwrap(), s.counts().clone(), "the counts kept match a recount");

    // Warm: the statements prepared.
    let warm = vec![
        Write::LandInstance { id: InstanceId::new("i-none") },
        Write::MachineStatus { id: m[0].clone(), status: MachineStatus::Pending, message: String::new() },
        Write::InstanceStatus {
            id: m[0].clone(),
            status: InstanceStatus::empty(),
            message: String::new(),
            failed_attempt: None,
        },
    ];
    assert!(group(&mut s, warm).iter().all(Result::is_ok));
    let before = s.round_trips();
    let answers = group(
        &mut s,
        vec![
            Write::LandInstance { id: a.instance.id.clone() },
            Write::LandInstance { id: InstanceId::new("i-gone") },
            // The same instance again: a second run, which finds it running already.
            Write::LandInstance { id: a.instance.id.clone() },
            Write::InstanceStatus {
                id: m[2].clone(),
                status: InstanceStatus::running(),
                message: String::new(),
                failed_attempt: None,
            },
            Write::MachineStatus { id: m[1].clone(), status: MachineStatus::Error, message: "x".into() },
        ],
    );
    assert_eq!(s.round_trips() - before, 1, "the group and its commit in one round trip");
    let landed = |a: &Result<Written, StoreError>| match a {
        Ok(Written::Landed(r)) => r.clone(),
        other => panic!("{other:?}"),
    };
    let running = CloudInstance { state: InstanceState::Running, ..a.instance.clone() };
    assert_eq!(landed(&answers[0]).map(|r| r.instance), Some(running.clone()));
    assert_eq!(landed(&answers[1]), None);
    assert_eq!(landed(&answers[2]).map(|r| r.instance), Some(running));
    assert_eq!(s.instance(&b.instance.id).unwrap().unwrap().instance.state, InstanceState::Pending, "only those named");
    let counts = s.counts().clone();
    assert_eq!(counts.instances_by_state.get("pending"), Some(&1));
    assert_eq!(counts.instances_by_state.get("running"), Some(&1));
    assert_eq!(counts.machines_in_error, 1, "out of error, and in error twice over: {counts:?}");
    assert_eq!(s.recount().unwrap(), counts, "the counts kept match a recount");
    // A repeated token: its instance as it is, nothing new.
    assert_eq!(group(&mut s, vec![new("t1", &m[1])]), vec![Ok(Written::Instance(b, false))]);
    assert_eq!(s.recount().unwrap(), s.counts().clone(), "the counts kept match a recount");
}

/// Through the store actor, under a fence: write-behind units commit under the lease and are
/// refused with `Fenced` (nothing written) under a stale one; their epoch is recorded.
#[test]
fn the_store_actor_fences_write_behind_units() {
    use super::{Write, Written};
    let (_pg, url, model) = leased_before_the_actor();
    let check = url.clone();
    actix::System::new().block_on(async move {
        let store = crate::service::store::actor::Store::start_postgres(&url).unwrap();
        let ids = store.exec(|s| s.add_machines(2, None)).await.unwrap();
        let fence = |epoch| Some(Fence::new(model.clone(), "replica-a", epoch));
        store.set_fence(fence(7)).await.unwrap();
        let status = |id: &MachineId, message: &str| Write::MachineStatus {
            id: id.clone(),
            status: MachineStatus::Error,
            message: message.into(),
        };
        let writes: Vec<_> = ids.iter().map(|id| store.write_behind(status(id, "under the lease"))).collect();
        for w in writes {
            assert_eq!(w.await, Ok(Written::Done));
        }
        store.set_fence(fence(6)).await.unwrap();
        let refused = store.write_behind(status(&ids[0], "stale")).await;
        assert!(matches!(refused, Err(StoreError::Fenced { epoch: 6, .. })), "{refused:?}");
        let id = ids[0].clone();
        let rec = store.exec(move |s| s.machine(&id)).await.unwrap().unwrap();
        assert_eq!(rec.status_message, "under the lease", "the fenced-out write wrote nothing");
        assert_eq!(store.exec(|s| s.recount()).await.unwrap().machines_by_status.get("error"), Some(&2));
    });
    let writes: i64 = raw(&check)
        .query_one("SELECT COALESCE(sum(writes), 0)::bigint FROM epoch_writes WHERE epoch = 7", &[])
        .unwrap()
        .get(0);
    assert_eq!(writes, 2, "both writes recorded under their epoch");
}

/// A start's tags: `model`'s, for `machine`.
fn start_tags(model: &str, machine: &MachineId) -> InstanceTags {
    InstanceTags { model: Some(model.to_owned()), machine: Some(machine.clone()), start: Some("n".into()) }
}

/// `writes` queued in a lazy, fenced group and committed: their answers.
fn fenced_group(s: &mut PgStore, writes: Vec<super::Write>) -> Vec<Result<super::Written, StoreError>> {
    assert!(s.begin_group(false).unwrap());
    s.set_fenced(true);
    for w in writes {
        assert!(s.defer(w).is_none(), "PostgreSQL queues write-behind units");
    }
    s.commit_group().unwrap();
    s.take_deferred()
}

/// The write-behind units' set-based statements are planned as index look-ups whatever the
/// size of the table when their plan is made: under their settings, the generic plan (the one
/// a prepared statement keeps) made on a table of three machines, where a scan costs least,
/// reads the machines and the instances through their indexes, never by a scan.
#[test]
fn the_set_based_statements_plan_index_look_ups_on_a_small_table() {
    use super::deferred::{
        INDEX_PLANS_SQL, INSERT_INSTANCES_SQL, LAND_INSTANCES_SQL, LOCK_MACHINES_SQL, SET_INSTANCE_STATUSES_SQL,
        SET_STARTED_SQL, SET_STATUSES_SQL,
    };
    let (_pg, url, mut s) = opened();
    s.add_machines(3, None).unwrap();
    let mut c = raw(&url);
    c.batch_execute("ANALYZE machines; ANALYZE instances").unwrap();
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(INDEX_PLANS_SQL).unwrap();
    tx.batch_execute("SET LOCAL plan_cache_mode TO force_generic_plan").unwrap();
    let ids = "ARRAY['0', '1']";
    let texts = "ARRAY['a', 'b']";
    let cases = [
        ("lock", LOCK_MACHINES_SQL, "text[]", ids.to_owned()),
        ("statuses", SET_STATUSES_SQL, "text[], text[], text[]", format!("{ids}, {texts}, {texts}")),
        (
            "instance statuses",
            SET_INSTANCE_STATUSES_SQL,
            "text[], text[], text[], text[]",
            format!("{ids}, {texts}, {texts}, {texts}"),
        ),
        (
            "records",
            SET_STARTED_SQL,
            "text[], text[], text[], text[], text[], text[], text[]",
            format!("{ids}, {texts}, {texts}, {texts}, {texts}, {texts}, {texts}"),
        ),
        (
            "instances",
            INSERT_INSTANCES_SQL,
            "text[], text[], text[], text[], text[], text[]",
            format!("{texts}, {texts}, {texts}, {ids}, {texts}, ARRAY['running', 'pending']"),
        ),
        ("landings", LAND_INSTANCES_SQL, "text[]", texts.to_owned()),
    ];
    for (i, (what, sql, types, args)) in cases.iter().enumerate() {
        tx.batch_execute(&format!("PREPARE p{i} ({types}) AS {sql}")).unwrap();
        let plan: Vec<String> =
            tx.query(&format!("EXPLAIN EXECUTE p{i} ({args})"), &[]).unwrap().iter().map(|r| r.get(0)).collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{what}: a scan\n{plan}");
        assert!(plan.contains("Index"), "{what}: no index look-up\n{plan}");
    }
}

/// The store's session keeps index look-ups as the plans of its statements that read machines
/// by id, even when they were made on a table of three machines (a generic plan is made at the
/// sixth execution and kept: a scan made then would scan 100,000 machines later).
#[test]
fn the_stores_session_keeps_index_look_ups_made_on_a_small_table() {
    use super::deferred::INDEX_PLANS_SQL;
    let (_pg, url, mut s) = opened();
    let ids = s.add_machines(3, None).unwrap();
    raw(&url).batch_execute("ANALYZE machines; ANALYZE constraints").unwrap();
    for _ in 0..8 {
        s.model_machines(&ids[..2]).unwrap();
        s.machine_applications(&ids[..2]).unwrap();
        s.provisioning_info(&ids[..2]).unwrap();
        s.machines(&ids[..2]).unwrap();
        s.machine(&ids[0]).unwrap();
    }
    let kept = s.on_session(
        "SELECT name, parameter_types::text FROM pg_prepared_statements \
         WHERE statement LIKE '%FROM machines%' AND generic_plans > 0 AND parameter_types != '{}' \
         ORDER BY name",
    );
    assert!(kept.len() >= 5, "the reads' generic plans: {kept:?}");
    for row in kept {
        let (name, types) = (row[0].clone().unwrap(), row[1].clone().unwrap());
        let args = if types == "{text[]}" { "ARRAY['1', '2']" } else { "'1'" };
        // The plan kept, shown under the default settings.
        let plan = s.on_session(&format!(
            "RESET enable_seqscan; RESET enable_hashjoin; RESET enable_mergejoin; \
             SET plan_cache_mode TO force_generic_plan; EXPLAIN EXECUTE {name}({args})"
        ));
        s.on_session(&format!("SET plan_cache_mode TO auto; {INDEX_PLANS_SQL}"));
        let plan: Vec<String> = plan.into_iter().filter_map(|r| r[0].clone()).collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan on machines"), "{name}: a scan of the machines\n{plan}");
        assert!(plan.contains("Index"), "{name}: no index look-up\n{plan}");
    }
}

/// An operator's adds queued as write-behind units
/// ([`Write::AddMachines`](crate::service::store::Write::AddMachines)) are made by
/// one statement with their group's other units: each gets its own machines, numbered after
/// the ones before, in order; listeners hear of them at the commit; a fence that refuses the
/// provisioner's units does not refuse an operator's adds (they are not fenced); a model that
/// is not alive refuses them (`ModelDying`, nothing added) while the group's other units are
/// written.
#[test]
fn adds_queued_as_write_behind_units_share_one_statement() {
    use super::{Write, Written};
    use crate::service::store::records::NewMachine;
    let (_pg, url, mut s, model, mut listener) = listening();
    let m = s.add_machines(2, None).unwrap();
    let _ = notices(&mut listener, Duration::from_millis(300));
    let add = |count, placement: Option<&str>| Write::AddMachines {
        count,
        spec: NewMachine { placement: placement.map(Into::into), ..NewMachine::default() },
    };
    let status =
        |id: &MachineId| Write::MachineStatus { id: id.clone(), status: MachineStatus::Error, message: "x".into() };
    let group = |s: &mut PgStore, writes: Vec<Write>| {
        assert!(s.begin_group(true).unwrap());
        for w in writes {
            s.set_fenced(w.fenced());
            assert!(s.defer(w).is_none(), "PostgreSQL queues adds with no constraints");
        }
        s.commit_group().unwrap();
        s.take_deferred()
    };
    let added = |ids: &[&str]| Ok(Written::Added(ids.iter().map(|i| MachineId::new(*i)).collect()));
    let answers = group(&mut s, vec![add(2, None), status(&m[0]), add(1, Some("zone=az2"))]);
    assert_eq!(answers, vec![added(&["2", "3"]), Ok(Written::Done), added(&["4"])]);
    let r = s.machine(&MachineId::new("4")).unwrap().unwrap();
    assert_eq!((r.machine.status, r.placement.as_deref()), (MachineStatus::Pending, Some("zone=az2")));
    let notice = |ids: &[&str]| Notice {
        model_uuid: model.clone(),
        kind: "machines".into(),
        ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        all: false,
    };
    assert_eq!(notices(&mut listener, Duration::from_secs(1)), [notice(&["2", "3", "4"]), notice(&["0"])]);
    assert_eq!(s.counts().machines_by_status.get("pending"), Some(&4));
    assert_eq!(s.recount().unwrap(), s.counts().clone(), "the counts kept match a recount");

    // Under a stale fence: the provisioner's unit refused, the operator's add made.
    lease(&url, &model, "replica-a", 7, 30);
    s.set_fence(Some(Fence::new(model.clone(), "replica-a", 6))).unwrap();
    let answers = group(&mut s, vec![status(&m[1]), add(1, None)]);
    assert!(matches!(answers[0], Err(StoreError::Fenced { epoch: 6, .. })), "{answers:?}");
    assert_eq!(answers[1], added(&["5"]));
    assert_eq!(s.machine(&m[1]).unwrap().unwrap().machine.status, MachineStatus::Pending, "nothing fenced written");
    s.set_fence(None).unwrap();

    // A dying model.
    s.destroy_model().unwrap();
    let answers = group(&mut s, vec![add(3, None), status(&m[1])]);
    assert_eq!(answers, vec![Err(StoreError::ModelDying), Ok(Written::Done)]);
    assert_eq!(s.machine_ids().unwrap().len(), 6, "nothing added");
    assert_eq!(s.recount().unwrap(), s.counts().clone(), "the counts kept match a recount");
}

/// The provisioner's writes to a machine's row can be HOT (heap-only, no index entry written):
/// no index on `machines` names a column they change (nor has one in its predicate), and the
/// table's pages keep room for new row versions. (Version 6's partial index of the machines in
/// error named `status` and `instance_status`; they are counted by a table of their own now,
/// checked by `machines_in_error_are_counted_without_a_scan`.)
#[test]
fn no_index_names_a_column_the_provisioners_writes_change() {
    let (_pg, url, _s) = opened();
    let mut c = raw(&url);
    let written = [
        "status",
        "status_message",
        "instance_status",
        "instance_status_message",
        "instance",
        "zone",
        "nonce",
        "display_name",
        "transient",
        "start_attempts",
        "last_start_error",
        "changed_at",
    ];
    let indexes: Vec<String> = c
        .query("SELECT indexdef FROM pg_indexes WHERE tablename = 'machines'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(indexes.len() >= 3, "{indexes:?}");
    for def in &indexes {
        let (_, columns) = def.split_once(" USING ").unwrap();
        let named: Vec<&str> = columns.split(|ch: char| !(ch.is_alphanumeric() || ch == '_')).collect();
        for column in written {
            assert!(!named.contains(&column), "{def} names {column}: its updates cannot be HOT");
        }
    }
    let options: Option<Vec<String>> =
        c.query_one("SELECT reloptions FROM pg_class WHERE relname = 'machines'", &[]).unwrap().get(0);
    assert_eq!(options, Some(vec!["fillfactor=70".to_owned()]));
}

/// Schema version 9: the provisioner's set-based writes and the adds stamp `changed_at`
/// themselves, one value a statement, so the stamping trigger's PL/pgSQL function is not called
/// for their rows (its `WHEN` clauses); any other write is still stamped by it.
#[test]
fn the_set_based_writes_stamp_their_rows_without_calling_the_trigger() {
    use super::deferred::{SET_INSTANCE_STATUSES_SQL, SET_STARTED_SQL, SET_STATUSES_SQL};
    use super::rows::ADD_MANY_SQL;
    let (_pg, url, mut s) = opened();
    let model = s.model_uuid().unwrap();
    s.add_machines(3, None).unwrap();
    let mut c = raw(&url);
    let defs: Vec<String> = c
        .query(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'machines'::regclass \
             AND tgname LIKE 'machines_stamp%' ORDER BY tgname",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(defs.len(), 2, "{defs:?}");
    assert!(defs.iter().all(|d| d.contains(" WHEN (") && d.contains("changed_at")), "{defs:?}");

    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SET LOCAL track_functions = 'pl'").unwrap();
    let calls = |tx: &mut postgres::Transaction<'_>| -> i64 {
        tx.query_one(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions WHERE funcname = 'machines_stamp'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let stamp = |tx: &mut postgres::Transaction<'_>, id: &str| -> Option<String> {
        tx.query_one("SELECT changed_at FROM machines WHERE id = $1", &[&id]).unwrap().get(0)
    };
    tx.batch_execute("UPDATE machines SET changed_at = 'before'").unwrap();
    let before = calls(&mut tx);
    let none: Option<&str> = None;
    // Each row written once here: a row written again within the same millisecond gets the
    // same stamp, and the trigger stamps it then (as it must: the stamp did not change).
    tx.execute(SET_STATUSES_SQL, &[&vec!["0"], &vec!["pending"], &vec!["a"]]).unwrap();
    tx.execute(SET_INSTANCE_STATUSES_SQL, &[&vec!["1"], &vec!["provisioning"], &vec!["starting"], &vec![none]])
        .unwrap();
    tx.execute(
        SET_STARTED_SQL,
        &[&vec!["2"], &vec!["i-1"], &vec![Some("az1")], &vec!["n"], &vec!["name"], &vec!["running"], &vec![none]],
    )
    .unwrap();
    tx.query(
        ADD_MANY_SQL,
        &[&vec![2i64], &vec![none], &vec![none], &CHANGES_CHANNEL, &model, &200i64, &vec![none], &vec![none]],
    )
    .unwrap();
    assert_eq!(calls(&mut tx), before, "the set-based writes and the adds call no stamping function");
    for id in ["0", "1", "2", "3", "4"] {
        let at = stamp(&mut tx, id).unwrap();
        assert!(at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T', "machine {id} stamped {at:?}");
    }
    // Any other write is stamped by the trigger, as before.
    tx.batch_execute("UPDATE machines SET changed_at = 'before' WHERE id = '0'").unwrap();
    let plain = calls(&mut tx);
    tx.batch_execute("UPDATE machines SET status_message = 'plain' WHERE id = '0'").unwrap();
    assert_eq!(calls(&mut tx), plain + 1);
    assert_ne!(stamp(&mut tx, "0").as_deref(), Some("before"));
    tx.rollback().unwrap();
}
