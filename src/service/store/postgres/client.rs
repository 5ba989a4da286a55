//! The PostgreSQL store's connection (feature `postgres`): `tokio-postgres` on a current-thread
//! runtime that the store's thread owns and blocks on, so that statements can be *pipelined*:
//! the statements queued with [`PgClient::queue`] (a group commit's `BEGIN`, savepoints and
//! releases: parameterless, their answers not needed before the next statement) go out in the
//! same write as the next statement and are answered in the same round trip. The blocking
//! `postgres` crate (the same client, blocking on its own runtime) has no way to send two
//! requests before reading the first answer, so each savepoint cost a round trip of its own.
//!
//! A queued statement that fails leaves the transaction in an unknown state: the statement
//! sent with it answers that failure, and [`PgClient::take_queued_failure`] says so until it
//! is asked, so that the group commit it belonged to is abandoned (a release that failed must
//! not let a later rollback to the savepoint undo a unit of work that was kept).
//!
//! Every call is bounded in time ([`PgClient::deadline`]): a server that accepts a statement
//! and then says nothing (a lock it waits on for ever, a half-open socket) is given up on, the
//! connection is closed (its runtime and socket dropped with it, so the server rolls back what
//! it held) and the call answers [`CallError::TimedOut`]; the store reconnects at its next
//! operation. The server bounds the same statements itself (`statement_timeout`, set by the
//! store), so the client's bound is the backstop for a server that cannot even say so.

use std::time::Duration;

use futures::future::LocalBoxFuture;
use postgres::types::ToSql;
use postgres::{Row, Statement};
use tokio_postgres::{Client, Config, Error, ToStatement};

use crate::service::pgtls::PgTls;

/// Why a call on the connection failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    /// The server answered an error, or the connection failed.
    #[error(transparent)]
    Postgres(#[from] Error),
    /// No answer within the connection's deadline: the connection is closed (the call may or
    /// may not have taken effect; a transaction it was in is rolled back by the server).
    #[error("the database did not answer within {0:?}: the connection was closed")]
    TimedOut(Duration),
}

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    /// The server refused, or the socket could not be connected.
    #[error(transparent)]
    Postgres(#[from] Error),
    /// The connection was made but its start-up did not finish in time.
    #[error("the server did not finish the connection's start-up within {0:?}")]
    TimedOut(Duration),
    /// The runtime the connection runs on could not be made.
    #[error("cannot make the connection's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// One connection, its runtime, and the statements queued to go with the next one.
pub(super) struct PgClient {
    runtime: tokio::runtime::Runtime,
    client: Client,
    /// Parameterless statements (`;`-separated) to send before the next statement.
    queued: String,
    /// A queued statement failed (see the module's documentation): what it answered.
    queued_failed: Option<String>,
    /// Round trips made (each request the store's thread waited for).
    round_trips: u64,
    /// The longest the store's thread waits for one call's answer.
    deadline: Duration,
    /// A call timed out: the connection is given up (see [`PgClient::is_closed`]).
    abandoned: bool,
    /// When the server last answered a call well (no error).
    answered: Option<tokio::time::Instant>,
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// What [`PgClient::pipeline_then`] answers: each statement's answer, and the trailing batch's.
pub(super) type PipelineAnswers = (Vec<Result<Reply, Error>>, Result<(), Error>);

/// One statement of a [`PgClient::pipeline`]: prepared, its parameters, and whether its rows
/// are wanted (else the count of rows it changed).
pub(super) struct Piped<'a> {
    pub(super) statement: Statement,
    pub(super) params: Params<'a>,
    pub(super) rows: bool,
}

/// A pipelined statement's answer.
#[derive(Debug)]
pub(super) enum Reply {
    /// Its rows.
    Rows(Vec<Row>),
    /// The rows it changed.
    Count(u64),
}

impl PgClient {
    /// Connects with `config`, the start-up included within `deadline` (a server that accepts
    /// the connection and then says nothing is given up on, not waited for).
    /// Each later call is bounded by `calls` ([`PgClient::set_deadline`] changes it).
    pub(super) fn connect(
        config: &Config,
        tls: &PgTls,
        deadline: Duration,
        calls: Duration,
    ) -> Result<Self, ConnectError> {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ConnectError::Runtime)?;
        let (client, connection) = runtime
            .block_on(async { tokio::time::timeout(deadline, config.connect(tls.clone())).await })
            .map_err(|_| ConnectError::TimedOut(deadline))??;
        // Polled whenever the store's thread blocks on a statement (a current-thread runtime).
        // Its messages read here rather than by awaiting it, which logs the server's notices
        // at info: they go to debug (`pgconnect::quiet_notices`).
        let mut connection = connection;
        runtime.spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = futures::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notice(n)) => {
                        tracing::debug!(
                            severity = n.severity(),
                            code = n.code().code(),
                            "PostgreSQL says: {}",
                            n.message()
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "the store's connection ended");
                        break;
                    }
                }
            }
        });
        Ok(Self {
            runtime,
            client,
            queued: String::new(),
            queued_failed: None,
            round_trips: 0,
            deadline: calls,
            abandoned: false,
            answered: None,
        })
    }

    /// The longest one call waits for its answer (tests).
    #[cfg(test)]
    pub(super) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Bounds each later call by `deadline` (a migration's statements may take longer than the
    /// store's usual ones).
    pub(super) fn set_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    /// Runs `call` on the connection's runtime within the deadline; past it, the connection is
    /// abandoned (its socket closed as the runtime goes) and the call answers
    /// [`CallError::TimedOut`].
    fn bounded<T>(
        runtime: &tokio::runtime::Runtime,
        deadline: Duration,
        abandoned: &mut bool,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, CallError> {
        if *abandoned {
            return Err(CallError::TimedOut(deadline));
        }
        runtime.block_on(async { tokio::time::timeout(deadline, call).await }).map_err(|_| {
            *abandoned = true;
            tracing::warn!(
                deadline_ms = deadline.as_millis() as u64,
                "the database did not answer in time: closing the connection"
            );
            CallError::TimedOut(deadline)
        })
    }

    /// Queues a parameterless statement to go out with the next one.
    pub(super) fn queue(&mut self, sql: &str) {
        if !self.queued.is_empty() {
            self.queued.push_str("; ");
        }
        self.queued.push_str(sql);
    }

    /// What a queued statement that failed answered, if one did since the last call.
    pub(super) fn take_queued_failure(&mut self) -> Option<String> {
        std::mem::take(&mut self.queued_failed)
    }

    /// Replaces what is queued (tests: a statement that fails where a release would be).
    #[cfg(test)]
    pub(super) fn replace_queued(&mut self, sql: &str) {
        self.queued = sql.to_owned();
    }

    /// Round trips made on this connection so far (tests count them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn round_trips(&self) -> u64 {
        self.round_trips
    }

    /// Whether nothing is queued on the connection, nor a queued statement's failure unread:
    /// what a connection handed to another store must be (see `pool`).
    pub(super) fn is_idle(&self) -> bool {
        self.queued.is_empty() && self.queued_failed.is_none()
    }

    /// Whether the server answered a call on the connection well (no error) within `within`.
    pub(super) fn answered_within(&self, within: Duration) -> bool {
        self.answered.is_some_and(|at| at.elapsed() < within)
    }

    /// Lets the connection read what the server sent while no call waited on it (a session the
    /// server ended says so at once: `FATAL`, then the socket closes), with no round trip: the
    /// runtime polls its sockets once (a yield wakes only after that poll) and the connection's
    /// task runs. [`PgClient::is_closed`] then tells whether the session is gone.
    pub(super) fn drive(&mut self) {
        if !self.abandoned {
            self.runtime.block_on(async {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
            });
        }
    }

    /// Whether the connection is known to be gone (or was given up on: a call timed out).
    pub(super) fn is_closed(&self) -> bool {
        self.abandoned || self.client.is_closed()
    }

    /// Runs `request` after the queued statements, sent together: one round trip. A failure of
    /// the queued ones is the answer (and is remembered).
    fn pipelined<'a, T>(
        &'a mut self,
        request: impl FnOnce(&'a Client) -> LocalBoxFuture<'a, Result<T, Error>>,
    ) -> Result<T, CallError> {
        let Self { runtime, client, queued, queued_failed, round_trips, deadline, abandoned, answered } = self;
        *round_trips += 1;
        let queued = std::mem::take(queued);
        let client: &'a Client = client;
        let (before, answer) = Self::bounded(runtime, *deadline, abandoned, async {
            if queued.is_empty() {
                (Ok(()), request(client).await)
            } else {
                // Polled in this order, so sent in this order, in one write.
                futures::join!(client.batch_execute(&queued), request(client))
            }
        })?;
        if let Err(e) = before {
            *queued_failed = Some(e.to_string());
            return Err(e.into());
        }
        let answer = answer?;
        *answered = Some(tokio::time::Instant::now());
        Ok(answer)
    }

    /// Sends the queued statements now (nothing if none is).
    pub(super) fn flush(&mut self) -> Result<(), CallError> {
        if self.queued.is_empty() {
            return Ok(());
        }
        self.batch_execute("")
    }

    /// Rolls the transaction back: what was queued is dropped (it belonged to it), and so is a
    /// queued statement's failure.
    pub(super) fn rollback(&mut self) -> Result<(), CallError> {
        self.queued.clear();
        self.queued_failed = None;
        self.batch_execute("ROLLBACK")
    }

    /// Runs parameterless statements (`;`-separated) by the simple protocol: the last one's
    /// rows, as text (tests).
    #[cfg(test)]
    pub(super) fn simple_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, CallError> {
        let messages = self.pipelined(|c| Box::pin(c.simple_query(sql)))?;
        let mut rows = Vec::new();
        for m in messages {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                rows.push((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect());
            }
        }
        Ok(rows)
    }

    /// Runs parameterless statements (`;`-separated), after the queued ones.
    pub(super) fn batch_execute(&mut self, sql: &str) -> Result<(), CallError> {
        if sql.is_empty() {
            let queued = std::mem::take(&mut self.queued);
            self.round_trips += 1;
            let Self { runtime, client, deadline, abandoned, .. } = self;
            let done = Self::bounded(runtime, *deadline, abandoned, client.batch_execute(&queued))?;
            return match done {
                Ok(()) => {
                    self.answered = Some(tokio::time::Instant::now());
                    Ok(())
                }
                Err(e) => {
                    self.queued_failed = Some(e.to_string());
                    Err(e.into())
                }
            };
        }
        self.pipelined(|c| Box::pin(c.batch_execute(sql)))
    }

    /// Prepares a statement, after the queued ones.
    pub(super) fn prepare(&mut self, sql: &str) -> Result<Statement, CallError> {
        self.pipelined(|c| Box::pin(c.prepare(sql)))
    }

    /// Runs a statement: the rows it changed.
    pub(super) fn execute<T: ?Sized + ToStatement + Sync>(&mut self, st: &T, p: Params<'_>) -> Result<u64, CallError> {
        self.pipelined(|c| Box::pin(c.execute(st, p)))
    }

    /// Runs statements that do not need each other's answers, sent together after the queued
    /// ones (one round trip): each one's answer, in order. In a transaction, one that fails
    /// makes the later ones fail too (the transaction is aborted).
    pub(super) fn pipeline(&mut self, statements: &[Piped<'_>]) -> Result<Vec<Result<Reply, Error>>, CallError> {
        self.pipelined(|c| Box::pin(async move { Ok(in_order(c, statements).await) }))
    }

    /// Runs statements as [`PgClient::pipeline`] does, then the parameterless statements
    /// `then` (`;`-separated: a group's commit), all sent together after the queued ones: one
    /// round trip. Each statement's answer, and `then`'s (in a transaction, a statement that
    /// failed makes `then` fail: its `COMMIT` is not run).
    pub(super) fn pipeline_then(&mut self, statements: &[Piped<'_>], then: &str) -> Result<PipelineAnswers, CallError> {
        self.pipelined(|c| {
            Box::pin(async move {
                // Polled in this order, so sent in this order.
                Ok(futures::join!(in_order(c, statements), c.batch_execute(then)))
            })
        })
    }

    /// Runs a query: its rows.
    pub(super) fn query<T: ?Sized + ToStatement + Sync>(
        &mut self,
        st: &T,
        p: Params<'_>,
    ) -> Result<Vec<Row>, CallError> {
        self.pipelined(|c| Box::pin(c.query(st, p)))
    }

    /// Runs a query of at most one row.
    pub(super) fn query_opt<T: ?Sized + ToStatement + Sync>(
        &mut self,
        st: &T,
        p: Params<'_>,
    ) -> Result<Option<Row>, CallError> {
        self.pipelined(|c| Box::pin(c.query_opt(st, p)))
    }

    /// Runs a query of exactly one row.
    pub(super) fn query_one<T: ?Sized + ToStatement + Sync>(
        &mut self,
        st: &T,
        p: Params<'_>,
    ) -> Result<Row, CallError> {
        self.pipelined(|c| Box::pin(c.query_one(st, p)))
    }
}

/// Runs `statements` on `c`, each sent when first polled: polled in order, so sent in order,
/// in one write (whatever their number). Each one's answer, in order.
async fn in_order<'a>(c: &'a Client, statements: &'a [Piped<'a>]) -> Vec<Result<Reply, Error>> {
    let mut pending: Vec<LocalBoxFuture<'a, Result<Reply, Error>>> = statements
        .iter()
        .map(|p| -> LocalBoxFuture<'a, Result<Reply, Error>> {
            if p.rows {
                Box::pin(async move { c.query(&p.statement, p.params).await.map(Reply::Rows) })
            } else {
                Box::pin(async move { c.execute(&p.statement, p.params).await.map(Reply::Count) })
            }
        })
        .collect();
    let mut answers: Vec<Option<Result<Reply, Error>>> = statements.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, answer) in pending.iter_mut().zip(answers.iter_mut()) {
            if answer.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(a) => *answer = Some(a),
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    answers.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    // A real listener that never answers, on the wall clock.
    #![allow(clippy::disallowed_methods, clippy::disallowed_types)]

    use super::*;

    /// A peer that accepts and then says nothing: the start-up is given up on at the deadline
    /// (the store's thread is not held for ever), and the attempt leaves nothing behind.
    #[test]
    fn a_silent_server_times_out() {
        let (url, held) = crate::service::pgconnect::silent_peer();
        let config: Config = url.parse().unwrap();
        let started = std::time::Instant::now();
        let e = PgClient::connect(&config, &PgTls::disabled(), Duration::from_millis(300), Duration::from_secs(5))
            .err()
            .expect("no server answered");
        assert!(matches!(e, ConnectError::TimedOut(_)), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        drop(held.join().unwrap().unwrap());
    }

    /// Nothing listening: refused at once, not timed out.
    #[test]
    fn a_refused_connection_is_a_postgres_error() {
        let config: Config = crate::service::pgconnect::refusing_peer().parse().unwrap();
        let e = PgClient::connect(&config, &PgTls::disabled(), Duration::from_secs(10), Duration::from_secs(5))
            .err()
            .expect("refused");
        assert!(matches!(e, ConnectError::Postgres(_)), "{e:?}");
    }
}
