//! Unit tests of the lease core: every transition, without a runtime or a database.

use std::time::Duration;

use tokio::time::Instant;

use super::state::*;
use crate::service::settings::{LeaseTimings, LeaseTimingsError};

const ME: &str = "replica-a";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn book() -> LeaseBook {
    LeaseBook::new(LeaseTimings::default())
}

/// A book that acquired epoch 7 with an attempt sent at `t0`.
fn leader(t0: Instant) -> LeaseBook {
    let mut b = book();
    assert_eq!(b.tick(t0), (None, Step::Acquire));
    let t = b.answer(ME, t0 + ms(5), Answer::Acquired { epoch: 7 }).unwrap();
    assert_eq!((t.from, t.to, t.why), (Role::Follower, Role::Leader { epoch: 7 }, Why::Acquired));
    b
}

/// A [`leader`] whose first renewal went out at `t0 + 2s`, not answered yet.
fn renewing(t0: Instant) -> LeaseBook {
    let mut b = leader(t0);
    assert_eq!(b.tick(t0 + secs(2)), (None, Step::Renew { epoch: 7 }));
    b
}

/// A leader's renewal of epoch 7, due at `now`, sent then and answered well 5 ms later.
fn renew(b: &mut LeaseBook, now: Instant) {
    assert_eq!(b.tick(now), (None, Step::Renew { epoch: 7 }));
    assert_eq!(b.answer(ME, now + ms(5), Answer::Renewed), None);
}

#[test]
fn timings_default_to_the_issues_and_are_checked_naming_the_setting() {
    let t = LeaseTimings::default();
    assert_eq!((t.lease(), t.renew_deadline(), t.retry()), (secs(10), secs(8), secs(2)));
    assert_eq!(LeaseTimings::new(secs(10), secs(8), secs(2)), Ok(t));
    let e = LeaseTimings::new(secs(8), secs(8), secs(2)).unwrap_err();
    assert!(matches!(e, LeaseTimingsError::LeaseNotAboveDeadline { .. }), "{e:?}");
    assert!(e.to_string().contains("lease.duration (8s) must be longer than lease.renew_deadline (8s)"), "{e}");
    // 1.2 × 5 s = 6 s: a deadline of exactly 6 s is refused, 6.001 s accepted.
    let e = LeaseTimings::new(secs(10), secs(6), secs(5)).unwrap_err();
    assert!(matches!(e, LeaseTimingsError::DeadlineNotAboveRetry { .. }), "{e:?}");
    assert!(e.to_string().contains("lease.renew_deadline (6s) must be longer than 1.2 × lease.retry (5s)"), "{e}");
    assert!(LeaseTimings::new(secs(10), ms(6001), secs(5)).is_ok());
    for (l, d, r, setting) in
        [(0, 8, 2, "lease.duration"), (10, 0, 2, "lease.renew_deadline"), (10, 8, 0, "lease.retry")]
    {
        assert_eq!(
            LeaseTimings::new(secs(l), secs(d), secs(r)),
            Err(LeaseTimingsError::Zero { setting }),
            "{l} {d} {r}"
        );
    }
}

#[test]
fn a_follower_tries_to_acquire_every_retry_and_waits_for_the_answer() {
    let t0 = Instant::now();
    let mut b = book();
    assert_eq!(b.role(), Role::Follower);
    assert_eq!(b.tick(t0), (None, Step::Acquire));
    assert_eq!(b.tick(t0 + ms(100)), (None, Step::Wait), "one attempt in flight at a time");
    let held = Answer::HeldBy { holder: "replica-b".into(), epoch: 3 };
    assert_eq!(b.answer(ME, t0 + ms(200), held), None);
    assert_eq!(b.holder(), Some(("replica-b", 3)));
    assert_eq!(b.next_tick(t0 + ms(200)), t0 + ms(2200), "a follower asks again after one retry");
    assert_eq!(b.tick(t0 + ms(2200)), (None, Step::Acquire));
    assert_eq!(b.answer(ME, t0 + ms(2300), Answer::Failed("down".into())), None, "a failure changes nothing");
    assert_eq!(b.role(), Role::Follower);
    assert_eq!(b.transitions(), 0);
}

#[test]
fn acquiring_makes_a_leader_that_renews_every_retry() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    assert_eq!(b.holder(), Some((ME, 7)));
    assert_eq!(b.transitions(), 1);
    assert!(b.may_act(t0 + ms(5)));
    assert_eq!(b.acting_deadline(), Some(t0 + secs(8)), "the deadline counts from the sending");
    assert_eq!(b.next_tick(t0 + ms(5)), t0 + ms(2005));
    assert_eq!(b.tick(t0 + secs(2)), (None, Step::Renew { epoch: 7 }));
    assert_eq!(b.answer(ME, t0 + secs(3), Answer::Renewed), None);
    assert_eq!(b.acting_deadline(), Some(t0 + secs(10)), "renewed as of its sending, at 2 s");
    assert_eq!(b.role(), Role::Leader { epoch: 7 });
}

/// The safety rule: a leader that cannot renew stops acting at its renew deadline, which is
/// before the lease it last renewed can expire for anyone else (renew_deadline < lease, both
/// counted from no later than the database's `now()` of that renewal).
#[test]
fn a_leader_that_cannot_renew_stops_acting_before_its_lease_can_expire_for_others() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    let lease_expires_no_earlier_than = t0 + b.timings().lease();
    // Every renewal fails (the database is unreachable) or hangs.
    let mut now = t0;
    let mut stepped_down_at = None;
    while now < t0 + secs(20) {
        now = b.next_tick(now);
        let (t, step) = b.tick(now);
        if let Some(t) = t {
            assert_eq!((t.from, t.to, t.why), (Role::Leader { epoch: 7 }, Role::Follower, Why::DeadlinePassed));
            stepped_down_at = Some(now);
            break;
        }
        assert!(b.may_act(now));
        if step != Step::Wait {
            assert_eq!(b.answer(ME, now + ms(500), Answer::Failed("timeout".into())), None);
        }
    }
    let at = stepped_down_at.expect("the leader steps down");
    assert_eq!(at, t0 + secs(8), "exactly at the renew deadline (the tick is scheduled for it)");
    assert!(at < lease_expires_no_earlier_than);
    assert!(!b.may_act(at));
    assert_eq!(b.role(), Role::Follower);
}

#[test]
fn a_hung_renewal_does_not_keep_a_leader_acting() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    // No answer: ticks wait, until the deadline.
    assert_eq!(b.tick(t0 + secs(4)), (None, Step::Wait));
    assert!(b.may_act(t0 + ms(7999)));
    assert!(!b.may_act(t0 + secs(8)), "may_act is false from the deadline on, whatever the timer");
    let (t, _) = b.tick(t0 + secs(8));
    assert_eq!(t.map(|t| t.why), Some(Why::DeadlinePassed));
    // The renewal answers at last, successfully: too late, it changes nothing.
    assert_eq!(b.answer(ME, t0 + secs(9), Answer::Renewed), None);
    assert_eq!(b.role(), Role::Follower);
}

#[test]
fn a_renewal_answered_after_the_deadline_steps_down() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    let t = b.answer(ME, t0 + ms(8500), Answer::Renewed).unwrap();
    assert_eq!(t.why, Why::DeadlinePassed);
    assert_eq!(b.role(), Role::Follower);
}

#[test]
fn a_refused_renewal_steps_down_at_once() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    let t = b.answer(ME, t0 + ms(2100), Answer::Refused).unwrap();
    assert_eq!((t.from, t.to, t.why), (Role::Leader { epoch: 7 }, Role::Follower, Why::Refused));
    assert!(!b.may_act(t0 + ms(2100)));
    assert_eq!(b.tick(t0 + secs(4)), (None, Step::Acquire), "then it tries again as a follower");
    let t = b.answer(ME, t0 + ms(4100), Answer::Acquired { epoch: 9 }).unwrap();
    assert_eq!(t.to, Role::Leader { epoch: 9 });
    assert_eq!(b.transitions(), 3);
}

#[test]
fn a_renewal_answered_by_another_holder_steps_down() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    let t = b.answer(ME, t0 + ms(2100), Answer::HeldBy { holder: "replica-b".into(), epoch: 8 }).unwrap();
    assert_eq!(t.why, Why::Refused);
    assert_eq!(b.holder(), Some(("replica-b", 8)));
}

#[test]
fn a_failed_renewal_keeps_the_leader_until_the_deadline() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    assert_eq!(b.answer(ME, t0 + ms(2100), Answer::Failed("reset".into())), None);
    assert!(b.may_act(t0 + ms(2100)));
    assert_eq!(b.next_tick(t0 + ms(7000)), t0 + secs(8), "the deadline comes before the next retry");
    assert_eq!(b.tick(t0 + secs(4)), (None, Step::Renew { epoch: 7 }));
    let t = b.answer(ME, t0 + ms(8100), Answer::Failed("reset".into())).unwrap();
    assert_eq!(t.why, Why::DeadlinePassed, "a failure past the deadline steps down");
}

#[test]
fn an_acquisition_answered_after_the_deadline_is_not_acted_on() {
    let t0 = Instant::now();
    let mut b = book();
    assert_eq!(b.tick(t0), (None, Step::Acquire));
    assert_eq!(b.answer(ME, t0 + secs(9), Answer::Acquired { epoch: 2 }), None);
    assert_eq!(b.role(), Role::Follower);
    assert!(!b.may_act(t0 + secs(9)));
}

#[test]
fn shutdown_releases_a_leaders_lease_and_stops_acting_at_once() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    let (t, step) = b.shutdown(t0 + secs(1));
    assert_eq!(step, Step::Release { epoch: 7 });
    let t = t.unwrap();
    assert_eq!((t.from, t.to, t.why), (Role::Leader { epoch: 7 }, Role::Follower, Why::Released));
    assert!(!b.may_act(t0 + secs(1)));
    assert_eq!(b.answer(ME, t0 + ms(1100), Answer::Released), None);
    assert_eq!(b.tick(t0 + secs(3)), (None, Step::Wait), "a shut-down book asks nothing more");
    assert_eq!(b.last_transition().map(|t| t.why), Some(Why::Released));
}

#[test]
fn shutdown_of_a_follower_stops_asking_and_releases_a_late_acquisition() {
    let t0 = Instant::now();
    let mut b = book();
    assert_eq!(b.tick(t0), (None, Step::Acquire));
    assert_eq!(b.shutdown(t0 + ms(10)), (None, Step::Wait));
    assert_eq!(b.answer(ME, t0 + ms(20), Answer::Acquired { epoch: 4 }), None, "never acted on");
    assert_eq!(b.role(), Role::Follower);
    assert_eq!(b.tick(t0 + ms(30)), (None, Step::Release { epoch: 4 }), "released at once");
    assert_eq!(b.answer(ME, t0 + ms(40), Answer::Released), None);
    assert_eq!(b.tick(t0 + secs(2)), (None, Step::Wait));
    assert_eq!(b.transitions(), 0);
}

#[test]
fn role_and_why_names_are_the_statuses() {
    assert_eq!(Role::Follower.name(), "follower");
    assert_eq!(Role::Leader { epoch: 1 }.name(), "leader");
    let names: Vec<_> = [Why::Acquired, Why::Refused, Why::DeadlinePassed, Why::Released, Why::HandedOver]
        .iter()
        .map(Why::name)
        .collect();
    assert_eq!(names, ["acquired", "refused", "renew_deadline", "released", "handed_over"]);
}

#[test]
fn a_spread_follower_asks_only_once_allowed_and_learns_the_holder_from_the_driver() {
    let t0 = Instant::now();
    let mut b = LeaseBook::spread(LeaseTimings::default());
    assert_eq!(b.tick(t0), (None, Step::Wait), "not given this model: it does not ask");
    b.observe(Some(("replica-b".to_owned(), 3)));
    assert_eq!(b.holder(), Some(("replica-b", 3)));
    b.allow(true);
    assert_eq!(b.tick(t0 + secs(2)), (None, Step::Acquire));
    let t = b.answer(ME, t0 + ms(2005), Answer::Acquired { epoch: 4 }).unwrap();
    assert_eq!(t.to, Role::Leader { epoch: 4 });
    // A leader keeps renewing whatever the spread says, and keeps its own view.
    b.allow(false);
    b.observe(None);
    assert_eq!(b.holder(), Some((ME, 4)));
    assert_eq!(b.tick(t0 + secs(4)), (None, Step::Renew { epoch: 4 }));
}

#[test]
fn a_hand_over_stops_acting_at_once_releases_and_does_not_take_the_model_back() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    let (t, step) = b.hand_over(t0 + secs(1));
    let t = t.unwrap();
    assert_eq!((t.from, t.to, t.why), (Role::Leader { epoch: 7 }, Role::Follower, Why::HandedOver));
    assert_eq!(step, Step::Release { epoch: 7 }, "the epoch is kept: the next holder's is 8");
    assert!(!b.may_act(t0 + secs(1)));
    assert_eq!(b.answer(ME, t0 + ms(1010), Answer::Released), None);
    assert_eq!(b.tick(t0 + secs(3)), (None, Step::Wait), "not asked for again until given back");
    b.allow(true);
    assert_eq!(b.tick(t0 + secs(5)), (None, Step::Acquire));
    // A follower has nothing to hand over.
    let mut f = book();
    assert_eq!(f.hand_over(t0), (None, Step::Wait));
}

#[test]
fn a_hand_over_asked_while_a_renewal_is_in_flight_waits_for_its_answer() {
    let t0 = Instant::now();
    let mut b = renewing(t0);
    assert_eq!(b.hand_over(t0 + ms(2010)), (None, Step::Wait), "one statement at a time");
    assert_eq!(b.role(), Role::Leader { epoch: 7 });
    assert_eq!(b.answer(ME, t0 + ms(2020), Answer::Renewed), None);
    let (t, step) = b.tick(t0 + ms(2030));
    assert_eq!(t.map(|t| t.why), Some(Why::HandedOver));
    assert_eq!(step, Step::Release { epoch: 7 });
}

#[test]
fn a_leader_whose_work_makes_no_progress_steps_down_and_releases_though_its_lease_renews() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    // Probed at once; the probe never answers (the store's thread is stuck), renewals do.
    assert!(b.probe_due(t0 + ms(10)));
    assert!(!b.probe_due(t0 + ms(20)), "one probe in flight at a time");
    let mut now = t0;
    for _ in 0..3 {
        now += secs(2);
        renew(&mut b, now);
        assert!(b.may_act(now + ms(5)));
    }
    // The next tick is due at the progress deadline, before the renewals' own.
    assert_eq!(b.next_tick(t0 + secs(7)), t0 + ms(10) + secs(8));
    let (t, step) = b.tick(t0 + ms(10) + secs(8));
    let t = t.expect("steps down");
    assert_eq!((t.from, t.to, t.why), (Role::Leader { epoch: 7 }, Role::Follower, Why::Stalled));
    assert_eq!(step, Step::Release { epoch: 7 }, "released, so another replica takes over at once");
    assert_eq!(Why::Stalled.name(), "stalled");
    assert!(b.stalled());
    assert_eq!(b.answer(ME, t0 + secs(9), Answer::Released), None);
    // It does not ask for the lease again while its work is stuck ...
    assert_eq!(b.tick(t0 + secs(11)), (None, Step::Wait));
    assert!(!b.probe_due(t0 + secs(11)), "the first probe is still in flight");
    // ... and asks once a probe answers well.
    b.probed(t0 + secs(12), true);
    assert!(!b.stalled());
    assert_eq!(b.tick(t0 + secs(12)), (None, Step::Acquire));
}

#[test]
fn a_leader_whose_probes_answer_keeps_leading_and_a_failed_probe_is_no_proof() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    let mut now = t0;
    for _ in 0..10 {
        now += secs(2);
        renew(&mut b, now);
        assert!(b.probe_due(now + ms(5)));
        b.probed(now + ms(50), true);
    }
    assert!(b.may_act(now + ms(100)));
    // Probes that answer badly (the database refuses the store's reads) prove nothing.
    let from = now;
    loop {
        now += secs(2);
        let (t, step) = b.tick(now);
        if let Some(t) = t {
            assert_eq!(t.why, Why::Stalled);
            assert_eq!(step, Step::Release { epoch: 7 });
            assert!(now.saturating_duration_since(from) <= secs(10), "{:?}", now.saturating_duration_since(from));
            break;
        }
        b.answer(ME, now + ms(5), Answer::Renewed);
        if b.probe_due(now + ms(5)) {
            b.probed(now + ms(50), false);
        }
    }
}

#[test]
fn a_book_that_is_never_probed_never_stalls() {
    let t0 = Instant::now();
    let mut b = leader(t0);
    let mut now = t0;
    for _ in 0..20 {
        now += secs(2);
        renew(&mut b, now);
    }
    assert!(b.may_act(now + ms(5)) && !b.stalled());
}

/// Issue 36: with the replica's beat, a model's lease ticks on `beat + k × retry` whenever it
/// started, so every model of the replica renews at the same instants (their renewals commit
/// together); never more than one retry after now, and no later than the acting deadline.
#[test]
fn on_the_replicas_beat_every_lease_ticks_at_the_same_instants() {
    let origin = Instant::now();
    let (a, b) = (book().with_beat(origin), book().with_beat(origin));
    // Started 0.3 s and 1.7 s after the beat: both tick at its next instant, 2 s.
    assert_eq!(a.next_tick(origin + ms(300)), origin + secs(2));
    assert_eq!(b.next_tick(origin + ms(1700)), origin + secs(2));
    // A tick on the beat waits a whole retry for the next.
    assert_eq!(a.next_tick(origin + secs(4)), origin + secs(6));
    assert_eq!(a.next_tick(origin + ms(4001)), origin + secs(6));
    // Without a beat: a retry from now.
    assert_eq!(book().next_tick(origin + ms(300)), origin + ms(2300));
    // A leader's acting deadline still comes first when it is nearer.
    let t0 = origin + ms(1900);
    let l = leader(t0).with_beat(origin);
    let next = l.next_tick(t0 + ms(5));
    assert!(next <= origin + secs(4) && next > t0, "{:?}", next - origin);
}
