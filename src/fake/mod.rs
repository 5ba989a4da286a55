//! An in-process fake cloud and fake model (feature `test-util`), for actor-level tests here
//! and in embedding controllers.
//!
//! Both are actors on the current actix system, so they run on the same (possibly paused)
//! clock as the provisioner: a start latency of 30 s takes no real time in a paused test.
//!
//! - [`FakeCloud`]: zones with availability, start/stop latencies, instances with tags and
//!   states, scripted StartInstance faults, derived zones, `fail_next` for any call,
//!   out-of-band stop/start/terminate/launch, idempotent client tokens, and a log of every
//!   call. [`FakeCloud::broker`] is its [`Broker`](crate::ports::Broker).
//! - [`FakeModel`]: machines with lives, statuses, provisioning info, distribution groups;
//!   notifies watchers as a machine watcher would; `fail_next` for any call; a log of
//!   EnsureDead and MarkForRemoval. [`FakeModel::api`] is its [`ModelApi`](crate::ports::ModelApi).

mod cloud;
mod model;

pub use cloud::{CallRecord, CloudOp, CloudSnapshot, Fault, FakeBroker, FakeCloud, FakeInstance};
pub use model::{FakeMachine, FakeModel, FakeModelApi, ModelOp, ModelSnapshot};
