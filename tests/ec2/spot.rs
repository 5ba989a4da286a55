//! Spot capacity on moto (issue 33): `prefer-spot` and `spot` machines launch with
//! `InstanceMarketOptions` and run on spot (`InstanceLifecycle` spot, listed as such); where the
//! cloud has no spot capacity (`tests/ec2/moto_server.py`'s `MOTO_FAIL_SPOT`), `prefer-spot`
//! falls back to on-demand and `spot` ends in a provisioning error that says why.

use std::collections::BTreeMap;

use provisioner::model::{CapacityPreference, CapacityType};
use provisioner::testing::moto::{Moto, NO_SPOT_MODEL};
use provisioner::testing::{FakeMachine, FakeModel};
use provisioner::{Broker, HarvestMode, Machine};

use super::{run, until};

/// A pending machine with this capacity preference.
fn wanting(id: &str, capacity: CapacityPreference) -> FakeMachine {
    let mut m = FakeMachine::new(Machine::pending(id));
    m.info.capacity = capacity;
    m
}

/// Each machine's instances' capacity types, as the broker lists them.
async fn capacity_by_machine(broker: &provisioner::adapters::ec2::Ec2Broker) -> BTreeMap<String, Vec<CapacityType>> {
    let mut out: BTreeMap<String, Vec<CapacityType>> = BTreeMap::new();
    for i in broker.all_instances().await.unwrap() {
        let machine = i.tags.machine.map(|m| m.to_string()).unwrap_or_default();
        out.entry(machine).or_default().push(i.capacity_type.expect("EC2 says its capacity type"));
    }
    out
}

#[actix_rt::test]
async fn prefer_spot_and_spot_machines_run_on_spot_and_on_demand_ones_do_not() {
    let uuid = "model-spot";
    let broker = Moto::shared().broker(uuid).await;
    let model = FakeModel::with_machines(vec![
        wanting("0", CapacityPreference::PreferSpot),
        wanting("1", CapacityPreference::OnDemand),
        wanting("2", CapacityPreference::Spot),
    ]);
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let ids = ["0", "1", "2"].map(String::from);
    until(&model, super::all_provisioned(&ids)).await;
    let got = capacity_by_machine(&broker).await;
    assert_eq!(got["0"], [CapacityType::Spot], "{got:?}");
    assert_eq!(got["1"], [CapacityType::OnDemand], "{got:?}");
    assert_eq!(got["2"], [CapacityType::Spot], "{got:?}");
    handle.shutdown();
}

#[actix_rt::test]
async fn without_spot_capacity_prefer_spot_falls_back_to_on_demand_and_spot_fails_saying_why() {
    let broker = Moto::shared().broker(NO_SPOT_MODEL).await;
    let model = FakeModel::with_machines(vec![
        wanting("0", CapacityPreference::PreferSpot),
        wanting("1", CapacityPreference::Spot),
    ]);
    let handle = run(NO_SPOT_MODEL, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, |m| {
        m.machine("0").is_some_and(|f| f.machine.instance.is_some())
            && m.machine("1").is_some_and(|f| f.machine.instance_status.is_error())
    })
    .await;
    let got = capacity_by_machine(&broker).await;
    assert_eq!(got.get("0").map(Vec::as_slice), Some(&[CapacityType::OnDemand][..]), "{got:?}");
    assert!(!got.contains_key("1"), "a spot machine never runs on-demand: {got:?}");
    let why = &snap.machine("1").unwrap().instance_status_message;
    assert!(why.contains("no spot capacity") && why.contains("InsufficientInstanceCapacity"), "{why}");
    handle.shutdown();
}
