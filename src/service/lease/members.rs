//! The replicas' membership and the view the spread of leaders is planned from (feature
//! `postgres`), on PostgreSQL's clock: each replica heartbeats one row of
//! `public.provisioner_replicas` (its id, `expires_at = now() + lease`) every lease retry; a
//! replica is live while its row has not expired. A replica that stops cleanly deletes its
//! row, so that the others stop counting it at once; one killed drops out when its row
//! expires, as its leases do.
//!
//! [`Members::view`] heartbeats and reads, in one round: the live replicas and each model's
//! lease row (in the model's schema), what [`super::share::plan`] decides from.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::Client;

use super::pg::{LeaseRow, LeaseSqlError};

/// The membership table (in `public`, beside the models directory).
pub(crate) const MEMBERS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS public.provisioner_replicas (
    replica TEXT PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
)";

/// The heartbeat: `$1` the replica, `$2` the lease in milliseconds.
const HEARTBEAT_SQL: &str = "INSERT INTO public.provisioner_replicas (replica, expires_at)
    VALUES ($1, now() + $2::bigint * interval '1 millisecond')
    ON CONFLICT (replica) DO UPDATE SET expires_at = EXCLUDED.expires_at";

/// The live replicas, in id order.
const LIVE_SQL: &str = "SELECT replica FROM public.provisioner_replicas WHERE expires_at > now() ORDER BY replica";

/// Which of the schemas `$1` have a lease table yet.
const TABLES_SQL: &str = "SELECT n.nspname FROM pg_catalog.pg_class c \
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
    WHERE c.relname = 'leader_lease' AND c.relkind IN ('r', 'p') AND n.nspname = ANY($1)";

/// The most models whose lease rows one statement of [`Members::view`] reads.
const VIEW_CHUNK: usize = 500;

/// The most statements of [`Members::view`] kept prepared (a round of 10,000 models is 20).
const MAX_PREPARED_VIEWS: usize = 64;

/// A clean stop: `$1` the replica.
const LEAVE_SQL: &str = "DELETE FROM public.provisioner_replicas WHERE replica = $1";

/// A model whose lease the view reads: its key in the plan (the model's name), its schema and
/// its uuid (the lease row's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelLease {
    /// The model's name.
    pub name: String,
    /// The PostgreSQL schema of its tables (`public` for `default`).
    pub schema: String,
    /// The model's uuid.
    pub uuid: String,
}

/// One round's reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MembersView {
    /// The live replicas (this one included: it has just heartbeaten).
    pub live: BTreeSet<String>,
    /// Each model's lease row, by name (`None`: never taken, or its table not created yet).
    pub leases: BTreeMap<String, Option<LeaseRow>>,
}

/// One replica's connection for its heartbeat and the round's reads.
pub(crate) struct Members {
    client: Client,
    replica: String,
    /// Statements sent by [`Members::view`] so far.
    statements: u64,
    /// The lease rows' statements prepared (by their text: the same models read the same way
    /// each round, so the server plans each once, not every round).
    prepared: std::collections::HashMap<String, postgres::Statement>,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members").field("replica", &self.replica).finish()
    }
}

impl Members {
    /// Connects (`timeout` bounds the connection and every statement, as the lease's does)
    /// and creates the table where missing.
    pub(crate) fn connect(url: &str, timeout: Duration, replica: &str) -> Result<Self, LeaseSqlError> {
        let mut connector = crate::service::pgconnect::Connector::new_with(super::pg::lease_config(url, timeout)?);
        let mut client = connector.connect(timeout).map_err(LeaseSqlError::Connect)?;
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&crate::service::store::MIGRATION_LOCK])?;
        tx.batch_execute(MEMBERS_TABLE_SQL)?;
        tx.commit()?;
        Ok(Self { client, replica: replica.to_owned(), statements: 0, prepared: Default::default() })
    }

    /// Heartbeats for `lease`, then reads the live replicas and every model's lease row: a
    /// bounded number of statements however many models there are (issue 36): the heartbeat,
    /// the live replicas, which schemas have a lease table yet, and the rows of those in one
    /// statement per [`VIEW_CHUNK`] models. Should one of those statements fail on a model
    /// whose schema went meanwhile (a model destroyed), its models are read one by one.
    pub(crate) fn view(&mut self, lease: Duration, models: &[ModelLease]) -> Result<MembersView, LeaseSqlError> {
        let ms = i64::try_from(lease.as_millis()).map_err(|_| LeaseSqlError::Duration(lease))?;
        self.statements += 3;
        self.client.execute(HEARTBEAT_SQL, &[&self.replica, &ms])?;
        let live = self.client.query(LIVE_SQL, &[])?.iter().map(|r| r.get(0)).collect();
        let schemas: Vec<&str> = models.iter().map(|m| m.schema.as_str()).collect();
        let with_table: BTreeSet<String> =
            self.client.query(TABLES_SQL, &[&schemas])?.iter().map(|r| r.get(0)).collect();
        let mut leases: BTreeMap<String, Option<LeaseRow>> = models.iter().map(|m| (m.name.clone(), None)).collect();
        let readable: Vec<&ModelLease> = models.iter().filter(|m| with_table.contains(&m.schema)).collect();
        for chunk in readable.chunks(VIEW_CHUNK) {
            let rows = match self.read_chunk(chunk) {
                Ok(rows) => rows,
                Err(e) if e.code().is_some() => {
                    let mut rows = Vec::new();
                    for m in chunk {
                        rows.extend(self.read_chunk(std::slice::from_ref(m)).or_else(|e| match e.code() {
                            Some(&SqlState::UNDEFINED_TABLE) | Some(&SqlState::INVALID_SCHEMA_NAME) => Ok(Vec::new()),
                            _ => Err(e),
                        })?);
                    }
                    rows
                }
                Err(e) => return Err(e.into()),
            };
            for (i, row) in rows {
                leases.insert(chunk[i].name.clone(), Some(row));
            }
        }
        Ok(MembersView { live, leases })
    }

    /// The lease rows of `chunk`'s models, in one statement: each found, by its place in `chunk`.
    fn read_chunk(&mut self, chunk: &[&ModelLease]) -> Result<Vec<(usize, LeaseRow)>, postgres::Error> {
        use std::fmt::Write;
        let mut sql = String::with_capacity(chunk.len() * 120);
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::with_capacity(chunk.len());
        for (i, m) in chunk.iter().enumerate() {
            // The schema is a checked model name with `-` as `_` (or `public`); quoted anyway.
            let _ = write!(
                sql,
                "{}SELECT {i}::int, holder, epoch, expires_at > now() FROM \"{}\".leader_lease WHERE model_uuid = ${}",
                if i == 0 { "" } else { " UNION ALL " },
                m.schema.replace('"', "\"\""),
                i + 1
            );
            params.push(&m.uuid);
        }
        self.statements += 1;
        let statement = match self.prepared.get(&sql) {
            Some(st) => st.clone(),
            None => {
                // The models changed: the texts of the rounds before are not asked again.
                if self.prepared.len() >= MAX_PREPARED_VIEWS {
                    self.prepared.clear();
                }
                let st = self.client.prepare(&sql)?;
                self.prepared.insert(sql, st.clone());
                st
            }
        };
        let rows = self.client.query(&statement, &params)?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as usize, LeaseRow { holder: r.get(1), epoch: r.get(2), live: r.get(3) }))
            .collect())
    }

    /// The statements [`Members::view`] sent so far.
    pub(crate) fn statements(&self) -> u64 {
        self.statements
    }

    /// A clean stop: this replica is no longer counted.
    pub(crate) fn leave(&mut self) -> Result<(), LeaseSqlError> {
        self.client.execute(LEAVE_SQL, &[&self.replica])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempPostgres;

    const LEASE: Duration = Duration::from_secs(10);
    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn heartbeats_make_replicas_live_a_leave_or_an_expiry_drops_them_and_leases_are_read_per_schema() {
        let pg = TempPostgres::start("lease-members").unwrap();
        let model = ModelLease { name: "default".into(), schema: "public".into(), uuid: "m-1".into() };
        let other = ModelLease { name: "team-a".into(), schema: "model_team_a".into(), uuid: "m-2".into() };
        let (mut a, mut b) =
            (Members::connect(pg.url(), TIMEOUT, "a").unwrap(), Members::connect(pg.url(), TIMEOUT, "b").unwrap());
        // No lease table yet anywhere: every model reads as never taken.
        let v = a.view(LEASE, &[model.clone(), other.clone()]).unwrap();
        assert_eq!(v.live, BTreeSet::from(["a".to_owned()]));
        assert_eq!(v.leases, BTreeMap::from([("default".to_owned(), None), ("team-a".to_owned(), None)]));

        // b takes default's lease; a sees it held, and both replicas live.
        let mut l = crate::service::lease::pg::PgLease::connect(pg.url(), TIMEOUT, "m-1", "b").unwrap();
        assert!(matches!(l.acquire(LEASE).unwrap(), super::super::state::Answer::Acquired { epoch: 1 }));
        b.view(LEASE, &[]).unwrap();
        let v = a.view(LEASE, &[model.clone(), other.clone()]).unwrap();
        assert_eq!(v.live, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        assert_eq!(v.leases["default"], Some(LeaseRow { holder: "b".into(), epoch: 1, live: true }));
        assert_eq!(v.leases["team-a"], None);

        // b leaves: a no longer counts it.
        b.leave().unwrap();
        let v = a.view(LEASE, std::slice::from_ref(&model)).unwrap();
        assert_eq!(v.live, BTreeSet::from(["a".to_owned()]));
        // b's heartbeat expires (on the database's clock): it drops out too.
        b.view(LEASE, &[]).unwrap();
        let mut c = Client::connect(pg.url(), postgres::NoTls).unwrap();
        c.execute(
            "UPDATE public.provisioner_replicas SET expires_at = now() - interval '1 second' WHERE replica = 'b'",
            &[],
        )
        .unwrap();
        let v = a.view(LEASE, &[model]).unwrap();
        assert_eq!(v.live, BTreeSet::from(["a".to_owned()]));
    }

    /// Issue 36: a round reads a thousand models' leases in a few statements (not one per
    /// model); a model without a lease table yet, or whose schema is gone, reads as never taken.
    #[test]
    fn a_view_of_a_thousand_models_takes_a_few_statements() {
        let pg = crate::testing::postgres::cluster();
        let url = crate::testing::postgres::fresh_db(&pg);
        let mut c = Client::connect(&url, postgres::NoTls).unwrap();
        let mut setup = String::new();
        let models: Vec<ModelLease> = (0..1000)
            .map(|i| ModelLease { name: format!("m{i}"), schema: format!("s{i}"), uuid: format!("u{i}") })
            .collect();
        for (i, m) in models.iter().enumerate().filter(|(i, _)| i % 10 != 3) {
            setup.push_str(&format!(
                "CREATE SCHEMA {s}; CREATE TABLE {s}.leader_lease (model_uuid TEXT PRIMARY KEY, holder TEXT NOT NULL, \
                 epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL);",
                s = m.schema
            ));
            if i % 7 == 0 {
                setup.push_str(&format!(
                    "INSERT INTO {}.leader_lease VALUES ('{}', 'b', {i}, now() + interval '1 minute');",
                    m.schema, m.uuid
                ));
            }
        }
        c.batch_execute(&setup).unwrap();
        let mut a = Members::connect(&url, TIMEOUT, "a").unwrap();
        let before = a.statements();
        let v = a.view(LEASE, &models).unwrap();
        let sent = a.statements() - before;
        assert!(sent <= 5, "{sent} statements for a view of 1,000 models");
        for (i, m) in models.iter().enumerate() {
            let want =
                (i % 10 != 3 && i % 7 == 0).then(|| LeaseRow { holder: "b".into(), epoch: i as i64, live: true });
            assert_eq!(v.leases[&m.name], want, "{}", m.name);
        }
    }
}
