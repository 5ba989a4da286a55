use super::*;
use crate::types::{Life, Machine, MachineId};

fn book() -> ManagerBook {
    ManagerBook::new(vec!["lxd".into(), "kvm".into()])
}

fn provisioned(id: &str) -> Machine {
    let mut m = Machine::pending(id);
    m.instance = Some(format!("i-{id}").as_str().into());
    m
}

#[test]
fn a_live_host_gets_a_listening_supervisor_per_type() {
    let mut b = book();
    let effects = b.host_seen(&"0".into(), Some(&Machine::pending("0")), None);
    assert_eq!(
        effects,
        vec![
            HostEffect::Supervise { host: "0".into(), kind: "lxd".into(), zone: None },
            HostEffect::Supervise { host: "0".into(), kind: "kvm".into(), zone: None },
        ]
    );
    assert!(b.host_seen(&"0".into(), Some(&Machine::pending("0")), None).is_empty(), "supervisors created twice");
}

#[test]
fn a_provisioned_host_announces_its_zone_once() {
    let mut b = book();
    let effects = b.host_seen(&"0".into(), Some(&provisioned("0")), Some("az2".into()));
    assert!(effects.contains(&HostEffect::Provisioned { host: "0".into(), zone: Some("az2".into()) }));
    assert!(b.provisioned(&"0".into(), Some("az2".into())).is_empty());
    assert_eq!(b.zone_of(&"0".into()), Some(Some("az2".into())));
}

#[test]
fn containers_are_routed_by_host_and_type() {
    let mut b = book();
    b.host_seen(&"0".into(), Some(&provisioned("0")), None);
    let effects = b.containers_seen(&["0/lxd/0".into(), "0/kvm/0".into(), "0/lxd/1".into()]);
    assert_eq!(
        effects,
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
    let mut dead = provisioned("0");
    dead.life = Life::Dead;
    assert_eq!(b.host_seen(&"0".into(), Some(&dead), None), vec![HostEffect::Died("0".into())]);
    assert!(b.host_seen(&"0".into(), None, None).is_empty(), "died twice");
    // A dead host's containers still reach its supervisor (to reap dead ones), and no new
    // supervisor is made for it.
    assert_eq!(
        b.containers_seen(&["0/lxd/5".into()]),
        vec![HostEffect::Route { host: "0".into(), kind: "lxd".into(), ids: vec!["0/lxd/5".into()] }]
    );
    b.host_seen(&"1".into(), Some(&provisioned("1")), None);
    assert_eq!(b.host_seen(&"1".into(), None, None), vec![HostEffect::Died("1".into())]);
}
