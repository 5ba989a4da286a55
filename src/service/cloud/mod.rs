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

/// Runs `test` on an actix system with a store on a database in a new, empty directory of its
/// own (`name` tells the tests' directories apart).
#[cfg(test)]
pub(crate) fn on_a_fresh_store<F: std::future::Future<Output = ()>>(
    name: &str,
    test: impl FnOnce(crate::service::store::Store) -> F,
) {
    let dir = std::env::temp_dir().join(format!("provisioner-cloud-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("p.db");
    actix_rt::System::new().block_on(async move { test(crate::service::store::Store::start(&db).unwrap()).await });
}
