//! The model host's messages. Reads are answered at once from the plain core; the changes of
//! the directory ([`StartAll`], [`Add`], [`MarkDying`], [`Forget`], [`Resync`], [`Remove`]) are
//! queued and run one at a time, each answered when it is done; the rest are the steps the
//! changes and the reapers take on the core.

use actix::Message;

use super::directory::{Directory, ModelEntry};
use super::state::{FollowPlan, Listed, Slot};
use super::HostError;
use crate::service::error::ServeError;
use crate::service::runtime::ModelRuntime;
use crate::service::store::Store;

/// The directory as last written.
#[derive(Message)]
#[rtype(result = "Directory")]
pub(super) struct GetDirectory;

/// The running model of this name: 404 naming it when unknown, 503 when it does not run.
#[derive(Message)]
#[rtype(result = "Result<ModelRuntime, HostError>")]
pub(super) struct GetState(pub String);

/// Every model in name order, with its state when it runs.
#[derive(Message)]
#[rtype(result = "Vec<Listed>")]
pub(super) struct List;

/// Whether the model may be destroyed (`default` only with force), changing nothing.
#[derive(Message)]
#[rtype(result = "Result<ModelEntry, HostError>")]
pub(super) struct MayDestroy {
    pub name: String,
    pub force: bool,
}

/// Every running model's state.
#[derive(Message)]
#[rtype(result = "Vec<ModelRuntime>")]
pub(super) struct Running;

/// Every running model that has a lease: its name, uuid and lease actor.
#[cfg(feature = "postgres")]
#[derive(Message)]
#[rtype(result = "Vec<(String, String, actix::Addr<crate::service::lease::actor::LeaseActor>)>")]
pub(super) struct Leases;

/// A change: every model of the directory started (the service's start), `default` on this
/// store.
#[derive(Message)]
#[rtype(result = "Result<(), ServeError>")]
pub(super) struct StartAll(pub Store);

/// A change: a model added.
#[derive(Message)]
#[rtype(result = "Result<ModelRuntime, HostError>")]
pub(super) struct Add(pub ModelEntry);

/// A change: a model marked dying, its reaper started.
#[derive(Message)]
#[rtype(result = "Result<(), HostError>")]
pub(super) struct MarkDying {
    pub name: String,
    pub force: bool,
}

/// A change: a model that does not run taken out of the directory.
#[derive(Message)]
#[rtype(result = "Result<(), HostError>")]
pub(super) struct Forget(pub String);

/// A change: the directory another replica may have written, followed (a replica's sync).
#[derive(Message)]
#[rtype(result = "Result<(), HostError>")]
pub(super) struct Resync;

/// A change: a destroyed model stopped and removed.
#[derive(Message)]
#[rtype(result = "Result<(), HostError>")]
pub(super) struct Remove(pub String);

/// A step: the directory as just written.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct SetDirectory(pub Directory);

/// A step: a model's slot set (`None`: taken out).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct SetSlot(pub String, pub Option<Slot>);

/// A step: the directory read back, taken as the last written; what to do to follow it.
#[derive(Message)]
#[rtype(result = "FollowPlan")]
pub(super) struct Follow(pub Directory);

/// A reaper's step: whether it is to start (one per model).
#[derive(Message)]
#[rtype(result = "bool")]
pub(super) struct BeginReaping(pub String);

/// A reaper's step: whether its model is still dying.
#[derive(Message)]
#[rtype(result = "bool")]
pub(super) struct StillDying(pub String);

/// A reaper's step: done.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct EndReaping(pub String);
