//! [`HostError`]: why a model operation failed, with the HTTP status the API answers.

use thiserror::Error;

use super::directory::ModelsError;
use super::persist::PersistError;

/// Why a model operation failed, with the HTTP status the API answers.
#[derive(Debug, Error)]
pub(crate) enum HostError {
    /// Refused by the directory (bad name, exists, unknown, `default` without force).
    #[error("{0}")]
    Refused(#[from] ModelsError),
    /// The model is in the directory but does not run here (its store could not be opened).
    #[error("model {name:?} does not run: {why}")]
    NotRunning {
        /// The model.
        name: String,
        /// Why.
        why: String,
    },
    /// The directory could not be kept.
    #[error("{0}")]
    Persist(#[source] PersistError),
    /// The model's store or provisioners could not be started.
    #[error("cannot start model {name:?}: {source}")]
    Start {
        /// The model.
        name: String,
        /// Why.
        #[source]
        source: Box<crate::service::ServeError>,
    },
    /// The model host's actor did not answer (it stops only with the service).
    #[error("the model host is not running")]
    Stopped,
}

impl From<PersistError> for HostError {
    fn from(e: PersistError) -> Self {
        match e {
            PersistError::Refused(r) => HostError::Refused(r),
            other => HostError::Persist(other),
        }
    }
}

impl HostError {
    /// The HTTP status.
    pub(crate) fn status(&self) -> u16 {
        match self {
            HostError::Refused(r) => r.status(),
            HostError::NotRunning { .. } => 503,
            // Bad settings of the model's cloud (as `serve` would exit 2 for them).
            HostError::Start { source, .. } if source.exit_code() == 2 => 400,
            HostError::Persist(_) | HostError::Start { .. } | HostError::Stopped => 500,
        }
    }
}
