//! The PostgreSQL store's connection: its configuration, (re)connecting with backoff, the
//! session's settings and the schema's migrations at each connection, and the transactions its
//! writes begin (fenced, or in a group commit).

use super::client::{CallError, ConnectError, PgClient};
use super::conn::{check_fence, pg, Run};
use super::deferred::INDEX_PLANS_SQL;
use super::pool::{self, Dialer};
use super::rows::{meta_get, meta_set};
use super::schema::{MIGRATIONS, RECORD_WRITE_SQL};
use super::{
    Conn, GroupRun, PgStore, Source, Tx, CALL_SLACK, IDLE_IN_TRANSACTION, MIGRATION_DEADLINE, MIGRATION_LOCK,
    PG_SCHEMA_VERSION, STATEMENT_DEADLINE,
};
use crate::model::Life;
use crate::service::store::backend::{Fence, StoreBackend};
use crate::service::store::errors::{PgFailure, StoreError};
use crate::service::store::records::{random_uuid, Book};
use postgres::Config;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

impl Drop for PgStore {
    /// A store of a pool gives its lane's connection back, and leaves the lane's slot (the last
    /// one's going closes the connection).
    fn drop(&mut self) {
        if let Source::Pooled { pool, .. } = self.source {
            self.release();
            pool::leave(pool);
        }
    }
}

impl PgStore {
    /// Parses a `postgres://` URL (or a key=value connection string): the blocking client's
    /// configuration and the URL's TLS settings (`sslmode`, `sslrootcert`: see `pgtls`). A bad
    /// one is [`StoreError::Invalid`] naming `store`.
    pub(crate) fn config(url: &str) -> Result<(Config, crate::service::pgtls::PgTls), StoreError> {
        let (config, tls) = Self::store_config(url)?;
        let mut config = Config::from(config);
        crate::service::pgconnect::quiet_notices(&mut config);
        Ok((config, tls))
    }

    /// [`PgStore::config`] for the store's own connection (`tokio-postgres`'s, the same
    /// settings: see `client.rs`).
    pub(crate) fn store_config(
        url: &str,
    ) -> Result<(tokio_postgres::Config, crate::service::pgtls::PgTls), StoreError> {
        let (mut config, tls) = crate::service::pgtls::parse(url)
            .map_err(|e| StoreError::Invalid { field: "store", message: format!("{url:?}: {e}") })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true).keepalives_idle(Duration::from_secs(10));
        // A statement whose packets go unacknowledged (the server unreachable mid-query) fails
        // after this instead of waiting out TCP's retransmissions (many minutes).
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(Duration::from_secs(10));
        }
        // A transaction left open by a store that can no longer talk to the server (a partition
        // swallowed its COMMIT) would keep its share lock on the lease row, and no replica could
        // take the lease until the server noticed the dead connection (hours, with TCP keepalive
        // answered by a middlebox). The store never idles inside a transaction (its statements
        // run back to back), so the server ends such a session soon, releasing its locks and
        // rolling its writes back.
        // Every statement bounded on the server too (see `STATEMENT_DEADLINE`).
        let idle = format!(
            "-c idle_in_transaction_session_timeout={} -c statement_timeout={ms} -c lock_timeout={ms}",
            IDLE_IN_TRANSACTION.as_millis(),
            ms = STATEMENT_DEADLINE.as_millis()
        );
        let options = match config.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {idle}"),
            _ => idle,
        };
        config.options(&options);
        if config.get_application_name().is_none() {
            config.application_name("provisioner");
        }
        Ok((config, tls))
    }

    /// A store that connects at its first operation (over TLS as `tls` says), on a connection
    /// of its own (tests: a store of a pool shares its lane's, see [`PgStore::pooled`]).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn new(config: tokio_postgres::Config, tls: crate::service::pgtls::PgTls) -> Self {
        Self::over(config, tls, Source::Own(Dialer::default()))
    }

    /// A store of `pool`, made on the lane's thread it runs on: it borrows that lane's connection
    /// of the pool for its turns (see `pool`), the session's `search_path` set to `schema`
    /// (`None`: the URL's own). `config` is the pool's (the service's URL).
    pub(crate) fn pooled(
        config: tokio_postgres::Config,
        tls: crate::service::pgtls::PgTls,
        pool: u64,
        schema: Option<String>,
    ) -> Self {
        pool::join(pool);
        Self::over(config, tls, Source::Pooled { pool, schema })
    }

    fn over(config: tokio_postgres::Config, tls: crate::service::pgtls::PgTls, source: Source) -> Self {
        Self {
            config,
            tls,
            client: None,
            source,
            attached: None,
            last_pid: None,
            model_uuid: None,
            book: Book { counts_changed: true, ..Book::default() },
            fence: None,
            fenced: false,
            durable: true,
            created: false,
            group: None,
            deferred_results: Vec::new(),
        }
    }

    /// Gives its lane's connection back (a store of a pool, at the end of its turn), if no
    /// group's transaction is open on it; one that is open is closed instead (the server rolls
    /// it back). A store of its own keeps its connection.
    pub(super) fn release(&mut self) {
        let Source::Pooled { pool, .. } = &self.source else { return };
        let Some(conn) = self.client.take() else { return };
        if let Some(group) = self.group.as_mut().filter(|g| g.begun) {
            let e = StoreError::Unavailable("the connection was given up with a group commit's transaction".into());
            group.broken.get_or_insert(e);
            return;
        }
        pool::give_back(*pool, conn);
    }

    /// Connects now (tests and start-up): the store, or why not.
    #[cfg(test)]
    pub(crate) fn open(url: &str) -> Result<Self, StoreError> {
        let (config, tls) = Self::store_config(url)?;
        let mut s = Self::new(config, tls);
        s.client()?;
        Ok(s)
    }

    /// Replaces the statements queued on the connection (tests: a failing one in their place).
    #[cfg(test)]
    pub(super) fn replace_queued(&mut self, sql: &str) {
        if let Some(conn) = self.client.as_mut() {
            conn.client.replace_queued(sql);
        }
    }

    /// Runs parameterless statements on the store's own session and answers their rows as text
    /// (tests: what the session has prepared, and the plans it keeps).
    #[cfg(test)]
    pub(super) fn on_session(&mut self, sql: &str) -> Vec<Vec<Option<String>>> {
        let conn = self.client().expect("a connection");
        conn.client.flush().expect("the queued statements");
        conn.client.simple_rows(sql).expect("the statements")
    }

    /// Round trips made on the current connection (tests).
    #[cfg(test)]
    pub(super) fn round_trips(&self) -> u64 {
        self.client.as_ref().map_or(0, |c| c.client.round_trips())
    }

    /// Whether this store created the model (it found an empty database).
    #[cfg(test)]
    pub(crate) fn created_model(&self) -> bool {
        self.created
    }

    /// The connection, made now if there is none (and the backoff allows an attempt): what a
    /// read runs on (the open group's queued statements go with its statement).
    pub(super) fn client(&mut self) -> Result<&mut Conn, StoreError> {
        self.connection()?;
        self.client.as_mut().ok_or_else(|| StoreError::Unavailable("no connection".into()))
    }

    /// The connection, made (or borrowed from the lane) now if the store holds none, and the
    /// store set up on it: its `search_path`, and on a connection it has not used before, its
    /// schema's migrations, its model and its counts. Not while a group's transaction is begun:
    /// it went with the connection it was on.
    pub(super) fn connection(&mut self) -> Result<&mut Conn, StoreError> {
        self.held_connection()?;
        self.settle().inspect_err(|e| self.note_damage(e))?;
        let want = self.durable;
        let Some(client) = self.client.as_mut() else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        if client.durable != Some(want) {
            let sql = if want { "SET synchronous_commit TO on" } else { "SET synchronous_commit TO off" };
            client.client.batch_execute(sql).map_err(pg("setting synchronous_commit"))?;
            client.durable = Some(want);
        }
        Ok(client)
    }

    /// The connection the store holds, made (or borrowed from the lane) now if it holds none,
    /// as it is: not set up for the store (see [`PgStore::connection`]).
    pub(super) fn held_connection(&mut self) -> Result<&mut Conn, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.client = None;
        }
        // A connection held across an idle while (a store's own) is checked as a borrowed one
        // is (`pool::still_there`), outside a transaction only.
        if self.group.as_ref().is_none_or(|g| !g.begun) {
            self.client = self.client.take().and_then(pool::still_there);
        }
        if self.client.is_none() {
            if let Some(group) = self.group.as_mut().filter(|g| g.begun) {
                let e = StoreError::Unavailable("the connection was lost with a group commit's transaction".into());
                return Err(group.broken.get_or_insert(e).clone());
            }
            let (config, tls) = (&self.config, &self.tls);
            let dial = || dial(config, tls);
            let conn = match &mut self.source {
                Source::Own(dialer) => dialer.dial(dial)?,
                Source::Pooled { pool, .. } => pool::borrow(*pool, dial)?,
            };
            self.last_pid = Some(conn.pid);
            self.client = Some(conn);
        }
        self.client.as_mut().ok_or_else(|| StoreError::Unavailable("no connection".into()))
    }

    /// Sets the store up on the connection it holds: the session's `search_path` to its schema
    /// (by a statement of its own, outside any transaction: see `pool`), and on a connection it
    /// has not used before, its schema migrated, its model read and its counts made afresh
    /// (other writers may have changed anything while it was away).
    fn settle(&mut self) -> Result<(), StoreError> {
        let schema = match &self.source {
            Source::Pooled { schema, .. } => schema.as_deref(),
            Source::Own(_) => None,
        };
        let Some(conn) = self.client.as_mut() else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        if conn.search_path.as_deref() != schema {
            let set = match schema {
                Some(schema) => {
                    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
                    conn.query_one("SELECT set_config('search_path', $1, false)", &[&quoted]).map(drop)
                }
                None => conn.client.batch_execute("SET search_path TO DEFAULT"),
            };
            set.map_err(pg("setting the model's schema"))?;
            conn.switch_statements(schema.map(str::to_owned));
        }
        if self.attached == Some(conn.generation) {
            return Ok(());
        }
        let generation = conn.generation;
        let (uuid, created) = migrate(conn)?;
        self.created |= created;
        self.model_uuid = Some(uuid);
        self.book.counts = self.recount()?;
        self.book.counts_changed = true;
        self.attached = Some(generation);
        Ok(())
    }

    pub(super) fn uuid(&self) -> String {
        self.model_uuid.clone().unwrap_or_default()
    }

    /// A write's transaction: begun, and checked against the fence when the work is the
    /// provisioner's and a fence is set.
    pub(super) fn begin(&mut self, ctx: &'static str) -> Result<Tx<'_>, StoreError> {
        let fence = if self.fenced { self.fence.clone() } else { None };
        self.begin_with(ctx, fence)
    }

    /// A write's transaction checked against `fence` (if some): a transaction of its own, or
    /// a savepoint in the open group's (the group's transaction begun, and the fence checked
    /// once for the group, if not done yet).
    pub(super) fn begin_with(&mut self, ctx: &'static str, fence: Option<Fence>) -> Result<Tx<'_>, StoreError> {
        self.connection()?;
        let Self { client, group, .. } = self;
        let Some(conn) = client.as_mut() else {
            return Err(StoreError::Unavailable("no connection".into()));
        };
        let Some(group) = group.as_mut() else {
            let mut tx = conn.transaction().map_err(pg(ctx))?;
            if let Some(f) = &fence {
                check_fence(&mut tx, f)?;
                tx.execute(RECORD_WRITE_SQL, &[&f.model_uuid, &f.holder, &f.epoch])
                    .map_err(pg("recording the write's epoch"))?;
                tx.fenced = true;
            }
            return Ok(tx);
        };
        if let Some(e) = &group.broken {
            return Err(e.clone());
        }
        if !group.begun {
            conn.client.queue("BEGIN");
            group.begun = true;
            group.began = Some(Instant::now());
        }
        if let Some(f) = &fence {
            match &group.fence {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e.clone()),
                None => {
                    // Sent with what is queued (`BEGIN`, a savepoint): a failure of those is no
                    // `Fenced`, and breaks the group.
                    let mut run = GroupRun { client: &mut conn.client, statements: &mut conn.statements };
                    let checked = check_fence(&mut run, f).map(|()| Ok(())).or_else(|e| match e {
                        StoreError::Fenced { .. } => Ok(Err(e)),
                        e => Err(e),
                    });
                    match checked {
                        Ok(passed) => {
                            group.fence = Some(passed.clone());
                            group.fence_in_member = group.member_savepoint;
                            passed?;
                        }
                        Err(e) => return Err(group.broken.get_or_insert(e).clone()),
                    }
                }
            }
        }
        if !group.member_savepoint {
            conn.client.queue("SAVEPOINT member");
            group.member_savepoint = true;
        }
        // Sent with the write's first statement.
        let savepoint = group.member_wrote;
        if savepoint {
            conn.client.queue("SAVEPOINT write");
        }
        Ok(Tx {
            client: &mut conn.client,
            statements: &mut conn.statements,
            group: Some(group),
            fenced: fence.is_some(),
            savepoint,
            done: false,
        })
    }
}

/// Connects with `config` (within its connect timeout, start-up included): a connection on which
/// no store is set up yet.
fn dial(config: &tokio_postgres::Config, tls: &crate::service::pgtls::PgTls) -> Result<Conn, StoreError> {
    let deadline = config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(5));
    let mut client =
        PgClient::connect(config, tls, deadline, STATEMENT_DEADLINE + CALL_SLACK).map_err(|e| match e {
            ConnectError::Postgres(e) => pg("connecting to the database")(e),
            other => StoreError::Postgres {
                context: "connecting to the database",
                source: PgFailure { code: None, message: other.to_string(), connection_lost: true },
            },
        })?;
    // The session's planner settings go with its first statement.
    client.queue(INDEX_PLANS_SQL);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .and_then(|r| r.try_get(0).map_err(CallError::from))
        .map_err(pg("reading the session's process id"))?;
    Ok(Conn {
        client,
        statements: HashMap::new(),
        pid,
        generation: pool::next_generation(),
        search_path: None,
        aside: HashMap::new(),
        switches: 0,
        durable: None,
    })
}

/// Applies the migrations the schema on `conn`'s `search_path` lacks (under the migration lock,
/// within [`MIGRATION_DEADLINE`]), and reads its model's uuid, or draws one on an empty schema:
/// the uuid, and whether it was drawn here.
fn migrate(conn: &mut Conn) -> Result<(String, bool), StoreError> {
    conn.client.set_deadline(MIGRATION_DEADLINE + CALL_SLACK);
    let migrated = migrate_within(conn);
    conn.client.set_deadline(STATEMENT_DEADLINE + CALL_SLACK);
    migrated
}

fn migrate_within(conn: &mut Conn) -> Result<(String, bool), StoreError> {
    let ctx = "migrating the schema";
    let mut tx = conn.transaction().map_err(pg(ctx))?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}",
        ms = MIGRATION_DEADLINE.as_millis()
    ))
    .map_err(pg(ctx))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(pg(ctx))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .map_err(pg(ctx))?;
    let found: i64 = tx
        .query_one("SELECT COALESCE(max(version), 0) FROM schema_migrations", &[])
        .and_then(|r| r.try_get(0).map_err(CallError::from))
        .map_err(pg(ctx))?;
    if found > PG_SCHEMA_VERSION {
        return Err(StoreError::TooNew { found, supported: PG_SCHEMA_VERSION });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql).map_err(pg(ctx))?;
        tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[version]).map_err(pg(ctx))?;
    }
    let (uuid, created) = match meta_get(&mut tx, "model_uuid").map_err(pg("reading the model uuid"))? {
        Some(u) => (u, false),
        None if found > 0 => {
            return Err(StoreError::Damaged {
                context: "reading the model uuid",
                message: "the database has a schema but no model uuid".into(),
            })
        }
        None => {
            let u = random_uuid();
            meta_set(&mut tx, "model_uuid", &u).map_err(pg("writing the model uuid"))?;
            meta_set(&mut tx, "model_life", Life::Alive.as_str()).map_err(pg("writing the model life"))?;
            (u, true)
        }
    };
    tx.commit().map_err(pg(ctx))?;
    Ok((uuid, created))
}
