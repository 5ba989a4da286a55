//! The invariant checker itself: each check flags what it is about.

use std::time::Duration;

use provisioner::fake::{CallRecord, CloudOp, CloudSnapshot, FakeInstance, ModelSnapshot};
use provisioner::sim::scenario::Format;
use provisioner::sim::{check, ModeTimeline, Scenario, SIM_MODEL_UUID};
use provisioner::types::{InstanceState, InstanceTags};
use provisioner::{CloudInstance, HarvestMode, InstanceId};

#[test]
fn invariant_6_flags_an_unknown_instance_stopped_in_mode_destroyed() {
    let s = Scenario::parse("", Format::Toml, "t.toml").unwrap();
    let id = InstanceId::new("stray");
    let tags = InstanceTags { model: Some(SIM_MODEL_UUID.into()), machine: None, start: None };
    let mut cloud = CloudSnapshot::default();
    let instance = CloudInstance { id: id.clone(), state: InstanceState::Terminated, zone: None, tags, age: None };
    cloud
        .instances
        .insert(id.clone(), FakeInstance { instance, foreign: false, born: (Duration::ZERO, Duration::ZERO) });
    let at = Duration::from_secs(300);
    cloud.calls.push(CallRecord {
        at,
        op: CloudOp::StopInstances,
        machine: None,
        zone: None,
        instances: vec![id],
        ok: Some(true),
        error: None,
        params: None,
        throttled: false,
        done_at: Some(at),
    });
    let model = ModelSnapshot::default();
    let v = check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::Destroyed));
    assert!(v.iter().any(|m| m.starts_with("unknown instance stray was stopped")), "{v:?}");
    assert!(check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::All)).is_empty());
}

fn start_call(at_s: u64, machine: &str, zone: Option<&str>, instance: &str) -> CallRecord {
    let at = Duration::from_secs(at_s);
    CallRecord {
        at,
        op: CloudOp::StartInstance,
        machine: Some(machine.into()),
        zone: zone.map(str::to_owned),
        instances: vec![InstanceId::new(instance)],
        ok: Some(true),
        error: None,
        params: None,
        throttled: false,
        done_at: Some(at),
    }
}

/// Semantics 12: a start the cloud accepted into a zone that `set_zones` had closed (named in
/// both lists, as the shared bug `fake_cloud_accepts_start_in_unavailable_zone` has it) is a
/// violation; the same start before the change, or into an open zone, is not.
#[test]
fn the_checker_flags_a_start_accepted_into_a_closed_zone() {
    let text = r#"
[cloud]
zones = ["az1", "az2"]
[[machines]]
id = "0"
[[events]]
at = "5s"
set_zones = { zones = ["az1", "az2"], unavailable_zones = ["az2"] }
"#;
    let s = Scenario::parse(text, Format::Toml, "t.toml").unwrap();
    let model = ModelSnapshot::default();
    let modes = ModeTimeline::new(HarvestMode::Destroyed);
    let mut cloud = CloudSnapshot::default();
    cloud.calls.push(start_call(20, "0", Some("az2"), "i-1"));
    let v = check(&s, &cloud, &model, &modes);
    assert!(v.iter().any(|m| m.contains("machine 0 was started in zone az2, closed to new instances")), "{v:?}");
    for ok in [start_call(20, "0", Some("az1"), "i-1"), start_call(2, "0", Some("az2"), "i-1")] {
        let mut cloud = CloudSnapshot::default();
        cloud.calls.push(ok);
        let v = check(&s, &cloud, &model, &modes);
        assert!(!v.iter().any(|m| m.contains("closed to new instances")), "{v:?}");
    }
}

/// Semantics 13: a new instance that takes a pre-existing instance's id, or one id handed to
/// two machines, is a violation (the shared bug `fake_cloud_reuses_existing_instance_id`).
#[test]
fn the_checker_flags_a_reused_instance_id() {
    let text = r#"
[[cloud.instances]]
id = "i-1"
machine = "1"
[[machines]]
id = "1"
status = "started"
instance = "i-1"
[[machines]]
id = "2"
[[machines]]
id = "3"
"#;
    let s = Scenario::parse(text, Format::Toml, "t.toml").unwrap();
    let model = ModelSnapshot::default();
    let modes = ModeTimeline::new(HarvestMode::Destroyed);
    let mut cloud = CloudSnapshot::default();
    cloud.calls.push(start_call(0, "2", None, "i-1"));
    let v = check(&s, &cloud, &model, &modes);
    assert!(v.iter().any(|m| m.contains("the id i-1 of an existing instance")), "{v:?}");
    let mut cloud = CloudSnapshot::default();
    cloud.calls.push(start_call(0, "2", None, "i-2"));
    cloud.calls.push(start_call(1, "2", None, "i-2")); // a repeat of one start: fine
    cloud.calls.push(start_call(2, "3", None, "i-2"));
    let v = check(&s, &cloud, &model, &modes);
    assert!(v.iter().any(|m| m.contains("instance id i-2 to machines 2 and 3")), "{v:?}");
    assert_eq!(v.iter().filter(|m| m.contains("i-2")).count(), 1, "{v:?}");
}
