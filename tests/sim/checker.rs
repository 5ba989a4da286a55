//! The invariant checker itself: each check flags what it is about.

use std::time::Duration;

use provisioner::model::{InstanceState, InstanceTags};
use provisioner::sim::scenario::Format;
use provisioner::sim::{check, ModeTimeline, Scenario, SIM_MODEL_UUID};
use provisioner::testing::{CallRecord, CloudOp, CloudSnapshot, FakeInstance, ModelSnapshot};
use provisioner::{CloudInstance, HarvestMode, InstanceId};

#[test]
fn invariant_6_flags_an_unknown_instance_stopped_in_mode_destroyed() {
    let s = Scenario::parse("", Format::Toml, "t.toml").unwrap();
    let mut cloud = CloudSnapshot::of([ours("stray", None, InstanceState::Terminated)]);
    cloud.calls.push(stop_call(300, &["stray"]));
    let model = ModelSnapshot::default();
    let v = check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::Destroyed));
    assert!(v.iter().any(|m| m.starts_with("unknown instance stray was stopped")), "{v:?}");
    assert!(check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::All)).is_empty());
}

/// A call at `at_s` seconds that the cloud answered at once, successfully.
fn call(at_s: u64, op: CloudOp, machine: Option<&str>, zone: Option<&str>, instances: &[&str]) -> CallRecord {
    let at = Duration::from_secs(at_s);
    CallRecord {
        at,
        op,
        machine: machine.map(provisioner::MachineId::new),
        zone: zone.map(str::to_owned),
        instances: instances.iter().map(|i| InstanceId::new(*i)).collect(),
        ok: Some(true),
        error: None,
        params: None,
        throttled: false,
        done_at: Some(at),
        instance_type: None,
        failed_types: Vec::new(),
        batch: None,
    }
}

fn start_call(at_s: u64, machine: &str, zone: Option<&str>, instance: &str) -> CallRecord {
    call(at_s, CloudOp::StartInstance, Some(machine), zone, &[instance])
}

fn ours(id: &str, machine: Option<&str>, state: InstanceState) -> (InstanceId, FakeInstance) {
    let tags = InstanceTags {
        model: Some(SIM_MODEL_UUID.into()),
        machine: machine.map(provisioner::MachineId::new),
        start: None,
    };
    let instance = CloudInstance::tagged(InstanceId::new(id), state, tags);
    (InstanceId::new(id), FakeInstance { instance, foreign: false, born: (Duration::ZERO, Duration::ZERO) })
}

fn stop_call(at_s: u64, ids: &[&str]) -> CallRecord {
    call(at_s, CloudOp::StopInstances, None, None, ids)
}

/// An unavailable zone takes no new instance: a start the cloud accepted into a zone that
/// `set_zones` had closed (named in both lists, as the shared bug
/// `fake_cloud_accepts_start_in_unavailable_zone` has it) is a violation; the same start before the
/// change, or into an open zone, is not.
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

/// Instance ids are never reused: a new instance that takes a pre-existing instance's id, or one id
/// handed to two machines, is a violation (the shared bug
/// `fake_cloud_reuses_existing_instance_id`).
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

fn model_of(machines: Vec<provisioner::testing::FakeMachine>) -> ModelSnapshot {
    ModelSnapshot::of(machines.into_iter().map(|m| (m.machine.id.clone(), m)))
}

/// A pending machine of the model.
fn pending(id: &str) -> provisioner::testing::FakeMachine {
    provisioner::testing::FakeMachine::new(provisioner::Machine::pending(id))
}

fn scenario(toml: &str) -> Scenario {
    Scenario::parse(toml, Format::Toml, "t.toml").unwrap()
}

/// No leak: an instance of ours tagged for a live machine that records none (the
/// instance a failed group lookup left unadopted, or an orphan whose stop was fire-and-forget)
/// is a leak.
#[test]
fn a_tagged_instance_of_a_live_machine_nobody_records_is_a_leak() {
    let s = scenario("[[machines]]\nid = \"0\"\n");
    let mut cloud = CloudSnapshot::of([ours("tag-0", Some("0"), InstanceState::Running)]);
    let mut m = pending("0");
    m.machine.status = provisioner::MachineStatus::Error;
    m.machine.instance_status = provisioner::model::InstanceStatus::provisioning_error();
    m.instance_status_message = "group lookup failed".into();
    let v = check(&s, &cloud, &model_of(vec![m.clone()]), &ModeTimeline::new(HarvestMode::Destroyed));
    assert_eq!(v, vec!["instance tag-0 tagged for live machine 0 is recorded by no machine (leaked)".to_string()]);
    // Recorded by its machine, or terminated: no leak.
    let mut adopted = m.clone();
    adopted.machine.instance = Some(InstanceId::new("tag-0"));
    adopted.machine.status = provisioner::MachineStatus::Started;
    assert!(check(&s, &cloud, &model_of(vec![adopted]), &ModeTimeline::new(HarvestMode::Destroyed)).is_empty());
    cloud.instances.extend([ours("tag-0", Some("0"), InstanceState::Terminated)]);
    assert!(check(&s, &cloud, &model_of(vec![m]), &ModeTimeline::new(HarvestMode::Destroyed)).is_empty());
}

/// Invariant 7: a machine that records an instance the provisioner stopped
/// (a restart adopted an instance being stopped) is not provisioned; one terminated out of band
/// is (as for an instance stopped outside our control: it is not replaced).
#[test]
fn invariant_7_counts_a_recorded_instance_we_stopped_as_not_provisioned() {
    let s = scenario("[[machines]]\nid = \"0\"\n");
    let mut cloud = CloudSnapshot::of([ours("i-1", Some("0"), InstanceState::Terminated)]);
    let mut m = pending("0");
    m.machine.instance = Some(InstanceId::new("i-1"));
    m.machine.status = provisioner::MachineStatus::Started;
    let model = model_of(vec![m]);
    let modes = ModeTimeline::new(HarvestMode::Destroyed);
    assert!(check(&s, &cloud, &model, &modes).is_empty(), "terminated out of band");
    cloud.calls.push(stop_call(6, &["i-1"]));
    let v = check(&s, &cloud, &model, &modes);
    assert!(v.iter().any(|m| m.contains("records instance i-1, which the provisioner stopped")), "{v:?}");
}

/// A release is final: the instance of a machine that died in mode none is never
/// stopped, whatever the mode later (the history of modes decides, not the mode at the stop).
#[test]
fn an_instance_whose_machine_died_in_mode_none_is_never_stopped() {
    let s = scenario("[[machines]]\nid = \"0\"\nstatus = \"started\"\ninstance = \"pre-0\"\n");
    let mut cloud = CloudSnapshot::of([ours("pre-0", Some("0"), InstanceState::Terminated)]);
    cloud.calls.push(stop_call(20, &["pre-0"]));
    let mut m = pending("0");
    m.machine.instance = Some(InstanceId::new("pre-0"));
    m.machine.life = provisioner::Life::Dead;
    m.died_at = Some(Duration::from_secs(5));
    m.removed = true;
    m.removed_at = Some(Duration::from_secs(20));
    let model = model_of(vec![m]);
    let mut modes = ModeTimeline::new(HarvestMode::None);
    modes.set(Duration::from_secs(10), HarvestMode::Destroyed);
    let v = check(&s, &cloud, &model, &modes);
    assert_eq!(v, vec!["instance pre-0 of machine 0, which died in mode none, was stopped at 20s".to_string()]);
    // Died in mode destroyed: stopping it is the point.
    assert!(check(&s, &cloud, &model, &ModeTimeline::new(HarvestMode::Destroyed)).is_empty());
}

/// The destruction wins over releases: after a destroy_model nothing of a non-manual machine runs
/// (a start landing at that instant included), and without force the manual machines are named.
#[test]
fn destroy_model_leaves_nothing_running_and_names_manual_machines() {
    let s = scenario(
        "[[machines]]\nid = \"0\"\n[[machines]]\nid = \"1\"\nmanual = true\nstatus = \"started\"\ninstance = \"manual:1\"\n\
         [[events]]\nat = \"1s\"\ndestroy_model = { force = false }\n",
    );
    let mut cloud = CloudSnapshot::of([ours("i-1", Some("0"), InstanceState::Running)]);
    let mut m0 = pending("0");
    m0.machine.instance = Some(InstanceId::new("i-1"));
    let mut m1 = pending("1");
    m1.machine.manual = true;
    let mut model = model_of(vec![m0, m1]);
    model.life = provisioner::Life::Dying;
    let modes = ModeTimeline::new(HarvestMode::Destroyed);
    let v = check(&s, &cloud, &model, &modes);
    assert_eq!(
        v,
        vec![
            "model destroyed at 1s but instance i-1 of machine 0 is running".to_string(),
            "destroy_model at 1s without force left manual machines 1 unnamed in the model's errors".to_string(),
        ]
    );
    cloud.instances.extend([ours("i-1", Some("0"), InstanceState::Terminated)]);
    model.errors.push("manually provisioned machines must first be destroyed: 1".into());
    model.refused_destroys.push(vec![provisioner::MachineId::new("1")]);
    assert!(check(&s, &cloud, &model, &modes).is_empty());
}

/// Capacity types (issue 33): a `spot` machine on on-demand capacity, or an `on-demand`
/// machine on spot, is a violation; a `prefer-spot` machine may have either.
#[test]
fn the_checker_flags_an_instance_on_capacity_its_machine_does_not_allow() {
    use provisioner::model::CapacityType;
    let text = r#"
[[machines]]
id = "0"
capacity = "spot"
[[machines]]
id = "1"
[[machines]]
id = "2"
capacity = "prefer-spot"
"#;
    let s = Scenario::parse(text, Format::Toml, "t.toml").unwrap();
    let model = ModelSnapshot::default();
    let modes = ModeTimeline::new(HarvestMode::Destroyed);
    let on = |id: &str, machine: &str, t: CapacityType| {
        let (id, mut f) = ours(id, Some(machine), InstanceState::Running);
        f.instance.capacity_type = Some(t);
        (id, f)
    };
    let run = |instances: Vec<(InstanceId, FakeInstance)>| {
        let mut cloud = CloudSnapshot::of(instances.clone());
        for (n, (id, f)) in instances.iter().enumerate() {
            let machine = f.instance.tags.machine.as_ref().unwrap().to_string();
            cloud.calls.push(start_call(n as u64, &machine, None, id.as_str()));
        }
        check(&s, &cloud, &model, &modes)
    };
    let v = run(vec![on("i-1", "0", CapacityType::OnDemand), on("i-2", "1", CapacityType::Spot)]);
    assert!(v.iter().any(|m| m == "machine 0 (spot) got instance i-1 on on-demand capacity"), "{v:?}");
    assert!(v.iter().any(|m| m == "machine 1 (on-demand) got instance i-2 on spot capacity"), "{v:?}");
    let v = run(vec![
        on("i-1", "0", CapacityType::Spot),
        on("i-2", "1", CapacityType::OnDemand),
        on("i-3", "2", CapacityType::OnDemand),
    ]);
    assert!(!v.iter().any(|m| m.contains("capacity")), "{v:?}");
}
