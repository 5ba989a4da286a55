use super::state::*;
use crate::model::{
    CloudInstance, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine, MachineId, MachineStatus,
};

fn mid(s: &str) -> MachineId {
    MachineId::new(s)
}

fn iid(s: &str) -> InstanceId {
    InstanceId::new(s)
}

/// A machine with this life, otherwise as `Machine::pending` makes it.
fn machine(id: &str, life: Life) -> Machine {
    Machine { life, ..Machine::pending(id) }
}

/// A machine with this life that has an instance recorded.
fn provisioned(id: &str, life: Life, instance: &str) -> Machine {
    Machine {
        life,
        instance: Some(iid(instance)),
        status: MachineStatus::Started,
        instance_status: InstanceStatus::running(),
        ..Machine::pending(id)
    }
}

/// A machine with this life in provisioning error, with no instance recorded.
fn in_error(id: &str, life: Life) -> Machine {
    Machine { status: MachineStatus::Error, instance_status: InstanceStatus::provisioning_error(), ..machine(id, life) }
}

/// A book whose instance view is `listing` (and nothing else).
fn viewing(listing: Vec<CloudInstance>) -> MachineBook {
    let mut book = MachineBook::new();
    book.load_view(listing);
    book
}

/// A running instance of ours, tagged with `machine` (if any), in `zone` (if any).
fn instance(id: &str, machine: Option<&str>, zone: Option<&str>) -> CloudInstance {
    CloudInstance {
        id: iid(id),
        state: InstanceState::Running,
        zone: zone.map(str::to_owned),
        tags: InstanceTags {
            model: Some("model-uuid".into()),
            machine: machine.map(MachineId::from),
            start: Some("nonce".into()),
        },
        age: None,
        instance_type: None,
        capacity_type: None,
        image: None,
    }
}

fn ids(v: &[&str]) -> Vec<InstanceId> {
    v.iter().map(|s| iid(s)).collect()
}

// ---- classify -------------------------------------------------------------------------------

#[test]
fn classify_dead_machine_is_dead_whatever_else_it_has() {
    assert_eq!(classify(&machine("0", Life::Dead)), Class::Dead);
    assert_eq!(classify(&provisioned("1", Life::Dead, "i-1")), Class::Dead);
    assert_eq!(classify(&Machine { manual: true, ..provisioned("2", Life::Dead, "i-2") }), Class::Dead);
    assert_eq!(classify(&Machine { status: MachineStatus::Error, ..machine("3", Life::Dead) }), Class::Dead);
}

#[test]
fn classify_dying_unprovisioned_machine_is_dying_unprovisioned() {
    assert_eq!(classify(&machine("0", Life::Dying)), Class::DyingUnprovisioned);
    let errored = in_error("1", Life::Dying);
    assert_eq!(classify(&errored), Class::DyingUnprovisioned);
}

#[test]
fn classify_dying_machine_with_instance_needs_nothing() {
    assert_eq!(classify(&provisioned("0", Life::Dying, "i-0")), Class::None);
    // Even one whose status still reads pending.
    let pending_looking = Machine { instance: Some(iid("i-1")), ..machine("1", Life::Dying) };
    assert_eq!(classify(&pending_looking), Class::None);
}

#[test]
fn classify_alive_machine_with_instance_needs_nothing() {
    assert_eq!(classify(&provisioned("0", Life::Alive, "i-0")), Class::None);
    // A pending status does not make a provisioned machine start again.
    let pending_with_instance = Machine { instance: Some(iid("i-1")), ..Machine::pending("1") };
    assert_eq!(pending_with_instance.status, MachineStatus::Pending);
    assert_eq!(classify(&pending_with_instance), Class::None);
    let provisioning_with_instance =
        Machine { instance_status: InstanceStatus::provisioning(), ..pending_with_instance };
    assert_eq!(classify(&provisioning_with_instance), Class::None);
}

#[test]
fn classify_alive_pending_unprovisioned_machine_is_pending() {
    assert_eq!(classify(&Machine::pending("0")), Class::Pending);
    assert_eq!(classify(&Machine::pending("12")), Class::Pending);
}

#[test]
fn scopes_split_top_level_machines_from_containers() {
    use crate::config::Scope;
    let environ = Scope::Environ;
    let lxd0 = Scope::Containers { host: MachineId::new("0"), kind: "lxd".into() };
    assert!(environ.contains(&MachineId::new("3")));
    assert!(!environ.contains(&MachineId::new("0/lxd/1")));
    assert!(lxd0.contains(&MachineId::new("0/lxd/1")));
    assert!(!lxd0.contains(&MachineId::new("0/kvm/1")));
    assert!(!lxd0.contains(&MachineId::new("1/lxd/1")));
    assert!(!lxd0.contains(&MachineId::new("0")));
    // Unknown instances: untagged ones are the environ provisioner's to judge only.
    assert!(environ.judges(None) && !lxd0.judges(None));
    assert!(!environ.judges(Some(&MachineId::new("0/lxd/1"))));
    assert!(lxd0.judges(Some(&MachineId::new("0/lxd/1"))));
}

#[test]
fn container_instances_are_never_unknown_to_the_environ_provisioner() {
    let book = viewing(vec![instance("c-1", Some("0/lxd/1"), None), instance("stray", None, None)]);
    assert_eq!(book.unknown_instances(), Some(vec![InstanceId::new("stray")]));
}

#[test]
fn classify_alive_error_status_with_provisioning_instance_status_is_pending() {
    let m = Machine {
        status: MachineStatus::Error,
        instance_status: InstanceStatus::provisioning(),
        ..Machine::pending("0")
    };
    assert_eq!(classify(&m), Class::Pending);
}

#[test]
fn classify_alive_error_status_with_provisioning_error_is_left_alone() {
    let m = in_error("0", Life::Alive);
    assert_eq!(classify(&m), Class::None);
    // Juju's older spelling of the same thing.
    let old = Machine { instance_status: InstanceStatus::other("error"), ..m };
    assert_eq!(classify(&old), Class::None);
}

#[test]
fn classify_alive_unprovisioned_machine_that_is_neither_pending_nor_provisioning_is_left_alone() {
    let started = Machine { status: MachineStatus::Started, ..Machine::pending("0") };
    assert_eq!(classify(&started), Class::None);
    let stopped = Machine {
        status: MachineStatus::Stopped,
        instance_status: InstanceStatus::other("stopped"),
        ..Machine::pending("1")
    };
    assert_eq!(classify(&stopped), Class::None);
}

#[test]
fn classify_manual_machines_are_never_pending() {
    let manual = Machine { manual: true, ..Machine::pending("0") };
    assert_eq!(classify(&manual), Class::None);
    let provisioning =
        Machine { status: MachineStatus::Error, instance_status: InstanceStatus::provisioning(), ..manual.clone() };
    assert_eq!(classify(&provisioning), Class::None);
}

#[test]
fn classify_dying_manual_machine_is_left_alone() {
    let unprovisioned = Machine { manual: true, ..machine("0", Life::Dying) };
    assert_eq!(classify(&unprovisioned), Class::None);
    let provisioned = Machine { manual: true, ..provisioned("1", Life::Dying, "manual:1") };
    assert_eq!(classify(&provisioned), Class::None);
}

// ---- MachineBook: machines --------------------------------------------------------------------

#[test]
fn upsert_keeps_recorded_instance_over_stale_model_read() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("0"));
    book.record_instance(&mid("0"), instance("i-0", Some("0"), Some("az1")));
    assert_eq!(book.machine(&mid("0")).unwrap().instance, Some(iid("i-0")));

    // A model read that predates the start reports no instance: ours wins.
    book.upsert(Machine::pending("0"));
    let m = book.machine(&mid("0")).unwrap();
    assert_eq!(m.instance, Some(iid("i-0")));
    assert_eq!(classify(m), Class::None, "a machine we started is not started again");
}

#[test]
fn upsert_applies_instance_recorded_before_the_machine_was_cached() {
    let mut book = MachineBook::new();
    book.record_instance(&mid("4"), instance("i-4", Some("4"), None));
    book.upsert(Machine::pending("4"));
    assert_eq!(book.machine(&mid("4")).unwrap().instance, Some(iid("i-4")));
}

#[test]
fn remove_forgets_the_recorded_instance() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("0"));
    book.record_instance(&mid("0"), instance("i-0", None, None));
    book.remove(&mid("0"));
    assert!(book.machine(&mid("0")).is_none());
    book.upsert(Machine::pending("0"));
    assert_eq!(book.machine(&mid("0")).unwrap().instance, None);
}

#[test]
fn upsert_with_new_instance_releases_ownership_of_the_old_one() {
    let mut book = MachineBook::new();
    book.upsert(provisioned("0", Life::Alive, "i-old"));
    book.load_view(vec![instance("i-old", None, None), instance("i-new", None, None)]);
    assert_eq!(book.unknown_instances(), Some(ids(&["i-new"])));
    book.upsert(provisioned("0", Life::Alive, "i-new"));
    assert_eq!(book.unknown_instances(), Some(ids(&["i-old"])));
}

#[test]
fn set_dead_marks_cached_machine_dead() {
    let mut book = MachineBook::new();
    book.upsert(machine("0", Life::Dying));
    book.set_dead(&mid("0"));
    assert_eq!(book.machine(&mid("0")).unwrap().life, Life::Dead);
    assert_eq!(classify(book.machine(&mid("0")).unwrap()), Class::Dead);
}

#[test]
fn machines_iterate_in_id_order() {
    let mut book = MachineBook::new();
    for id in ["2", "0", "1"] {
        book.upsert(Machine::pending(id));
    }
    let order: Vec<&str> = book.machines().map(|m| m.id.as_str()).collect();
    assert_eq!(order, ["0", "1", "2"]);
}

// ---- MachineBook: instance view ---------------------------------------------------------------

#[test]
fn unknown_instances_is_none_before_first_listing() {
    let mut book = MachineBook::new();
    book.record_instance(&mid("0"), instance("i-0", Some("0"), None));
    assert!(!book.loaded_once());
    assert!(!book.is_fresh());
    assert_eq!(book.unknown_instances(), None);
}

#[test]
fn unknown_instances_is_none_after_mark_stale_until_next_listing() {
    let mut book = viewing(vec![instance("i-x", None, None)]);
    assert!(book.loaded_once() && book.is_fresh());
    assert_eq!(book.unknown_instances(), Some(ids(&["i-x"])));

    book.mark_stale();
    assert!(book.loaded_once(), "a failed listing does not undo the first load");
    assert!(!book.is_fresh());
    assert_eq!(book.unknown_instances(), None);

    book.load_view(vec![instance("i-y", None, None)]);
    assert_eq!(book.unknown_instances(), Some(ids(&["i-y"])), "a fresh listing replaces the view");
}

#[test]
fn unknown_excludes_instances_owned_by_cached_machines() {
    let mut book = MachineBook::new();
    // Untagged, so only ownership can exclude it.
    book.upsert(provisioned("0", Life::Alive, "i-0"));
    book.upsert(Machine::pending("1"));
    book.record_instance(&mid("1"), instance("i-1", None, None));
    // Owned by a dead machine: the dead-machine path handles it, not the unknown one.
    book.upsert(provisioned("2", Life::Dead, "i-2"));
    book.load_view(vec![
        instance("i-0", None, None),
        instance("i-1", None, None),
        instance("i-2", None, None),
        instance("i-z", None, None),
    ]);
    assert_eq!(book.unknown_instances(), Some(ids(&["i-z"])));
}

#[test]
fn unknown_excludes_instances_tagged_with_a_live_cached_machine() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("1")); // alive, starting
    book.upsert(machine("2", Life::Dying));
    book.load_view(vec![instance("i-1", Some("1"), None), instance("i-2", Some("2"), None)]);
    assert_eq!(book.unknown_instances(), Some(vec![]));
}

#[test]
fn unknown_includes_instances_tagged_with_uncached_machines_and_untagged_ones() {
    let mut book = MachineBook::new();
    book.upsert(machine("2", Life::Dead));
    book.upsert(Machine::pending("3"));
    book.load_view(vec![
        instance("i-2", Some("2"), None),   // dead machine still known: its own harvest decides
        instance("i-3", Some("3"), None),   // live machine: excluded
        instance("i-9", Some("9"), None),   // machine not cached
        instance("i-x", None, Some("az1")), // no machine tag
    ]);
    assert_eq!(book.unknown_instances(), Some(ids(&["i-9", "i-x"])));
    // Once the dead machine is forgotten, a leftover tagged for it is unknown.
    book.remove(&mid("2"));
    assert_eq!(book.unknown_instances(), Some(ids(&["i-2", "i-9", "i-x"])));
}

#[test]
fn load_view_skips_terminated_instances() {
    let mut book = MachineBook::new();
    let gone = CloudInstance { state: InstanceState::Terminated, ..instance("i-t", Some("9"), None) };
    book.load_view(vec![gone, instance("i-r", Some("9"), None)]);
    assert!(book.instance(&iid("i-t")).is_none());
    assert_eq!(book.unknown_instances(), Some(ids(&["i-r"])));
    assert_eq!(book.adoptable(&mid("9")).map(|i| i.id), Some(iid("i-r")));
}

#[test]
fn adoptable_finds_tagged_free_instance() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("3"));
    let tagged = instance("i-3", Some("3"), Some("az2"));
    book.load_view(vec![tagged.clone(), instance("i-other", Some("4"), None)]);
    assert_eq!(book.adoptable(&mid("3")), Some(tagged));
    assert_eq!(book.adoptable(&mid("5")), None);
}

#[test]
fn adoptable_skips_instance_owned_by_another_machine() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("3"));
    book.upsert(provisioned("7", Life::Alive, "i-3"));
    book.load_view(vec![instance("i-3", Some("3"), None)]);
    assert_eq!(book.adoptable(&mid("3")), None);
}

#[test]
fn adoptable_returns_instance_the_machine_already_owns() {
    let mut book = MachineBook::new();
    book.upsert(Machine::pending("3"));
    book.record_instance(&mid("3"), instance("i-3", Some("3"), None));
    assert_eq!(book.adoptable(&mid("3")).map(|i| i.id), Some(iid("i-3")));
}

#[test]
fn instances_gone_removes_from_view() {
    let mut book =
        viewing(vec![instance("i-a", Some("3"), None), instance("i-b", Some("3"), None), instance("i-c", None, None)]);
    assert_eq!(book.unknown_instances(), Some(ids(&["i-a", "i-b", "i-c"])));

    book.instances_gone(&ids(&["i-a", "i-c", "i-never"]));
    assert!(book.instance(&iid("i-a")).is_none());
    assert!(book.instance(&iid("i-c")).is_none());
    assert_eq!(book.instances().map(|i| i.id.clone()).collect::<Vec<_>>(), ids(&["i-b"]));
    assert_eq!(book.unknown_instances(), Some(ids(&["i-b"])));
    assert_eq!(book.adoptable(&mid("3")).map(|i| i.id), Some(iid("i-b")));

    book.instances_gone(&ids(&["i-b"]));
    assert_eq!(book.adoptable(&mid("3")), None);
    assert_eq!(book.unknown_instances(), Some(vec![]));
}

#[test]
fn placement_returns_zone_only_for_live_machines() {
    let mut book = MachineBook::new();
    book.upsert(provisioned("0", Life::Alive, "i-0"));
    book.upsert(provisioned("1", Life::Dying, "i-1"));
    book.upsert(Machine::pending("2"));
    book.upsert(provisioned("3", Life::Alive, "i-3"));
    book.load_view(vec![
        instance("i-0", Some("0"), Some("az1")),
        instance("i-1", Some("1"), Some("az2")),
        instance("i-3", Some("3"), None),
    ]);

    assert_eq!(book.placement(&mid("0")), Some("az1".to_owned()));
    assert_eq!(book.placement(&mid("1")), Some("az2".to_owned()), "dying is still live");
    assert_eq!(book.placement(&mid("2")), None, "no instance");
    assert_eq!(book.placement(&mid("3")), None, "instance without zone");
    assert_eq!(book.placement(&mid("9")), None, "not cached");

    book.set_dead(&mid("0"));
    assert_eq!(book.placement(&mid("0")), None, "dead machines hold no zone");
}

#[test]
fn absorb_classifies_a_batch_and_sorts_out_reads_that_failed() {
    use crate::ports::ModelError;
    let mut book = viewing(vec![instance("lost", Some("1"), Some("az2"))]);
    let mut dying = Machine::pending("2");
    dying.life = Life::Dying;
    let reads = vec![
        (mid("0"), Ok(Machine::pending("0"))),
        (mid("1"), Ok(Machine::pending("1"))),
        (mid("2"), Ok(dying)),
        (mid("3"), Ok(machine("3", Life::Dead))),
        (mid("4"), Err(ModelError::NotFound(mid("4")))),
        (mid("5"), Err(ModelError::Other("timeout".into()))),
    ];
    let (out, kill) = book.absorb(reads);
    let ids = |v: &[Machine]| v.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&out.pending), vec![mid("0"), mid("1")]);
    assert_eq!(out.dead.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), vec![mid("3")]);
    assert_eq!(kill, vec![mid("2")]);
    assert_eq!(out.gone, vec![mid("4")]);
    assert_eq!(out.retry_later, vec![mid("5")]);
    // Machine 1 adopts the instance tagged for it, and counts in its zone.
    assert_eq!(
        out.adopt.iter().map(|(m, i)| (m.clone(), i.id.clone())).collect::<Vec<_>>(),
        vec![(mid("1"), iid("lost"))]
    );
    assert_eq!(out.placements, vec![(mid("1"), "az2".to_string())]);
    assert!(book.machine(&mid("0")).is_some() && book.machine(&mid("4")).is_none());
}

#[test]
fn killed_machines_are_handed_on_dead_and_failed_kills_are_read_again() {
    use crate::ports::ModelError;
    let mut book = MachineBook::new();
    let mut a = Machine::pending("2");
    a.life = Life::Dying;
    let mut b = Machine::pending("3");
    b.life = Life::Dying;
    let (mut out, kill) = book.absorb(vec![(mid("2"), Ok(a)), (mid("3"), Ok(b))]);
    assert_eq!(kill, vec![mid("2"), mid("3")]);
    book.killed(vec![(mid("2"), Ok(())), (mid("3"), Err(ModelError::Other("timeout".into())))], &mut out);
    assert_eq!(out.dead.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), vec![mid("2")]);
    assert_eq!(book.machine(&mid("2")).map(|m| m.life), Some(Life::Dead));
    assert_eq!(out.retry_later, vec![mid("3")]);
    assert_eq!(book.machine(&mid("3")).map(|m| m.life), Some(Life::Dying), "not dead until its kill succeeds");
}

#[test]
fn status_changes_report_instances_stopped_or_back_or_gone_once() {
    let mut book = MachineBook::new();
    let mut m = Machine::pending("0");
    m.instance = Some(iid("i-0"));
    m.instance_status = crate::model::InstanceStatus::running();
    book.upsert(m);
    book.load_view(vec![instance("i-0", Some("0"), None)]);
    assert!(book.status_changes().is_empty(), "a running instance reported as changed");
    book.load_view(vec![CloudInstance { state: InstanceState::Stopped, ..instance("i-0", Some("0"), None) }]);
    let changes = book.status_changes();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].1.as_str(), "stopped");
    assert!(book.status_changes().is_empty(), "reported twice");
    book.load_view(vec![instance("i-0", Some("0"), None)]);
    assert_eq!(book.status_changes()[0].1.as_str(), "running");
    book.load_view(vec![]);
    assert_eq!(book.status_changes()[0].1.as_str(), "missing");
}

/// Careful harvesting, ages: a reported age is taken as of the listing and grows with the clock;
/// an instance whose age the cloud does not report is aged from its first listing (a later
/// listing does not make it young again); an instance no longer listed is forgotten.
#[test]
fn instance_ages_come_from_the_cloud_or_from_the_first_listing() {
    use std::time::Duration;
    let mut book = MachineBook::new();
    book.set_clock(Duration::from_secs(100));
    let aged = CloudInstance { age: Some(Duration::from_secs(50)), ..instance("reported", None, None) };
    book.load_view(vec![aged.clone(), instance("silent", None, None)]);
    assert_eq!(book.age_of(&iid("reported")), Some(Duration::from_secs(50)));
    assert_eq!(book.age_of(&iid("silent")), Some(Duration::ZERO));
    book.set_clock(Duration::from_secs(130));
    book.load_view(vec![instance("silent", None, None)]);
    assert_eq!(book.age_of(&iid("silent")), Some(Duration::from_secs(30)), "aged from its first listing");
    assert_eq!(book.age_of(&iid("reported")), None, "forgotten once no longer listed");
    let unknown = book.unknown_with_ages().unwrap();
    assert_eq!(unknown, vec![(iid("silent"), Duration::from_secs(30))]);
}

// ---- stops in flight and orphans: never adopted, each stop retried until it succeeds ----------

#[test]
fn an_instance_being_stopped_is_never_adopted_and_its_machine_waits_for_the_stop() {
    let mut book = viewing(vec![instance("i-1", Some("0"), None)]);
    book.stops_planned(&ids(&["i-1"]), None);
    assert_eq!(book.adoptable(&mid("0")), None);
    let (out, _) = book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    assert!(out.adopt.is_empty() && out.pending.is_empty(), "{out:?}");
    assert_eq!(out.retry_later, vec![mid("0")]);
    // The stop is seen through: a new start.
    book.instances_gone(&ids(&["i-1"]));
    let (out, _) = book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    assert_eq!(out.pending.len(), 1);
    assert!(out.retry_later.is_empty());
}

#[test]
fn a_listing_sent_before_a_stop_was_seen_through_does_not_bring_the_instance_back() {
    // Found by the model checker (issue 35): a periodic listing answered while an orphan was
    // still live arrived after its stop was seen through, and the retried machine adopted it.
    let mut book = viewing(Vec::new());
    let lagging = book.issue_listing();
    book.stops_planned(&ids(&["i-1"]), Some(&mid("0")));
    book.instances_gone(&ids(&["i-1"]));
    book.load_listing(vec![instance("i-1", Some("0"), None)], lagging);
    assert_eq!(book.adoptable(&mid("0")), None, "not adopted");
    assert!(book.instance(&iid("i-1")).is_none(), "not in the view");
    // A listing sent after the stop is believed (here: the cloud still shows it).
    let later = book.issue_listing();
    book.load_listing(vec![instance("i-1", Some("0"), None)], later);
    assert!(book.instance(&iid("i-1")).is_some());
}

#[test]
fn a_listing_older_than_the_view_is_not_loaded() {
    let mut book = MachineBook::new();
    let older = book.issue_listing();
    let newer = book.issue_listing();
    book.load_listing(Vec::new(), newer);
    book.load_listing(vec![instance("i-1", Some("0"), None)], older);
    assert!(book.instance(&iid("i-1")).is_none());
}

#[test]
fn a_listing_sent_before_a_machine_got_its_instance_does_not_call_the_instance_missing() {
    let mut book = viewing(Vec::new());
    book.upsert(Machine::pending("0"));
    let lagging = book.issue_listing();
    book.record_instance(&mid("0"), instance("i-1", Some("0"), None));
    book.load_listing(Vec::new(), lagging);
    assert!(book.status_changes().is_empty(), "the listing could not show it");
    book.load_view(Vec::new());
    let changes = book.status_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].1.as_str(), "missing");
}

#[test]
fn a_stop_planned_for_an_unlisted_instance_names_its_machine() {
    let mut book = viewing(Vec::new());
    book.stops_planned(&ids(&["orphan"]), Some(&mid("0")));
    assert!(book.stop_in_flight_for(&mid("0")));
    assert!(!book.stop_in_flight_for(&mid("1")));
    // Planned again without the machine (the harvest's stop job): still known, and cleared
    // once gone.
    book.stops_planned(&ids(&["orphan"]), None);
    assert!(book.stop_in_flight_for(&mid("0")));
    book.instances_gone(&ids(&["orphan"]));
    assert!(!book.stop_in_flight_for(&mid("0")));
}

#[test]
fn an_unrecorded_instance_of_a_machine_in_error_is_an_orphan_to_stop() {
    let mut book = viewing(vec![instance("i-1", Some("0"), None), instance("i-2", Some("1"), None)]);
    let failed = in_error("0", Life::Alive);
    let started_elsewhere = Machine { status: MachineStatus::Started, ..Machine::pending("1") };
    let (out, _) = book.absorb(vec![(mid("0"), Ok(failed)), (mid("1"), Ok(started_elsewhere))]);
    // Machine 0 is in error and records none: its tagged instance is an orphan, not adopted.
    // Machine 1 records none but is not in error: left alone.
    assert_eq!(out.orphans, vec![(mid("0"), iid("i-1"))]);
    assert!(out.adopt.is_empty() && out.pending.is_empty());
    // Once its stop is planned it is not reported again.
    book.stops_planned(&ids(&["i-1"]), None);
    assert!(book.orphans_of(&mid("0"), None).is_empty());
}

#[test]
fn an_unrecorded_instance_of_a_dead_machine_in_error_is_an_orphan_to_stop_and_stays_its_instance() {
    // Seed 4066: a restarted provisioner finds dead machine 0 in provisioning error with the
    // orphan of a failed record still tagged for it (its predecessor's stop lost to the crash).
    let mut book = viewing(vec![instance("i-1", Some("0"), None), instance("i-2", Some("1"), None)]);
    let failed = in_error("0", Life::Dead);
    let dead_fine = Machine { life: Life::Dead, ..Machine::pending("1") };
    let (out, _) = book.absorb(vec![(mid("0"), Ok(failed)), (mid("1"), Ok(dead_fine))]);
    // Machine 0's is an orphan (stopped whatever the mode) and still its dead instance (its
    // removal waits for that stop); machine 1 is not in error: its instance only goes with it.
    assert_eq!(out.orphans, vec![(mid("0"), iid("i-1"))]);
    let tagged: Vec<(MachineId, Vec<InstanceId>)> = out.dead.iter().map(|d| (d.id.clone(), d.tagged.clone())).collect();
    assert_eq!(tagged, vec![(mid("0"), ids(&["i-1"])), (mid("1"), ids(&["i-2"]))]);
    // Once its stop is planned it is not reported again.
    book.stops_planned(&ids(&["i-1"]), None);
    assert!(book.dead_orphans_of(&mid("0")).is_empty());
}

#[test]
fn extra_tagged_instances_of_a_machine_beside_the_one_it_keeps_are_orphans() {
    let mut book = viewing(vec![
        instance("a", Some("0"), None),
        instance("b", Some("0"), None),
        instance("i-9", Some("9"), None),
        instance("x", Some("9"), None),
    ]);
    // Pending machine 0 adopts one and the other is stopped.
    let (out, _) = book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    assert_eq!(out.adopt.iter().map(|(_, i)| i.id.clone()).collect::<Vec<_>>(), ids(&["a"]));
    assert_eq!(out.orphans, vec![(mid("0"), iid("b"))]);
    // Provisioned machine 9 keeps the instance it records.
    let (out, _) = book.absorb(vec![(mid("9"), Ok(provisioned("9", Life::Alive, "i-9")))]);
    assert_eq!(out.orphans, vec![(mid("9"), iid("x"))]);
    // Nothing is an orphan from a stale view.
    book.mark_stale();
    assert!(book.orphans_of(&mid("9"), None).is_empty());
}

#[test]
fn only_live_manual_non_controller_machines_in_scope_block_a_destroy() {
    let scope = crate::config::Scope::Environ;
    let manual = Machine { manual: true, ..Machine::pending("1") };
    assert!(blocks_destroy(&manual, &scope));
    assert!(!blocks_destroy(&Machine { life: Life::Dead, ..manual.clone() }, &scope));
    assert!(!blocks_destroy(&Machine { controller: true, ..manual.clone() }, &scope));
    assert!(!blocks_destroy(&Machine::pending("2"), &scope));
    assert!(!blocks_destroy(&Machine { manual: true, ..Machine::pending("0/lxd/0") }, &scope));
}

#[test]
fn a_machine_whose_tagged_instance_a_dead_machine_still_records_waits_for_it() {
    // A reuse handover a crash interrupted: "i-4" is retagged for 6, still recorded by dead 4.
    let mut book = viewing(vec![instance("i-4", Some("6"), None)]);
    let (_, _) = book.absorb(vec![(mid("4"), Ok(provisioned("4", Life::Dead, "i-4")))]);
    let (out, _) = book.absorb(vec![(mid("6"), Ok(Machine::pending("6")))]);
    assert!(out.pending.is_empty() && out.adopt.is_empty(), "{out:?}");
    assert_eq!(out.retry_later, vec![mid("6")]);
    // Once the dead machine's stop is seen through and it is forgotten, machine 6 starts.
    book.instances_gone(&ids(&["i-4"]));
    book.remove(&mid("4"));
    let (out, _) = book.absorb(vec![(mid("6"), Ok(Machine::pending("6")))]);
    assert_eq!(out.pending.len(), 1);
}

#[test]
fn a_dead_machine_carries_the_unlisted_orphan_whose_stop_is_in_flight() {
    // Its start's record failed: the orphan "i-1" is being stopped, but no listing has shown
    // it. When the machine dies, its dead view names i-1, so the harvest removes the machine
    // only once that stop is seen through (not at once, which a crash losing the stop would
    // turn into a running instance of a removed machine).
    let mut book = viewing(Vec::new());
    book.stops_planned(&ids(&["i-1"]), Some(&mid("0")));
    let (out, _) = book.absorb(vec![(mid("0"), Ok(machine("0", Life::Dead)))]);
    assert_eq!(out.dead.len(), 1, "{out:?}");
    assert_eq!(out.dead[0].tagged, ids(&["i-1"]));
    // Seen through: no longer carried.
    book.instances_gone(&ids(&["i-1"]));
    assert!(book.dead_machine(&mid("0")).unwrap().tagged.is_empty());
}

#[test]
fn a_notification_is_filtered_to_the_books_scope_in_order() {
    let ids = |v: &[&str]| v.iter().map(|s| MachineId::new(*s)).collect::<Vec<_>>();
    let environ = MachineBook::with_scope(crate::config::Scope::Environ);
    assert_eq!(environ.in_scope(ids(&["2", "0/lxd/0", "0", "1/kvm/3"])), ids(&["2", "0"]));
    let lxd =
        MachineBook::with_scope(crate::config::Scope::Containers { host: MachineId::new("0"), kind: "lxd".into() });
    assert_eq!(lxd.in_scope(ids(&["2", "0/lxd/0", "0", "1/lxd/3", "0/kvm/1"])), ids(&["0/lxd/0"]));
}

// ---- extra instances of live machines (issue 32) -------------------------------------------

/// A pending machine 0 whose start recorded `i-b` (zone b).
fn started_in_b() -> MachineBook {
    let mut book = viewing(Vec::new());
    book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    book.record_started(&mid("0"), instance("i-b", Some("0"), Some("b")), None);
    book
}

#[test]
fn an_instance_tagged_for_a_live_machine_beside_its_recorded_one_is_extra_on_a_later_listing() {
    let mut book = started_in_b();
    let listing = vec![instance("i-b", Some("0"), Some("b")), instance("i-a", Some("0"), Some("a"))];
    book.load_view(listing.clone());
    assert_eq!(book.extra_instances(), vec![(mid("0"), iid("i-a"))]);
    // Never from a stale view.
    book.mark_stale();
    assert!(book.extra_instances().is_empty());
    // Not once its stop is decided.
    book.load_view(listing);
    book.stops_planned(&ids(&["i-a"]), None);
    assert!(book.extra_instances().is_empty());
    book.instances_gone(&ids(&["i-a"]));
    assert!(book.extra_instances().is_empty());
}

#[test]
fn a_listing_issued_before_the_machine_got_its_instance_judges_no_extra() {
    let mut book = viewing(Vec::new());
    book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    let early = book.issue_listing();
    book.record_started(&mid("0"), instance("i-b", Some("0"), Some("b")), None);
    // The listing asked for before the record answers after it.
    book.load_listing(vec![instance("i-b", Some("0"), Some("b")), instance("i-a", Some("0"), Some("a"))], early);
    assert!(book.extra_instances().is_empty(), "older than the recorded instance");
    let later = book.issue_listing();
    book.load_listing(vec![instance("i-b", Some("0"), Some("b")), instance("i-a", Some("0"), Some("a"))], later);
    assert_eq!(book.extra_instances(), vec![(mid("0"), iid("i-a"))]);
}

#[test]
fn the_recorded_instance_is_never_extra_whatever_its_state() {
    let mut book = started_in_b();
    // Stopped outside our control (seed 000): still the machine's.
    let stopped = CloudInstance { state: InstanceState::Stopped, ..instance("i-b", Some("0"), Some("b")) };
    book.load_view(vec![stopped]);
    assert!(book.extra_instances().is_empty());
    // Missing from the listing: nothing else is tagged for it.
    book.load_view(Vec::new());
    assert!(book.extra_instances().is_empty());
}

#[test]
fn no_extra_without_a_recorded_instance_nor_for_dead_or_manual_machines_nor_owned_instances() {
    // Pending (a start in flight): its tagged instances are its start's business.
    let mut book = viewing(vec![instance("i-a", Some("0"), None)]);
    book.absorb(vec![(mid("0"), Ok(Machine::pending("0")))]);
    book.load_view(vec![instance("i-a", Some("0"), None)]);
    assert!(book.extra_instances().is_empty());
    // Dead: the harvest takes its strays with it.
    let mut book = viewing(vec![instance("i-1", Some("1"), None), instance("x", Some("1"), None)]);
    book.absorb(vec![(mid("1"), Ok(provisioned("1", Life::Dead, "i-1")))]);
    book.load_view(vec![instance("i-1", Some("1"), None), instance("x", Some("1"), None)]);
    assert!(book.extra_instances().is_empty());
    // Manual.
    let mut book = viewing(Vec::new());
    let manual = Machine { manual: true, ..provisioned("2", Life::Alive, "manual:10.0.0.2") };
    book.absorb(vec![(mid("2"), Ok(manual))]);
    book.load_view(vec![instance("y", Some("2"), None)]);
    assert!(book.extra_instances().is_empty());
    // Recorded by another machine (a reuse hand-over the listing does not show yet): not extra.
    let mut book = started_in_b();
    book.absorb(vec![(mid("5"), Ok(Machine::pending("5")))]);
    book.record_started(&mid("5"), instance("i-p", Some("5"), None), None);
    book.load_view(vec![instance("i-b", Some("0"), Some("b")), instance("i-p", Some("0"), None)]);
    assert!(book.extra_instances().is_empty(), "owned by machine 5");
}
