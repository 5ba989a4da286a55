//! The service's container initialisers. [`Ready`], on LXD: a host is a container on a
//! member, and its containers go on that member, so there is nothing to install.
//!
//! The simulated one, [`SimInitialiser`]: "preparing" a host for containers takes
//! `--sim-container-init-delay` (real time, on the tokio clock), and the first
//! `--sim-container-init-failures` preparations of each host and container type fail (fault
//! injection: the supervisor retries them with backoff and shows the failure on the
//! containers' status). A real initialiser (installing LXD on the host) is out of scope.
//!
//! Attempts are counted by a small actor (per host and type, in memory: a restarted service
//! counts afresh), the decision is [`SimInitPlan::outcome`], plain and unit-tested.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;

use crate::containers::{ContainerInitialiser, InitialiseError};
use crate::model::MachineId;

/// How the simulated preparation behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SimInitPlan {
    /// How long one preparation takes.
    pub delay: Duration,
    /// How many preparations of each host and type fail first.
    pub failures: u32,
}

impl SimInitPlan {
    /// The result of preparation number `attempt` (0-based) of one host and type.
    pub(crate) fn outcome(&self, host: &MachineId, kind: &str, attempt: u32) -> Result<(), InitialiseError> {
        if attempt < self.failures {
            Err(InitialiseError::new(format!(
                "simulated fault preparing host {host} for {kind} containers (failure {} of {})",
                attempt + 1,
                self.failures
            )))
        } else {
            Ok(())
        }
    }
}

/// Counts preparations per host and type.
#[derive(Default)]
struct Attempts(BTreeMap<(MachineId, String), u32>);

impl Actor for Attempts {
    type Context = Context<Self>;
}

/// The next attempt's number for a host and type.
#[derive(Message)]
#[rtype(result = "u32")]
struct NextAttempt(MachineId, String);

impl Handler<NextAttempt> for Attempts {
    type Result = u32;
    fn handle(&mut self, msg: NextAttempt, _ctx: &mut Self::Context) -> u32 {
        let n = self.0.entry((msg.0, msg.1)).or_insert(0);
        let attempt = *n;
        *n += 1;
        attempt
    }
}

/// The [`ContainerInitialiser`] `serve` runs with the simulated cloud.
pub(crate) struct SimInitialiser {
    plan: SimInitPlan,
    attempts: Addr<Attempts>,
}

impl SimInitialiser {
    /// Starts one on the current actix system.
    pub(crate) fn start(plan: SimInitPlan) -> Self {
        Self { plan, attempts: Attempts::default().start() }
    }
}

impl ContainerInitialiser for SimInitialiser {
    fn initialise(&self, host: MachineId, kind: String) -> BoxFuture<'static, Result<(), InitialiseError>> {
        let plan = self.plan;
        let attempt = self.attempts.send(NextAttempt(host.clone(), kind.clone()));
        Box::pin(async move {
            let attempt =
                attempt.await.map_err(|e| InitialiseError::with_source("the simulated initialiser stopped", e))?;
            actix_rt::time::sleep(plan.delay).await;
            plan.outcome(&host, &kind, attempt)
        })
    }
}

/// The [`ContainerInitialiser`] of an LXD cloud: every host is ready at once.
pub(crate) struct Ready;

impl ContainerInitialiser for Ready {
    fn initialise(&self, _host: MachineId, _kind: String) -> BoxFuture<'static, Result<(), InitialiseError>> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failures_of_each_host_and_type_fail_then_it_succeeds() {
        let plan = SimInitPlan { delay: Duration::ZERO, failures: 2 };
        let host = MachineId::new("3");
        let first = plan.outcome(&host, "lxd", 0).unwrap_err();
        assert!(first.message().contains("host 3") && first.message().contains("1 of 2"), "{first}");
        assert!(plan.outcome(&host, "lxd", 1).is_err());
        assert!(plan.outcome(&host, "lxd", 2).is_ok());
        assert!(SimInitPlan::default().outcome(&host, "kvm", 0).is_ok());
    }

    #[test]
    fn attempts_are_counted_per_host_and_type_after_the_delay() {
        actix::System::new().block_on(async {
            let init = SimInitialiser::start(SimInitPlan { delay: Duration::from_millis(20), failures: 1 });
            let began = actix_rt::time::Instant::now();
            assert!(init.initialise(MachineId::new("0"), "lxd".into()).await.is_err());
            assert!(began.elapsed() >= Duration::from_millis(20), "the delay is taken");
            assert!(init.initialise(MachineId::new("0"), "kvm".into()).await.is_err(), "each type fails first");
            assert!(init.initialise(MachineId::new("1"), "lxd".into()).await.is_err(), "each host fails first");
            assert!(init.initialise(MachineId::new("0"), "lxd".into()).await.is_ok());
        });
    }
}
