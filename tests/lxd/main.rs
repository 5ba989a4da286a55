//! The LXD broker's tests against real LXD daemons (`provisioner::testing::lxd`): standalone
//! daemons and clusters in temporary directories, on loopback addresses of their own, with a
//! busybox image built in the test. A machine that cannot run LXD (not root, no packages to be
//! had) skips them, saying why.

mod harness;
