//! The service's error type: [`ServeError`], why `provisioner serve` could not start or run
//! (with the exit code the binary answers), and [`FileOp`], the file operations on the data
//! directory it names.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::service::store::StoreError;

/// Why the service could not start or run. [`ServeError::exit_code`] says how the binary exits.
#[derive(Debug, Error)]
pub enum ServeError {
    /// `--broker ec2` in a build without the EC2 broker (exit 2).
    #[error("this build has no EC2 broker: build with `--features serve,ec2`, or use --broker sim")]
    NoEc2Broker,
    /// `[sim] out_of_capacity` has an entry that is not `TYPE:ZONE` (exit 2).
    #[error("[sim] out_of_capacity: every entry must be TYPE:ZONE, e.g. \"m5.large:az1\"")]
    SimOutOfCapacity,
    /// The EC2 broker's settings are incomplete or wrong (exit 2).
    #[cfg(feature = "ec2")]
    #[error("{0}")]
    Ec2Settings(#[source] crate::adapters::ec2::Ec2ConfigError),
    /// The EC2 broker cannot list its availability zones (exit 1).
    #[cfg(feature = "ec2")]
    #[error("EC2: cannot list availability zones: {0}")]
    Ec2Zones(#[source] crate::ports::BrokerError),
    /// The LXD broker's settings are incomplete or wrong, or the daemon refuses them (exit 2):
    /// one sentence naming the setting.
    #[error("{0}")]
    LxdSettings(#[source] crate::adapters::lxd::LxdConfigError),
    /// The LXD broker cannot list its zones (exit 1).
    #[error("LXD: cannot list the cluster's members (its zones): {0}")]
    LxdZones(#[source] crate::ports::BrokerError),
    /// `--init` on a data directory that holds a model's database (exit 2).
    #[error(
        "--init creates a new model only in a data directory without one, and {} already holds model database {}; \
         to start over, stop the service and move provisioner.db, provisioner.db-wal and provisioner.db-shm aside first",
        dir.display(),
        db.display()
    )]
    InitOverModel {
        /// The data directory.
        dir: PathBuf,
        /// Its database.
        db: PathBuf,
    },
    /// The data directory cannot be used as it is (exit 1): a model it held is lost, or its
    /// token file is empty.
    #[error("cannot use data directory {path}: {message}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why, and what to do.
        message: String,
    },
    /// A file operation in the data directory failed (exit 1).
    #[error("cannot use data directory {path}: {}{source}", op.context(file))]
    DataDirIo {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        op: FileOp,
        /// To which file (the directory itself for [`FileOp::CreateDir`]).
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database failed (exit 1).
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The starts a previous run left in flight could not all be settled (exit 1): the
    /// provisioner does not run with a client token of the previous run unsettled.
    #[error("{0}; the provisioner does not run until it is: start the service again once the cloud answers")]
    Resume(#[from] crate::service::cloud::intents::ResumeError),
    /// The models directory cannot be read or written (exit 1).
    #[error("{0}")]
    Models(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// `--store` names a store this build cannot open (exit 2).
    #[error("--store: {0}")]
    StoreUrl(String),
    /// `--store postgres://...` in a build without PostgreSQL (exit 2).
    #[error("--store: this build has no PostgreSQL store: build with `--features postgres`, or use --store sqlite")]
    NoPostgres,
    /// The database is damaged: the service will not run on it (exit 1).
    #[error(
        "the database {path} is damaged, so the service will not run on it ({source}). Restore provisioner.db \
         (with its provisioner.db-wal, if any) from a backup; or, to give up this model (its instances in the \
         cloud will no longer be managed), move provisioner.db, provisioner.db-wal and provisioner.db-shm aside \
         and start with `serve --init` to create a new model"
    )]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// What the check found.
        #[source]
        source: StoreError,
    },
    /// The provisioner refused its configuration (exit 2).
    #[error("invalid provisioner configuration: {0}")]
    Provisioner(#[from] crate::config::ConfigError),
    /// The listen address cannot be bound (exit 1).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The audit log cannot be opened (exit 2): the message names the file.
    #[error("{0}")]
    Audit(#[source] crate::service::audit::AuditError),
    /// The TLS certificate or key cannot be used (exit 2); the message names the file.
    #[error("{0}")]
    Tls(#[source] crate::service::tls::TlsError),
    /// An actor of the service that should answer has stopped (exit 1).
    #[error("the service's {what} are not running: {source}")]
    Stopped {
        /// What stopped.
        what: &'static str,
        /// Why the message was not answered.
        #[source]
        source: actix::MailboxError,
    },
    /// Signals cannot be watched (exit 1).
    #[error("cannot watch {signal}: {source}")]
    Signals {
        /// `SIGTERM`, `SIGINT` or `Ctrl-C`.
        signal: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    /// 2 for bad usage or input, 1 for a failure at run time.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::NoEc2Broker
            | ServeError::InitOverModel { .. }
            | ServeError::Provisioner(_)
            | ServeError::StoreUrl(_)
            | ServeError::NoPostgres
            | ServeError::SimOutOfCapacity
            | ServeError::Tls(_)
            | ServeError::Audit(_)
            | ServeError::LxdSettings(_) => 2,
            #[cfg(feature = "ec2")]
            ServeError::Ec2Settings(_) => 2,
            _ => 1,
        }
    }
}

/// A file operation on the data directory, as [`ServeError::DataDirIo`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    /// Creating the directory.
    CreateDir,
    /// Reading a file.
    Read,
    /// Creating a file.
    Create,
    /// Writing a file.
    Write,
    /// Removing a file.
    Remove,
    /// Moving a file aside.
    MoveAside,
    /// Making a file private (0600).
    MakePrivate,
}

impl FileOp {
    /// What was being done to `file`, as the error's text says it before the cause.
    fn context(self, file: &Path) -> String {
        let f = file.display();
        match self {
            FileOp::CreateDir => String::new(),
            FileOp::Read => format!("cannot read {f}: "),
            FileOp::Create => format!("cannot create {f}: "),
            FileOp::Write => format!("cannot write {f}: "),
            FileOp::Remove => format!("cannot remove {f}: "),
            FileOp::MoveAside => format!("cannot move {f} aside: "),
            FileOp::MakePrivate => format!("cannot make {f} private: "),
        }
    }
}

/// The service cannot use the data directory `path` as it is, for `message`.
pub(crate) fn data_dir_error(path: &Path, message: String) -> ServeError {
    ServeError::DataDir { path: path.to_owned(), message }
}

/// The error of `op` on `file` in the data directory `path`.
pub(crate) fn data_dir_io(path: &Path, op: FileOp, file: &Path) -> impl FnOnce(std::io::Error) -> ServeError {
    let (path, file) = (path.to_owned(), file.to_owned());
    move |source| ServeError::DataDirIo { path, op, file, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_store_is_reported_as_stopped() {
        let e = StoreError::Stopped(actix::MailboxError::Closed);
        assert_eq!(e.to_string(), "the store is not running: Mailbox has closed");
        assert!(std::error::Error::source(&e).is_some());
    }
}
