//! Statements on the store's connection: errors mapped onto the store's ([`pg`]), statements
//! prepared once per connection, the [`Run`] trait over the connection, a write's transaction
//! ([`Tx`]: its own, or a savepoint in a group commit) and a group's level, and the leader's
//! fence check.

use super::client::{CallError, PgClient, Piped, Reply};
use super::{Conn, GroupRun, PgGroup, Tx};
use crate::service::store::backend::Fence;
use crate::service::store::errors::{PgFailure, StoreError};
use postgres::types::ToSql;
use postgres::{Row, Statement};
use std::borrow::BorrowMut;
use std::collections::HashMap;

pub(super) fn failure(e: &CallError) -> PgFailure {
    let e = match e {
        CallError::Postgres(e) => e,
        timed_out @ CallError::TimedOut(_) => {
            return PgFailure { code: None, message: timed_out.to_string(), connection_lost: true }
        }
    };
    let code = e.code().map(|c| c.code().to_owned());
    // No server answer (closed, reset, refused, timed out), or the server going away.
    let connection_lost = e.is_closed()
        || e.as_db_error().is_none()
        || code.as_deref().is_some_and(|c| c.starts_with("08") || c.starts_with("57P"));
    let message = match e.as_db_error() {
        Some(db) => db.to_string(),
        None => match std::error::Error::source(e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        },
    };
    PgFailure { code, message, connection_lost }
}

/// Maps a client error onto the store's, naming what was being done.
pub(super) fn pg<E: Into<CallError>>(context: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Postgres { context, source: failure(&e.into()) }
}

pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// One parameter of a deferred statement.
pub(super) type Param<'a> = Box<dyn ToSql + Sync + 'a>;

/// A statement prepared once per connection (the client would prepare each text again: one
/// more round trip per statement).
pub(super) fn prepared(
    c: &mut PgClient,
    cache: &mut HashMap<String, Statement>,
    sql: &str,
) -> Result<Statement, CallError> {
    if let Some(st) = cache.get(sql) {
        return Ok(st.clone());
    }
    let st = c.prepare(sql)?;
    cache.insert(sql.to_owned(), st.clone());
    Ok(st)
}

/// Runs statements, prepared once per connection: on the connection ([`Conn`]) or in a
/// transaction ([`Tx`]).
pub(super) trait Run {
    fn execute(&mut self, sql: &str, p: Params<'_>) -> Result<u64, CallError>;
    fn query(&mut self, sql: &str, p: Params<'_>) -> Result<Vec<Row>, CallError>;
    fn query_opt(&mut self, sql: &str, p: Params<'_>) -> Result<Option<Row>, CallError>;
    fn query_one(&mut self, sql: &str, p: Params<'_>) -> Result<Row, CallError>;
}

impl Tx<'_> {
    /// Commits it (a transaction of its own), or keeps it in its group (the savepoint's
    /// release is sent with the group's next statements).
    pub(super) fn commit(mut self) -> Result<(), CallError> {
        self.done = true;
        match self.group.as_deref_mut() {
            None => self.client.batch_execute("COMMIT"),
            Some(g) => {
                if self.savepoint {
                    self.client.queue("RELEASE SAVEPOINT write");
                }
                g.written = true;
                g.member_wrote = true;
                g.member_fenced_writes += i64::from(self.fenced);
                Ok(())
            }
        }
    }
    pub(super) fn batch_execute(&mut self, sql: &str) -> Result<(), CallError> {
        self.client.batch_execute(sql)
    }
    /// Runs statements that do not need each other's answers in one round trip (see
    /// [`PgClient::pipeline`]): their answers, or the first failure.
    pub(super) fn pipeline(&mut self, statements: &[(&str, Params<'_>, bool)]) -> Result<Vec<Reply>, CallError> {
        let mut piped = Vec::with_capacity(statements.len());
        for (sql, params, rows) in statements {
            let statement = prepared(&mut *self.client, &mut *self.statements, sql)?;
            piped.push(Piped { statement, params, rows: *rows });
        }
        Ok(self.client.pipeline(&piped)?.into_iter().collect::<Result<_, _>>()?)
    }
}

impl Reply {
    /// The rows of a query.
    pub(super) fn into_rows(self) -> Vec<Row> {
        match self {
            Reply::Rows(rows) => rows,
            Reply::Count(_) => Vec::new(),
        }
    }
    /// The rows a statement changed (or returned).
    pub(super) fn count(&self) -> u64 {
        match self {
            Reply::Rows(rows) => rows.len() as u64,
            Reply::Count(n) => *n,
        }
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // In a group, sent with the next statement (its failure breaks the group: see
        // `PgClient`).
        match self.group.as_deref_mut() {
            None => {
                let _ = self.client.rollback();
            }
            Some(_) if self.savepoint => {
                self.client.queue("ROLLBACK TO SAVEPOINT write");
                self.client.queue("RELEASE SAVEPOINT write");
            }
            Some(g) => {
                // The unit's first write: back to the unit's savepoint (kept), which holds
                // nothing else the unit wrote. A fence checked inside it lost its lock.
                self.client.queue("ROLLBACK TO SAVEPOINT member");
                if std::mem::take(&mut g.fence_in_member) {
                    g.fence = None;
                }
            }
        }
    }
}

run_over!(Conn, client, statements);
run_over!(Tx<'_>, client, statements);
run_over!(GroupRun<'_>, client, statements);

/// What a fenced write runs first: the lease's row, share-locked until the transaction ends
/// (so no takeover commits before it), judged by [`Fence::admits`] (this holder at this epoch,
/// unexpired on the statement's own clock: in a group commit the transaction may have begun a
/// little earlier); `Fenced` if not admitted.
pub(super) fn check_fence(r: &mut impl Run, f: &Fence) -> Result<(), StoreError> {
    let row = r
        .query_opt(
            "SELECT holder, epoch, expires_at > statement_timestamp() FROM leader_lease \
             WHERE model_uuid = $1 FOR SHARE",
            &[&f.model_uuid],
        )
        .map_err(pg("checking the leader lease"))?;
    let held = row.map(|row| crate::model::HeldLease { holder: row.get(0), epoch: row.get(1), live: row.get(2) });
    if f.admits(held.as_ref()) {
        Ok(())
    } else {
        Err(StoreError::Fenced { model_uuid: f.model_uuid.clone(), holder: f.holder.clone(), epoch: f.epoch })
    }
}

impl Conn {
    /// A transaction of its own.
    pub(super) fn transaction(&mut self) -> Result<Tx<'_>, CallError> {
        self.client.batch_execute("BEGIN")?;
        Ok(Tx {
            client: &mut self.client,
            statements: &mut self.statements,
            group: None,
            fenced: false,
            savepoint: false,
            done: false,
        })
    }
}

/// Breaks `group` if a statement queued on its connection (a savepoint, a release, a rollback to
/// one) failed: its transaction is then in no state to keep anything. The error it broke with.
pub(super) fn queued_failure(conn: Option<&mut Conn>, group: &mut PgGroup) -> Option<StoreError> {
    let message = conn?.client.take_queued_failure()?;
    let e = StoreError::Postgres {
        context: "running a group's savepoints",
        source: PgFailure { code: None, message, connection_lost: false },
    };
    Some(group.broken.get_or_insert(e).clone())
}
