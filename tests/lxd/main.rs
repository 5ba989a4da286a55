//! The LXD broker's tests against real LXD daemons (`provisioner::testing::lxd`): standalone
//! daemons and clusters in temporary directories, on loopback addresses of their own, with a
//! busybox image built in the test. A machine that cannot run LXD (not root, no packages to be
//! had) skips them, saying why.

// These tests drive real daemons in real time: they sleep and read the wall clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

/// The LXD broker against daemons and a cluster: the contract, settings, constraints, zones.
mod broker;
/// The harness itself.
mod harness;

/// Whether LXD can run here; if not, the test says why and passes.
pub(crate) fn lxd_or_skip() -> bool {
    match provisioner::testing::lxd::ensure_lxd() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}
