//! Many models per service (issue 18): each model has its own store (SQLite: the data
//! directory's `provisioner.db` for `default`, `models/NAME.db` for the others; PostgreSQL:
//! `public` for `default`, schema `model_NAME` for the others), its own cloud, metrics, event
//! stream and provisioner actors; the service keeps a small directory of them.
//!
//! - [`directory`]: plain: the names' rule, the entries (name, uuid, cloud, life), what adding
//!   and destroying may do.
//! - [`persist`]: where the directory is kept (`models.json`, or table `provisioner_models`).
//! - [`running`]: the running models, looked up per request; adding, destroying, reaping.
//! - `spread` (feature `postgres`): the shell that spreads the models' leaders over the
//!   replicas (membership heartbeat, `share::plan`, each lease actor's order, hand-overs).

pub mod directory;
pub mod persist;
pub mod running;
#[cfg(feature = "postgres")]
pub mod spread;

pub use crate::service::runtime::Shared;
pub use directory::{check_name, CloudSettings, Directory, ModelEntry, ModelLife, ModelsError, DEFAULT_MODEL};
pub use persist::{DirectoryStore, PersistError};
pub use running::{HostError, ModelHost};
