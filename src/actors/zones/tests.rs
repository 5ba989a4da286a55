use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use super::state::*;
use crate::actors::workers::{Attempts, FailureKind, Step};
use crate::model::{FailOutcome, MachineId};

fn mid(s: &str) -> MachineId {
    MachineId::new(s)
}

/// A book whose zones are all listed and available.
fn book(seed: u64, zones: &[&str]) -> ZoneBook {
    let mut b = ZoneBook::new(seed);
    b.update_zones(&zones.iter().map(|z| ((*z).to_owned(), true)).collect::<Vec<_>>());
    b
}

fn any() -> ZoneRequest {
    ZoneRequest::default()
}

fn allowed(zones: &[&str]) -> ZoneRequest {
    ZoneRequest { allowed: Some(zones.iter().map(|z| (*z).to_owned()).collect()), ..ZoneRequest::default() }
}

fn derived(zones: &[&str]) -> ZoneRequest {
    ZoneRequest { derived: zones.iter().map(|z| (*z).to_owned()).collect(), ..ZoneRequest::default() }
}

fn choose(b: &mut ZoneBook, machine: &str, req: ZoneRequest) -> String {
    b.choose(&mid(machine), req).expect("a suitable zone").expect("a zoned cloud")
}

/// Zone name → number of machines placed there.
fn populations(b: &ZoneBook) -> BTreeMap<String, usize> {
    b.view().into_iter().map(|z| (z.name, z.machines.len())).collect()
}

fn zone_names(b: &ZoneBook) -> Vec<String> {
    b.view().into_iter().map(|z| z.name).collect()
}

#[test]
fn zoneless_book_returns_no_zone() {
    let mut b = ZoneBook::new(7);
    assert!(!b.is_zoned());
    assert_eq!(b.choose(&mid("0"), any()), Ok(None));
    assert_eq!(b.choose(&mid("1"), allowed(&["az1"])), Ok(None), "constraints do not matter without zones");
    assert_eq!(b.zone_of(&mid("0")), None);
}

#[test]
fn zone_choice_prefers_lowest_population() {
    for seed in 0..20 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        b.populate(&[(mid("a"), "az1".into()), (mid("b"), "az1".into()), (mid("c"), "az3".into())]);
        assert_eq!(choose(&mut b, "0", any()), "az2", "seed {seed}");
        // az2 and az3 now hold one machine each, az1 two: az1 is never the pick.
        let next = choose(&mut b, "1", any());
        assert!(next == "az2" || next == "az3", "seed {seed}: chose {next}");
        assert_ne!(next, "az1");
    }
}

#[test]
fn zone_ties_are_broken_by_the_seeded_rng_reproducibly() {
    let run = |seed: u64| -> Vec<String> {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        (0..9).map(|i| choose(&mut b, &i.to_string(), any())).collect()
    };
    for seed in 0..10 {
        assert_eq!(run(seed), run(seed), "seed {seed} must reproduce its choices");
    }
    // The tie-break really is random: over several seeds the first pick of a 3-way tie varies.
    let firsts: BTreeSet<String> = (0..32).map(|seed| run(seed)[0].clone()).collect();
    assert!(firsts.len() > 1, "first choice never varies with the seed: {firsts:?}");
    let sequences: BTreeSet<Vec<String>> = (0..32).map(run).collect();
    assert!(sequences.len() > 1);
}

#[test]
fn zone_spread_over_many_machines_is_even() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        for i in 0..9 {
            choose(&mut b, &i.to_string(), any());
        }
        let expected: BTreeMap<String, usize> = ["az1", "az2", "az3"].iter().map(|z| ((*z).to_owned(), 3)).collect();
        assert_eq!(populations(&b), expected, "seed {seed}");
    }
}

#[test]
fn zone_choice_records_the_placement() {
    let mut b = book(1, &["az1", "az2"]);
    let z = choose(&mut b, "0", any());
    assert_eq!(b.zone_of(&mid("0")), Some(z.as_str()));
    let view = b.view();
    let holder = view.iter().find(|v| v.name == z).unwrap();
    assert_eq!(holder.machines, vec![mid("0")]);
}

#[test]
fn rechoosing_a_machine_moves_it_rather_than_counting_it_twice() {
    let mut b = book(3, &["az1", "az2"]);
    for _ in 0..5 {
        choose(&mut b, "0", any());
    }
    assert_eq!(populations(&b).values().sum::<usize>(), 1);
}

#[test]
fn zone_choice_respects_zones_constraint() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        // az3 is the most populated, but it is the only one allowed.
        b.populate(&[(mid("a"), "az3".into()), (mid("b"), "az3".into())]);
        assert_eq!(choose(&mut b, "0", allowed(&["az3"])), "az3");
        // az1 is empty, but not allowed.
        for i in 1..7 {
            let z = choose(&mut b, &i.to_string(), allowed(&["az2", "az3"]));
            assert_ne!(z, "az1", "seed {seed}");
        }
    }
}

#[test]
fn zone_constraint_naming_no_known_zone_finds_nothing() {
    let mut b = book(0, &["az1", "az2"]);
    assert_eq!(b.choose(&mid("0"), allowed(&["az9"])), Err(ZoneError::NoSuitableZone(mid("0"))));
    assert_eq!(b.zone_of(&mid("0")), None);
}

#[test]
fn zone_choice_respects_derived_zones() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        b.populate(&[(mid("a"), "az2".into())]);
        assert_eq!(choose(&mut b, "0", derived(&["az2"])), "az2", "seed {seed}");
        for i in 1..5 {
            let z = choose(&mut b, &i.to_string(), derived(&["az2", "az3"]));
            assert_ne!(z, "az1");
        }
    }
}

#[test]
fn zone_choice_needs_both_constraint_and_derived_zones() {
    let mut b = book(0, &["az1", "az2", "az3"]);
    let both = ZoneRequest {
        allowed: Some(vec!["az1".into(), "az2".into()]),
        derived: vec!["az2".into(), "az3".into()],
        group: None,
        shape: None,
    };
    assert_eq!(choose(&mut b, "0", both), "az2");
    let disjoint =
        ZoneRequest { allowed: Some(vec!["az1".into()]), derived: vec!["az2".into()], group: None, shape: None };
    assert_eq!(b.choose(&mid("1"), disjoint), Err(ZoneError::NoSuitableZone(mid("1"))));
}

#[test]
fn unavailable_zone_is_never_chosen() {
    let mut b = ZoneBook::new(0);
    b.update_zones(&[("az1".into(), true), ("az2".into(), false)]);
    for i in 0..6 {
        assert_eq!(choose(&mut b, &i.to_string(), any()), "az1");
    }
    assert_eq!(b.choose(&mid("x"), allowed(&["az2"])), Err(ZoneError::NoSuitableZone(mid("x"))));
    let az2 = b.view().into_iter().find(|z| z.name == "az2").unwrap();
    assert!(!az2.available);
    assert!(az2.machines.is_empty());
}

#[test]
fn unavailable_zone_holding_machines_is_kept_but_never_chosen() {
    let mut b = book(0, &["az1", "az2"]);
    b.populate(&[(mid("a"), "az2".into()), (mid("b"), "az1".into()), (mid("c"), "az1".into())]);
    // az2 goes unavailable while it holds machines, and while it is the less populated zone.
    b.update_zones(&[("az1".into(), true), ("az2".into(), false)]);
    assert_eq!(zone_names(&b), ["az1", "az2"]);
    for i in 0..6 {
        assert_eq!(choose(&mut b, &i.to_string(), any()), "az1");
    }
    assert_eq!(b.zone_of(&mid("a")), Some("az2"), "machines already there stay counted there");
}

#[test]
fn update_zones_keeps_unlisted_zone_holding_machines_but_never_chooses_it() {
    let mut b = book(0, &["az1", "az2"]);
    b.populate(&[(mid("a"), "az2".into())]);
    b.update_zones(&[("az1".into(), true)]);

    let view = b.view();
    let az2 = view.iter().find(|z| z.name == "az2").expect("az2 kept: it holds a machine");
    assert!(!az2.available);
    assert_eq!(az2.machines, vec![mid("a")]);
    assert_eq!(b.zone_of(&mid("a")), Some("az2"));

    // az1 gets busier than az2, yet az2 is never chosen.
    for i in 0..5 {
        assert_eq!(choose(&mut b, &i.to_string(), any()), "az1");
    }
    assert_eq!(b.choose(&mid("x"), allowed(&["az2"])), Err(ZoneError::NoSuitableZone(mid("x"))));
}

#[test]
fn update_zones_drops_empty_unlisted_zone() {
    let mut b = book(0, &["az1", "az2", "az3"]);
    b.populate(&[(mid("a"), "az3".into())]);
    b.update_zones(&[("az1".into(), true)]);
    assert_eq!(zone_names(&b), ["az1", "az3"]);
}

#[test]
fn update_zones_adds_new_zones_empty_and_usable() {
    let mut b = book(0, &["az1"]);
    b.populate(&[(mid("a"), "az1".into())]);
    b.update_zones(&[("az1".into(), true), ("az2".into(), true)]);
    assert_eq!(choose(&mut b, "0", any()), "az2");
}

#[test]
fn populate_ignores_unknown_zones() {
    let mut b = book(0, &["az1"]);
    b.populate(&[(mid("a"), "nowhere".into())]);
    assert_eq!(b.zone_of(&mid("a")), None);
    assert_eq!(zone_names(&b), ["az1"]);
}

#[test]
fn distribution_group_counts_only_group_members() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2"]);
        // Lots of machines outside the group in az1; one group member in az2.
        b.populate(&[
            (mid("x1"), "az1".into()),
            (mid("x2"), "az1".into()),
            (mid("x3"), "az1".into()),
            (mid("g1"), "az2".into()),
        ]);
        let group = ZoneRequest { group: Some(vec![mid("g1"), mid("g2")]), ..ZoneRequest::default() };
        assert_eq!(choose(&mut b, "g2", group), "az1", "seed {seed}: group population decides");
        // Without a group every machine counts, and az2 is the emptier one.
        assert_eq!(choose(&mut b, "solo", any()), "az2", "seed {seed}");
    }
}

#[test]
fn distribution_group_spreads_members_across_zones() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        let crowd: Vec<(MachineId, String)> = (0..5).map(|i| (mid(&format!("x{i}")), "az1".to_owned())).collect();
        b.populate(&crowd);
        let members = vec![mid("g0"), mid("g1"), mid("g2")];
        let req = ZoneRequest { group: Some(members.clone()), ..ZoneRequest::default() };
        let chosen: BTreeSet<String> = members.iter().map(|m| choose(&mut b, m.as_str(), req.clone())).collect();
        assert_eq!(chosen.len(), 3, "seed {seed}: group members share a zone: {chosen:?}");
    }
}

#[test]
fn distribution_group_ignores_the_machine_itself() {
    let mut b = book(0, &["az1", "az2"]);
    b.populate(&[(mid("g1"), "az2".into())]);
    let req = ZoneRequest { group: Some(vec![mid("g1"), mid("g2")]), ..ZoneRequest::default() };
    // Choosing again for g2 must not count g2's own earlier reservation.
    for _ in 0..5 {
        assert_eq!(choose(&mut b, "g2", req.clone()), "az1");
    }
}

#[test]
fn mark_failed_tries_another_zone_while_one_is_eligible_then_exhausts_the_round() {
    for seed in 0..10 {
        let mut b = book(seed, &["az1", "az2", "az3"]);
        let m = mid("0");
        let mut tried = BTreeSet::new();
        for round_call in 0..3 {
            let z = choose(&mut b, "0", any());
            assert!(tried.insert(z.clone()), "seed {seed}: zone {z} tried twice in one round");
            let outcome = b.mark_failed(&m, &z);
            assert_eq!(b.zone_of(&m), None, "a failed machine leaves its zone");
            if round_call < 2 {
                assert_eq!(outcome, FailOutcome::TryAnotherZone);
                let marked: Vec<String> =
                    b.view().into_iter().filter(|v| v.failed.contains(&m)).map(|v| v.name).collect();
                assert_eq!(marked.len(), round_call + 1);
            } else {
                assert_eq!(outcome, FailOutcome::RoundExhausted);
            }
        }
        // The marks were cleared: every zone may be chosen again.
        assert!(b.view().iter().all(|v| v.failed.is_empty()));
        assert!(b.choose(&m, any()).unwrap().is_some());
    }
}

#[test]
fn mark_failed_counts_only_eligible_zones() {
    let mut b = book(0, &["az1", "az2", "az3"]);
    let m = mid("0");
    let req = allowed(&["az1", "az2"]);
    let first = choose(&mut b, "0", req.clone());
    assert_eq!(b.mark_failed(&m, &first), FailOutcome::TryAnotherZone);
    let second = choose(&mut b, "0", req.clone());
    assert_ne!(first, second);
    assert_ne!(second, "az3");
    // az3 is free but not allowed: the round is over.
    assert_eq!(b.mark_failed(&m, &second), FailOutcome::RoundExhausted);
    assert!(b.view().iter().all(|v| v.failed.is_empty()));
    // After the round, the first failed zone is a candidate again.
    let z = choose(&mut b, "0", allowed(&[first.as_str()]));
    assert_eq!(z, first);
}

#[test]
fn mark_failed_with_a_single_zone_exhausts_the_round_at_once() {
    let mut b = book(0, &["az1"]);
    choose(&mut b, "0", any());
    assert_eq!(b.mark_failed(&mid("0"), "az1"), FailOutcome::RoundExhausted);
    assert_eq!(choose(&mut b, "0", any()), "az1");
}

#[test]
fn failed_zone_marks_are_per_machine() {
    let mut b = book(0, &["az1", "az2"]);
    let z = choose(&mut b, "0", any());
    assert_eq!(b.mark_failed(&mid("0"), &z), FailOutcome::TryAnotherZone);
    // Machine 1 may still use the zone machine 0 failed in.
    assert_eq!(choose(&mut b, "1", allowed(&[z.as_str()])), z);
    // Machine 0 may not, this round.
    assert_eq!(b.choose(&mid("0"), allowed(&[z.as_str()])), Err(ZoneError::NoSuitableZone(mid("0"))));
}

#[test]
fn release_reservation_removes_machine_from_its_zone() {
    let mut b = book(0, &["az1", "az2"]);
    let z = choose(&mut b, "0", any());
    assert_eq!(populations(&b)[&z], 1);
    b.release_reservation(&mid("0"));
    assert_eq!(b.zone_of(&mid("0")), None);
    assert!(populations(&b).values().all(|n| *n == 0));
    // The freed zone counts as empty again.
    b.populate(&[(mid("a"), if z == "az1" { "az2".into() } else { "az1".into() })]);
    assert_eq!(choose(&mut b, "1", any()), z);
}

#[test]
fn release_clears_failure_marks_too() {
    let mut b = book(0, &["az1", "az2", "az3"]);
    let m = mid("0");
    let z = choose(&mut b, "0", any());
    assert_eq!(b.mark_failed(&m, &z), FailOutcome::TryAnotherZone);
    assert!(b.view().iter().any(|v| v.failed.contains(&m)));

    b.release(&m);
    assert!(b.view().iter().all(|v| v.failed.is_empty() && v.machines.is_empty()));
    // The zone it failed in is eligible again.
    assert_eq!(choose(&mut b, "0", allowed(&[z.as_str()])), z);
}

#[test]
fn release_drops_an_unlisted_zone_once_it_is_empty() {
    let mut b = book(0, &["az1", "az2"]);
    b.populate(&[(mid("a"), "az2".into())]);
    b.update_zones(&[("az1".into(), true)]);
    assert_eq!(zone_names(&b), ["az1", "az2"]);
    b.release(&mid("a"));
    assert_eq!(zone_names(&b), ["az1"]);
}

#[test]
fn no_suitable_zone_error_text() {
    let mut b = ZoneBook::new(0);
    b.update_zones(&[("az1".into(), false)]);
    let err = b.choose(&mid("0"), any()).unwrap_err();
    assert_eq!(err, ZoneError::NoSuitableZone(mid("0")));
    assert_eq!(err.to_string(), "suitable availability zone for machine 0 not found");
}

fn shaped(shape: &str) -> ZoneRequest {
    ZoneRequest { shape: Some(shape.to_owned()), ..ZoneRequest::default() }
}

/// The capacity memory: a zone that failed a start for its zone is avoided, for a while, by other
/// machines of the same shape; not by other shapes, not once the memory expired, and never to
/// the point of refusing a machine whose every eligible zone is remembered.
#[test]
fn capacity_memory_steers_the_same_shape_away_for_a_while() {
    let mut b = book(0, &["az1", "az2"]).with_capacity_memory(Duration::from_secs(180));
    b.set_clock(Duration::from_secs(10));
    let first = choose(&mut b, "0", shaped("arch=amd64 instance-type=m5.large"));
    b.remember_capacity("arch=amd64 instance-type=m5.large", &first);
    assert_eq!(b.mark_failed(&mid("0"), &first), FailOutcome::TryAnotherZone);
    let other = if first == "az1" { "az2" } else { "az1" };
    assert_eq!(b.remembered("arch=amd64 instance-type=m5.large"), vec![first.as_str()]);
    // Every later machine of that shape goes elsewhere, even as `other` fills up.
    for i in 1..6 {
        assert_eq!(choose(&mut b, &i.to_string(), shaped("arch=amd64 instance-type=m5.large")), other);
    }
    // Another shape is not steered: lowest population is `first` now.
    assert_eq!(choose(&mut b, "small", shaped("arch=amd64 instance-type=t3.micro")), first);
    // A machine that may only use the remembered zone still gets it.
    let only = ZoneRequest { allowed: Some(vec![first.clone()]), ..shaped("arch=amd64 instance-type=m5.large") };
    assert_eq!(choose(&mut b, "pinned", only), first);
    // After the memory expires, population decides again.
    b.set_clock(Duration::from_secs(190));
    assert!(b.remembered("arch=amd64 instance-type=m5.large").is_empty());
    assert_eq!(choose(&mut b, "late", shaped("arch=amd64 instance-type=m5.large")), first);
}

#[test]
fn without_capacity_memory_failures_steer_only_their_machine() {
    let mut b = book(0, &["az1", "az2"]);
    let first = choose(&mut b, "0", shaped("s"));
    b.remember_capacity("s", &first);
    b.mark_failed(&mid("0"), &first);
    assert!(b.remembered("s").is_empty());
    let picks: BTreeSet<String> = (1..8).map(|i| choose(&mut b, &i.to_string(), shaped("s"))).collect();
    assert_eq!(picks.len(), 2, "both zones used: {picks:?}");
}

#[test]
fn a_machine_failing_everywhere_still_gets_n_times_z_plus_one_calls() {
    // With every zone remembered, the memory steers nothing: the retry call counts (N·Z+1) are
    // unchanged.
    let mut b = book(0, &["az1", "az2", "az3"]).with_capacity_memory(Duration::from_secs(180));
    let mut attempts = Attempts::new(2);
    let mut calls = 0;
    loop {
        let zone = choose(&mut b, "0", shaped("s"));
        calls += 1;
        match attempts.on_failure(FailureKind::Zone) {
            Step::MarkZone => match attempts.on_zone_outcome({
                b.remember_capacity("s", &zone);
                b.mark_failed(&mid("0"), &zone)
            }) {
                Step::FailOver | Step::NewRound => continue,
                other => panic!("{other:?}"),
            },
            Step::Final => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(calls, 2 * 3 + 1);
}

/// A cloud listing more zone names than the book interns is not a crash: the names past the
/// limit are ignored, the others (and a dropped zone listed again) keep working.
#[test]
fn zone_names_past_the_limit_are_ignored() {
    let mut b = ZoneBook::new(1);
    let names: Vec<(String, bool)> = (0..MAX_ZONE_NAMES + 2).map(|i| (format!("z{i}"), i == 0)).collect();
    b.update_zones(&names);
    assert_eq!(b.view().len(), MAX_ZONE_NAMES, "the names past the limit are not zones");
    assert_eq!(choose(&mut b, "0", any()), "z0");
    b.update_zones(&[("z0".to_owned(), true), (format!("z{}", MAX_ZONE_NAMES + 1), true)]);
    assert_eq!(populations(&b), BTreeMap::from([("z0".to_owned(), 1)]));
    assert_eq!(choose(&mut b, "1", any()), "z0", "only the zone within the limit is chosen");
}
