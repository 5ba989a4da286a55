//! A real cloud's instances as readers see them (issue 30, item 8; the simulated cloud's
//! listing is a read of the store, and its readers read it): served from the listings the
//! service already made (the provisioner's own, and those made for readers), with their age,
//! so that no reader drives the cloud's API. `/v1/instances` and `/v1/status` ask
//! [`InstanceListings`] for a listing at most [`MAX_AGE`] old: a fresh one is answered from
//! memory; otherwise one listing is made (never two at once: every reader that asks meanwhile
//! waits for it), through the metered broker (and so through the account's client-side
//! limiter where the broker paces its calls). However many readers poll, the cloud is listed at
//! most about once per [`MAX_AGE`] on their behalf while it does not change; a start, stop or
//! release made through the service makes the next read list again (readers see the service's
//! own changes at once).
//!
//! - `state`: the plain core, [`ListingBook`]: fresh or not, one listing in flight, who waits.
//! - `actor`: [`InstanceListings`], the shell: makes the listing and answers the waiters; hears
//!   the provisioner's own listings ([`Listed`], sent by the metered broker).

mod actor;
mod state;

pub(crate) use actor::{Changed, InstanceListings, Listed, ReadInstances};

/// The oldest listing a reader is answered from.
pub(crate) const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);
