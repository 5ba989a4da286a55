//! The store's errors, shared by both backends: [`StoreError`] (every variant says what was
//! being done) and [`PgFailure`], a PostgreSQL failure as the store keeps it.

use thiserror::Error;

use crate::model::MachineId;

/// What went wrong in the store. Every variant says what was being done.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error while {context}: {source}")]
    Sqlite {
        /// What the store was doing.
        context: &'static str,
        /// SQLite's error (shared: a store that failed to open answers it to every request).
        #[source]
        source: std::sync::Arc<rusqlite::Error>,
    },
    /// The database was written by a newer build.
    #[error("the database has schema version {found}, newer than this build's {supported}; upgrade the binary")]
    TooNew {
        /// The version found.
        found: i64,
        /// The newest version this build knows (the backend's).
        supported: i64,
    },
    /// PostgreSQL failed (or could not be reached).
    #[error("database error while {context}: {source}")]
    Postgres {
        /// What the store was doing.
        context: &'static str,
        /// What the server or the connection said.
        #[source]
        source: PgFailure,
    },
    /// The database cannot be reached now (the store reconnects with backoff): nothing was
    /// read or written.
    #[error("the database is unreachable: {0}")]
    Unavailable(String),
    /// A provisioner write under a fence that no longer holds: the lease this replica acts on
    /// has another holder, a newer epoch, or has expired. Nothing was written.
    #[error("fenced: the leader lease of model {model_uuid} is no longer held by {holder} at epoch {epoch}")]
    Fenced {
        /// The lease's model.
        model_uuid: String,
        /// The holder the write was made for.
        holder: String,
        /// The epoch the write was made under.
        epoch: i64,
    },
    /// No such machine (or it was removed).
    #[error("machine {0} not found")]
    NotFound(MachineId),
    /// The model is dying: it refuses new machines and changes.
    #[error("the model is dying")]
    ModelDying,
    /// A request the model's state forbids, with the reason.
    #[error("{0}")]
    Refused(String),
    /// A request field names something the model does not allow (a container's host that
    /// does not exist or is not alive, a manual machine's address already registered): bad
    /// input, refused before anything is written.
    #[error("field {field:?}: {message}")]
    Invalid {
        /// The request's field.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// Another process holds the database (another service on the same data directory).
    #[error(
        "the database is in use by another process (is another provisioner service running on this data directory?)"
    )]
    InUse,
    /// No such application.
    #[error("application {0:?} not found")]
    NoApplication(String),
    /// No created API token has this id.
    #[error("API token {0:?} not found (see `provisioner token list`)")]
    NoToken(String),
    /// The store stopped: its actor no longer takes messages.
    #[error("the store is not running: {0}")]
    Stopped(#[source] actix::MailboxError),
    /// The database file is damaged (SQLite found a corrupt page, or it is not a database).
    #[error("the database is damaged ({context}: {message})")]
    Damaged {
        /// What the store was doing.
        context: &'static str,
        /// What SQLite found.
        message: String,
    },
}

impl StoreError {
    pub(super) fn sql(context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                StoreError::Damaged { context, message: e.to_string() }
            }
            _ => StoreError::Sqlite { context, source: std::sync::Arc::new(e) },
        }
    }
}

/// A PostgreSQL failure as the store keeps it (comparable and cloneable, like every
/// [`StoreError`]): its SQLSTATE code if the server sent one, and the client's message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct PgFailure {
    /// The SQLSTATE code (`40001`, `57P01`, ...), if the server answered.
    pub code: Option<String>,
    /// The message.
    pub message: String,
    /// The connection is gone (closed, reset, refused): the store reconnects.
    pub connection_lost: bool,
}

impl PgFailure {
    /// The server gave the statement up at its deadline (`statement_timeout`: `57014`,
    /// `lock_timeout`: `55P03`): the database could not answer in time (a 503, not a fault of
    /// the request).
    pub fn timed_out(&self) -> bool {
        matches!(self.code.as_deref(), Some("57014" | "55P03"))
    }
}
