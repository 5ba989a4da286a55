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

/// The queue as the broker reads it: the test server interrupts a spot instance (the warning
/// through its EventBridge rule onto the queue now, the termination three seconds later, as EC2
/// does two minutes after its warning); the warning is received, names the instance and its
/// deadline, and once acknowledged is not received again; the instance goes with
/// `Server.SpotInstanceTermination`.
#[actix_rt::test]
async fn an_interruption_warning_arrives_on_the_queue_and_the_instance_goes_when_it_runs_out() {
    use aws_sdk_ec2::types::Tag;
    use provisioner::adapters::ec2::NoticeKind;
    use provisioner::testing::moto::INTERRUPT_TAG;

    let moto = Moto::shared();
    let uuid = "model-interrupted";
    let broker = moto.broker_with(uuid, |c| c.interruption_queue = Some(moto.interruption_queue())).await;
    let queue = broker.interruptions().expect("the queue is configured").with_wait(std::time::Duration::from_secs(2));
    let model = FakeModel::with_machines(vec![wanting("0", CapacityPreference::Spot)]);
    let handle = run(uuid, &broker, &model, HarvestMode::Destroyed);
    let snap = until(&model, super::all_provisioned(&["0".to_owned()])).await;
    let id = super::recorded(&snap, "0");
    handle.shutdown();
    let tag = Tag::builder().key(INTERRUPT_TAG).value("3").build();
    broker.client().create_tags().resources(&id).tags(tag).send().await.unwrap();

    // Other tests' notices may share the queue: ours is the one naming our instance.
    let mut ours = None;
    for _ in 0..10 {
        let notices = queue.receive().await.unwrap();
        let (mine, others): (Vec<_>, Vec<_>) = notices.into_iter().partition(|n| n.instance.as_str() == id);
        // Not ours to act on: back to the queue soon for whoever reads it (here: nobody).
        drop(others);
        if let Some(n) = mine.into_iter().find(|n| n.kind == NoticeKind::Interruption) {
            ours = Some(n);
            break;
        }
    }
    let notice = ours.expect("the interruption warning arrives");
    let sent = notice.sent.expect("the event's time");
    assert_eq!(notice.deadline(), Some(sent + std::time::Duration::from_secs(120)));
    queue.acknowledge(vec![notice.receipt.clone()]).await.unwrap();

    let mut reason = None;
    for _ in 0..100 {
        let out = broker.client().describe_instances().instance_ids(&id).send().await.unwrap();
        let i = out.reservations()[0].instances()[0].clone();
        if i.state().and_then(|s| s.name()) == Some(&aws_sdk_ec2::types::InstanceStateName::Terminated) {
            reason = i.state_reason().and_then(|r| r.code()).map(str::to_owned);
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(reason.as_deref(), Some("Server.SpotInstanceTermination"), "terminated by the interruption");
    let again = queue.receive().await.unwrap();
    assert!(
        !again.iter().any(|n| n.instance.as_str() == id && n.kind == NoticeKind::Interruption),
        "an acknowledged warning is gone: {again:?}"
    );
}
