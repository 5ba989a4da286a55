//! What every model of one service shares ([`Shared`]): the service's settings, its API token,
//! audit log, own store, metrics, event-stream gate, cloud accounts and, with replicas, the
//! replica's id and links.

use std::sync::Arc;

use actix_rt::time::Instant;

use crate::service::settings::ServeSettings;
use crate::service::store::Store;

/// What every model of the service shares.
pub(crate) struct Shared {
    /// The service's settings (each model's are these with its cloud applied:
    /// `host::model_settings`).
    pub opts: ServeSettings,
    /// The admin token (empty when this replica knows only its hash).
    pub token: String,
    /// The admin token's hash, when this replica does not hold the token.
    pub token_sha256: Option<String>,
    /// The audit log.
    pub audit: Arc<crate::service::audit::AuditLog>,
    /// When the service started.
    pub started: Instant,
    /// The store of the service's own records (the API tokens): `default`'s, kept open even
    /// when that model is destroyed (`/healthz` and `/readyz` read it).
    pub service_store: Store,
    /// The service's metrics (`/metrics`): the HTTP requests of every model, and `default`'s
    /// families while it runs (its model metrics are these); kept when `default` is destroyed.
    pub metrics: actix::Addr<crate::service::metrics::Metrics>,
    /// The gate of every model's event streams (their caps; a revoked token's streams ended).
    pub streams: actix::Addr<crate::service::events::StreamGate>,
    /// The cloud accounts in use, whose limits their models share.
    pub accounts: actix::Addr<super::accounts::Accounts>,
    /// This replica's id (replicas on PostgreSQL): `--replica-id`, or a random one for the
    /// process, the same for every model's lease.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub replica_id: String,
    /// How many models' leases this replica holds now (`/v1/status`'s `models_led`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub models_led: Arc<std::sync::atomic::AtomicUsize>,
    /// On PostgreSQL: the lease thread, listener and lease arbiter the models share.
    #[cfg(feature = "postgres")]
    pub replica_links: Option<ReplicaLinks>,
}

/// What a replica's models share on PostgreSQL: one lease thread and connection
/// ([`LeaseSql`](crate::service::lease::sql::LeaseSql)), one listener
/// ([`NoticeHub`](crate::service::lease::listen::NoticeHub)), and one arbiter that only the
/// lease actors run on, so that no model's work delays a renewal.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub(crate) struct ReplicaLinks {
    pub(super) sql: crate::service::lease::sql::LeaseSql,
    pub(super) notices: actix::Addr<crate::service::lease::listen::NoticeHub>,
    pub(super) arbiter: actix_rt::ArbiterHandle,
    /// The beat every model's lease ticks on (their renewals go to `sql` together).
    pub(super) beat: tokio::time::Instant,
}

#[cfg(feature = "postgres")]
impl ReplicaLinks {
    /// Starts them for replica `replica` on the service's database at `url` (the service's
    /// own URL: a model's schema is set per lease step).
    pub(crate) fn start(
        url: &str,
        replica: &str,
        timings: crate::service::lease::LeaseTimings,
    ) -> Result<Self, crate::service::error::ServeError> {
        let sql = crate::service::lease::sql::LeaseSql::start(
            url.to_owned(),
            replica.to_owned(),
            timings.retry(),
            timings.lease(),
        )
        .map_err(|e| crate::service::error::ServeError::StoreUrl(format!("cannot start the lease thread: {e}")))?;
        let notices = crate::service::lease::listen::NoticeHub::start_listening(url.to_owned(), timings.retry())
            .map_err(|e| crate::service::error::ServeError::StoreUrl(format!("cannot start the LISTEN thread: {e}")))?;
        let arbiter = actix_rt::Arbiter::new().handle();
        Ok(Self { sql, notices, arbiter, beat: tokio::time::Instant::now() })
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for ReplicaLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaLinks").finish_non_exhaustive()
    }
}
