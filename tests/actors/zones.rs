//! Availability zones: spreading, constraints, derived zones, fail-over, distribution groups.

use std::collections::BTreeMap;
use std::time::Duration;

use provisioner::model::InstanceState;
use provisioner::testing::{CloudOp, FakeMachine, FakeModel, Fault};
use provisioner::{Life, Machine, MachineId, MachineStatus, ProvisionerConfig, RetryStrategy};

use crate::support::*;

fn zone_counts(snap: &provisioner::testing::ModelSnapshot) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in snap.machines.values() {
        if let Some(z) = &m.zone {
            *counts.entry(z.clone()).or_insert(0) += 1;
        }
    }
    counts
}

fn all_provisioned(ids: &'static [&'static str]) -> impl Fn(&provisioner::testing::ModelSnapshot) -> bool {
    move |m| ids.iter().all(|id| instance_of(m, id).is_some())
}

/// T4 `TestEvenZonePlacement`, P28: four machines over three zones use all three zones, each
/// once or twice.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn machines_spread_evenly_over_zones() {
    let h = Harness::zoned(test_config(), &["az1", "az2", "az3"], &["0", "1", "2", "3"]);
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["0", "1", "2", "3"])).await;
    let counts = zone_counts(&model);
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|c| (1..=2).contains(c)), "{counts:?}");
    assert_eq!(h.cloud().await.calls_of(CloudOp::DeriveZones).len(), 4);
    let zones = h.handle.zones().await.unwrap();
    for id in ["0", "1", "2", "3"] {
        assert_eq!(zones.zone_of(&MachineId::new(id)), model.machine(id).unwrap().zone.as_deref());
    }
}

/// The tie-break is random but seeded: the same seed places machines the same way, and
/// different seeds do not all agree.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_tie_breaks_are_reproducible_from_the_seed() {
    let mut placements = Vec::new();
    for seed in [7, 7, 8, 9, 10] {
        let config = ProvisionerConfig { seed, workers: 1, ..test_config() };
        let h = Harness::zoned(config, &["az1", "az2", "az3", "az4"], &["0", "1", "2"]);
        let model = h.until_model(Duration::from_secs(10), all_provisioned(&["0", "1", "2"])).await;
        placements.push(["0", "1", "2"].map(|id| model.machine(id).unwrap().zone.clone()));
        h.handle.shutdown();
    }
    assert_eq!(placements[0], placements[1]);
    assert!(placements[2..].iter().any(|p| p != &placements[0]), "{placements:?}");
}

/// T6 `TestZoneConstraintsNoZoneAvailable`: no zone matches `zones=az9`: no start, and
/// the instance status says which machine found no zone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn no_matching_zone_is_a_provisioning_error_without_a_start() {
    let mut m = FakeMachine::new(Machine::pending("0"));
    m.info.constraints.zones = Some(vec!["az9".into()]);
    let h = Harness::new(test_config(), zoned_cloud(&["az1", "az2", "az3"]), FakeModel::with_machines(vec![m]));
    let model =
        h.until_model(Duration::from_secs(10), |m| m.machine("0").unwrap().machine.instance_status.is_error()).await;
    assert_eq!(
        model.machine("0").unwrap().instance_status_message,
        "suitable availability zone for machine 0 not found"
    );
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 0);
    assert!(h.handle.is_running());
}

/// T7, T9, T11: `zones=` constraints are honoured with and without distribution groups.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_constraints_are_honoured() {
    let mut a = FakeMachine::new(Machine::pending("0"));
    a.info.constraints.zones = Some(vec!["az1".into()]);
    let mut b = FakeMachine::new(Machine::pending("1"));
    b.info.constraints.zones = Some(vec!["az1".into(), "az2".into()]);
    b.group = Ok(vec!["az1".into()]);
    let mut c = FakeMachine::new(Machine::pending("2"));
    c.info.constraints.zones = Some(vec!["az2".into()]);
    c.group = Ok(vec!["3".into()]);
    let h = Harness::new(test_config(), zoned_cloud(&["az1", "az2", "az3"]), FakeModel::with_machines(vec![a, b, c]));
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["0", "1", "2"])).await;
    assert_eq!(model.machine("0").unwrap().zone.as_deref(), Some("az1"));
    assert!(matches!(model.machine("1").unwrap().zone.as_deref(), Some("az1" | "az2")));
    assert_eq!(model.machine("2").unwrap().zone.as_deref(), Some("az2"));
}

/// P8: a zone-specific failure fails over to another zone at once, using no round
/// (retry count 1) and no delay.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_specific_failure_fails_over_to_another_zone_at_once() {
    let config = with_retries(1, Duration::from_secs(10));
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.add_fault(Fault::zone_specific("0", 1, "no capacity"));
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["0"])));
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["0"])).await;
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 2);
    assert_ne!(starts[0].zone, starts[1].zone);
    assert_eq!(starts[1].at, starts[0].at, "fail-over waited");
    assert_eq!(model.machine("0").unwrap().zone, starts[1].zone);
}

/// Retry rounds: a machine that always fails zone-specifically gets N·Z+1 calls with Z
/// eligible zones, and N+1 when it fails zone-independently.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn always_failing_machine_gets_n_times_z_plus_one_calls() {
    let config = with_retries(2, Duration::from_secs(1));
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.add_fault(Fault::zone_specific("0", 100, "zing"));
    cloud.add_fault(Fault::zone_independent("1", 100, "arf"));
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["0", "1"])));
    h.until_model(Duration::from_secs(60), |m| {
        ["0", "1"].iter().all(|id| m.machine(id).unwrap().machine.status == MachineStatus::Error)
    })
    .await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "0"), 2 * 3 + 1);
    assert_eq!(starts_of(&cloud, "1"), 2 + 1);
    let zones = h.handle.zones().await.unwrap();
    assert!(zones.zones.iter().all(|z| z.machines.is_empty() && z.failed.is_empty()), "{zones:?}");
}

/// P36 `TestProvisioningMachinesClearAZFailures`: zones zone1 (holding the controller),
/// zone2 (unavailable), zone3, zone4; retry count 4; three failures: zone3 and zone4 (pop 0)
/// fail, then zone1 fails, marks clear, and the next round succeeds in zone3 or zone4.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn failure_marks_clear_after_every_zone_failed() {
    let config = with_retries(4, Duration::from_millis(5));
    let cloud = zoned_cloud(&[]);
    cloud.set_zones(&["zone1", "zone3", "zone4"], &["zone2"]);
    cloud.launch_aged("i-ctl", Some("zone1"), Some("0"), InstanceState::Running, false, OLD);
    cloud.add_fault(Fault::zone_specific("1", 3, "zing"));
    let mut controller = with_instance("0", "i-ctl");
    controller.status = MachineStatus::Started;
    controller.controller = true;
    let h = Harness::new(config, cloud, FakeModel::new(vec![controller, Machine::pending("1")]));
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["1"])).await;
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 4);
    let zones: Vec<_> = starts.iter().map(|c| c.zone.clone().unwrap()).collect();
    assert_eq!(zones[2], "zone1", "{zones:?}");
    assert!(zones.iter().all(|z| z != "zone2"));
    assert!(matches!(model.machine("1").unwrap().zone.as_deref(), Some("zone3" | "zone4")));
}

/// P37 `TestProvisioningMachinesDerivedAZ`: derived zones restrict placement; a machine whose
/// derived zone does not exist is never started; zone-independent failures use a round.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn derived_zones_restrict_placement() {
    let config = with_retries(2, Duration::from_millis(5));
    let cloud = zoned_cloud(&[]);
    cloud.set_zones(&["zone1", "zone3", "zone4"], &["zone2"]);
    cloud.set_derived_zones("1", &["fail-zone"]);
    cloud.set_derived_zones("2", &["zone4"]);
    cloud.set_derived_zones("3", &["zone1", "zone4"]);
    cloud.set_derived_zones("4", &["zone1"]);
    cloud.set_derived_zones("5", &["zone3"]);
    cloud.add_fault(Fault::zone_specific("2", 3, "zing"));
    cloud.add_fault(Fault::zone_specific("3", 1, "zing"));
    cloud.add_fault(Fault::zone_independent("5", 1, "arf"));
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["1", "2", "3", "4", "5"])));
    let model = h
        .until_model(Duration::from_secs(30), |m| {
            all_provisioned(&["3", "4", "5"])(m)
                && ["1", "2"].iter().all(|id| m.machine(id).unwrap().machine.status == MachineStatus::Error)
        })
        .await;
    let cloud = h.cloud().await;
    assert_eq!(starts_of(&cloud, "1"), 0);
    assert_eq!(
        model.machine("1").unwrap().instance_status_message,
        "suitable availability zone for machine 1 not found"
    );
    assert_eq!(starts_of(&cloud, "2"), 3);
    assert_eq!(starts_of(&cloud, "3"), 2);
    assert_eq!(starts_of(&cloud, "5"), 2);
    assert_eq!(model.machine("4").unwrap().zone.as_deref(), Some("zone1"));
    assert_eq!(model.machine("5").unwrap().zone.as_deref(), Some("zone3"));
    assert!(matches!(model.machine("3").unwrap().zone.as_deref(), Some("zone1" | "zone4")));
}

/// P38 `TestProvisioningMachinesNoZonedEnviron`: a zoneless cloud starts machines
/// without a zone and the zone book stays empty.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zoneless_cloud_starts_without_zones() {
    let h = Harness::new(test_config(), zoneless_cloud(), FakeModel::with_machines(machines(&["0", "1", "2", "3"])));
    h.until_model(Duration::from_secs(10), all_provisioned(&["0", "1", "2", "3"])).await;
    let cloud = h.cloud().await;
    assert!(cloud.calls_of(CloudOp::StartInstance).iter().all(|c| c.zone.is_none()));
    assert!(cloud.calls_of(CloudOp::AvailabilityZones).is_empty());
    assert!(h.handle.zones().await.unwrap().zones.is_empty());
}

/// P30/P31: distribution group members spread over zones (a group of up to three never shares
/// a zone), even when a member fails once.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn distribution_group_members_spread_over_zones() {
    let config = ProvisionerConfig { workers: 1, ..with_retries(2, Duration::ZERO) };
    let groups: [(&str, &[&str]); 5] =
        [("1", &["4", "5"]), ("2", &["3"]), ("3", &["2"]), ("4", &["1", "5"]), ("5", &["1", "4"])];
    let ms = groups
        .iter()
        .map(|(id, g)| {
            let mut m = FakeMachine::new(Machine::pending(*id));
            m.group = Ok(g.iter().map(|x| MachineId::new(*x)).collect());
            m
        })
        .collect();
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.add_fault(Fault::zone_specific("2", 1, "zing"));
    let h = Harness::new(config, cloud, FakeModel::with_machines(ms));
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["1", "2", "3", "4", "5"])).await;
    let zone = |id: &str| model.machine(id).unwrap().zone.clone().unwrap();
    for (id, g) in groups {
        for other in g {
            assert_ne!(zone(id), zone(other), "{id} and {other} share a zone");
        }
    }
    let book = h.handle.zones().await.unwrap();
    assert!(
        book.zones.iter().any(|z| z.failed.contains(&MachineId::new("2"))),
        "machine 2 keeps its failure mark: {book:?}"
    );
}

/// P32 `TestProvisioningMachinesSingleMachineDGFailure`: one machine's distribution
/// group lookup fails: it gets a provisioning error, the others start.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn distribution_group_failure_errors_only_that_machine() {
    let mut ms = machines(&["1", "2", "3", "4", "5"]);
    ms[0].group = Err("machine 1 not found".into());
    let h = Harness::new(test_config(), zoned_cloud(&["az1", "az2", "az3"]), FakeModel::with_machines(ms));
    let model = h
        .until_model(Duration::from_secs(10), |m| {
            all_provisioned(&["2", "3", "4", "5"])(m) && m.machine("1").unwrap().machine.instance_status.is_error()
        })
        .await;
    assert_eq!(model.machine("1").unwrap().instance_status_message, "machine 1 not found");
    assert_eq!(starts_of(&h.cloud().await, "1"), 0);
}

/// P33: a dead machine leaves its zone; the others stay.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn dead_machine_leaves_its_zone() {
    let h = Harness::zoned(test_config(), &["az1", "az2", "az3"], &["1", "2", "3", "4"]);
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&["1", "2", "3", "4"])).await;
    h.model.set_life("1", Life::Dead);
    h.until_model(Duration::from_secs(10), |m| m.machine("1").unwrap().removed).await;
    h.settle().await;
    let book = h.handle.zones().await.unwrap();
    assert_eq!(book.zone_of(&"1".into()), None);
    for id in ["2", "3", "4"] {
        assert_eq!(book.zone_of(&MachineId::new(id)), model.machine(id).unwrap().zone.as_deref());
    }
}

/// P35 (made non-vacuous): after a restart the new allocator counts existing machines in their
/// zones, so new machines still fill the emptiest zone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_populations_survive_a_restart() {
    let h = Harness::zoned(test_config(), &["az1", "az2", "az3"], &["1", "2", "3", "4", "5"]);
    let before = h.until_model(Duration::from_secs(10), all_provisioned(&["1", "2", "3", "4", "5"])).await;
    let counts = zone_counts(&before);
    let emptiest = counts.iter().min_by_key(|(_, c)| **c).map(|(z, _)| z.clone()).unwrap();
    let book_before = h.handle.zones().await.unwrap();
    let h = h.restart(test_config());
    h.settle().await;
    let book_after = h.handle.zones().await.unwrap();
    assert_eq!(book_before, book_after);
    h.model.add_machine(FakeMachine::new(Machine::pending("6")));
    let after = h.until_model(Duration::from_secs(10), all_provisioned(&["6"])).await;
    assert_eq!(after.machine("6").unwrap().zone.as_deref(), Some(emptiest.as_str()));
}

/// T16 `TestUpdatedZonesReflectedInAZMachineSlice` (a zone no longer available is not chosen): the
/// zone list is re-read every resync interval; a zone that became unavailable is never chosen
/// although it holds machines, and a new zone is used.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_list_changes_are_picked_up_and_unavailable_zones_avoided() {
    let config = ProvisionerConfig { resync_interval: Duration::from_secs(60), ..test_config() };
    let h = Harness::zoned(config, &["az1"], &["0"]);
    h.until_model(Duration::from_secs(10), all_provisioned(&["0"])).await;
    h.cloud.set_zones(&["az2", "az3"], &["az1"]);
    h.run_for(Duration::from_secs(61)).await;
    let book = h.handle.zones().await.unwrap();
    let names: Vec<_> = book.zones.iter().map(|z| (z.name.as_str(), z.available)).collect();
    assert_eq!(names, vec![("az1", false), ("az2", true), ("az3", true)]);
    // Enough machines that an unavailable az1 (holding one) would surely get some.
    const NEW: [&str; 9] = ["1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let new = NEW;
    for id in new {
        h.model.add_machine(FakeMachine::new(Machine::pending(id)));
    }
    let model = h.until_model(Duration::from_secs(10), all_provisioned(&NEW)).await;
    for id in new {
        assert_ne!(model.machine(id).unwrap().zone.as_deref(), Some("az1"));
    }
}

/// "Zone reservations are released on every failed attempt": a machine waiting out the retry
/// delay after a zone-independent failure holds no zone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn zone_independent_failure_releases_the_reservation_during_the_retry_delay() {
    // A long delay (jittered in [0, 1000 s]) leaves time to look.
    let config = with_retries(1, Duration::from_secs(1000));
    let cloud = zoned_cloud(&["az1", "az2"]);
    cloud.add_fault(Fault::zone_independent("0", 1, "arf"));
    let h = Harness::new(config, cloud, FakeModel::with_machines(machines(&["0"])));
    h.run_for(Duration::from_secs(5)).await;
    assert_eq!(starts_of(&h.cloud().await, "0"), 1);
    let zones = h.handle.zones().await.unwrap();
    assert!(zones.zones.iter().all(|z| z.machines.is_empty()), "reservation kept during the delay: {zones:?}");
    h.until_model(Duration::from_secs(1000), all_provisioned(&["0"])).await;
}

/// The capacity memory. Machine 0 is pinned to az2; machine 1 then goes to
/// the emptier az1, finds it out of capacity and fails over to az2; machine 2, of the same shape,
/// avoids az1 even though az1 is now the emptiest zone. With the memory off it takes az1, as
/// population says.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_zone_out_of_capacity_is_avoided_by_machines_of_the_same_shape() {
    for (memory, want) in [(Duration::from_secs(180), "az2"), (Duration::ZERO, "az1")] {
        let config = ProvisionerConfig {
            workers: 1,
            capacity_memory: memory,
            retry: RetryStrategy::new(1, Duration::ZERO),
            ..test_config()
        };
        let cloud = zoned_cloud(&["az1", "az2"]);
        cloud.add_fault(Fault {
            zone: Some("az1".into()),
            ..Fault::zone_specific("1", 1, "InsufficientInstanceCapacity")
        });
        let mut ms = machines(&["0", "1", "2"]);
        ms[0].info.constraints.zones = Some(vec!["az2".into()]);
        let h = Harness::new(config, cloud, FakeModel::with_machines(ms));
        let model = h.until_model(Duration::from_secs(10), all_provisioned(&["0", "1", "2"])).await;
        let cloud = h.cloud().await;
        let starts = cloud.calls_of(CloudOp::StartInstance);
        let zones: Vec<_> = starts.iter().map(|c| c.zone.as_deref().unwrap_or_default()).collect();
        assert_eq!(zones[..3], ["az2", "az1", "az2"], "machine 1 failed over from az1");
        assert_eq!(model.machine("1").unwrap().zone.as_deref(), Some("az2"));
        assert_eq!(model.machine("2").unwrap().zone.as_deref(), Some(want), "capacity memory {memory:?}");
    }
}
