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
