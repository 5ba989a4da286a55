//! Capacity preferences (issue 33) against a broker without spot: LXD's and (for now) EC2's
//! brokers refuse every spot call with a zone-independent failure that says so
//! (`BrokerError::no_spot`). A `prefer-spot` machine goes on to on-demand at once, using no
//! round; a `spot` machine never falls back and ends in a provisioning error naming why. On a
//! cloud with spot, the capacity type of each call is in its parameters.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use provisioner::model::{CapacityPreference, CapacityType, InstanceStatus};
use provisioner::ports::{Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};
use provisioner::testing::{CloudOp, FakeMachine, FakeModel};
use provisioner::{Machine, MachineStatus};

use crate::support::*;

/// The fake cloud's broker, refusing spot calls as a broker without spot does (they never reach
/// the cloud, whose log shows the on-demand ones); how many spot calls machines 0 and 1 made.
struct NoSpot {
    inner: Arc<dyn Broker>,
    spot: [AtomicU32; 2],
}

impl Broker for NoSpot {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        if params.capacity == CapacityType::Spot {
            if let Some(n) = params.machine.as_str().parse::<usize>().ok().and_then(|i| self.spot.get(i)) {
                n.fetch_add(1, Ordering::SeqCst);
            }
            return Box::pin(async { Err(BrokerError::no_spot()) });
        }
        self.inner.start_instance(params)
    }
    provisioner::forward_broker!(inner: stop_instances, all_instances, supports_zones, availability_zones, release_instances);
}

fn with_capacity(id: &str, capacity: CapacityPreference) -> FakeMachine {
    let mut m = FakeMachine::new(Machine::pending(id));
    m.info.capacity = capacity;
    m
}

#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn without_spot_prefer_spot_goes_on_demand_at_once_and_spot_fails_saying_why() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    let broker = Arc::new(NoSpot { inner: Arc::new(cloud.broker()), spot: Default::default() });
    let model = FakeModel::with_machines(vec![
        with_capacity("0", CapacityPreference::PreferSpot),
        with_capacity("1", CapacityPreference::Spot),
        with_capacity("2", CapacityPreference::OnDemand),
    ]);
    // No retry round: a prefer-spot machine still lands, its fall-back uses none.
    let h = Harness::over(with_retries(0, Duration::from_secs(1)), broker.clone(), cloud, model);
    let model = h
        .until_model(Duration::from_secs(30), |m| {
            instance_of(m, "0").is_some()
                && instance_of(m, "2").is_some()
                && m.machine("1").is_some_and(|x| x.machine.instance_status.is_error())
        })
        .await;
    let spot_calls = |i: usize| broker.spot[i].load(Ordering::SeqCst);
    assert_eq!((spot_calls(0), spot_calls(1)), (1, 1), "one spot call each; no round left for machine 1");
    let cloud = h.cloud().await;
    let on_demand: Vec<(String, CapacityType)> = cloud
        .calls_of(CloudOp::StartInstance)
        .iter()
        .map(|c| (c.machine.as_ref().unwrap().to_string(), c.params.as_ref().unwrap().capacity))
        .collect();
    let expected = [("0".to_owned(), CapacityType::OnDemand), ("2".to_owned(), CapacityType::OnDemand)];
    assert_eq!(on_demand.iter().collect::<std::collections::BTreeSet<_>>(), expected.iter().collect());
    let spot = model.machine("1").unwrap();
    assert_eq!(spot.machine.instance_status, InstanceStatus::provisioning_error());
    assert_eq!(spot.machine.status, MachineStatus::Error);
    assert_eq!(
        spot.instance_status_message,
        "no spot capacity in any allowed zone: this cloud's broker does not start spot instances yet"
    );
    let got = |m: &str| {
        let i = instance_of(&model, m).unwrap();
        cloud.instances.get(&provisioner::InstanceId::new(i)).unwrap().instance.capacity_type
    };
    assert_eq!((got("0"), got("2")), (Some(CapacityType::OnDemand), Some(CapacityType::OnDemand)));
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 2, "the spot calls never reached the cloud");
}
