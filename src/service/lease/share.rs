//! Spreading the models' leaders over the replicas (issue 18): the plain core that decides,
//! from one view of who leads what, which models' leases this replica tries to take and which
//! it hands over. No actix, no SQL: the shell feeds it the live replicas (their heartbeats) and
//! each model's live holder, and carries out the [`SharePlan`] through the per-model leases,
//! which alone arbitrate (two replicas with different views never both lead a model: the
//! lease and its fenced epoch see to that; the plan only decides who asks).
//!
//! The rules:
//! - A replica's fair share is `ceil(models / live replicas)`.
//! - Each model ranks the replicas by a hash of (model, replica) (rendezvous hashing): its
//!   first choice is the live replica ranked highest, so a replica joining or leaving moves only
//!   the models whose ranking it tops, about `models / replicas` of them.
//! - A free model (no live holder) goes to its highest-ranked live replica that is below its
//!   share, counting the free models already given out in model order. Every replica with the
//!   same view computes the same assignment, so they do not race for a free model; with
//!   different views (heartbeats seen at different moments) the lease decides.
//! - A replica above its share releases its extras (those that rank it lowest), but only as
//!   many as the other live replicas have room for: a model is never let go with nobody to take
//!   it. It holds at most its share once the hand-over is done (one more, at most, while a
//!   replica that joined has not taken what was released for it yet).
// Without PostgreSQL there are no replicas: only the types the status shows are used.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

/// What one replica sees: the live replicas (itself included) and each model's live holder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShareView<'a> {
    /// This replica's id.
    pub me: &'a str,
    /// The live replicas (heartbeat not expired), this one included.
    pub live: &'a BTreeSet<String>,
    /// Every model (by its lease key), with the live replica holding its lease (`None`: free,
    /// expired, or held by a replica that is not live).
    pub holders: &'a BTreeMap<String, Option<String>>,
}

/// What this replica does next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SharePlan {
    /// The fair share: `ceil(models / live replicas)`.
    pub share: usize,
    /// Free models whose lease this replica tries to take now, in model order.
    pub acquire: Vec<String>,
    /// Models this replica leads and hands over (finish or abandon its calls as a fail-over
    /// would, then release the lease), in model order.
    pub release: Vec<String>,
}

/// `ceil(models / replicas)`; a replica alone (or none counted) takes every model.
pub(crate) fn fair_share(models: usize, replicas: usize) -> usize {
    models.div_ceil(replicas.max(1))
}

/// How much a model wants a replica: higher first. Stable for a given build (the standard
/// library's SipHash with fixed keys); replicas of different builds may rank differently,
/// which costs hand-overs, never safety.
fn rank(model: &str, replica: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    model.hash(&mut h);
    replica.hash(&mut h);
    h.finish()
}

/// The live replicas in the order a model wants them.
fn preference<'a>(model: &str, live: &'a BTreeSet<String>) -> Vec<&'a String> {
    let mut order: Vec<&String> = live.iter().collect();
    order.sort_by(|a, b| rank(model, b).cmp(&rank(model, a)).then_with(|| a.cmp(b)));
    order
}

/// Decides this replica's next acquisitions and hand-overs from its view.
pub(crate) fn plan(view: ShareView<'_>) -> SharePlan {
    // A replica that does not see itself live (its heartbeat not yet written) still counts.
    let mut live = view.live.clone();
    live.insert(view.me.to_owned());
    let share = fair_share(view.holders.len(), live.len());

    // Each live replica's load: what it holds now.
    let mut load: BTreeMap<&str, usize> = live.iter().map(|r| (r.as_str(), 0)).collect();
    for holder in view.holders.values().flatten() {
        if let Some(n) = load.get_mut(holder.as_str()) {
            *n += 1;
        }
    }

    // Hand-overs first: what this replica lets go is free for the others' assignment below.
    let mine: Vec<&String> =
        view.holders.iter().filter(|(_, h)| h.as_deref() == Some(view.me)).map(|(m, _)| m).collect();
    let room: usize = load.iter().filter(|(r, _)| **r != view.me).map(|(_, n)| share.saturating_sub(*n)).sum();
    let extras = mine.len().saturating_sub(share).min(room);
    let mut by_want: Vec<&String> = mine.clone();
    by_want.sort_by(|a, b| rank(a, view.me).cmp(&rank(b, view.me)).then_with(|| a.cmp(b)));
    let mut release: Vec<String> = by_want.into_iter().take(extras).cloned().collect();
    release.sort();
    if let Some(n) = load.get_mut(view.me) {
        *n -= release.len();
    }

    // Free models, in model order, each to its most wanting live replica below its share.
    // Models this replica releases are not taken back by it.
    let mut acquire = Vec::new();
    for (model, holder) in view.holders {
        if holder.is_some() {
            continue;
        }
        let order = preference(model, &live);
        let load_of = |r: &String| load.get(r.as_str()).copied().unwrap_or(usize::MAX);
        // Never a model without a taker. With one view someone is always below its share (the
        // shares add up to at least the models); should views disagree, the least loaded takes
        // it, one over its share until a hand-over evens it out.
        let taker =
            order.iter().find(|r| load_of(r) < share).or_else(|| order.iter().min_by_key(|r| load_of(r))).copied();
        if let Some(taker) = taker {
            if let Some(n) = load.get_mut(taker.as_str()) {
                *n += 1;
            }
            if taker == view.me {
                acquire.push(model.clone());
            }
        }
    }
    SharePlan { share, acquire, release }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("replica-{i}")).collect()
    }

    fn models(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("model-{i:02}")).collect()
    }

    /// Every replica plans on the same view; the plans are applied (releases first, then
    /// acquisitions, a model taken by the first replica that asks); answers the new holders.
    fn round(live: &BTreeSet<String>, holders: &BTreeMap<String, Option<String>>) -> BTreeMap<String, Option<String>> {
        let plans: Vec<(String, SharePlan)> =
            live.iter().map(|me| (me.clone(), plan(ShareView { me, live, holders }))).collect();
        let mut next = holders.clone();
        for (me, p) in &plans {
            for m in &p.release {
                assert_eq!(next[m].as_deref(), Some(me.as_str()), "{me} releases {m}, which it does not hold");
                next.insert(m.clone(), None);
            }
        }
        for (me, p) in &plans {
            for m in &p.acquire {
                assert_eq!(holders[m], None, "{me} asks for {m}, which is not free");
                if next[m].is_none() {
                    next.insert(m.clone(), Some(me.clone()));
                }
            }
        }
        next
    }

    fn loads(live: &BTreeSet<String>, holders: &BTreeMap<String, Option<String>>) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, usize> = live.iter().map(|r| (r.clone(), 0)).collect();
        for h in holders.values().flatten() {
            *out.entry(h.clone()).or_default() += 1;
        }
        out
    }

    /// Rounds until nothing changes (bounded).
    fn settle(
        live: &BTreeSet<String>,
        mut holders: BTreeMap<String, Option<String>>,
    ) -> (BTreeMap<String, Option<String>>, usize) {
        for rounds in 0..10 {
            let next = round(live, &holders);
            if next == holders {
                return (holders, rounds);
            }
            holders = next;
        }
        panic!("no steady state in 10 rounds: {holders:?}");
    }

    #[test]
    fn the_fair_share_is_the_ceiling_of_models_over_replicas() {
        assert_eq!(fair_share(12, 3), 4);
        assert_eq!(fair_share(12, 5), 3);
        assert_eq!(fair_share(13, 4), 4);
        assert_eq!(fair_share(0, 3), 0);
        assert_eq!(fair_share(7, 0), 7);
    }

    #[test]
    fn free_models_are_shared_out_in_one_round_without_two_replicas_asking_for_one() {
        let live = replicas(3);
        let holders: BTreeMap<String, Option<String>> = models(12).into_iter().map(|m| (m, None)).collect();
        let mut asked: BTreeMap<String, usize> = BTreeMap::new();
        for me in &live {
            let p = plan(ShareView { me, live: &live, holders: &holders });
            assert_eq!(p.share, 4);
            assert!(p.release.is_empty());
            for m in p.acquire {
                *asked.entry(m).or_default() += 1;
            }
        }
        assert_eq!(asked.len(), 12, "every model is asked for");
        assert!(asked.values().all(|n| *n == 1), "no model is asked for twice: {asked:?}");
        let (settled, _) = settle(&live, holders);
        assert!(settled.values().all(Option::is_some));
        assert!(loads(&live, &settled).values().all(|n| *n == 4), "{:?}", loads(&live, &settled));
    }

    #[test]
    fn a_balanced_assignment_is_left_alone() {
        let live = replicas(3);
        let holders: BTreeMap<String, Option<String>> = models(12).into_iter().map(|m| (m, None)).collect();
        let (settled, _) = settle(&live, holders);
        for me in &live {
            assert_eq!(
                plan(ShareView { me, live: &live, holders: &settled }),
                SharePlan { share: 4, ..SharePlan::default() }
            );
        }
    }

    #[test]
    fn a_replica_that_joins_gets_its_share_through_hand_overs_and_only_its_share_moves() {
        let three = replicas(3);
        let holders: BTreeMap<String, Option<String>> = models(12).into_iter().map(|m| (m, None)).collect();
        let (before, _) = settle(&three, holders);
        let four = replicas(4);
        let newcomer = "replica-3".to_owned();
        let (after, rounds) = settle(&four, before.clone());
        assert!(rounds <= 2, "a release round, then an acquisition round: {rounds}");
        assert!(after.values().all(Option::is_some), "nothing left without a leader");
        let l = loads(&four, &after);
        assert!(l.values().all(|n| *n == 3), "{l:?}");
        let moved = before.iter().filter(|(m, h)| after[*m] != **h).count();
        assert_eq!(moved, 3, "only the newcomer's share moves");
        assert!(before.iter().filter(|(m, h)| after[*m] != **h).all(|(m, _)| after[m].as_ref() == Some(&newcomer)));
        // During the hand-over no replica held more than its old share.
        let first = round(&four, &before);
        assert!(loads(&four, &first).values().all(|n| *n <= 4));
    }

    #[test]
    fn a_dead_replicas_models_go_to_the_others_within_their_new_share() {
        let three = replicas(3);
        let holders: BTreeMap<String, Option<String>> = models(12).into_iter().map(|m| (m, None)).collect();
        let (before, _) = settle(&three, holders);
        let two: BTreeSet<String> = three.iter().filter(|r| *r != "replica-1").cloned().collect();
        // Its leases expire: the shell reports its models free.
        let orphaned: BTreeMap<String, Option<String>> =
            before.iter().map(|(m, h)| (m.clone(), h.clone().filter(|h| h != "replica-1"))).collect();
        let (after, rounds) = settle(&two, orphaned);
        assert_eq!(rounds, 1);
        assert!(after.values().all(Option::is_some));
        assert!(loads(&two, &after).values().all(|n| *n == 6));
        // The survivors kept what they had.
        assert!(before.iter().filter(|(_, h)| h.as_deref() != Some("replica-1")).all(|(m, h)| after[m] == *h));
    }

    #[test]
    fn nothing_is_released_when_no_other_replica_has_room() {
        let live = replicas(2);
        let me = "replica-0";
        // replica-0 holds 5, replica-1 holds 5 of 10: balanced. A stale view (replica-1 at 5,
        // a third replica not yet seen) gives no room: nothing is let go.
        let holders: BTreeMap<String, Option<String>> =
            models(10).into_iter().enumerate().map(|(i, m)| (m, Some(format!("replica-{}", i % 2)))).collect();
        let p = plan(ShareView { me, live: &live, holders: &holders });
        assert_eq!(p, SharePlan { share: 5, ..SharePlan::default() });
        // Alone with every model while the other replica holds none and is live: it hands
        // over half.
        let all_mine: BTreeMap<String, Option<String>> =
            models(10).into_iter().map(|m| (m, Some(me.to_owned()))).collect();
        let p = plan(ShareView { me, live: &live, holders: &all_mine });
        assert_eq!(p.release.len(), 5);
        assert!(p.acquire.is_empty());
    }

    #[test]
    fn models_added_later_are_led_and_the_shares_stay_even() {
        let live = replicas(3);
        let holders: BTreeMap<String, Option<String>> = models(9).into_iter().map(|m| (m, None)).collect();
        let (mut settled, _) = settle(&live, holders);
        for m in ["model-09", "model-10", "model-11"] {
            settled.insert(m.to_owned(), None);
        }
        let (after, rounds) = settle(&live, settled.clone());
        assert_eq!(rounds, 1);
        assert!(after.values().all(Option::is_some), "{after:?}");
        assert!(loads(&live, &after).values().all(|n| *n == 4), "{:?}", loads(&live, &after));
        assert!(settled.iter().filter(|(_, h)| h.is_some()).all(|(m, h)| after[m] == *h), "none moved");
    }

    #[test]
    fn a_replica_alone_takes_every_model() {
        let live = replicas(1);
        let holders: BTreeMap<String, Option<String>> = models(7).into_iter().map(|m| (m, None)).collect();
        let p = plan(ShareView { me: "replica-0", live: &live, holders: &holders });
        assert_eq!(p.acquire, models(7));
        // Not yet seeing its own heartbeat changes nothing.
        let nobody = BTreeSet::new();
        assert_eq!(plan(ShareView { me: "replica-0", live: &nobody, holders: &holders }).acquire, models(7));
    }
}
