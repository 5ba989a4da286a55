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
        Ok(Self { client, replica: replica.to_owned() })
    }

    /// Heartbeats for `lease`, then reads the live replicas and every model's lease row.
    pub(crate) fn view(&mut self, lease: Duration, models: &[ModelLease]) -> Result<MembersView, LeaseSqlError> {
        let ms = i64::try_from(lease.as_millis()).map_err(|_| LeaseSqlError::Duration(lease))?;
        self.client.execute(HEARTBEAT_SQL, &[&self.replica, &ms])?;
        let live = self.client.query(LIVE_SQL, &[])?.iter().map(|r| r.get(0)).collect();
        let mut leases = BTreeMap::new();
        for m in models {
            // The schema is a checked model name with `-` as `_` (or `public`): no quoting issue.
            let sql = format!(
                "SELECT holder, epoch, expires_at > now() FROM \"{}\".leader_lease WHERE model_uuid = $1",
                m.schema
            );
            let row = match self.client.query_opt(sql.as_str(), &[&m.uuid]) {
                Ok(row) => row.map(|r| LeaseRow { holder: r.get(0), epoch: r.get(1), live: r.get(2) }),
                // A model just added: its lease connection has not created the table yet.
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
                Err(e) => return Err(e.into()),
            };
            leases.insert(m.name.clone(), row);
        }
        Ok(MembersView { live, leases })
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
}
