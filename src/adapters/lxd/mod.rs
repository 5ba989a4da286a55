//! The LXD broker (feature `lxd`): the [`Broker`](crate::ports::Broker) port over LXD's REST
//! API, on the daemon's unix socket (`unix:PATH`) or over HTTPS (`https://HOST:PORT`, with a
//! client certificate the daemon trusts and the daemon's certificate pinned). Containers only
//! (LXD's virtual machines need what this broker does not ask for).
//!
//! - Zones: a cluster's members, each named by its failure domain (members sharing one are one
//!   zone) or, without one, by its own name; a member LXD sees offline is an unavailable zone.
//!   A standalone daemon is one zone named after its server name. A start in a zone goes to
//!   one of its online members (`target=MEMBER`), the same one for a repeated call.
//! - Starts: create (`POST /1.0/instances` from the configured image alias) then start (LXD
//!   5.0 cannot create started), each waited on by its operation's id. The instance's name is
//!   its id, derived from the model, the machine and the start's client token
//!   ([`instance_name`]), so a retry after an ambiguous failure meets the instance the first
//!   call made ("already exists": adopted if it carries this machine's keys). Our identity is
//!   in `user.*` config keys ([`KEY_MODEL`], [`KEY_MACHINE`], [`KEY_START`]); listings and
//!   every change read them first: an instance without this model's key is never touched.
//! - Constraints ([`shape`]): `cores` → `limits.cpu`, `mem` → `limits.memory`,
//!   `instance-type` → the cores and memory of that type in the shipped table, `root-disk` →
//!   the root disk's `size` on a pool whose driver can enforce it ([`SIZED_POOL_DRIVERS`]: not
//!   `dir`), `arch` checked against the member. What cannot be met is the machine's error,
//!   with the reason.
//! - A member that does not answer (frozen, cut off: LXD's calls to it hang until it is
//!   marked offline, 20 s or more) costs a call at most [`LxdConfig::call_timeout`] and is
//!   [`BrokerError::ZoneUnreachable`](crate::ports::BrokerError::ZoneUnreachable): the start
//!   fails over to another zone (with a new name) and whatever the unanswered call makes
//!   later is an extra instance the provisioner stops.
//! - Containers of a machine (`H/lxd/N`, seed 003's lazy container provisioners): [`OnHost`]
//!   places each on the member where its host machine's instance runs (`lxd-host=H`), tagged
//!   with [`KEY_HOST`]; a host without a running instance takes none yet.
//! - Stops: force stop, then delete, each waited on; an instance already gone is success.
//!   Released instances lose [`KEY_MODEL`]; reuse rewrites [`KEY_MACHINE`] and [`KEY_START`].
//! - Listings: `GET /1.0/instances?recursion=1` filtered to this model's key. A container
//!   created and never started is `pending`; one created long ago and never started (its
//!   provisioner stopped between create and start) is started by the listing that finds it.
//!   `Stopped`, `Frozen` and `Error` (a member offline) read as `stopped`.
//! - Errors: see [`classify`].

mod broker;
mod client;
mod config;
mod errors;
mod shape;

pub use broker::{member_for, LxdBroker, Member, OnHost, HOST_PLACEMENT};
pub use client::{Answer, CallError, LxdClient};
pub use config::{
    LxdConfig, LxdConfigError, LxdEndpoint, LxdTlsFiles, DEFAULT_CALL_TIMEOUT, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_PROJECT,
};
pub use errors::classify;
pub use shape::{
    instance_name, lxd_arch, shape, RootPool, Shape, KEY_HOST, KEY_INSTANCE_TYPE, KEY_MACHINE, KEY_MODEL, KEY_START,
    KEY_TAG_PREFIX, SIZED_POOL_DRIVERS,
};
