//! PostgreSQL group commits: one transaction the units of work share, each in a savepoint of
//! its own, their savepoints queued to go with the next statement, the fence checked once and
//! the fenced writes recorded once, at the commit (see [`PgGroup`]). The operations of
//! [`StoreBackend`](crate::service::store::StoreBackend)'s group commit, called by `backend.rs`.

use super::conn::{pg, queued_failure, Run};
use super::schema::RECORD_WRITES_SQL;
use super::{GroupRun, PgGroup, PgStore};
use crate::service::store::errors::StoreError;

pub(super) fn begin_group(store: &mut PgStore, durable: bool) -> Result<bool, StoreError> {
    if store.group.is_some() {
        return Err(StoreError::Refused("a group commit is open already".into()));
    }
    if let Some(conn) = store.client.as_mut() {
        conn.client.take_queued_failure(); // a past group's, rolled back with it
    }
    store.group = Some(PgGroup { before: store.book.mark(), durable, ..PgGroup::default() });
    Ok(true)
}

pub(super) fn begin_member(store: &mut PgStore) -> Result<(), StoreError> {
    let Some(group) = store.group.as_mut() else {
        return Err(StoreError::Refused("no group commit is open".into()));
    };
    if let Some(e) = &group.broken {
        return Err(e.clone());
    }
    group.member = Some(store.book.mark());
    group.member_fenced_writes = 0;
    group.member_wrote = false;
    // Once the transaction is begun, every unit of work has its savepoint (a failed read
    // would otherwise abort the group's transaction); before, a read runs outside it.
    if group.begun {
        let Some(conn) = store.client.as_mut() else {
            let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
            return Err(group.broken.get_or_insert(e).clone());
        };
        conn.client.queue("SAVEPOINT member"); // sent with its first statement
        group.member_savepoint = true;
    }
    Ok(())
}

pub(super) fn end_member(store: &mut PgStore, keep: bool) -> Result<(), StoreError> {
    let Some(group) = store.group.as_mut() else {
        return Err(StoreError::Refused("no group commit is open".into()));
    };
    let Some(mark) = group.member.take() else {
        return Err(StoreError::Refused("no write of a group is in progress".into()));
    };
    let savepoint = std::mem::take(&mut group.member_savepoint);
    let fenced_writes = std::mem::take(&mut group.member_fenced_writes);
    group.member_wrote = false;
    queued_failure(store.client.as_mut(), group);
    if let Some(e) = &group.broken {
        store.book.undo(mark);
        return Err(e.clone());
    }
    let conn = match store.client.as_mut() {
        Some(conn) => Some(conn),
        None if savepoint => {
            let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
            store.book.undo(mark);
            return Err(group.broken.get_or_insert(e).clone());
        }
        None => None,
    };
    // The release or the rollback goes with the next statement, or with the commit.
    if keep {
        if let Some(conn) = conn.filter(|_| savepoint) {
            conn.client.queue("RELEASE SAVEPOINT member");
        }
        group.fenced_writes += fenced_writes;
        group.fence_in_member = false;
        store.book.keep(mark);
        return Ok(());
    }
    store.book.undo(mark);
    if std::mem::take(&mut group.fence_in_member) {
        group.fence = None; // its lock went with the savepoint
    }
    if let Some(conn) = conn.filter(|_| savepoint) {
        conn.client.queue("ROLLBACK TO SAVEPOINT member");
        conn.client.queue("RELEASE SAVEPOINT member");
    }
    Ok(())
}

pub(super) fn commit_group(store: &mut PgStore) -> Result<(), StoreError> {
    store.deferred_results.clear();
    let deferred = store.group.as_mut().map(|g| std::mem::take(&mut g.deferred)).unwrap_or_default();
    if !deferred.is_empty() {
        match store.send_deferred(deferred) {
            Ok(true) => {
                if let Some(group) = store.group.take() {
                    store.book.keep(group.before);
                }
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => {
                store.deferred_results.clear();
                if let Some(group) = store.group.as_mut() {
                    group.broken.get_or_insert(e);
                }
            }
        }
    }
    let Some(mut group) = store.group.take() else {
        return Err(StoreError::Refused("no group commit is open".into()));
    };
    if !group.begun {
        if let Some(e) = group.broken {
            store.book.undo(group.before);
            return Err(e);
        }
        store.book.keep(group.before);
        return Ok(());
    }
    let ctx = "committing a group of writes";
    let committed = (|| {
        if let Some(e) = group.broken.take() {
            return Err(e);
        }
        let conn = store.client.as_mut().ok_or_else(|| {
            StoreError::Unavailable("the connection was lost with a group commit's transaction".into())
        })?;
        if let Some(e) = queued_failure(Some(conn), &mut group) {
            return Err(e);
        }
        if let Some(f) = store.fence.as_ref().filter(|_| group.fenced_writes > 0) {
            let mut run = GroupRun { client: &mut conn.client, statements: &mut conn.statements };
            run.execute(RECORD_WRITES_SQL, &[&f.model_uuid, &f.holder, &f.epoch, &group.fenced_writes])
                .map_err(pg("recording the writes' epoch"))?;
        }
        if conn.durable != Some(group.durable) {
            conn.client.queue(if group.durable {
                "SET LOCAL synchronous_commit TO on"
            } else {
                "SET LOCAL synchronous_commit TO off"
            });
        }
        // In a transaction that failed, COMMIT would roll back and answer success: the
        // SELECT before it fails there, and the commit is not sent.
        conn.client.queue("SELECT 1");
        conn.client.queue("COMMIT");
        conn.client.flush().map_err(pg(ctx))
    })();
    match committed {
        Ok(()) => {
            store.book.keep(group.before);
            Ok(())
        }
        Err(e) => {
            if let Some(conn) = store.client.as_mut().filter(|c| !c.client.is_closed()) {
                let _ = conn.client.rollback();
            }
            store.book.undo(group.before);
            Err(e)
        }
    }
}

pub(super) fn abort_group(store: &mut PgStore) {
    store.deferred_results.clear();
    if let Some(group) = store.group.take() {
        if let Some(conn) = store.client.as_mut().filter(|c| group.begun && !c.client.is_closed()) {
            let _ = conn.client.rollback();
        }
        store.book.undo(group.before);
    }
}
