use super::state::*;
use crate::model::{Life, Machine, MachineId};

fn book() -> ManagerBook {
    ManagerBook::new(vec!["lxd".into(), "kvm".into()])
}

fn provisioned(id: &str) -> Machine {
    let mut m = Machine::pending(id);
    m.instance = Some(format!("i-{id}").as_str().into());
    m
}

#[test]
fn a_host_gets_a_supervisor_per_type_with_its_first_container_of_that_type_only() {
    let mut b = book();
    // A host without containers costs no supervisor (a fleet of them costs no actor).
    assert!(b.host_seen(&"0".into(), Some(&Machine::pending("0")), None).is_empty());
    assert!(b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az2".into())).is_empty());
    let effects = b.containers_seen(&["0/lxd/0".into()]);
    assert_eq!(
        effects,
        vec![
            HostEffect::Supervise { host: "0".into(), kind: "lxd".into(), zone: Some(Some("az2".into())), dead: false },
            HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/0".into()] },
        ]
    );
    let again = b.containers_seen(&["0/lxd/1".into(), "0/kvm/0".into()]);
    assert_eq!(
        again,
        vec![
            HostEffect::Supervise { host: "0".into(), kind: "kvm".into(), zone: Some(Some("az2".into())), dead: false },
            HostEffect::Route { host: "0".into(), kind: "kvm".into(), ids: vec!["0/kvm/0".into()] },
            HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/1".into()] },
        ],
        "one supervisor per type, made once"
    );
}

#[test]
fn a_provisioned_host_announces_its_zone_once_to_its_supervisors() {
    let mut b = book();
    b.containers_seen(&["0/lxd/0".into()]);
    let effects = b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az2".into()));
    assert!(effects.contains(&HostEffect::Provisioned { host: "0".into(), zone: Some("az2".into()) }));
    assert!(b.provisioned(&"0".into(), Some("az2".into())).is_empty());
    assert_eq!(b.zone_of(&"0".into()), Some(Some("az2".into())));
    // Without supervisors the zone is only recorded.
    assert!(b.host_seen(&"1".into(), Some(&provisioned("1")), Some("az1".into())).is_empty());
    assert_eq!(b.zone_of(&"1".into()), Some(Some("az1".into())));
}

#[test]
fn containers_are_routed_by_host_and_type() {
    let mut b = book();
    b.host_seen(&"0".into(), Some(&provisioned("0")), None);
    let effects = b.containers_seen(&["0/lxd/0".into(), "0/kvm/0".into(), "0/lxd/1".into()]);
    let routes: Vec<HostEffect> = effects.into_iter().filter(|e| matches!(e, HostEffect::Route { .. })).collect();
    assert_eq!(
        routes,
        vec![
            HostEffect::Route { host: "0".into(), kind: "kvm".into(), ids: vec!["0/kvm/0".into()] },
            HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/0".into(), "0/lxd/1".into()] },
        ]
    );
}

#[test]
fn unsupported_container_types_are_reported_once() {
    let mut b = book();
    let c: MachineId = "0/docker/0".into();
    assert_eq!(b.containers_seen(std::slice::from_ref(&c)), vec![HostEffect::Unsupported(c.clone(), "docker".into())]);
    assert!(b.containers_seen(&[c]).is_empty());
}

#[test]
fn a_dead_or_missing_host_tells_its_supervisors_once() {
    let mut b = book();
    b.host_seen(&"0".into(), Some(&provisioned("0")), None);
    b.containers_seen(&["0/lxd/0".into()]);
    let mut dead = provisioned("0");
    dead.life = Life::Dead;
    assert_eq!(
        b.host_seen(&"0".into(), Some(&dead), None),
        vec![HostEffect::Died("0".into()), HostEffect::EnsureDead(vec!["0/lxd/0".into()])]
    );
    assert!(b.host_seen(&"0".into(), None, None).is_empty(), "died twice");
    // A dead host's containers still reach its supervisor (to reap them), and no new
    // supervisor is made for it; a container added to a dead host dies with it.
    assert_eq!(
        b.containers_seen(&["0/lxd/5".into()]),
        vec![
            HostEffect::EnsureDead(vec!["0/lxd/5".into()]),
            HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/5".into()] }
        ]
    );
    b.host_seen(&"1".into(), Some(&provisioned("1")), None);
    b.containers_seen(&["1/kvm/0".into()]);
    assert_eq!(
        b.host_seen(&"1".into(), None, None),
        vec![HostEffect::Died("1".into()), HostEffect::EnsureDead(vec!["1/kvm/0".into()])]
    );
    // A host without supervisors dies silently.
    b.host_seen(&"2".into(), Some(&provisioned("2")), None);
    assert!(b.host_seen(&"2".into(), None, None).is_empty());
}

fn dead(id: &str) -> Machine {
    let mut m = provisioned(id);
    m.life = Life::Dead;
    m
}

#[test]
fn a_host_that_dies_takes_its_containers_with_it_once() {
    // A host that dies takes its containers with it: they are taken to dead (then reaped by the
    // supervisors).
    let mut b = book();
    b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az1".into()));
    b.containers_seen(&["0/lxd/0".into(), "0/kvm/1".into()]);
    assert_eq!(
        b.host_seen(&"0".into(), Some(&dead("0")), None),
        vec![HostEffect::Died("0".into()), HostEffect::EnsureDead(vec!["0/kvm/1".into(), "0/lxd/0".into()])]
    );
    // Their own death notifications are routed (to be reaped), not killed again.
    assert_eq!(
        b.containers_seen(&["0/lxd/0".into()]),
        vec![HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/0".into()] }]
    );
}

#[test]
fn a_restarted_manager_finding_a_dead_host_makes_reaping_supervisors() {
    // After a restart the first notification carries the dead host and its live container;
    // the host is read after the containers were seen.
    let mut b = book();
    let seen = b.containers_seen(&["0/lxd/0".into()]);
    assert!(seen.contains(&HostEffect::Supervise { host: "0".into(), kind: "lxd".into(), zone: None, dead: false }));
    assert_eq!(
        b.host_seen(&"0".into(), Some(&dead("0")), None),
        vec![HostEffect::Died("0".into()), HostEffect::EnsureDead(vec!["0/lxd/0".into()])]
    );
    // A host first seen dead (no container yet) gets dead supervisors with its first container.
    let mut b = book();
    assert!(b.host_seen(&"1".into(), None, None).is_empty());
    assert_eq!(
        b.containers_seen(&["1/kvm/0".into()]),
        vec![
            HostEffect::Supervise { host: "1".into(), kind: "kvm".into(), zone: None, dead: true },
            HostEffect::EnsureDead(vec!["1/kvm/0".into()]),
            HostEffect::Route { host: "1".into(), kind: "kvm".into(), ids: vec!["1/kvm/0".into()] },
        ]
    );
}

#[test]
fn unprovisioned_hosts_with_waiting_containers_are_read_again() {
    let mut b = book();
    b.host_seen(&"0".into(), Some(&Machine::pending("0")), None);
    b.host_seen(&"1".into(), Some(&Machine::pending("1")), None);
    assert!(b.waiting_hosts().is_empty(), "a host without containers is worth no read");
    b.containers_seen(&["0/lxd/0".into()]);
    assert_eq!(b.waiting_hosts(), vec![MachineId::from("0")]);
    b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az1".into()));
    assert!(b.waiting_hosts().is_empty(), "a provisioned host was read again");
}

/// The waiting hosts are kept as the hosts change (asked after every pass, they must not walk
/// every host): after any sequence of host reads, provisionings, deaths and containers, the kept
/// set is what a walk of every host finds.
#[test]
fn the_waiting_hosts_kept_match_a_walk_of_every_host() {
    use rand::{Rng, SeedableRng};
    for seed in 0..20 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut b = book();
        for step in 0..400 {
            let host = format!("{}", rng.random_range(0..12));
            let id = MachineId::from(host.as_str());
            match rng.random_range(0..6) {
                0 => drop(b.host_seen(&id, Some(&Machine::pending(host.as_str())), None)),
                1 => drop(b.host_seen(&id, Some(&provisioned(host.as_str())), Some("az1".into()))),
                2 => drop(b.provisioned(&id, None)),
                3 if rng.random_bool(0.3) => {
                    let mut dead = Machine::pending(host.as_str());
                    dead.life = Life::Dead;
                    drop(b.host_seen(&id, if rng.random_bool(0.5) { Some(&dead) } else { None }, None));
                }
                _ => {
                    let kind = if rng.random_bool(0.8) { "lxd" } else { "unknown" };
                    let container = MachineId::from(format!("{host}/{kind}/{}", rng.random_range(0..3)).as_str());
                    drop(b.containers_seen(&[container]));
                }
            }
            assert_eq!(b.waiting_hosts(), b.waiting_hosts_by_scan(), "seed {seed}, step {step}");
        }
    }
}

/// A machine without containers costs no read and no entry: only hosts with containers are
/// read when they change, and a host is read (once) when its first container comes.
#[test]
fn only_hosts_with_containers_are_read_and_a_first_container_has_its_host_read() {
    let mut b = book();
    let ids = |v: &[&str]| v.iter().map(|s| MachineId::from(*s)).collect::<Vec<_>>();
    assert!(b.hosts_to_read(ids(&["0", "1", "2"])).is_empty(), "no host has containers");
    // Our own start of a host without containers is not recorded either.
    assert!(b.provisioned(&"0".into(), Some("az1".into())).is_empty());
    assert_eq!(b.zone_of(&"0".into()), None);
    // Its first container: the host is read, even though it did not change.
    b.containers_seen(&ids(&["0/lxd/0"]));
    assert_eq!(b.hosts_to_read(ids(&["2"])), ids(&["0"]));
    assert!(b.hosts_to_read(Vec::new()).is_empty(), "read once");
    // A second container does not ask again; a change of the host does.
    b.containers_seen(&ids(&["0/lxd/1"]));
    assert!(b.hosts_to_read(ids(&["1"])).is_empty());
    assert_eq!(b.hosts_to_read(ids(&["0", "1"])), ids(&["0"]));
    // The read tells the zone, to the supervisor made with the first container.
    let effects = b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az1".into()));
    assert_eq!(effects, vec![HostEffect::Provisioned { host: "0".into(), zone: Some("az1".into()) }]);
    // A host that died without containers is found dead when its first container comes.
    b.containers_seen(&ids(&["3/lxd/0"]));
    assert_eq!(b.hosts_to_read(Vec::new()), ids(&["3"]));
    let effects = b.host_seen(&"3".into(), None, None);
    assert!(effects.contains(&HostEffect::EnsureDead(ids(&["3/lxd/0"]))), "{effects:?}");
}
