//! The leader lease's SQL (feature `postgres`), on PostgreSQL's clock: one `leader_lease` row per
//! model (`model_uuid` the key, `holder` a replica id, `epoch` growing at each acquisition,
//! `expires_at`). Every statement is a single one, so it is atomic on its own; every time is
//! the database's `now()`, never a replica's clock.
//!
//! - acquire: insert the row, or take it over with `epoch + 1` only where it has expired
//!   (`ON CONFLICT ... DO UPDATE ... WHERE expires_at < now()`); two contenders at once are
//!   serialised by the row's lock, so exactly one wins. Each acquisition is recorded in
//!   `lease_epochs` in the same statement, with a value of `fence_seq` drawn after the row was
//!   locked (a first row starts above every epoch recorded, so epochs never repeat, even if
//!   the row is deleted by hand).
//! - renew: extend the expiry only as the holder, at its epoch, before it expired.
//! - release: expire the lease now, keeping the epoch, so that the next acquisition is at
//!   `epoch + 1` at once.
//! - [`FENCE_SQL`]: what a fenced write runs first in its transaction (the holder and epoch
//!   still hold an unexpired lease; the row is share-locked, so a takeover waits for the write
//!   to commit, and a write after a takeover finds nothing).
//! - [`audit_epochs`]: the proof, read from the record, that no write committed under a stale
//!   epoch (every epoch's last write drew its sequence value before the next acquisition), and
//!   the acquisitions (how many transitions there were).
//!
//! The client is the sync `postgres` crate: the lease's shell runs it on a thread of its own,
//! so a hung call never blocks the actors, and the renew deadline is kept by a timer, not by
//! the call.

use std::time::Duration;

use postgres::{Client, GenericClient, Transaction};
use thiserror::Error;

use super::state::Answer;

/// The table, as the store's migrations create it (created here too where missing, so that
/// the lease can be used and tested on its own).
pub(crate) const CREATE_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS leader_lease (
    model_uuid TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
)";

/// The advisory lock key under which the tables are created: the store's migration lock, so
/// that a lease connecting while a store migrates waits for it.
const LEASE_TABLE_LOCK: i64 = crate::service::store::MIGRATION_LOCK;

/// Acquire when free or expired: `$1` model uuid, `$2` holder, `$3` the lease in milliseconds.
/// The acquisition is recorded in `lease_epochs` with a `fence_seq` value drawn after the lease
/// row was locked (the data-modifying CTE runs, and locks, before its row reaches the outer
/// insert).
pub(crate) const ACQUIRE_SQL: &str = "WITH acquired AS (
    INSERT INTO leader_lease AS l (model_uuid, holder, epoch, expires_at)
    VALUES ($1, $2, COALESCE((SELECT max(epoch) FROM lease_epochs WHERE model_uuid = $1), 0) + 1,
            now() + $3::bigint * interval '1 millisecond')
    ON CONFLICT (model_uuid) DO UPDATE
        SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at < now()
    RETURNING model_uuid, holder, epoch)
    INSERT INTO lease_epochs AS e (model_uuid, epoch, holder, acquired_seq)
    SELECT model_uuid, epoch, holder, nextval('fence_seq') FROM acquired
    ON CONFLICT (model_uuid, epoch) DO UPDATE
        SET holder = EXCLUDED.holder, acquired_seq = EXCLUDED.acquired_seq, acquired_at = now()
    RETURNING epoch";

/// Renew by the holder at its epoch, before expiry: `$1` model, `$2` holder, `$3` epoch,
/// `$4` the lease in milliseconds.
pub(crate) const RENEW_SQL: &str = "UPDATE leader_lease SET expires_at = now() + $4::bigint * interval '1 millisecond'
    WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()";

/// Release (expire now, keep the epoch): `$1` model, `$2` holder, `$3` epoch.
pub(crate) const RELEASE_SQL: &str = "UPDATE leader_lease SET expires_at = now()
    WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()";

/// The fence a leader's write checks first, in the same transaction: one row while `$2` at
/// epoch `$3` holds an unexpired lease on model `$1`, none otherwise (the write is refused).
#[cfg(test)]
pub(crate) const FENCE_SQL: &str = "SELECT epoch FROM leader_lease
    WHERE model_uuid = $1 AND holder = $2 AND epoch = $3 AND expires_at > now() FOR SHARE";

/// Who holds the lease.
const CURRENT_SQL: &str = "SELECT holder, epoch, expires_at > now() FROM leader_lease WHERE model_uuid = $1";

/// Why the lease's SQL failed.
#[derive(Debug, Error)]
pub enum LeaseSqlError {
    /// The URL is not a PostgreSQL connection string.
    #[error("invalid PostgreSQL URL: {0}")]
    Url(#[source] Box<crate::service::pgtls::PgUrlError>),
    /// The database cannot be reached or refused the statement.
    #[error("lease: {0}")]
    Database(#[from] postgres::Error),
    /// No connection within the timeout (the server accepted and said nothing, or the
    /// connecting thread failed).
    #[error("lease: {0}")]
    Connect(#[source] crate::service::pgconnect::ConnectError),
    /// The lease's duration does not fit the database's arithmetic.
    #[error("lease: duration {0:?} is too long")]
    Duration(Duration),
}

impl LeaseSqlError {
    /// The server refused the statement (an SQL error: a missing table, a timeout, a lock not
    /// granted), the connection itself still usable; otherwise the connection failed.
    pub fn refused_by_server(&self) -> bool {
        matches!(self, LeaseSqlError::Database(e) if e.as_db_error().is_some())
    }
}

/// The lease's row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRow {
    /// The holder's replica id.
    pub holder: String,
    /// The epoch.
    pub epoch: i64,
    /// Whether it has not expired (on the database's clock).
    pub live: bool,
}

/// One replica's lease on one model, over a connection of its own: [`PgLeases`] for that one
/// model, in the connection's own `search_path`.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct PgLease {
    leases: PgLeases,
    key: LeaseKey,
}

fn millis(d: Duration) -> Result<i64, LeaseSqlError> {
    i64::try_from(d.as_millis()).map_err(|_| LeaseSqlError::Duration(d))
}

/// The lease connection's configuration: `timeout` bounds the connection, every statement
/// (`statement_timeout`) and unacknowledged sends (`tcp_user_timeout`).
pub(crate) fn lease_config(
    url: &str,
    timeout: Duration,
) -> Result<(postgres::Config, crate::service::pgtls::PgTls), LeaseSqlError> {
    let (config, tls) = crate::service::pgtls::parse(url).map_err(|e| LeaseSqlError::Url(Box::new(e)))?;
    let mut config = postgres::Config::from(config);
    let ms = millis(timeout)?.max(1);
    // The epoch must never be handed out twice: every lease commit is flushed before it
    // answers, whatever the server's default (a lost acquisition would reuse its epoch).
    let ours = format!("-c statement_timeout={ms} -c lock_timeout={ms} -c synchronous_commit=on");
    // The URL's own options are kept (a model's `search_path`: its lease is in its schema).
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {ours}"),
        _ => ours,
    };
    config
        .connect_timeout(timeout)
        .tcp_user_timeout(timeout)
        .keepalives_idle(timeout.max(Duration::from_secs(1)))
        .options(&options)
        .application_name("provisioner-lease");
    Ok((config, tls))
}

#[cfg(test)]
impl PgLease {
    /// Connects and makes sure the table is there. The connection commits synchronously. `timeout` bounds the connection, every
    /// statement (`statement_timeout`) and unacknowledged sends (`tcp_user_timeout`), so that a
    /// database cut off answers an error rather than hang for ever.
    #[cfg(test)]
    pub(crate) fn connect(url: &str, timeout: Duration, model_uuid: &str, holder: &str) -> Result<Self, LeaseSqlError> {
        let mut connector = crate::service::pgconnect::Connector::new_with(lease_config(url, timeout)?);
        Self::connect_with(&mut connector, timeout, model_uuid, holder)
    }

    /// Connects through `connector` (start-up included within `timeout`, see
    /// [`Connector`](crate::service::pgconnect::Connector)) and makes sure the tables are there.
    #[cfg(test)]
    pub(crate) fn connect_with(
        connector: &mut crate::service::pgconnect::Connector,
        timeout: Duration,
        model_uuid: &str,
        holder: &str,
    ) -> Result<Self, LeaseSqlError> {
        let mut leases = PgLeases::connect_with(connector, timeout, holder)?;
        let key = LeaseKey { model_uuid: model_uuid.to_owned(), schema: None };
        leases.prepare(&key)?;
        Ok(Self { leases, key })
    }

    /// Tries to take the lease for `lease`: [`Answer::Acquired`] with the new epoch, or
    /// [`Answer::HeldBy`] whoever holds it unexpired.
    #[cfg(test)]
    pub(crate) fn acquire(&mut self, lease: Duration) -> Result<Answer, LeaseSqlError> {
        self.leases.acquire(&self.key, lease)
    }

    /// Renews the lease held at `epoch` for `lease`: [`Answer::Renewed`] or [`Answer::Refused`].
    #[cfg(test)]
    pub(crate) fn renew(&mut self, epoch: i64, lease: Duration) -> Result<Answer, LeaseSqlError> {
        self.leases.in_schema(&self.key, |tx, model, holder| renew_on(tx, model, holder, epoch, lease))
    }

    /// Releases the lease held at `epoch` (a lease no longer ours is left alone).
    #[cfg(test)]
    pub(crate) fn release(&mut self, epoch: i64) -> Result<Answer, LeaseSqlError> {
        self.leases.release(&self.key, epoch)
    }

    /// The lease's row, if any.
    #[cfg(test)]
    pub(crate) fn current(&mut self) -> Result<Option<LeaseRow>, LeaseSqlError> {
        self.leases.in_schema(&self.key, |tx, model, _| current_on(tx, model))
    }

    /// Whether `holder` at `epoch` may write now: [`FENCE_SQL`] in a transaction of its own
    /// (a store runs the same statement first in each fenced write's transaction).
    #[cfg(test)]
    pub(crate) fn fence_holds(&mut self, holder: &str, epoch: i64) -> Result<bool, LeaseSqlError> {
        self.leases
            .in_schema(&self.key, |tx, model, _| Ok(tx.query_opt(FENCE_SQL, &[&model, &holder, &epoch])?.is_some()))
    }
}

fn acquire_on(c: &mut impl GenericClient, model: &str, holder: &str, lease: Duration) -> Result<Answer, LeaseSqlError> {
    let ms = millis(lease)?;
    if let Some(row) = c.query_opt(ACQUIRE_SQL, &[&model, &holder, &ms])? {
        return Ok(Answer::Acquired { epoch: row.get(0) });
    }
    Ok(match current_on(c, model)? {
        Some(LeaseRow { holder, epoch, .. }) => Answer::HeldBy { holder, epoch },
        // Deleted in between (by hand): nothing known, the next attempt inserts it.
        None => Answer::Failed("the lease row vanished".to_owned()),
    })
}

fn renew_on(
    c: &mut impl GenericClient,
    model: &str,
    holder: &str,
    epoch: i64,
    lease: Duration,
) -> Result<Answer, LeaseSqlError> {
    let ms = millis(lease)?;
    let n = c.execute(RENEW_SQL, &[&model, &holder, &epoch, &ms])?;
    Ok(if n == 1 { Answer::Renewed } else { Answer::Refused })
}

fn release_on(c: &mut impl GenericClient, model: &str, holder: &str, epoch: i64) -> Result<Answer, LeaseSqlError> {
    c.execute(RELEASE_SQL, &[&model, &holder, &epoch])?;
    Ok(Answer::Released)
}

fn current_on(c: &mut impl GenericClient, model: &str) -> Result<Option<LeaseRow>, LeaseSqlError> {
    let row = c.query_opt(CURRENT_SQL, &[&model])?;
    Ok(row.map(|r| LeaseRow { holder: r.get(0), epoch: r.get(1), live: r.get(2) }))
}

/// Which lease: a model's uuid, and the schema its tables are in (`None`: the connection's
/// own `search_path`, e.g. `default`'s `public`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LeaseKey {
    /// The model's uuid (the lease row's key).
    pub model_uuid: String,
    /// The schema of the model's tables: a checked model schema name or `public`.
    pub schema: Option<String>,
}

/// Every model's lease of one replica over ONE connection (the replica's lease thread): each
/// step runs in a transaction of its own with the model's schema as its `search_path`, and
/// renewals that were asked together commit together (one transaction, a savepoint each, one
/// flush to disk for them all).
pub(crate) struct PgLeases {
    client: Client,
    holder: String,
    /// The schemas whose lease tables this connection has made sure of.
    ready: std::collections::BTreeSet<Option<String>>,
}

impl std::fmt::Debug for PgLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeases").field("holder", &self.holder).field("ready", &self.ready).finish()
    }
}

/// Sets the transaction's `search_path` to the key's schema, or back to the connection's own
/// (for the rest of the transaction: a renewal of another model in the same one sets it anew).
fn enter(tx: &mut Transaction<'_>, key: &LeaseKey) -> Result<(), LeaseSqlError> {
    match &key.schema {
        Some(schema) => {
            let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
            tx.execute("SELECT set_config('search_path', $1, true)", &[&quoted])?;
        }
        None => tx.batch_execute("SET LOCAL search_path TO DEFAULT")?,
    }
    Ok(())
}

impl PgLeases {
    /// Connects through `connector` ([`PgLease::config`]'s settings: every statement bounded,
    /// every commit flushed) as replica `holder`.
    pub(crate) fn connect_with(
        connector: &mut crate::service::pgconnect::Connector,
        timeout: Duration,
        holder: &str,
    ) -> Result<Self, LeaseSqlError> {
        let client = connector.connect(timeout).map_err(LeaseSqlError::Connect)?;
        Ok(Self { client, holder: holder.to_owned(), ready: Default::default() })
    }

    /// This replica's id.
    #[cfg(test)]
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// Makes sure the key's schema has the lease tables (once per schema and connection).
    fn prepare(&mut self, key: &LeaseKey) -> Result<(), LeaseSqlError> {
        if self.ready.contains(&key.schema) {
            return Ok(());
        }
        let mut tx = self.client.transaction()?;
        enter(&mut tx, key)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LEASE_TABLE_LOCK])?;
        tx.batch_execute(CREATE_TABLE_SQL)?;
        tx.batch_execute(crate::service::store::EPOCH_TABLES_SQL)?;
        tx.commit()?;
        self.ready.insert(key.schema.clone());
        Ok(())
    }

    /// [`PgLease::acquire`] for `key`.
    pub(crate) fn acquire(&mut self, key: &LeaseKey, lease: Duration) -> Result<Answer, LeaseSqlError> {
        self.in_schema(key, |tx, model, holder| acquire_on(tx, model, holder, lease))
    }

    /// [`PgLease::release`] for `key`.
    pub(crate) fn release(&mut self, key: &LeaseKey, epoch: i64) -> Result<Answer, LeaseSqlError> {
        self.in_schema(key, |tx, model, holder| release_on(tx, model, holder, epoch))
    }

    /// `step` in a transaction of its own with `key`'s schema as its `search_path`.
    fn in_schema<T>(
        &mut self,
        key: &LeaseKey,
        step: impl FnOnce(&mut Transaction<'_>, &str, &str) -> Result<T, LeaseSqlError>,
    ) -> Result<T, LeaseSqlError> {
        self.prepare(key)?;
        let mut tx = self.client.transaction()?;
        enter(&mut tx, key)?;
        let answer = step(&mut tx, &key.model_uuid, &self.holder)?;
        tx.commit()?;
        Ok(answer)
    }

    /// Renews every `(key, epoch)` for `lease`, all in one statement (one round trip, one
    /// commit: a replica leading a hundred models renews them all at once); each renewal's own
    /// answer. Should the server refuse that statement (a model's schema dropped, say), they are
    /// renewed again one by one ([`PgLeases::renew_each`]), so that one model's failure fails
    /// it alone. `Err`: the connection failed, and no renewal is known to have taken effect.
    pub(crate) fn renew_all(
        &mut self,
        leases: &[(LeaseKey, i64)],
        lease: Duration,
    ) -> Result<Vec<Result<Answer, LeaseSqlError>>, LeaseSqlError> {
        if leases.is_empty() || !leases.iter().all(|(k, _)| self.ready.contains(&k.schema)) {
            return self.renew_each(leases, lease);
        }
        match self.renew_in_one(leases, lease) {
            Ok(answers) => Ok(answers.into_iter().map(Ok).collect()),
            Err(e) if e.refused_by_server() => self.renew_each(leases, lease),
            Err(e) => Err(e),
        }
    }

    /// [`RENEW_SQL`] for every lease, as the data-modifying parts of one statement (each on its
    /// model's table, schema-qualified; `default`'s on the connection's own `search_path`).
    fn renew_in_one(&mut self, leases: &[(LeaseKey, i64)], lease: Duration) -> Result<Vec<Answer>, LeaseSqlError> {
        use std::fmt::Write;
        let ms = millis(lease)?;
        let mut sql = String::with_capacity(leases.len() * 220);
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&ms, &self.holder];
        for (i, (key, epoch)) in leases.iter().enumerate() {
            let table = match &key.schema {
                Some(s) => format!("\"{}\".leader_lease", s.replace('"', "\"\"")),
                None => "leader_lease".to_owned(),
            };
            let _ = write!(
                sql,
                "{}r{i} AS (UPDATE {table} SET expires_at = now() + $1::bigint * interval '1 millisecond' \
                 WHERE model_uuid = ${} AND holder = $2 AND epoch = ${} AND expires_at > now() RETURNING 1)",
                if i == 0 { "WITH " } else { ", " },
                3 + 2 * i,
                4 + 2 * i
            );
            params.push(&key.model_uuid);
            params.push(epoch);
        }
        for i in 0..leases.len() {
            let _ = write!(sql, "{}(SELECT count(*) FROM r{i})", if i == 0 { " SELECT " } else { ", " });
        }
        let row = self.client.query_one(sql.as_str(), &params)?;
        Ok((0..leases.len())
            .map(|i| if row.get::<_, i64>(i) == 1 { Answer::Renewed } else { Answer::Refused })
            .collect())
    }

    /// Renews every `(key, epoch)` for `lease` in one transaction, a savepoint each: each
    /// renewal's own answer (one that failed on its own, e.g. a model's schema dropped, is an
    /// error for that one only), all of them known only once the transaction committed. `Err`:
    /// the transaction or its commit failed, and no renewal is known to have taken effect.
    pub(crate) fn renew_each(
        &mut self,
        leases: &[(LeaseKey, i64)],
        lease: Duration,
    ) -> Result<Vec<Result<Answer, LeaseSqlError>>, LeaseSqlError> {
        let mut answers = Vec::with_capacity(leases.len());
        let mut todo = Vec::with_capacity(leases.len());
        for (i, (key, _)) in leases.iter().enumerate() {
            match self.prepare(key) {
                Ok(()) => todo.push(i),
                Err(e) if e.refused_by_server() => answers.push((i, Err(e))),
                Err(e) => return Err(e),
            }
        }
        let mut tx = self.client.transaction()?;
        for i in todo {
            let (key, epoch) = &leases[i];
            let mut sp = tx.savepoint("renewal")?;
            let answer =
                enter(&mut sp, key).and_then(|()| renew_on(&mut sp, &key.model_uuid, &self.holder, *epoch, lease));
            match answer {
                Ok(a) => {
                    sp.commit()?;
                    answers.push((i, Ok(a)));
                }
                // A statement the server refused: that renewal only (the savepoint rolls back).
                Err(e) if e.refused_by_server() => {
                    sp.rollback()?;
                    answers.push((i, Err(e)));
                }
                Err(e) => return Err(e),
            }
        }
        tx.commit()?;
        answers.sort_by_key(|(i, _)| *i);
        Ok(answers.into_iter().map(|(_, a)| a).collect())
    }
}

/// What the epochs' record says (see [`audit_epochs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochAudit {
    /// Every acquisition, in epoch order: `(epoch, holder)`.
    pub acquisitions: Vec<(i64, String)>,
    /// Fenced writes recorded, over every epoch.
    pub writes: i64,
    /// Writes that committed under a stale epoch: an epoch's write whose sequence value is above
    /// a later epoch's acquisition, or a write by another holder than the epoch's. Empty when
    /// fencing held.
    pub stale: Vec<StaleWrite>,
}

/// A write the fence should have refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// The epoch the write was made under.
    pub epoch: i64,
    /// Who wrote.
    pub holder: String,
    /// The newer epoch acquired before the write (or the epoch itself, held by someone else).
    pub superseded_by: i64,
}

/// Reads the epochs' record of model `model_uuid`: every acquisition, the writes, and any write
/// committed under a stale epoch (what fencing must make impossible).
pub fn audit_epochs(client: &mut Client, model_uuid: &str) -> Result<EpochAudit, LeaseSqlError> {
    let acquisitions = client
        .query("SELECT epoch, holder FROM lease_epochs WHERE model_uuid = $1 ORDER BY epoch", &[&model_uuid])?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let writes: i64 = client
        .query_one("SELECT COALESCE(sum(writes), 0)::bigint FROM epoch_writes WHERE model_uuid = $1", &[&model_uuid])?
        .get(0);
    let stale = client
        .query(
            "SELECT w.epoch, w.holder, e.epoch FROM epoch_writes w JOIN lease_epochs e ON e.model_uuid = w.model_uuid
             WHERE w.model_uuid = $1
               AND ((e.epoch > w.epoch AND e.acquired_seq < w.last_seq) OR (e.epoch = w.epoch AND e.holder <> w.holder))
             ORDER BY w.epoch, e.epoch",
            &[&model_uuid],
        )?
        .iter()
        .map(|r| StaleWrite { epoch: r.get(0), holder: r.get(1), superseded_by: r.get(2) })
        .collect();
    Ok(EpochAudit { acquisitions, writes, stale })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempPostgres;

    const MODEL: &str = "9f1c2e3a-0000-4000-8000-000000000001";
    const LEASE: Duration = Duration::from_secs(10);
    const TIMEOUT: Duration = Duration::from_secs(10);

    fn lease(pg: &TempPostgres, holder: &str) -> PgLease {
        PgLease::connect(pg.url(), TIMEOUT, MODEL, holder).unwrap()
    }

    /// Makes the lease expire as if its time had passed (on the database's clock).
    fn expire(pg: &TempPostgres) {
        let mut c = Client::connect(pg.url(), postgres::NoTls).unwrap();
        c.execute("UPDATE leader_lease SET expires_at = now() - interval '1 second' WHERE model_uuid = $1", &[&MODEL])
            .unwrap();
    }

    /// A cluster of the test's own, stopped at the end.
    fn with_pg(name: &str, f: impl FnOnce(&TempPostgres)) {
        let pg = TempPostgres::start(name).unwrap();
        f(&pg);
    }

    #[test]
    fn lease_sql_on_a_real_postgres() {
        with_pg("lease-sql", |pg| {
            // Two contenders at once: exactly one wins, at epoch 1.
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
            let threads: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|h| {
                    let (url, barrier) = (pg.url().to_owned(), barrier.clone());
                    std::thread::spawn(move || {
                        let l = PgLease::connect(&url, TIMEOUT, MODEL, h);
                        barrier.wait();
                        (h, l.unwrap().acquire(LEASE).unwrap())
                    })
                })
                .collect();
            let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let winners: Vec<_> = answers.iter().filter(|(_, a)| matches!(a, Answer::Acquired { .. })).collect();
            assert_eq!(winners.len(), 1, "{answers:?}");
            let (winner, _) = winners[0];
            let loser = if *winner == "a" { "b" } else { "a" };
            assert!(answers.contains(&(*winner, Answer::Acquired { epoch: 1 })), "{answers:?}");
            assert!(
                answers.contains(&(loser, Answer::HeldBy { holder: winner.to_string(), epoch: 1 })),
                "the loser learns who holds it: {answers:?}"
            );

            let (mut w, mut l) = (lease(pg, winner), lease(pg, loser));
            // The holder renews; the loser cannot renew, whatever epoch it names, nor take it.
            assert_eq!(w.renew(1, LEASE).unwrap(), Answer::Renewed);
            assert_eq!(l.renew(1, LEASE).unwrap(), Answer::Refused);
            assert_eq!(l.renew(2, LEASE).unwrap(), Answer::Refused);
            assert_eq!(l.acquire(LEASE).unwrap(), Answer::HeldBy { holder: winner.to_string(), epoch: 1 });
            assert_eq!(w.renew(2, LEASE).unwrap(), Answer::Refused, "a renewal at another epoch is refused");
            // The fence holds for the holder at its epoch only.
            assert!(w.fence_holds(winner, 1).unwrap());
            assert!(!w.fence_holds(loser, 1).unwrap());
            assert!(!w.fence_holds(winner, 0).unwrap());

            // A release lets the other in at once, at epoch + 1.
            assert_eq!(w.release(1).unwrap(), Answer::Released);
            assert_eq!(w.current().unwrap().map(|r| (r.epoch, r.live)), Some((1, false)), "the epoch is kept");
            assert!(!w.fence_holds(winner, 1).unwrap(), "a released lease fences its old holder out");
            assert_eq!(l.acquire(LEASE).unwrap(), Answer::Acquired { epoch: 2 });
            assert_eq!(w.renew(1, LEASE).unwrap(), Answer::Refused, "the old holder cannot renew");
            assert_eq!(w.release(1).unwrap(), Answer::Released, "nor release the new holder's lease");
            assert_eq!(
                w.current().unwrap(),
                Some(LeaseRow { holder: loser.to_string(), epoch: 2, live: true }),
                "the stale release left the new lease alone"
            );

            // An expired lease is taken by the next contender with epoch + 1, and the holder
            // whose lease expired can neither renew it nor pass the fence.
            expire(pg);
            assert!(!l.fence_holds(loser, 2).unwrap(), "an expired lease fences its holder out");
            assert_eq!(l.renew(2, LEASE).unwrap(), Answer::Refused, "an expired lease is not renewed");
            assert_eq!(w.acquire(LEASE).unwrap(), Answer::Acquired { epoch: 3 });
            assert!(w.fence_holds(winner, 3).unwrap());
            assert!(!w.fence_holds(loser, 2).unwrap(), "the old epoch stays fenced out");

            // The lease is keyed by the model: another model's lease is independent.
            let mut other = PgLease::connect(pg.url(), TIMEOUT, "another-model", loser).unwrap();
            assert_eq!(other.acquire(LEASE).unwrap(), Answer::Acquired { epoch: 1 });
            assert_eq!(w.current().unwrap().map(|r| r.epoch), Some(3));
        });
    }

    #[test]
    fn renewals_of_many_models_commit_together_and_one_failing_loses_no_other() {
        with_pg("lease-many", |pg| {
            let mut c = Client::connect(pg.url(), postgres::NoTls).unwrap();
            c.batch_execute("CREATE SCHEMA model_x; CREATE SCHEMA model_y;").unwrap();
            let key = |schema: &str, uuid: &str| LeaseKey { model_uuid: uuid.into(), schema: Some(schema.into()) };
            let (x, y) = (key("model_x", "ux"), key("model_y", "uy"));
            let mut connector =
                crate::service::pgconnect::Connector::new_with(lease_config(pg.url(), TIMEOUT).unwrap());
            let mut l = PgLeases::connect_with(&mut connector, TIMEOUT, "a").unwrap();
            assert_eq!(l.holder(), "a");
            assert_eq!(l.acquire(&x, LEASE).unwrap(), Answer::Acquired { epoch: 1 });
            assert_eq!(l.acquire(&y, LEASE).unwrap(), Answer::Acquired { epoch: 1 });
            // Each model's lease is in its own schema.
            let holder = |c: &mut Client, schema: &str| -> Vec<(String, i64)> {
                c.query(&format!("SELECT model_uuid, epoch FROM {schema}.leader_lease"), &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect()
            };
            assert_eq!(holder(&mut c, "model_x"), vec![("ux".to_owned(), 1)]);
            assert_eq!(holder(&mut c, "model_y"), vec![("uy".to_owned(), 1)]);
            // A model in the connection's own schema (`default`'s `public`).
            let public = LeaseKey { model_uuid: "up".into(), schema: None };
            assert_eq!(l.acquire(&public, LEASE).unwrap(), Answer::Acquired { epoch: 1 });
            assert_eq!(holder(&mut c, "public"), vec![("up".to_owned(), 1)]);
            // Renewed together, whatever the schemas' order; a stale epoch is refused without
            // disturbing the others.
            let answers = l.renew_all(&[(x.clone(), 1), (public.clone(), 1), (y.clone(), 7)], LEASE).unwrap();
            assert_eq!(
                answers.into_iter().map(|a| a.unwrap()).collect::<Vec<_>>(),
                vec![Answer::Renewed, Answer::Renewed, Answer::Refused]
            );
            // That was one statement (no fall-back to one renewal at a time).
            assert_eq!(
                l.renew_in_one(&[(x.clone(), 1), (public.clone(), 1), (y.clone(), 7)], LEASE).unwrap(),
                vec![Answer::Renewed, Answer::Renewed, Answer::Refused]
            );
            // A model's schema dropped: its renewal fails alone, the other's commits.
            c.batch_execute("DROP SCHEMA model_y CASCADE").unwrap();
            c.execute("UPDATE model_x.leader_lease SET expires_at = now() + interval '1 second'", &[]).unwrap();
            let answers = l.renew_all(&[(y.clone(), 1), (x.clone(), 1)], LEASE).unwrap();
            assert!(answers[0].as_ref().is_err_and(|e| e.refused_by_server()), "{:?}", answers[0]);
            assert_eq!(answers[1].as_ref().unwrap(), &Answer::Renewed);
            let left: f64 = c
                .query_one("SELECT extract(epoch FROM expires_at - now())::float8 FROM model_x.leader_lease", &[])
                .unwrap()
                .get(0);
            assert!(left > 5.0, "x's renewal committed: {left} s left");
            // Released in its schema; the next acquisition is at epoch + 1.
            assert_eq!(l.release(&x, 1).unwrap(), Answer::Released);
            assert_eq!(l.acquire(&x, LEASE).unwrap(), Answer::Acquired { epoch: 2 });
        });
    }

    #[test]
    fn a_bad_url_and_an_unreachable_database_are_errors() {
        let e = PgLease::connect("postgres://[::1", TIMEOUT, MODEL, "a").unwrap_err();
        assert!(matches!(e, LeaseSqlError::Url(_)), "{e:?}");
        // A free loopback port with nothing listening.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let e = PgLease::connect(&url, Duration::from_secs(2), MODEL, "a").unwrap_err();
        assert!(matches!(e, LeaseSqlError::Connect(crate::service::pgconnect::ConnectError::Postgres(_))), "{e:?}");
    }
}
