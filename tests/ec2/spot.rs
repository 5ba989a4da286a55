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
    // The provisioner runs without the queue (with it, its poller would read the queue too, and
    // its last long poll, still open on the server's side after the shutdown, could take the
    // warning); the test reads it through a broker of its own.
    let broker = moto.broker(uuid).await;
    let reader = moto.broker_with(uuid, |c| c.interruption_queue = Some(moto.interruption_queue())).await;
    let queue = reader.interruptions().expect("the queue is configured").with_wait(std::time::Duration::from_secs(2));
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

/// Every instance of model `uuid` in moto (any state): id, machine tag, state.
async fn instances_by_machine(
    broker: &provisioner::adapters::ec2::Ec2Broker,
    uuid: &str,
) -> Vec<(String, Option<String>, aws_sdk_ec2::types::InstanceStateName)> {
    super::cloud(broker, uuid).await.into_iter().map(|(id, state, _zone, machine)| (id, machine, state)).collect()
}

/// Whether an instance in this state is live (pending or running).
fn live(state: &aws_sdk_ec2::types::InstanceStateName) -> bool {
    use aws_sdk_ec2::types::InstanceStateName as S;
    matches!(state, S::Pending | S::Running)
}

/// Issue 33: the hand-over on moto, through the EC2 broker's interruption queue. A
/// `prefer-spot` machine runs on spot; its instance gets EC2's interruption warning with 20 s to
/// go (the test server's `provisioner-test-interrupt` tag); the provisioner reads it from the
/// queue, starts a replacement tagged for the same machine, which runs BEFORE the interrupted
/// instance is gone; the machine records the replacement and ends with exactly one live
/// instance; every message on the queue is deleted.
#[actix_rt::test]
async fn a_warned_spot_instance_is_handed_over_to_a_replacement_before_it_goes() {
    use actix_rt::time::Instant;
    use aws_sdk_ec2::types::{InstanceStateName, Tag};
    use provisioner::testing::moto::{HANDOVER_QUEUE, INTERRUPT_TAG};
    use std::time::Duration;

    let moto = Moto::shared();
    let uuid = "model-handover";
    let broker = moto.broker_with(uuid, |c| c.interruption_queue = Some(moto.queue_url(HANDOVER_QUEUE))).await;
    assert!(broker.supports_interruptions());
    let model = FakeModel::with_machines(vec![wanting("0", CapacityPreference::PreferSpot)]);
    // A listing every 2 s: a notice about an instance no machine of this model owns (another
    // test's, on the shared queue) is acknowledged once two listings since it came show that.
    let config = provisioner::ProvisionerConfig {
        resync_interval: Duration::from_secs(2),
        ..super::config(uuid, HarvestMode::Destroyed)
    };
    let handle = super::run_with(config, &broker, &model);
    let snap = until(&model, super::all_provisioned(&["0".to_owned()])).await;
    let interrupted = super::recorded(&snap, "0");
    assert_eq!(capacity_by_machine(&broker).await["0"], [CapacityType::Spot]);

    let warned = Instant::now();
    let tag = Tag::builder().key(INTERRUPT_TAG).value("20").build();
    broker.client().create_tags().resources(&interrupted).tags(tag).send().await.unwrap();

    // Sample the cloud every 200 ms (at most 40 s: the warning runs out after 20).
    let mut replacement_running: Option<(String, Duration)> = None;
    let mut interrupted_gone: Option<Duration> = None;
    let mut most_live = 0;
    let mut last = Vec::new();
    for _ in 0..200 {
        let now = warned.elapsed();
        let all = instances_by_machine(&broker, uuid).await;
        let mine: Vec<_> = all.iter().filter(|(_, m, _)| m.as_deref() == Some("0")).collect();
        most_live = most_live.max(mine.iter().filter(|(_, _, s)| live(s)).count());
        if replacement_running.is_none() {
            if let Some((id, _, _)) =
                mine.iter().find(|(id, _, s)| *id != interrupted && *s == InstanceStateName::Running)
            {
                replacement_running = Some((id.clone(), now));
            }
        }
        if interrupted_gone.is_none() && mine.iter().any(|(id, _, s)| *id == interrupted && !live(s)) {
            interrupted_gone = Some(now);
        }
        last = all;
        if replacement_running.is_some() && interrupted_gone.is_some() {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    let (replacement, running_at) =
        replacement_running.unwrap_or_else(|| panic!("no replacement ran within 40 s: {last:?}"));
    let gone_at = interrupted_gone.unwrap_or_else(|| panic!("the interrupted instance never went: {last:?}"));
    assert!(
        running_at < gone_at,
        "the replacement ran ({running_at:?} after the warning) before the interrupted instance went ({gone_at:?})"
    );
    eprintln!(
        "hand-over lead time: {:.1} s with a 20 s warning (replacement running {:.1} s after the warning, \
         interrupted instance gone {:.1} s after it)",
        (gone_at - running_at).as_secs_f64(),
        running_at.as_secs_f64(),
        gone_at.as_secs_f64()
    );
    assert!(most_live <= 2, "never a third live instance: {last:?}");

    // The machine records the replacement, and has it alone.
    until(&model, |m| {
        m.machine("0").and_then(|f| f.machine.instance.as_ref()).is_some_and(|i| i.as_str() == replacement)
    })
    .await;
    let mut settled = false;
    for _ in 0..150 {
        let all = instances_by_machine(&broker, uuid).await;
        let live_ids: Vec<&String> =
            all.iter().filter(|(_, m, s)| m.as_deref() == Some("0") && live(s)).map(|(id, _, _)| id).collect();
        if live_ids == [&replacement] {
            settled = true;
            break;
        }
        last = all;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(settled, "machine 0 ends with its replacement alone: {last:?}");

    // Every message is deleted (the warning once acted on; other tests' notices, not ours,
    // once two listings since they came show no machine of ours owns them), while the
    // provisioner still reads the queue.
    let mut depth = u64::MAX;
    for _ in 0..150 {
        depth = moto.queue_depth(HANDOVER_QUEUE).await;
        if depth == 0 {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(depth, 0, "messages left on the queue");
    handle.shutdown();
}
