//! The store's behaviour suite: each test written once against `&mut dyn StoreBackend` and run
//! on both backends, SQLite (a test each, in memory, below) and PostgreSQL (feature `postgres`:
//! [`BEHAVIOURS`], run by `postgres/tests.rs` on one cluster, a fresh database per test). The
//! tests of what only one backend has are in its own folder (`sqlite/tests.rs`,
//! `postgres/tests.rs`).

use super::backend::StoreBackend;
use super::errors::StoreError;
use super::sqlite::StoreCore;
use crate::model::{
    Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, MachineId, MachineStatus,
};
use crate::ports::ProvisionedInstance;

pub(super) fn ids(v: &[MachineId]) -> Vec<&str> {
    v.iter().map(MachineId::as_str).collect()
}

pub(super) fn tags(uuid: &str, machine: &str) -> InstanceTags {
    InstanceTags { model: Some(uuid.into()), machine: Some(MachineId::new(machine)), start: Some("n".into()) }
}

/// The opening of a group commit's test, on either backend (the group begun): a unit of work
/// that adds machines 0 and 1 and is kept, then one that writes and fails, ended unkept.
pub(super) fn a_good_unit_then_a_failed_one(s: &mut dyn StoreBackend) {
    s.begin_member().unwrap();
    assert_eq!(ids(&s.add_machines(2, None).unwrap()), ["0", "1"]);
    s.end_member(true).unwrap();
    assert!(s.group_has_written());
    // A unit of work that writes, then fails: rolled back alone.
    s.begin_member().unwrap();
    s.add_machines(1, None).unwrap();
    s.set_status(&MachineId::new("9"), MachineStatus::Started, "").unwrap_err();
    s.end_member(false).unwrap();
}

/// A unit of work adding three machines in a group, then the group aborted.
pub(super) fn three_machines_then_abort(s: &mut dyn StoreBackend) {
    s.begin_member().unwrap();
    s.add_machines(3, None).unwrap();
    s.end_member(true).unwrap();
    s.abort_group();
}

fn machines_round_trip_and_ids_are_never_reused(s: &mut dyn StoreBackend) {
    let zones = vec!["az1".to_owned(), "az2".to_owned()];
    let added = s.add_machines(3, Some(&zones)).unwrap();
    assert_eq!(ids(&added), ["0", "1", "2"]);
    assert_eq!(s.take_outbox(), (added.clone(), false));
    let info = s.provisioning_info(&added[..1]).unwrap();
    assert_eq!(info[0].as_ref().unwrap().constraints.zones, Some(zones));

    let m0 = MachineId::new("0");
    s.set_instance_status(&m0, &InstanceStatus::provisioning(), "starting").unwrap();
    let rec = s.machine(&m0).unwrap().unwrap();
    assert_eq!(rec.machine.instance_status, InstanceStatus::provisioning());
    assert_eq!(rec.message(), "starting");
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-1"),
        zone: Some("az2".into()),
        nonce: "machine-0:x".into(),
        display_name: "sim-i-1".into(),
        status: InstanceStatus::running(),
        capacity_type: None,
    };
    s.set_instance_info(&m0, &info).unwrap();
    let rec = s.machine(&m0).unwrap().unwrap();
    assert_eq!(rec.machine.instance, Some(InstanceId::new("i-1")));
    assert_eq!(rec.machine.status, MachineStatus::Started);
    assert_eq!(rec.zone.as_deref(), Some("az2"));
    assert_eq!(rec.message(), "");

    // Removal: dead, then gone; the next id is still new.
    s.remove_machines(std::slice::from_ref(&m0), false, false).unwrap();
    assert_eq!(s.take_outbox().0, vec![m0.clone()]);
    assert_eq!(s.machine(&m0).unwrap().unwrap().machine.life, Life::Dead);
    s.mark_for_removal(&m0).unwrap();
    assert!(s.machine(&m0).unwrap().is_none());
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["3"]);
    assert!(matches!(s.set_status(&m0, MachineStatus::Error, "x"), Err(StoreError::NotFound(_))));
}

fn removal_and_retry_are_all_or_nothing(s: &mut dyn StoreBackend) {
    let added = s.add_machines(2, None).unwrap();
    s.take_outbox();
    let err = s.remove_machines(&[added[0].clone(), MachineId::new("9")], false, false).unwrap_err();
    assert_eq!(err, StoreError::NotFound(MachineId::new("9")));
    assert_eq!(s.machine(&added[0]).unwrap().unwrap().machine.life, Life::Alive, "the first was removed anyway");
    assert_eq!(s.take_outbox().0, Vec::<MachineId>::new());

    // Retry needs a provisioning error.
    assert!(matches!(s.retry_machines(&added[..1]), Err(StoreError::Refused(_))));
    s.set_instance_status(&added[0], &InstanceStatus::provisioning_error(), "no capacity").unwrap();
    s.set_status(&added[0], MachineStatus::Error, "no capacity").unwrap();
    s.retry_machines(&added[..1]).unwrap();
    assert_eq!(s.take_outbox(), (Vec::new(), true));
    assert_eq!(s.transient_errors().unwrap().len(), 1);
    // The provisioner resets it to pending: the retry request ends.
    s.set_status(&added[0], MachineStatus::Pending, "").unwrap();
    assert!(!s.machine(&added[0]).unwrap().unwrap().transient);

    // A second removal needs --force.
    s.remove_machines(&added[1..], true, false).unwrap();
    assert!(s.machine(&added[1]).unwrap().unwrap().machine.keep_instance);
    assert!(matches!(s.remove_machines(&added[1..], false, false), Err(StoreError::Refused(_))));
    s.remove_machines(&added[1..], false, true).unwrap();
}

fn a_dying_model_refuses_machines_and_destroys_once(s: &mut dyn StoreBackend) {
    s.add_machines(2, None).unwrap();
    assert_eq!(s.destroy_model().unwrap().len(), 2);
    assert_eq!(s.model_life().unwrap(), Life::Dying);
    assert_eq!(s.destroy_model().unwrap_err(), StoreError::ModelDying);
    assert_eq!(s.add_machines(1, None).unwrap_err(), StoreError::ModelDying);
}

fn instances_are_idempotent_by_client_token_and_listed_by_model(s: &mut dyn StoreBackend) {
    let (a, new) = s.create_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(new);
    assert_eq!(a.instance.state, InstanceState::Pending);
    let (again, new) = s.create_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(!new);
    assert_eq!(again.instance.id, a.instance.id);
    let (b, _) = s.create_instance("1/n/1", None, &tags("other-model", "1")).unwrap();
    assert_ne!(a.instance.id, b.instance.id);
    assert_eq!(s.pending_instances().unwrap().len(), 2);
    let landed = s.land_instance(&a.instance.id).unwrap().unwrap();
    assert_eq!(landed.instance.state, InstanceState::Running);
    let live = s.live_instances("m").unwrap();
    assert_eq!(live.len(), 1, "only our model's instances are listed");
    assert_eq!(live[0].tags.machine, Some(MachineId::new("0")));
    s.terminate_instances(&[a.instance.id.clone(), InstanceId::new("i-gone")]).unwrap();
    assert!(s.live_instances("m").unwrap().is_empty());
    // A terminated instance does not come back to life when its late landing arrives.
    assert_eq!(s.land_instance(&a.instance.id).unwrap().unwrap().instance.state, InstanceState::Terminated);
    assert!(!s.retag_instance(&a.instance.id, &tags("m", "5")).unwrap());
    s.release_instances(std::slice::from_ref(&b.instance.id)).unwrap();
    assert_eq!(s.instance(&b.instance.id).unwrap().unwrap().instance.tags.model, None);
}

fn settings_round_trip(s: &mut dyn StoreBackend) {
    assert_eq!(s.settings().unwrap().workers, None);
    s.set_workers(4).unwrap();
    s.set_harvest_mode(HarvestMode::All).unwrap();
    let got = s.settings().unwrap();
    assert_eq!((got.workers, got.harvest_mode, got.repair), (Some(4), Some(HarvestMode::All), None));
    use crate::config::repair::{MaxUnhealthy, RepairPolicy};
    let policy = RepairPolicy {
        after: Some(std::time::Duration::from_secs(600)),
        max_unhealthy: MaxUnhealthy::Count(2),
        replace_drifted: true,
        drift_budget: 3,
    };
    s.set_repair(policy).unwrap();
    assert_eq!(s.settings().unwrap().repair, Some(policy));
    let off = RepairPolicy { after: None, max_unhealthy: MaxUnhealthy::Percent(30), ..RepairPolicy::default() };
    s.set_repair(off).unwrap();
    assert_eq!(s.settings().unwrap().repair, Some(off), "off is kept as off");
}

/// The gauges' counts kept as the store writes always equal a full recount,
/// whatever the writes (random ones, from a seeded RNG, failed ones included).
fn counts_kept_as_writes_commit_match_a_full_recount(s: &mut dyn StoreBackend) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
    let statuses = [MachineStatus::Pending, MachineStatus::Started, MachineStatus::Error, MachineStatus::Stopped];
    let mut instances: Vec<InstanceId> = Vec::new();
    let mut most_in_error = 0;
    for step in 0..2_000 {
        let machine = MachineId::new(rng.random_range(0..40u32).to_string());
        // Errors (unknown machines, refusals) are part of the test: they must count nothing.
        let _ = match rng.random_range(0..11) {
            0 => s.add_machines(rng.random_range(1..4), None).map(drop),
            1 => s.set_status(&machine, statuses[rng.random_range(0..statuses.len())], "x"),
            2 => s.set_instance_info(
                &machine,
                &ProvisionedInstance {
                    instance: InstanceId::new(format!("i-{step}")),
                    zone: None,
                    nonce: "n".into(),
                    display_name: String::new(),
                    status: InstanceStatus::running(),
                    capacity_type: None,
                },
            ),
            3 => s.ensure_dead(&machine),
            4 => s.mark_for_removal(&machine),
            5 => s.remove_machines(&[machine.clone(), machine.clone()], rng.random_bool(0.5), rng.random_bool(0.5)),
            6 => s
                .create_instance(&format!("t{}", rng.random_range(0..60u32)), None, &tags("m", machine.as_str()))
                .map(|(r, _)| instances.push(r.instance.id)),
            7 if !instances.is_empty() => {
                let id = instances[rng.random_range(0..instances.len())].clone();
                s.land_instance(&id).map(drop)
            }
            8 if !instances.is_empty() => {
                let id = instances[rng.random_range(0..instances.len())].clone();
                s.terminate_instances(&[id.clone(), id, InstanceId::new("i-gone")])
            }
            9 if step > 1_500 => s.destroy_model().map(drop),
            _ if rng.random_bool(0.5) => s.set_instance_status(&machine, &InstanceStatus::provisioning(), "starting"),
            _ => s.set_instance_status(&machine, &InstanceStatus::provisioning_error(), "no capacity"),
        };
        let recount = s.recount().unwrap();
        assert_eq!(s.counts(), &recount, "after step {step}");
        most_in_error = most_in_error.max(recount.machines_in_error);
    }
    assert!(s.counts().machines_by_status.values().sum::<u64>() > 0);
    assert!(s.counts().instances_by_state.get("terminated").copied().unwrap_or(0) > 0);
    assert_eq!(s.counts().model_life, "dying");
    assert!(most_in_error >= 3, "machines in error were counted: at most {most_in_error}");
}

/// An application's machines are its distribution group; removing it takes them to dead, all
/// at once, and a second one of the same name is refused while it exists.
fn applications_group_their_machines_and_go_with_them(s: &mut dyn StoreBackend) {
    use crate::model::Constraints;
    s.add_machines(1, None).unwrap();
    let c = Constraints::parse("cores=2").unwrap();
    let web = s.add_application("web", 3, &c, Default::default()).unwrap();
    assert_eq!(ids(&web), ["1", "2", "3"]);
    assert!(matches!(s.add_application("web", 1, &c, Default::default()), Err(StoreError::Refused(_))));
    let db = s.add_application("db", 1, &Constraints::default(), Default::default()).unwrap();
    let groups =
        s.distribution_groups(&[web[0].clone(), MachineId::new("0"), db[0].clone(), MachineId::new("9")]).unwrap();
    assert_eq!(groups[0].as_deref().map(ids), Some(vec!["2", "3"]));
    assert_eq!(groups[1], Some(Vec::new()), "a machine of no application has no group");
    assert_eq!(groups[2], Some(Vec::new()));
    assert_eq!(groups[3], None);
    let apps = s.applications().unwrap();
    assert_eq!(apps.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["db", "web"]);
    assert_eq!((apps[1].constraints.cores, ids(&apps[1].machines)), (Some(2), vec!["1", "2", "3"]));
    assert_eq!(s.machine(&web[1]).unwrap().unwrap().application.as_deref(), Some("web"));
    let _ = s.take_outbox();
    assert_eq!(ids(&s.remove_application("web").unwrap()), ["1", "2", "3"]);
    assert_eq!(ids(&s.take_outbox().0), ["1", "2", "3"], "the watcher hears of them");
    assert!(web.iter().all(|m| s.machine(m).unwrap().unwrap().machine.life == Life::Dead));
    assert_eq!(s.remove_application("web"), Err(StoreError::NoApplication("web".into())));
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
    // Its dying machines are no group of a new application of the same name.
    let again = s.add_application("web", 1, &c, Default::default()).unwrap();
    assert_eq!(s.distribution_groups(&again).unwrap()[0], Some(Vec::new()));
    s.destroy_model().unwrap();
    assert_eq!(s.add_application("late", 1, &c, Default::default()), Err(StoreError::ModelDying));
}

/// Containers are numbered per host and type, never reused; a missing or dead host is refused
/// naming the `host` field, and nothing is written (no id is used up).
fn containers_are_numbered_per_host_and_type_on_alive_hosts_only(s: &mut dyn StoreBackend) {
    let hosts = s.add_machines(2, None).unwrap();
    let (h0, h1) = (&hosts[0], &hosts[1]);
    assert_eq!(ids(&s.add_containers(h0, "lxd", 2).unwrap()), ["0/lxd/0", "0/lxd/1"]);
    assert_eq!(ids(&s.add_containers(h0, "kvm", 1).unwrap()), ["0/kvm/0"]);
    assert_eq!(ids(&s.add_containers(h1, "lxd", 1).unwrap()), ["1/lxd/0"]);
    let (changed, _) = s.take_outbox();
    assert_eq!(changed.len(), 6, "the watchers hear of every new machine: {changed:?}");
    let missing = s.add_containers(&MachineId::new("7"), "lxd", 1).unwrap_err();
    assert!(matches!(&missing, StoreError::Invalid { field: "host", .. }), "{missing:?}");
    assert!(missing.to_string().contains("machine 7 does not exist"), "{missing}");
    s.remove_machines(std::slice::from_ref(h1), false, true).unwrap();
    let dead = s.add_containers(h1, "lxd", 1).unwrap_err();
    assert!(matches!(&dead, StoreError::Invalid { field: "host", .. }), "{dead:?}");
    assert_eq!(s.list_machines().unwrap().len(), 6, "nothing written by a refusal");
    // Ids are never reused, and machines keep their own numbering.
    s.ensure_dead(&MachineId::new("0/lxd/1")).unwrap();
    s.mark_for_removal(&MachineId::new("0/lxd/1")).unwrap();
    assert_eq!(ids(&s.add_containers(h0, "lxd", 1).unwrap()), ["0/lxd/2"]);
    assert_eq!(ids(&s.add_machines(1, None).unwrap()), ["2"]);
    // Listed machines first (in id order), then containers in the order they came.
    let listed: Vec<String> = s.list_machines().unwrap().iter().map(|m| m.machine.id.to_string()).collect();
    assert_eq!(listed, ["0", "1", "2", "0/lxd/0", "0/kvm/0", "1/lxd/0", "0/lxd/2"]);
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
}

/// A host with live containers is not removed without force (nothing written); removed with
/// them, or with force, it is.
fn a_host_with_live_containers_is_removed_only_with_them_or_with_force(s: &mut dyn StoreBackend) {
    let hosts = s.add_machines(11, None).unwrap();
    let c = s.add_containers(&hosts[1], "lxd", 2).unwrap();
    s.add_containers(&hosts[10], "lxd", 1).unwrap();
    assert_eq!(ids(&s.live_containers_of(&hosts[1]).unwrap()), ["1/lxd/0", "1/lxd/1"], "10/lxd/0 is not 1's");
    s.take_outbox();
    let e = s.remove_machines(std::slice::from_ref(&hosts[1]), false, false).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("1/lxd/0, 1/lxd/1") && m.contains("--force")), "{e:?}");
    let e = s.remove_machines(&[hosts[1].clone(), c[0].clone()], false, false).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("1/lxd/1") && !m.contains("1/lxd/0")), "{e:?}");
    assert!(s.list_machines().unwrap().iter().all(|m| m.machine.life == Life::Alive), "nothing written");
    assert!(s.take_outbox().0.is_empty());
    // A dead container does not hold its host.
    s.remove_machines(std::slice::from_ref(&c[0]), false, false).unwrap();
    s.remove_machines(&[hosts[1].clone(), c[1].clone()], false, false).unwrap();
    s.remove_machines(std::slice::from_ref(&hosts[10]), false, true).unwrap();
    let live: Vec<String> = s
        .list_machines()
        .unwrap()
        .into_iter()
        .filter(|m| m.machine.life == Life::Alive)
        .map(|m| m.machine.id.to_string())
        .collect();
    assert!(!live.contains(&"1".to_owned()) && !live.contains(&"10".to_owned()), "{live:?}");
    assert!(live.contains(&"10/lxd/0".to_owned()), "the engine takes a dead host's containers to dead: {live:?}");
}

/// A manual machine is registered as Juju's manual provider shows it, takes a machine id, and
/// an address already a live manual machine's is refused.
fn a_manual_machine_is_registered_started_with_its_address(s: &mut dyn StoreBackend) {
    s.add_machines(1, None).unwrap();
    let id = s.add_manual("10.0.0.5").unwrap();
    assert_eq!(id.as_str(), "1");
    let m = s.machine(&id).unwrap().unwrap();
    assert!(m.machine.manual);
    assert_eq!(m.machine.status, MachineStatus::Started);
    assert_eq!(m.machine.instance, Some(InstanceId::new("manual:10.0.0.5")));
    assert_eq!(m.machine.instance_status, InstanceStatus::running());
    assert_eq!(m.address.as_deref(), Some("10.0.0.5"));
    assert_eq!(m.zone, None);
    assert!(!s.machine(&MachineId::new("0")).unwrap().unwrap().machine.manual);
    let e = s.add_manual("10.0.0.5").unwrap_err();
    assert!(matches!(&e, StoreError::Invalid { field: "address", message } if message.contains("machine 1")), "{e:?}");
    assert_eq!(ids(&s.live_manual_machines().unwrap()), ["1"]);
    s.remove_machines(std::slice::from_ref(&id), false, false).unwrap();
    assert!(s.live_manual_machines().unwrap().is_empty(), "a dead one no longer blocks a destruction");
    assert_eq!(s.add_manual("10.0.0.5").unwrap().as_str(), "2", "a dead one's address can be registered again");
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
    s.destroy_model().unwrap();
    assert_eq!(s.add_manual("host-9").unwrap_err(), StoreError::ModelDying);
    assert_eq!(s.add_containers(&MachineId::new("0"), "lxd", 1).unwrap_err(), StoreError::ModelDying);
}

/// Created API tokens: numbered ids, listed oldest first, found by hash (revoked ones too, so
/// that the API can say "revoked"), revoked once (a second revocation keeps the first time),
/// an unknown id refused by name; only the hash is kept.
fn api_tokens_are_kept_as_hashes_and_revoked_once(s: &mut dyn StoreBackend) {
    use crate::service::token::Scope;
    assert!(s.tokens().unwrap().is_empty());
    let a = s.create_token(Scope::ReadOnly, None, "aaaa", "2026-01-01T00:00:00.000Z").unwrap();
    let b = s.create_token(Scope::Admin, Some(("team-a", "uuid-a")), "bbbb", "2026-01-01T00:00:01.000Z").unwrap();
    assert_eq!((a.model.as_deref(), b.model.as_deref()), (None, Some("team-a")));
    assert_eq!((a.model_uuid.as_deref(), b.model_uuid.as_deref()), (None, Some("uuid-a")));
    assert_eq!((a.id.as_str(), a.scope, a.revoked.as_deref()), ("tok-1", Scope::ReadOnly, None));
    assert_eq!((b.id.as_str(), b.scope), ("tok-2", Scope::Admin));
    assert_eq!(s.tokens().unwrap(), [a.clone(), b.clone()]);
    assert_eq!(s.token_by_hash("bbbb").unwrap(), Some(b.clone()));
    assert_eq!(s.token_by_hash("cccc").unwrap(), None);
    let revoked = s.revoke_token("tok-1", "2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(revoked.revoked.as_deref(), Some("2026-01-02T00:00:00.000Z"));
    let again = s.revoke_token("tok-1", "2026-01-03T00:00:00.000Z").unwrap();
    assert_eq!(again, revoked, "a second revocation changes nothing");
    assert_eq!(s.token_by_hash("aaaa").unwrap(), Some(revoked));
    assert_eq!(s.revoke_token("tok-9", "x").unwrap_err(), StoreError::NoToken("tok-9".into()));
    assert!(s.create_token(Scope::Admin, None, "bbbb", "x").is_err(), "a hash is one token's");
    assert_eq!(s.create_token(Scope::Admin, None, "dddd", "x").unwrap().id, "tok-3", "ids are never reused");
    s.destroy_model().unwrap();
    assert_eq!(s.tokens().unwrap().len(), 3, "tokens outlive the model's destruction");
    // A destroyed model's tokens are revoked with it; another model's and every model's stay.
    let c = s.create_token(Scope::ReadOnly, Some(("team-a", "uuid-a")), "eeee", "x").unwrap();
    let d = s.create_token(Scope::ReadOnly, Some(("team-b", "uuid-b")), "ffff", "x").unwrap();
    let gone = s.revoke_model_tokens("team-a", "uuid-a", "2026-01-04T00:00:00.000Z").unwrap();
    assert_eq!(gone.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [b.id.as_str(), c.id.as_str()]);
    assert!(gone.iter().all(|t| t.revoked.as_deref() == Some("2026-01-04T00:00:00.000Z")));
    assert_eq!(s.token_by_hash("ffff").unwrap(), Some(d), "another model's token stays");
    assert_eq!(s.token_by_hash("dddd").unwrap().unwrap().revoked, None, "a token of every model stays");
    assert!(s.revoke_model_tokens("team-a", "uuid-a", "y").unwrap().is_empty(), "once");
}

/// Start intents: kept in the order written, a token written again keeps its first row, a
/// dropped one goes (dropping an unknown token is no error).
fn start_intents_are_kept_until_dropped(s: &mut dyn StoreBackend) {
    assert!(s.start_intents().unwrap().is_empty());
    s.put_start_intent("t-1", &MachineId::new("1"), "{\"a\":1}").unwrap();
    s.put_start_intent("t-2", &MachineId::new("2"), "{\"b\":2}").unwrap();
    s.put_start_intent("t-1", &MachineId::new("1"), "{\"changed\":true}").unwrap();
    assert_eq!(s.start_intents().unwrap(), ["{\"a\":1}", "{\"b\":2}"]);
    s.drop_start_intent("t-1").unwrap();
    s.drop_start_intent("t-9").unwrap();
    assert_eq!(s.start_intents().unwrap(), ["{\"b\":2}"]);
}

/// The machines in error, counted without a scan (SQLite: a partial index; PostgreSQL: a
/// table kept by triggers), are those a scan finds: an error status or a `provisioning error`
/// instance status; a retry or a start takes them out, and so does their removal; machines
/// added are not in error.
fn machines_in_error_are_counted_without_a_scan(s: &mut dyn StoreBackend) {
    let m = s.add_machines(4, None).unwrap();
    assert_eq!(s.machines_in_error().unwrap(), 0);
    s.set_status(&m[0], MachineStatus::Error, "no").unwrap();
    s.set_instance_status(&m[1], &InstanceStatus::provisioning_error(), "capacity").unwrap();
    let scan = |s: &mut dyn StoreBackend| {
        s.list_machines()
            .unwrap()
            .iter()
            .filter(|r| {
                r.machine.status == MachineStatus::Error
                    || r.machine.instance_status == InstanceStatus::provisioning_error()
            })
            .count() as u64
    };
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (2, 2));
    s.set_status(&m[0], MachineStatus::Pending, "").unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (1, 1));
    // In error twice over, then out of one of them: still in error.
    s.set_status(&m[1], MachineStatus::Error, "no").unwrap();
    s.set_instance_status(&m[1], &InstanceStatus::running(), "").unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (1, 1));
    s.ensure_dead(&m[1]).unwrap();
    s.mark_for_removal(&m[1]).unwrap();
    s.add_machines(2, None).unwrap();
    assert_eq!((s.machines_in_error().unwrap(), scan(s)), (0, 0));
}

/// A start's record ([`StoreBackend::record_started_instance`], the model port's one write
/// per start): the machine gets its instance and becomes `started`, its attempt is counted as
/// a success (the last error cleared) and its status counts move; an unknown machine is
/// refused and changes nothing.
fn a_started_instance_is_recorded_with_its_successful_attempt(s: &mut dyn StoreBackend) {
    let m = s.add_machines(2, None).unwrap();
    s.record_start_outcome(&m[0], Some("no capacity in az1")).unwrap();
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-7"),
        zone: Some("az2".into()),
        nonce: "machine-0:n".into(),
        display_name: "sim-i-7".into(),
        status: InstanceStatus::running(),
        capacity_type: None,
    };
    s.record_started_instance(&m[0], &info).unwrap();
    let r = s.machine(&m[0]).unwrap().unwrap();
    assert_eq!(r.machine.instance, Some(InstanceId::new("i-7")));
    assert_eq!(
        (r.machine.status, r.machine.instance_status.clone()),
        (MachineStatus::Started, InstanceStatus::running())
    );
    assert_eq!((r.zone.as_deref(), r.message()), (Some("az2"), ""));
    assert_eq!((r.start_attempts, r.last_start_error), (2, None), "the failed attempt and the success");
    assert_eq!(s.counts().machines_by_status.get("started"), Some(&1));
    assert_eq!(s.counts().machines_by_status.get("pending"), Some(&1));
    let gone = MachineId::new("9");
    assert_eq!(s.record_started_instance(&gone, &info), Err(StoreError::NotFound(gone)));
    assert_eq!(s.machine(&m[1]).unwrap().unwrap().start_attempts, 0);
}

/// Recording an instance alone ([`StoreBackend::set_instance_info`]) does not count a start
/// attempt (nor clear the last error); the model port's record of a start
/// ([`StoreBackend::record_started_instance`]) does.
fn an_instance_recorded_alone_counts_no_start_attempt(s: &mut dyn StoreBackend) {
    let m = s.add_machines(2, None).unwrap();
    s.record_start_outcome(&m[0], Some("no capacity in az1")).unwrap();
    let info = |n: u32| ProvisionedInstance {
        instance: InstanceId::new(format!("i-{n}")),
        zone: Some("az1".into()),
        nonce: format!("machine-{n}:n"),
        display_name: format!("sim-i-{n}"),
        status: InstanceStatus::running(),
        capacity_type: None,
    };
    s.set_instance_info(&m[0], &info(1)).unwrap();
    s.set_instance_info(&m[1], &info(2)).unwrap();
    let attempts = |s: &mut dyn StoreBackend, id: &MachineId| {
        let r = s.machine(id).unwrap().unwrap();
        (r.start_attempts, r.last_start_error)
    };
    assert_eq!(attempts(s, &m[0]), (1, Some("no capacity in az1".to_owned())), "only the failed attempt");
    assert_eq!(attempts(s, &m[1]), (0, None));
    s.record_started_instance(&m[1], &info(3)).unwrap();
    assert_eq!(attempts(s, &m[1]), (1, None), "the start recorded counts one attempt");
    s.record_started_instance(&m[0], &info(4)).unwrap();
    assert_eq!(attempts(s, &m[0]), (2, None), "the success counted, the last error cleared");
}

/// A start without latency creates its instance running (counted as running, never as
/// pending); a repeated client token gets the instance it made as it is, pending or not, and
/// creates nothing.
fn an_instance_created_running_is_counted_running_and_kept_by_its_token(s: &mut dyn StoreBackend) {
    let (a, new) = s.create_running_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert!(new);
    assert_eq!((a.instance.state, a.instance.zone.as_deref()), (InstanceState::Running, Some("az1")));
    assert_eq!(s.instance(&a.instance.id).unwrap().unwrap(), a);
    let (pending, _) = s.create_instance("1/n/1", None, &tags("m", "1")).unwrap();
    let (again, new) = s.create_running_instance("1/n/1", None, &tags("m", "1")).unwrap();
    assert!(!new);
    assert_eq!(again, pending, "the token's instance, still pending");
    let (same, new) = s.create_running_instance("0/n/1", Some("az1"), &tags("m", "0")).unwrap();
    assert_eq!((same, new), (a.clone(), false));
    assert_eq!(s.all_instances().unwrap().len(), 2);
    // A token's repeats take no id: the next new instance's is the next one.
    let (b, _) = s.create_running_instance("2/n/1", None, &tags("m", "2")).unwrap();
    assert_eq!((a.instance.id.as_str(), pending.instance.id.as_str()), ("i-00000001", "i-00000002"));
    assert_eq!(b.instance.id.as_str(), "i-00000003");
    s.terminate_instances(std::slice::from_ref(&b.instance.id)).unwrap();
    let counts = s.counts().clone();
    assert_eq!(counts.instances_by_state.get("running"), Some(&1));
    assert_eq!(counts.instances_by_state.get("pending"), Some(&1));
    assert_eq!(s.recount().unwrap().instances_by_state, counts.instances_by_state);
}

/// The provisioner's lean reads (its machines, what a start needs, a machine's application)
/// answer what the whole record says, for every kind of machine: plain, with constraints and a
/// placement, an application's unit, a container, a manual machine, provisioned, dead; and
/// nothing for a machine that is not there.
fn the_provisioners_lean_reads_match_the_whole_record(s: &mut dyn StoreBackend) {
    use super::records::NewMachine;
    use crate::model::Constraints;
    s.add_machines(1, Some(&["az1".to_owned(), "az3".to_owned()])).unwrap();
    let c = Constraints::parse("arch=arm64 cores=4 mem=8G root-disk=20G spaces=a,b tags=gpu,^slow").unwrap();
    let spec = NewMachine { constraints: c.clone(), placement: Some("zone=az2".into()), ..NewMachine::default() };
    let placed = s.add_new_machines(1, &spec).unwrap();
    let web = s
        .add_application("web", 2, &Constraints::parse("instance-type=m5.large").unwrap(), Default::default())
        .unwrap();
    let containers = s.add_containers(&MachineId::new("0"), "lxd", 1).unwrap();
    let manual = s.add_manual("10.0.0.7").unwrap();
    let info = ProvisionedInstance {
        instance: InstanceId::new("i-3"),
        zone: Some("az1".into()),
        nonce: "n".into(),
        display_name: String::new(),
        status: InstanceStatus::running(),
        capacity_type: None,
    };
    s.record_started_instance(&web[0], &info).unwrap();
    s.remove_machines(std::slice::from_ref(&placed[0]), true, false).unwrap();
    let mut all = s.machine_ids().unwrap();
    assert_eq!(all.len(), 6, "{all:?}");
    assert!(all.contains(&containers[0]) && all.contains(&manual));
    all.push(MachineId::new("99"));
    for id in &all {
        let whole = s.machine(id).unwrap();
        assert_eq!(s.model_machine(id).unwrap(), whole.as_ref().map(|m| m.machine.clone()), "{id}");
        let provisioning = s.machine_provisioning(id).unwrap();
        let expected = whole.as_ref().map(|m| (m.constraints.clone(), m.placement.clone()));
        assert_eq!(provisioning.map(|p| (p.constraints, p.placement)), expected, "{id}");
        assert_eq!(s.machine_application(id).unwrap(), whole.as_ref().map(|m| m.application.clone()), "{id}");
    }
    // The same, many at once (PostgreSQL reads each kind by one statement), in request order.
    all.reverse();
    let wholes: Vec<_> = all.iter().map(|id| s.machine(id).unwrap()).collect();
    let machines: Vec<_> = wholes.iter().map(|w| w.as_ref().map(|m| m.machine.clone())).collect();
    assert_eq!(s.model_machines(&all).unwrap(), machines);
    let infos: Vec<_> =
        s.provisioning_info(&all).unwrap().into_iter().map(|p| p.map(|p| (p.constraints, p.placement))).collect();
    let expected: Vec<_> =
        wholes.iter().map(|w| w.as_ref().map(|m| (m.constraints.clone(), m.placement.clone()))).collect();
    assert_eq!(infos, expected);
    let applications: Vec<_> = wholes.iter().map(|w| w.as_ref().map(|m| m.application.clone())).collect();
    assert_eq!(s.machine_applications(&all).unwrap(), applications);
    let p = s.machine_provisioning(&placed[0]).unwrap().unwrap();
    assert_eq!((p.constraints, p.placement.as_deref()), (c, Some("zone=az2")));
    assert_eq!(s.machine_application(&web[1]).unwrap(), Some(Some("web".into())));
    let m = s.model_machine(&web[0]).unwrap().unwrap();
    assert_eq!((m.instance, m.status), (Some(InstanceId::new("i-3")), MachineStatus::Started));
    assert!(s.model_machine(&manual).unwrap().unwrap().manual);
    let dead = s.model_machine(&placed[0]).unwrap().unwrap();
    assert_eq!((dead.life, dead.keep_instance), (Life::Dead, true));
    // The batched reads (PostgreSQL's in one statement each) answer what the single ones do, in
    // the order asked, a repeated id each time.
    all.insert(0, web[1].clone());
    let one_by_one: Vec<_> = all.iter().map(|id| s.model_machine(id).unwrap()).collect();
    assert_eq!(s.model_machines(&all).unwrap(), one_by_one);
    let one_by_one: Vec<_> = all.iter().map(|id| s.machine_application(id).unwrap()).collect();
    assert_eq!(s.machine_applications(&all).unwrap(), one_by_one);
    let pairs = |v: Vec<Option<crate::model::ProvisioningInfo>>| -> Vec<_> {
        v.into_iter().map(|p| p.map(|p| (p.constraints, p.placement))).collect()
    };
    let one_by_one: Vec<_> = all.iter().map(|id| s.machine_provisioning(id).unwrap()).collect();
    assert_eq!(pairs(s.provisioning_info(&all).unwrap()), pairs(one_by_one));
}

/// The behaviour tests above, each run against SQLite (a test each, in memory) and against
/// PostgreSQL (feature `postgres`: one cluster for the lot, a fresh database per test).
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&mut super::StoreCore::in_memory().unwrap());
                }
            )*
        }
        /// The same tests against PostgreSQL.
        #[cfg(feature = "postgres")]
        pub(super) const BEHAVIOURS: &[(&str, fn(&mut dyn StoreBackend))] = &[$((stringify!($name), $name)),*];
    };
}

on_both_backends!(
    machines_round_trip_and_ids_are_never_reused,
    removal_and_retry_are_all_or_nothing,
    a_dying_model_refuses_machines_and_destroys_once,
    instances_are_idempotent_by_client_token_and_listed_by_model,
    settings_round_trip,
    counts_kept_as_writes_commit_match_a_full_recount,
    applications_group_their_machines_and_go_with_them,
    containers_are_numbered_per_host_and_type_on_alive_hosts_only,
    a_host_with_live_containers_is_removed_only_with_them_or_with_force,
    a_manual_machine_is_registered_started_with_its_address,
    api_tokens_are_kept_as_hashes_and_revoked_once,
    start_intents_are_kept_until_dropped,
    machines_in_error_are_counted_without_a_scan,
    a_started_instance_is_recorded_with_its_successful_attempt,
    an_instance_recorded_alone_counts_no_start_attempt,
    an_instance_created_running_is_counted_running_and_kept_by_its_token,
    the_provisioners_lean_reads_match_the_whole_record,
    machines_are_read_together_in_request_order,
    capacity_preferences_and_what_a_machine_got_round_trip,
    constraints_are_replaced_on_live_machines_only,
    a_machines_trace_context_is_read_with_its_provisioning_info,
);

/// Traces (issue 37): the trace context of the request that added machines is kept with each
/// and read with its provisioning info (one by one and many at once); a container's info
/// carries its host's; machines added untraced have none.
fn a_machines_trace_context_is_read_with_its_provisioning_info(s: &mut dyn StoreBackend) {
    use super::records::NewMachine;
    let traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let spec = NewMachine { trace_parent: Some(traced.into()), ..NewMachine::default() };
    let hosts = s.add_new_machines(2, &spec).unwrap();
    let plain = s.add_new_machines(1, &NewMachine::default()).unwrap();
    let containers = s.add_containers(&hosts[1], "lxd", 1).unwrap();
    let plain_containers = s.add_containers(&plain[0], "lxd", 1).unwrap();
    let ids = [hosts.clone(), plain.clone(), containers.clone(), plain_containers.clone()].concat();
    let expected = [(Some(traced), None), (Some(traced), None), (None, None), (None, Some(traced)), (None, None)];
    let got = |p: &crate::model::ProvisioningInfo| (p.trace_parent.clone(), p.host_trace_parent.clone());
    let many: Vec<_> = s.provisioning_info(&ids).unwrap().iter().map(|p| got(p.as_ref().unwrap())).collect();
    let expected: Vec<_> = expected.iter().map(|(t, h)| (t.map(str::to_owned), h.map(str::to_owned))).collect();
    assert_eq!(many, expected);
    for (id, want) in ids.iter().zip(&expected) {
        assert_eq!(&s.provisioning_info(std::slice::from_ref(id)).unwrap()[0].as_ref().map(got).unwrap(), want, "{id}");
    }
}

/// Capacity (issue 33): a machine's preference is kept (`on-demand` by default), read with its
/// provisioning info, and inherited by an application's units; what its instance runs on is
/// recorded with the instance (not known until then, nor when the cloud does not say).
fn capacity_preferences_and_what_a_machine_got_round_trip(s: &mut dyn StoreBackend) {
    use super::records::NewMachine;
    use crate::model::{CapacityPreference, CapacityType};
    let plain = s.add_machines(1, None).unwrap();
    let spot =
        s.add_new_machines(2, &NewMachine { capacity: CapacityPreference::Spot, ..NewMachine::default() }).unwrap();
    let web =
        s.add_application("web", 2, &Constraints::parse("cores=2").unwrap(), CapacityPreference::PreferSpot).unwrap();
    let rec = |s: &mut dyn StoreBackend, id: &MachineId| s.machine(id).unwrap().unwrap();
    assert_eq!((rec(s, &plain[0]).capacity, rec(s, &plain[0]).capacity_type), (CapacityPreference::OnDemand, None));
    assert_eq!(rec(s, &spot[1]).capacity, CapacityPreference::Spot);
    assert_eq!(rec(s, &web[0]).capacity, CapacityPreference::PreferSpot);
    let info = s.provisioning_info(&[plain[0].clone(), spot[0].clone(), web[1].clone()]).unwrap();
    let prefs: Vec<_> = info.iter().map(|i| i.as_ref().map(|i| i.capacity)).collect();
    assert_eq!(
        prefs,
        [Some(CapacityPreference::OnDemand), Some(CapacityPreference::Spot), Some(CapacityPreference::PreferSpot)]
    );
    let apps = s.applications().unwrap();
    assert_eq!((apps[0].name.as_str(), apps[0].capacity), ("web", CapacityPreference::PreferSpot));
    let started = |n: u32, t: Option<CapacityType>| ProvisionedInstance {
        instance: InstanceId::new(format!("i-{n}")),
        zone: None,
        nonce: format!("n-{n}"),
        display_name: String::new(),
        status: InstanceStatus::running(),
        capacity_type: t,
    };
    s.record_started_instance(&spot[0], &started(1, Some(CapacityType::Spot))).unwrap();
    s.set_instance_info(&web[0], &started(2, Some(CapacityType::OnDemand))).unwrap();
    s.set_instance_info(&plain[0], &started(3, None)).unwrap();
    assert_eq!(rec(s, &spot[0]).capacity_type, Some(CapacityType::Spot));
    assert_eq!(rec(s, &web[0]).capacity_type, Some(CapacityType::OnDemand));
    assert_eq!(rec(s, &plain[0]).capacity_type, None);
    let listed: Vec<_> = s.list_machines().unwrap().into_iter().map(|m| (m.capacity, m.capacity_type)).collect();
    assert_eq!(listed[1], (CapacityPreference::Spot, Some(CapacityType::Spot)));
}

/// A live machine's constraints are replaced (read back by `machine` and the provisioning
/// info, the machine notified, nothing else of it or of another machine changed); an empty set
/// clears them; an unknown machine is not found, a dying, dead or manual one refused, and a
/// refusal writes nothing.
fn constraints_are_replaced_on_live_machines_only(s: &mut dyn StoreBackend) {
    let zones = vec!["az1".to_owned()];
    let added = s.add_machines(3, Some(&zones)).unwrap();
    let (m0, m1, m2) = (added[0].clone(), added[1].clone(), added[2].clone());
    s.set_status(&m2, MachineStatus::Started, "up").unwrap();
    s.take_outbox();
    let before = s.list_machines().unwrap();
    let counts = s.counts().clone();

    let new = Constraints::parse("cores=4 mem=8G zones=az2").unwrap();
    s.set_constraints(&m0, &new).unwrap();
    assert_eq!(s.take_outbox(), (vec![m0.clone()], false), "the machine watcher hears of it");
    let after = s.list_machines().unwrap();
    assert_eq!(after[0].constraints, new);
    assert_eq!(s.provisioning_info(&added[..1]).unwrap()[0].as_ref().unwrap().constraints, new);
    assert_eq!(s.machine_provisioning(&m0).unwrap().unwrap().constraints, new);
    let mut expected = before[0].clone();
    expected.constraints = new.clone();
    expected.zones = new.zones.clone();
    expected.changed_at = after[0].changed_at.clone();
    assert_eq!(after[0], expected, "nothing but its constraints changed");
    assert_eq!(after[1..], before[1..], "no other machine changed");
    assert_eq!(s.counts(), &counts);
    // The same set on another machine shares its row; an empty set clears them (no row).
    s.set_constraints(&m2, &new).unwrap();
    assert_eq!(s.machine(&m2).unwrap().unwrap().constraints, new);
    assert_eq!(s.machine(&m2).unwrap().unwrap().machine.status, MachineStatus::Started);
    s.set_constraints(&m0, &Constraints::default()).unwrap();
    assert_eq!(s.machine(&m0).unwrap().unwrap().constraints, Constraints::default());
    assert_eq!(s.machine(&m2).unwrap().unwrap().constraints, new, "the shared row is kept");
    s.take_outbox();

    // Refusals write nothing.
    let missing = MachineId::new("99");
    assert_eq!(s.set_constraints(&missing, &new).unwrap_err(), StoreError::NotFound(missing));
    s.remove_machines(std::slice::from_ref(&m1), false, false).unwrap();
    s.take_outbox();
    let e = s.set_constraints(&m1, &new).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("machine 1") && m.contains("dead")), "{e:?}");
    assert_eq!(s.machine(&m1).unwrap().unwrap().constraints.zones, Some(zones));
    let manual = s.add_manual("10.0.0.7").unwrap();
    s.take_outbox();
    let e = s.set_constraints(&manual, &new).unwrap_err();
    assert!(matches!(&e, StoreError::Refused(m) if m.contains("manual")), "{e:?}");
    assert_eq!(s.machine(&manual).unwrap().unwrap().constraints, Constraints::default());
    assert_eq!(s.take_outbox(), (Vec::new(), false), "a refusal notifies nothing");
    let recount = s.recount().unwrap();
    assert_eq!(s.counts(), &recount);
}

/// `machines` answers each id asked, in the order asked, a repeated id each time and a missing
/// one as `None` (PostgreSQL reads them in one statement); `distribution_groups` the same.
fn machines_are_read_together_in_request_order(s: &mut dyn StoreBackend) {
    let added = s.add_machines(3, None).unwrap();
    let app = s.add_application("web", 2, &Constraints::default(), Default::default()).unwrap();
    let missing = MachineId::new("99");
    let asked = [added[2].clone(), missing.clone(), added[0].clone(), added[2].clone(), app[1].clone()];
    let read: Vec<Option<String>> =
        s.machines(&asked).unwrap().into_iter().map(|m| m.map(|m| m.machine.id.to_string())).collect();
    assert_eq!(read, [Some("2".to_owned()), None, Some("0".to_owned()), Some("2".to_owned()), Some("4".to_owned())]);
    assert!(s.machines(&[]).unwrap().is_empty());
    let groups = s.distribution_groups(&[app[0].clone(), missing, added[1].clone(), app[1].clone()]).unwrap();
    assert_eq!(groups, [Some(vec![app[1].clone()]), None, Some(Vec::new()), Some(vec![app[0].clone()])]);
}
