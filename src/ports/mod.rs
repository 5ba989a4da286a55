//! The ports: what the provisioner needs from outside, as object-safe async traits.
//!
//! - [`Broker`]: the cloud. Starts and stops instances, lists ours with their state, and
//!   optionally knows availability zones.
//! - [`ModelApi`]: the model of machines. Reads machines and their provisioning info in
//!   batches, writes instance info and statuses.
//!
//! The machine watcher is not a trait: whoever owns the model sends
//! [`MachinesChanged`](crate::MachinesChanged) to the provisioner (the first
//! notification carries every machine, later ones the ids that changed), and
//! [`RetryTick`](crate::RetryTick) when machines were marked for a retry.
//!
//! Every method returns a `'static` boxed future, so implementations own what they need
//! (an HTTP client, an actor address) and callers can hold `Arc<dyn Broker>`.

mod broker;
mod model;

pub use broker::start_settled;
#[cfg(any(feature = "test-util", feature = "serve"))]
pub(crate) use broker::{repeated_start, token_key};
pub use broker::{
    AvailabilityZone, BatchMember, BatchStartParams, BatchStarted, Broker, BrokerError, BrokerErrorKind, BrokerFuture,
    InterruptionNotice, NoticeKind, Pacer, StartInstanceParams, StartedInstance,
};
pub use model::{ModelApi, ModelError, ModelFuture, ProvisionedInstance};
