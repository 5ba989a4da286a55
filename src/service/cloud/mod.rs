//! The brokers of one model, each a [`Broker`](crate::ports::Broker) or beside one:
//!
//! - `sim`: the simulated cloud over the store (its instances persisted beside the model), an
//!   actor owning its per-type fail-over memory and, with `--sim-account-start-rate`, the
//!   account's bucket.
//! - `intents`: the broker decorator that writes each start's client token and parameters
//!   before a real cloud's call, and repeats the unsettled ones before a provisioner starts.
//! - `initialiser`: the simulated container initialiser (delay and fault injection) that the
//!   container provisioners run with beside the simulated cloud.
//! - `listing`: a real cloud's instances as readers see them: served from the listings made,
//!   with their age (no reader drives the cloud's API).

pub(crate) mod initialiser;
pub(crate) mod intents;
pub(crate) mod listing;
pub(crate) mod sim;
