//! SQLite group commits (the store actor's, see `actor.rs`): one transaction that the units of
//! work share, each in a savepoint of its own, committed at once, and the book kept with it.

use super::rows::run_cached;
use super::{OpenGroup, StoreCore};
use crate::service::store::backend::StoreBackend;
use crate::service::store::errors::StoreError;

/// Opens a group commit: one transaction that the writes until [`StoreBackend::commit_group`]
/// share, each in a savepoint of its own ([`StoreBackend::begin_member`],
/// [`StoreBackend::end_member`]), committed at once: fsynced once for all of them if
/// `durable` (SQLite cannot change its safety level inside a transaction, so a group is
/// durable or not from its start).
pub(super) fn begin_group(core: &mut StoreCore, durable: bool) -> Result<(), StoreError> {
    if core.group.is_some() {
        return Err(StoreError::Refused("a group commit is open already".into()));
    }
    core.set_durable(durable)?;
    run_cached(&core.conn, "BEGIN").map_err(StoreError::sql("beginning a group commit"))?;
    core.group = Some(OpenGroup {
        before: core.book.mark(),
        member: None,
        changes_at_begin: core.conn.total_changes(),
        stamp: std::cell::OnceCell::new(),
    });
    Ok(())
}

/// A write of the open group begins: its savepoint, and the book's mark to go back to if
/// it fails.
pub(super) fn begin_member(core: &mut StoreCore) -> Result<(), StoreError> {
    let Some(group) = core.group.as_mut() else {
        return Err(StoreError::Refused("no group commit is open".into()));
    };
    run_cached(&core.conn, "SAVEPOINT member").map_err(StoreError::sql("beginning a write of a group"))?;
    group.member = Some(core.book.mark());
    group.stamp = std::cell::OnceCell::new();
    Ok(())
}

/// The write in progress ends: kept in the group (`keep`), or rolled back to its savepoint
/// (its failure undoes none of the others). An error means the group's transaction itself
/// is gone (SQLite rolls a transaction back on its own after some failures, a full disk
/// among them): the caller must abort the group.
pub(super) fn end_member(core: &mut StoreCore, keep: bool) -> Result<(), StoreError> {
    let Some(mark) = core.group.as_mut().and_then(|g| g.member.take()) else {
        return Err(StoreError::Refused("no write of a group is in progress".into()));
    };
    let rollback = if keep { Ok(()) } else { run_cached(&core.conn, "ROLLBACK TO member") };
    let ended = rollback
        .and_then(|()| run_cached(&core.conn, "RELEASE member"))
        .map_err(StoreError::sql("ending a write of a group"));
    match ended {
        Ok(()) if keep => core.book.keep(mark),
        _ => core.book.undo(mark),
    }
    ended?;
    if core.conn.is_autocommit() {
        return Err(StoreError::Refused("the group commit's transaction ended before its commit".into()));
    }
    Ok(())
}

/// Whether the open group has written anything so far: until it has, what its writes read
/// was committed before it began.
pub(super) fn group_has_written(core: &StoreCore) -> bool {
    core.group.as_ref().is_some_and(|g| core.conn.total_changes() != g.changes_at_begin)
}

/// Commits the open group: when this returns `Ok`, every write kept in it is on disk (if
/// the group is durable) and the book holds them; on an error none of them is, and the book
/// is as before the group.
pub(super) fn commit_group(core: &mut StoreCore) -> Result<(), StoreError> {
    let Some(group) = core.group.take() else {
        return Err(StoreError::Refused("no group commit is open".into()));
    };
    match run_cached(&core.conn, "COMMIT").map_err(StoreError::sql("committing a group of writes")) {
        Ok(()) => {
            core.book.keep(group.before);
            Ok(())
        }
        Err(e) => {
            if !core.conn.is_autocommit() {
                let _ = core.conn.execute_batch("ROLLBACK");
            }
            core.book.undo(group.before);
            Err(e)
        }
    }
}

/// Abandons the open group (nothing of it is written): the book goes back to before it.
pub(super) fn abort_group(core: &mut StoreCore) {
    if let Some(group) = core.group.take() {
        if !core.conn.is_autocommit() {
            let _ = core.conn.execute_batch("ROLLBACK");
        }
        core.book.undo(group.before);
    }
}
