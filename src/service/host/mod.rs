//! Many models per service (issue 18), the model host: each model has its own store (SQLite:
//! the data directory's `provisioner.db` for `default`, `models/NAME.db` for the others;
//! PostgreSQL: `public` for `default`, schema `model_NAME` for the others), its own cloud,
//! metrics, event stream and provisioner actors; the service keeps a small directory of them.
//! The host gets the model starter injected ([`StartModel`](crate::service::runtime::StartModel),
//! which the runtime implements and `serve` passes in); nothing here imports the HTTP layer
//! or `serve`.
//!
//! - [`directory`]: plain: the names' rule, the entries (name, uuid, cloud, life), what adding
//!   and destroying may do.
//! - [`persist`]: where the directory is kept (`models.json`, or table `provisioner_models`).
//! - `cloud`: a model's settings (the service's with its cloud applied) and its broker.
//! - `handle`: [`ModelHost`], the cheap handle the HTTP layer and `serve` hold: one message per
//!   method.
//! - `actor`, `messages`, `state`: the model host's actor (the thin shell that runs the
//!   directory's changes one at a time), its messages, and its plain core (the directory as
//!   last written, each model's slot, the reapers; what following another replica does).
//! - `changes`: the changes' steps: starting every model, adding, marking dying and reaping,
//!   forgetting, removing, a replica following the directory.
//! - `error`: [`HostError`], with the HTTP status the API answers.
//! - `spread` (feature `postgres`): the shell that spreads the models' leaders over the
//!   replicas (membership heartbeat, `share::plan`, each lease actor's order, hand-overs).

mod actor;
mod cloud;
pub(crate) mod directory;
mod error;
mod handle;
mod messages;
pub(crate) mod persist;
#[cfg(feature = "postgres")]
pub(crate) mod spread;
mod state;

pub(crate) use crate::service::runtime::Shared;
pub(crate) use actor::ModelHost;
pub(crate) use cloud::broker_of;
pub(crate) use directory::{CloudSettings, ModelEntry, ModelLife, ModelsError, DEFAULT_MODEL};
pub(crate) use error::HostError;
pub(crate) use persist::DirectoryStore;
pub(crate) use state::Listed;
