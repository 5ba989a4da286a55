//! An in-process fake cloud and fake model (feature `test-util`), for actor-level tests here
//! and in embedding controllers.
//!
//! Both are actors on the current actix system, so they run on the same (possibly paused)
//! clock as the provisioner: a start latency of 30 s takes no real time in a paused test.
//!
//! - [`FakeCloud`]: zones with availability, start/stop latencies, instances with tags and
//!   states, scripted StartInstance faults, derived zones, `fail_next` for any call,
//!   out-of-band stop/start/terminate/launch, idempotent client tokens (the model's own), and a
//!   log of every call. [`FakeCloud::broker`] is its [`Broker`](crate::ports::Broker);
//!   [`FakeCloud::broker_for`] a broker for another model on the same cloud.
//! - [`FakeModel`]: machines with lives, statuses, provisioning info, distribution groups;
//!   notifies watchers as a machine watcher would; `fail_next` for any call; a log of
//!   EnsureDead and MarkForRemoval. [`FakeModel::api`] is its [`ModelApi`](crate::ports::ModelApi).
//! - [`broker_contract`]: the broker contract suite, what every
//!   [`Broker`](crate::ports::Broker) must do, to run against a broker of your own (this crate
//!   runs it against [`FakeCloud`], the service's simulated cloud and the EC2 broker on moto).
//! - [`TempPostgres`]: a throwaway PostgreSQL server on a free loopback port, for tests of the
//!   PostgreSQL store; [`postgres`] also holds the server shared by the tests running at the
//!   same time, a fresh database of a test's own, and the certificates for a server with TLS.
//! - `moto` (feature `ec2`): moto's EC2 server on a free loopback port, for tests of the EC2
//!   broker and of the service on it.
//! - `lxd` (feature `lxd`): real LXD daemons and clusters in temporary directories on loopback
//!   addresses of their own, a busybox image built in the test, client certificates: for tests
//!   of the LXD broker.

pub mod broker_contract;
mod cloud;
mod compact;
mod initialiser;
#[cfg(feature = "lxd")]
pub mod lxd;
mod model;
#[cfg(feature = "ec2")]
pub mod moto;
pub mod postgres;

/// An actix system on a paused, current-thread tokio runtime: virtual time advances only when
/// every task waits, so retry delays and latencies take no real time and runs are
/// deterministic. Use it as `#[actix_rt::test(system = "provisioner::testing::PausedSystem")]`.
pub struct PausedSystem;

impl PausedSystem {
    /// A system runner on a paused clock.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> actix_rt::SystemRunner {
        actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime builds")
        })
    }
}

pub use cloud::{
    CallRecord, CloudOp, CloudSnapshot, FakeBroker, FakeCloud, Fault, PartialLaunch, SpotFault, TypeFault,
    NOTICE_VISIBILITY, NOTICE_WAIT, NO_SPOT_CAPACITY, SPOT_PRICE_RATIO,
};
pub use compact::FakeInstance;
pub use initialiser::FakeInitialiser;
pub use model::{FakeMachine, FakeModel, FakeModelApi, ModelOp, ModelSnapshot};
pub use postgres::{TempPostgres, TempPostgresError};
