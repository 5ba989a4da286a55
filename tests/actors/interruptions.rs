//! Spot interruptions (issue 33): the fake cloud's notices (a warning now, the instance
//! terminated when it runs out, unacknowledged notices answered again as SQS redelivers them).

use std::time::Duration;

use provisioner::model::InstanceState;
use provisioner::model::{CapacityPreference, CapacityType};
use provisioner::ports::{Broker, NoticeKind};
use provisioner::testing::{FakeCloud, FakeMachine, FakeModel, NOTICE_VISIBILITY, NOTICE_WAIT};

use crate::support::*;

#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn the_fake_cloud_warns_then_terminates_and_redelivers_until_acknowledged() {
    let cloud = FakeCloud::with_zones("model-uuid", &["az1"]).with_interruptions();
    cloud.launch("i-9", Some("az1"), Some("0"), InstanceState::Running, false);
    let broker = cloud.broker();
    assert!(broker.supports_interruptions());
    assert!(!FakeCloud::new("m").broker().supports_interruptions(), "off unless asked for");

    // None pending: a bounded wait, answering none.
    let before = actix_rt::time::Instant::now();
    assert!(broker.interruption_notices().await.unwrap().is_empty());
    assert_eq!(before.elapsed(), NOTICE_WAIT);

    cloud.interrupt("i-9", Duration::from_secs(120));
    let notices = broker.interruption_notices().await.unwrap();
    assert_eq!(notices.len(), 1);
    let n = &notices[0];
    assert_eq!(
        (n.instance.as_str(), n.kind, n.deadline),
        ("i-9", NoticeKind::Interruption, Some(Duration::from_secs(120)))
    );
    // Answered once, hidden until the visibility timeout runs out, then answered again.
    assert!(broker.interruption_notices().await.unwrap().is_empty());
    actix_rt::time::sleep(NOTICE_VISIBILITY).await;
    let again = broker.interruption_notices().await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].receipt, n.receipt);
    // Warned at 1 s for 121 s; answered again at 1 + 1 + 30 s: 89 s left.
    assert_eq!(again[0].deadline, Some(Duration::from_secs(121) - NOTICE_WAIT - NOTICE_VISIBILITY - NOTICE_WAIT));
    assert_eq!(cloud.snapshot().await.state_of("i-9"), Some(InstanceState::Running));

    broker.acknowledge_notices(vec![n.receipt.clone()]).await.unwrap();
    actix_rt::time::sleep(Duration::from_secs(120)).await;
    assert!(broker.interruption_notices().await.unwrap().is_empty(), "acknowledged: never again");
    assert_eq!(
        cloud.snapshot().await.state_of("i-9"),
        Some(InstanceState::Terminated),
        "taken when the warning ran out"
    );

    // A terminated instance is not interrupted again.
    cloud.interrupt("i-9", Duration::from_secs(120));
    assert!(broker.interruption_notices().await.unwrap().is_empty());
}

/// A warning for a live machine's recorded instance: a replacement starts at once (on the same
/// capacity type: a `spot` machine's stays spot), the machine has two live instances while it
/// starts (never three), the model records the replacement once it is made (the switch), the
/// interrupted instance is stopped once the replacement runs, and only then is the notice
/// acknowledged; a spot machine's replacement is spot again, in another zone. A notice
/// about an instance no machine of ours owns is held (its start may still be in flight) until
/// two listings since it came show no machine owns it, then acknowledged.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_warning_starts_a_replacement_switches_to_it_stops_the_old_once_then_acknowledges() {
    let cloud = zoned_cloud(&["az1", "az2"]).with_interruptions();
    let mut spot = FakeMachine::new(provisioner::Machine::pending("1"));
    spot.info.capacity = CapacityPreference::Spot;
    let model = FakeModel::with_machines(vec![FakeMachine::new(provisioner::Machine::pending("0")), spot]);
    let h = Harness::new(test_config(), cloud.clone(), model);
    let snap = h
        .until_model(Duration::from_secs(30), |m| instance_of(m, "0").is_some() && instance_of(m, "1").is_some())
        .await;
    let old = [instance_of(&snap, "0").unwrap(), instance_of(&snap, "1").unwrap()];
    cloud.set_latency(Duration::from_secs(5), Duration::ZERO);
    cloud.launch("i-50", Some("az1"), Some("7"), InstanceState::Running, false);
    for id in &old {
        cloud.interrupt(id, Duration::from_secs(120));
    }
    cloud.interrupt("i-50", Duration::from_secs(120));

    // Mid-start: the old instances still recorded, the notices kept, two live instances each.
    h.run_for(Duration::from_secs(3)).await;
    let mid = h.cloud().await;
    let names = |v: Vec<provisioner::model::InstanceId>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let mut kept = old.to_vec();
    kept.push("i-50".into());
    assert_eq!(names(cloud.unacknowledged_notices().await), kept, "the unknown one's released, not acknowledged");
    assert_eq!(instance_of(&h.model().await, "0").as_ref(), Some(&old[0]));
    for m in ["0", "1"] {
        assert_eq!(mid.live_instances_of(&m.into()).len(), 2, "machine {m}: the interrupted and its replacement");
    }

    h.run_for(Duration::from_secs(10)).await;
    let snap = h.model().await;
    let cloud_now = h.cloud().await;
    for (i, m) in ["0", "1"].iter().enumerate() {
        let new = instance_of(&snap, m).unwrap();
        assert_ne!(new, old[i], "machine {m} switched");
        let live = cloud_now.live_instances_of(&(*m).into());
        assert_eq!(live.len(), 1, "machine {m} ends with one instance: {live:?}");
        assert_eq!(live[0].instance.id.as_str(), new);
        let stopped = stops(&cloud_now).iter().flatten().filter(|id| **id == old[i]).count();
        assert_eq!(stopped, 1, "machine {m}'s interrupted instance stopped once");
    }
    let capacity =
        |id: &str| cloud_now.instances.get(&provisioner::model::InstanceId::new(id)).unwrap().instance.capacity_type;
    assert_eq!(capacity(&instance_of(&snap, "1").unwrap()), Some(CapacityType::Spot), "a spot machine stays spot");
    let zone =
        |id: &str| cloud_now.instances.get(&provisioner::model::InstanceId::new(id)).unwrap().instance.zone.clone();
    assert_ne!(
        zone(&instance_of(&snap, "1").unwrap()),
        zone(&old[1]),
        "a spot replacement avoids the interrupted instance's zone (another is allowed)"
    );
    assert_eq!(names(cloud.unacknowledged_notices().await), ["i-50"], "acknowledged after the switch");
    for m in ["0", "1"] {
        let new = instance_of(&snap, m).unwrap();
        assert_eq!(cloud_now.state_of(&new), Some(InstanceState::Running), "running long before the deadline");
    }
    // Nothing more once the warnings run out: no further start; the unknown instance's notice
    // is held (its start might not have answered yet) until two listings since it came show no
    // machine owns it (the harness lists every hour), then acknowledged.
    h.run_for(Duration::from_secs(200)).await;
    assert_eq!(names(cloud.unacknowledged_notices().await), ["i-50"], "held past its warning");
    h.run_for(Duration::from_secs(2 * 3600)).await;
    assert!(cloud.unacknowledged_notices().await.is_empty());
    assert_eq!(starts_of(&h.cloud().await, "0"), 2);
    assert_eq!(starts_of(&h.cloud().await, "1"), 2);
}

/// A crash in the middle of a hand-over (the replacement's start in flight) resumes it as issue
/// 33 asks: the replacement is started once (its start's client token names the interrupted
/// instance, the same for every provisioner), the new incarnation's first batch's listing shows
/// it and resumes the hand-over with it (adopted, not stopped as an extra nor started again), the
/// interrupted instance is stopped once, never three live instances, one at the end, and the
/// notice, handed out again, is acknowledged.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_crash_mid_hand_over_resumes_it_without_a_third_instance() {
    let cloud = zoned_cloud(&["az1", "az2"]).with_interruptions();
    let h = Harness::new(test_config(), cloud.clone(), FakeModel::with_machines(machines(&["0"])));
    let snap = h.until_model(Duration::from_secs(30), |m| instance_of(m, "0").is_some()).await;
    let old = instance_of(&snap, "0").unwrap();
    cloud.set_latency(Duration::from_secs(5), Duration::ZERO);
    cloud.interrupt(&old, Duration::from_secs(120));
    h.run_for(Duration::from_secs(2)).await;
    assert_eq!(starts_of(&h.cloud().await, "0"), 2, "the replacement's start is in flight");
    let h = h.restart(test_config());
    let snap = h.until_model(Duration::from_secs(90), |m| instance_of(m, "0").is_some_and(|i| i != old)).await;
    let new = instance_of(&snap, "0").unwrap();
    // The notice the crash lost comes back once its visibility timeout runs out: acknowledged
    // then (the hand-over it was about is over).
    h.run_for(NOTICE_VISIBILITY + Duration::from_secs(10)).await;
    let c = h.cloud().await;
    assert_eq!(starts_of(&c, "0"), 2, "the replacement started once, adopted after the crash");
    assert!(c.duplicates.is_empty(), "never three live instances: {:?}", c.duplicates);
    assert_eq!(stops(&c).iter().flatten().filter(|id| **id == old).count(), 1, "the interrupted one stopped once");
    assert_eq!(c.live_instances_of(&"0".into()).len(), 1);
    assert_eq!(c.state_of(&new), Some(InstanceState::Running));
    assert!(cloud.unacknowledged_notices().await.is_empty());
}

/// A spot machine held to one zone (`zones=az1`) cannot leave the interrupted zone: its
/// replacement avoids the interrupted instance's type there instead (the broker's per-type
/// fail-over is told the type is short of spot capacity in that zone), and runs on the next
/// type that fits, still spot.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_spot_replacement_held_to_its_zone_avoids_the_interrupted_type() {
    let cloud = zoned_cloud(&["az1", "az2"]).with_interruptions();
    let mut m = FakeMachine::new(provisioner::Machine::pending("0"));
    m.info.capacity = CapacityPreference::Spot;
    m.info.constraints.zones = Some(vec!["az1".into()]);
    m.info.constraints.cores = Some(2);
    let h = Harness::new(test_config(), cloud.clone(), FakeModel::with_machines(vec![m]));
    let snap = h.until_model(Duration::from_secs(30), |m| instance_of(m, "0").is_some()).await;
    let old = instance_of(&snap, "0").unwrap();
    let c = h.cloud().await;
    let of = |c: &provisioner::testing::CloudSnapshot, id: &str| {
        c.instances.get(&provisioner::model::InstanceId::new(id)).map(|i| i.instance.clone()).unwrap()
    };
    let before = of(&c, &old);
    assert!(before.instance_type.is_some(), "a typed instance: {before:?}");
    cloud.interrupt(&old, Duration::from_secs(120));
    let snap = h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some_and(|i| i != old)).await;
    let new = instance_of(&snap, "0").unwrap();
    let c = h.cloud().await;
    let after = of(&c, &new);
    assert_eq!(after.zone.as_deref(), Some("az1"), "held to its zone");
    assert_eq!(after.capacity_type, Some(CapacityType::Spot));
    assert_ne!(after.instance_type, before.instance_type, "the interrupted type avoided in its zone");
}
