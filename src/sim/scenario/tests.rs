//! Unit tests of parsing, the action table and error locations.

use super::*;
use crate::model::{HarvestMode, Life};

fn toml_err(text: &str) -> ScenarioError {
    Scenario::parse(text, Format::Toml, "t.toml").unwrap_err()
}

fn json_err(text: &str) -> ScenarioError {
    Scenario::parse(text, Format::Json, "t.json").unwrap_err()
}

fn every_action() -> Vec<Action> {
    vec![
        Action::AddMachine(Box::new(MachineSpec::pending("9"))),
        Action::SetLife(SetLifeSpec { machine: "0".into(), life: Life::Dead }),
        Action::SetStatus(SetStatusSpec { machine: "0".into(), status: None, instance_status: Some("x".into()) }),
        Action::SetHarvestMode(HarvestMode::All),
        Action::SetWorkers(3),
        Action::RetryProvisioning(vec!["0".into()]),
        Action::SetZones(SetZonesSpec { zones: vec!["az1".into()], unavailable_zones: vec![] }),
        Action::CloudStop("i-1".into()),
        Action::CloudStart("i-1".into()),
        Action::CloudTerminate("i-1".into()),
        Action::CloudLaunch(LaunchSpec { id: "i-2".into(), zone: None, machine: None, foreign: true, age: None }),
        Action::FailNext(FailNextSpec { call: FailCall::Machines, times: 2, message: "no".into() }),
        Action::Restart,
        Action::DestroyModel(DestroyModelSpec { force: true }),
    ]
}

#[test]
fn every_action_survives_a_trip_through_a_toml_file_under_its_own_key() {
    let mut s = Scenario::parse("[[machines]]\nid = \"0\"\n", Format::Toml, "t.toml").unwrap();
    let actions = every_action();
    s.events = actions.iter().map(|a| EventSpec::new(Duration::from_secs(1), a.clone())).collect();
    let text = s.to_toml();
    for a in &actions {
        assert!(text.contains(a.key()), "{} not written:\n{text}", a.key());
    }
    let back = Scenario::parse(&text, Format::Toml, "t.toml").unwrap();
    assert_eq!(back, s);
    let read: Vec<Action> = back.timeline().into_iter().map(|(_, a)| a).collect();
    assert_eq!(read, actions);
}

#[test]
fn an_event_without_exactly_one_action_has_no_action() {
    let none = EventSpec::default();
    assert_eq!(none.action(), Err(EventError::NoAction));
    let mut two = EventSpec::new(Duration::ZERO, Action::Restart);
    two.set_workers = Some(Workers(3));
    assert_eq!(two.action(), Err(EventError::SeveralActions(vec!["set_workers", "restart"])));
    // A scenario built in code with such events runs none of them (never a made-up restart).
    let mut s = Scenario::parse("", Format::Toml, "t.toml").unwrap();
    s.events = vec![none, two, EventSpec::new(Duration::from_secs(2), Action::SetWorkers(4))];
    assert_eq!(s.timeline(), vec![(Duration::from_secs(2), Action::SetWorkers(4))]);
}

#[test]
fn a_duplicate_machine_is_named_at_its_own_line_after_instances_with_ids() {
    // An instance's `id` key comes first in the file: the duplicate is still the machine's.
    let e = toml_err("[[cloud.instances]]\nid = \"i-1\"\n[[machines]]\nid = \"0\"\n[[machines]]\nid = \"0\"\n");
    assert_eq!(e.to_string(), "t.toml:6: id: machine id \"0\" appears twice");
}

#[test]
fn an_added_machine_in_its_own_table_is_located() {
    let text = "[[machines]]\nid = \"0\"\n[[events]]\nat = \"1s\"\n[events.add_machine]\nid = \"0\"\n";
    assert_eq!(toml_err(text).to_string(), "t.toml:5: add_machine: machine id \"0\" already exists");
}

#[test]
fn a_container_is_located_at_its_own_id() {
    // An instance whose id is the same string, earlier in the file, must not be taken for it.
    let text = "[[cloud.instances]]\nid = \"3/lxd/1\"\n[[machines]]\nid = \"0\"\n[[machines]]\nid = \"3/lxd/1\"\n";
    assert_eq!(toml_err(text).to_string(), "t.toml:6: id: container \"3/lxd/1\" names unknown host \"3\"");
}

#[test]
fn json_errors_name_the_line_of_the_value() {
    let text = "{\"machines\": [{\"id\": \"0\"}],\n \"cloud\": {\"faults\": [\n  {\"machine\": \"0\"},\n  {\"machine\": \"6\"}]}}\n";
    assert_eq!(json_err(text).to_string(), "t.json:4: machine: fault names unknown machine \"6\"");
    let text = "{\"machines\": [{\"id\": \"0\"}], \"events\": [\n {\"at\": \"1s\", \"restart\": true},\n {\"at\": \"2s\",\n  \"set_status\": {\n   \"machine\": \"8\"}}]}\n";
    assert_eq!(json_err(text).to_string(), "t.json:5: set_status: unknown machine id \"8\" in event 1 (at 2s)");
    let text = "{\"events\": [{\"at\": \"1s\"},\n {\"at\": \"2s\"}]}\n";
    assert!(json_err(text).to_string().starts_with("t.json:1: events[0]: an event needs exactly one action key"));
}

#[test]
fn parse_errors_name_the_key_before_them() {
    let e = toml_err("[cloud]\nzones = [\n \"a\",\n 3,\n]\n");
    assert_eq!(e.line, Some(4));
    assert_eq!(e.field, "zones: ");
    let e = json_err("{\"machines\": [{\"id\": \"0\"}], \"seed\": \"x\"}");
    assert_eq!((e.line, e.field.as_str()), (Some(1), "seed: "));
}

#[test]
fn a_fault_spec_names_a_bad_field_with_its_line_and_the_shared_fields() {
    let text = "name = \"x\"\n[[machines]]\nid = \"0\"\n[[events]]\nat = \"1s\"\n\
                fail_next = { call = \"machines\", times = 2, mesage = \"x\" }\n";
    assert_eq!(
        toml_err(text).to_string(),
        "t.toml:6: mesage: unknown field `mesage`, expected one of `call`, `times`, `message`"
    );
    let text = "name = \"x\"\n[[machines]]\nid = \"0/lxd/0\"\n[[machines]]\nid = \"0\"\n\
                [[cloud.init_faults]]\nhost = \"0\"\nkind = \"lxd\"\ntimes = \"two\"\n";
    assert_eq!(toml_err(text).to_string(), "t.toml:9: times: invalid type: string \"two\", expected u32");
    let text = "name = \"x\"\n[[machines]]\nid = \"0/lxd/0\"\n[[machines]]\nid = \"0\"\n\
                [[cloud.init_faults]]\nhost = \"0\"\nkind = \"lxd\"\n";
    let s = Scenario::parse(text, Format::Toml, "t.toml").unwrap();
    assert_eq!((s.cloud.init_faults[0].times, s.cloud.init_faults[0].message.as_str()), (1, "injected failure"));
}

#[test]
fn instance_type_faults_are_capacity_faults_and_a_fault_names_something() {
    let ok = "[[machines]]\nid = \"0\"\ncores = 2\nmem_mb = 8192\n[cloud]\nzones = [\"az1\"]\ninstance_type = \"t3.micro\"\n[[cloud.faults]]\ninstance_type = \"t3.large\"\nzone = \"az1\"\n";
    let s = Scenario::parse(ok, Format::Toml, "t.toml").unwrap();
    assert_eq!(s.cloud.faults[0].machine, "");
    assert_eq!(s.cloud.instance_type.as_deref(), Some("t3.micro"));
    assert_eq!((s.machines[0].cores, s.machines[0].mem_mb), (Some(2), Some(8192)));
    let again = Scenario::parse(&s.to_toml(), Format::Toml, "t.toml").unwrap();
    assert_eq!(again.cloud, s.cloud, "round-trips");
    let lost = "[[machines]]\nid = \"0\"\n[[cloud.faults]]\ninstance_type = \"t3.large\"\nlost_response = true\n";
    assert!(toml_err(lost).to_string().contains("instance_type: a fault of an instance type is a capacity fault"));
    let nothing = "[[machines]]\nid = \"0\"\n[[cloud.faults]]\ntimes = 2\n";
    assert!(
        toml_err(nothing).to_string().contains("a fault names a machine, an instance_type, or both"),
        "{}",
        toml_err(nothing)
    );
}

/// A machine can say everything the service's model can: every constraint and a placement
/// (`zone=`, or `subnet=` with `[cloud] subnets`); all optional, round-tripping; a placement
/// that is neither directive is refused at its line.
#[test]
fn machines_take_every_constraint_and_a_placement() {
    let ok = "[[machines]]\nid = \"0\"\narch = \"arm64\"\ncores = 2\nmem_mb = 4096\nroot_disk_mb = 20480\n\
              instance_type = \"t4g.large\"\nspaces = [\"db\"]\ntags = [\"ssd\", \"team=web\"]\nplacement = \"subnet=subnet-a\"\n\
              [[machines]]\nid = \"1\"\n[cloud]\nzones = [\"az1\", \"az2\"]\nsubnets = { subnet-a = [\"az2\"] }\n";
    let s = Scenario::parse(ok, Format::Toml, "t.toml").unwrap();
    let c = s.machines[0].constraints();
    assert_eq!(
        (c.root_disk_mb, c.spaces.clone(), c.tags.clone()),
        (Some(20480), vec!["db".to_owned()], vec!["ssd".to_owned(), "team=web".to_owned()])
    );
    assert_eq!(
        (c.arch.as_deref(), c.cores, c.mem_mb, c.instance_type.as_deref()),
        (Some("arm64"), Some(2), Some(4096), Some("t4g.large"))
    );
    assert_eq!(s.machines[0].placement.as_deref(), Some("subnet=subnet-a"));
    assert_eq!(s.machines[1].constraints(), crate::model::Constraints::default(), "all optional");
    assert_eq!(s.machines[1].placement, None);
    assert_eq!(s.cloud.derived_zones_for("0", Some("subnet=subnet-a")), Ok(vec!["az2".to_owned()]));
    assert_eq!(s.cloud.derived_zones_for("0", Some("zone=az1")), Ok(vec!["az1".to_owned()]));
    assert!(s.cloud.derived_zones_for("0", Some("subnet=nope")).unwrap_err().contains("\"nope\""));
    assert_eq!(s.cloud.derived_zones_for("1", None), Ok(Vec::new()));
    let again = Scenario::parse(&s.to_toml(), Format::Toml, "t.toml").unwrap();
    assert_eq!((again.machines.clone(), again.cloud.clone()), (s.machines.clone(), s.cloud.clone()), "round-trips");
    let bad = "[[machines]]\nid = \"0\"\n\nplacement = \"rack=3\"\n";
    assert_eq!(
        toml_err(bad).to_string(),
        "t.toml:4: placement: invalid placement \"rack=3\": expected zone=ZONE or subnet=SUBNET"
    );
}

#[test]
fn batch_settings_and_partial_launches_are_checked_at_their_line() {
    let ok = "[provisioner]\nbatch_starts = true\nbatch_size = 7\n[[cloud.faults]]\nmachine = \"0\"\npartial = 1\n[[machines]]\nid = \"0\"\n";
    let s = Scenario::parse(ok, Format::Toml, "t.toml").unwrap();
    assert!(s.provisioner.batch_starts);
    assert_eq!((s.provisioner.batch_size, s.cloud.faults[0].partial), (7, Some(1)));
    let defaults = Scenario::parse("[[machines]]\nid = \"0\"\n", Format::Toml, "t.toml").unwrap();
    assert!(!defaults.provisioner.batch_starts, "off by default");
    assert_eq!(defaults.provisioner.batch_size, 100);
    assert!(!defaults.to_toml().contains("batch"), "defaults are not written out");

    let zero = "[provisioner]\nbatch_starts = true\nbatch_size = 0\n";
    assert_eq!(toml_err(zero).to_string(), "t.toml:3: batch_size: batch_size must be between 1 and 1000, got 0");
    let lost = "[[cloud.faults]]\nmachine = \"0\"\npartial = 1\nlost_response = true\n[[machines]]\nid = \"0\"\n";
    assert!(toml_err(lost).to_string().starts_with("t.toml:3: partial: a partial launch is a capacity fault"));
}

#[test]
fn capacity_settings_and_spot_faults_are_checked_at_their_line() {
    use crate::model::{CapacityPreference, UsdPerHour};
    let ok = "[provisioner]\nspot_max_price = 0.05\n[cloud]\nspot_price = 0.02\n[[cloud.faults]]\nspot_capacity = true\nzone = \"az1\"\n[[machines]]\nid = \"0\"\ncapacity = \"prefer-spot\"\n";
    let s = Scenario::parse(ok, Format::Toml, "t.toml").unwrap();
    assert_eq!(s.machines[0].capacity, CapacityPreference::PreferSpot);
    assert_eq!((s.provisioner.spot_max_price, s.cloud.spot_price), (UsdPerHour::new(0.05), UsdPerHour::new(0.02)));
    assert!(s.cloud.faults[0].spot_capacity && s.cloud.faults[0].machine.is_empty(), "no machine needed");
    let again = Scenario::parse(&s.to_toml(), Format::Toml, "t.toml").unwrap();
    assert_eq!(again.machines[0].capacity, CapacityPreference::PreferSpot, "written out and read back");
    let defaults = Scenario::parse("[[machines]]\nid = \"0\"\n", Format::Toml, "t.toml").unwrap();
    assert_eq!(defaults.machines[0].capacity, CapacityPreference::OnDemand);
    assert!(
        !defaults.to_toml().contains("capacity = ") && !defaults.to_toml().contains("spot"),
        "defaults are not written"
    );

    let bad = "[[machines]]\nid = \"0\"\ncapacity = \"cheap\"\n";
    assert!(toml_err(bad).to_string().starts_with("t.toml:3: capacity: unknown variant `cheap`"), "{}", toml_err(bad));
    let price = "[provisioner]\nspot_max_price = -1.0\n";
    assert_eq!(
        toml_err(price).to_string(),
        "t.toml:2: spot_max_price: invalid price -1: expected a number of dollars, 0 or more"
    );
    let lost = "[[cloud.faults]]\nspot_capacity = true\nlost_response = true\n[[machines]]\nid = \"0\"\n";
    assert!(toml_err(lost)
        .to_string()
        .starts_with("t.toml:2: spot_capacity: a spot_capacity fault is a capacity fault"));
}

#[test]
fn a_mutation_of_the_service_protocol_is_refused_where_it_would_change_nothing() {
    let text = "[provisioner]\nmutations = { skip-fence-check = true }\n";
    let e = toml_err(text).to_string();
    assert!(e.starts_with("t.toml:2: mutations: mutation skip-fence-check breaks the service's protocol"), "{e}");
    let ok = "[provisioner]\nmutations = { adopt-while-stopping = true }\n";
    assert!(Scenario::parse(ok, Format::Toml, "t.toml").unwrap().provisioner.mutations.adopt_while_stopping);
}
