//! One model's runtime, below the HTTP layer: [`ModelRuntime`], the handles of a running
//! model (its store, cloud, provisioners, metrics, event streams, and with replicas its lease)
//! that the HTTP handlers and the model host use.
//!
//! - `handles`: [`ModelRuntime`], [`ModelReplica`], [`NotRunning`].
//! - `model_api`: [`StoreModel`], the engine's [`ModelApi`](crate::ports::ModelApi) over the
//!   store: what a model's provisioners read and write.
//! - [`shared`](Shared): what every model of one service shares (settings, token, audit log,
//!   the service's store and metrics, the cloud accounts, the replica's links).
//! - [`accounts`]: the cloud accounts whose request limits the models on them share (an actor
//!   owns them; each one's limiter is the engine's).
//! - [`location`]: where a model's store lives (its SQLite file, its PostgreSQL schema).
//! - `start`: starting and stopping a model ([`open_model_store`], [`start_model`],
//!   [`stop_models`]; [`StartModel`], the model starter the model host is given, and
//!   [`ModelStarter`], the service's).
//! - `provisioners`: a model's environ and container provisioners started over its store and
//!   cloud (what a lone service runs at once and a leader at each epoch), and
//!   [`PendingStarts`], the starts a previous run or leader left in flight.
//! - `replica`: a model's replica side on PostgreSQL: its lease actor and the hooks that run its
//!   provisioners while this replica leads.

pub(crate) mod accounts;
mod handles;
pub(crate) mod location;
mod model_api;
mod provisioners;
mod replica;
mod shared;
mod start;

pub(crate) use handles::{ModelRuntime, NotRunning};
pub(crate) use location::{model_db, schema_name, schema_url, DEFAULT_MODEL, MODELS_DIR};
pub(crate) use model_api::StoreModel;
#[cfg(feature = "postgres")]
pub(crate) use shared::ReplicaLinks;
pub(crate) use shared::Shared;
pub(crate) use start::{stop_models, ModelStarter, ModelToStart, StartModel};
