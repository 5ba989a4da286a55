//! The batcher's plain core: which waiting starts share one cloud call, the intent of each
//! call (client token → ordered machines) recorded before it is made, and what each answer
//! means for each machine.
//!
//! A start that reaches its cloud call with batching on joins the open batch of its zone and
//! shape (everything the call shares: zone, constraints, placement, volumes, extra tags), or
//! opens one. A batch takes members until it is full (`size`) or closed; it is closed when the
//! limiter grants its start token, so batches grow while the start bucket is empty, which is
//! exactly when one call per machine would wait. Closing records the intent: the client token
//! (the first member's own token and the batch's size) and the members in launch order; the
//! call is made only from an intent, and a replay after an ambiguous failure sends the same
//! intent again (same token, same members, same order), so the cloud answers what the first
//! call made and creates nothing. Members stay waiting through the replays, so no instance is
//! ever made for a machine whose start is not waiting for it. A zone that did not answer
//! (`ZoneUnreachable`) is not replayed: each member hears that the call may have made its
//! instance, and fails over as a single start does.

use std::collections::BTreeMap;

use crate::model::{CapacityType, Constraints, UsdPerHour, VolumeParams};
use crate::ports::{BatchMember, BatchStartParams, BatchStarted, BrokerError, StartInstanceParams, StartedInstance};

/// How many times a batch whose call failed ambiguously is replayed (same token, same
/// members) before its members are told it may have made their instances; each of them then
/// looks for its instance by its tags before any new call (as a single start does).
pub const MAX_REPLAYS: u32 = 3;

/// What a cloud call shares between the machines it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    zone: Option<String>,
    constraints: Constraints,
    placement: Option<String>,
    volumes: Vec<VolumeParams>,
    extra_tags: BTreeMap<String, String>,
    /// Spot and on-demand starts never share a call (issue 33).
    capacity: CapacityType,
    spot_max_price: Option<UsdPerHour>,
}

impl Shape {
    fn of(p: &StartInstanceParams) -> Self {
        Self {
            zone: p.zone.clone(),
            constraints: p.constraints.clone(),
            placement: p.placement.clone(),
            volumes: p.volumes.clone(),
            extra_tags: p.extra_tags.clone(),
            capacity: p.capacity,
            spot_max_price: p.spot_max_price,
        }
    }
}

/// A batch still taking members.
#[derive(Debug, Clone)]
struct Open<R> {
    id: u64,
    shape: Shape,
    members: Vec<(StartInstanceParams, R)>,
}

/// A closed batch: its intent, and the members waiting for its answer.
#[derive(Debug, Clone)]
struct Flying<R> {
    params: BatchStartParams,
    replies: Vec<R>,
    /// Replays after an ambiguous failure so far.
    replays: u32,
    /// Throttled replays so far (they do not count against [`MAX_REPLAYS`]).
    throttled: u32,
    /// Some call of this intent failed ambiguously: it may have made instances.
    ambiguous: bool,
}

impl<R> Flying<R> {
    /// The machines of its call, in order.
    fn members(&self) -> std::sync::Arc<[crate::model::MachineId]> {
        self.params.members.iter().map(|m| m.machine.clone()).collect()
    }
}

/// What [`BatchBook::join`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// The batch the start joined.
    pub batch: u64,
    /// The start opened it: the shell waits for a start token for it, then closes it.
    pub opened: bool,
}

/// What one member learns of its batch's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Its instance, or why it got none.
    pub result: Result<StartedInstance, BrokerError>,
    /// The call may have made its instance although it failed (ambiguous failures, replays
    /// used up): look for it by its tags before a new call.
    pub maybe_made: bool,
    /// The machines the call was made for (this one among them), in the order they joined:
    /// a trace shows whom a start was batched with.
    pub with: std::sync::Arc<[crate::model::MachineId]>,
}

/// What the shell does with a batch's answer.
#[derive(Debug, Clone)]
pub enum Answer<R> {
    /// Hand each waiting member its reply; the intent is done.
    Deliver(Vec<(R, Reply)>),
    /// Replay the same intent after a backoff of this many failed tries (members keep waiting).
    Replay {
        /// Failed tries so far, for the backoff.
        attempt: u32,
    },
    /// No such batch (already answered).
    Unknown,
}

/// The open batches and the intents in flight. `R` is whatever answers a waiting member (a
/// oneshot sender in the shell).
#[derive(Debug, Clone)]
pub struct BatchBook<R> {
    size: usize,
    next: u64,
    open: Vec<Open<R>>,
    flying: BTreeMap<u64, Flying<R>>,
    /// Code broken on purpose (`batch_replay_new_token`): tests and the model checker only.
    mutations: crate::config::Mutations,
}

impl<R> BatchBook<R> {
    /// An empty book whose calls carry at most `size` machines (at least one).
    pub fn new(size: usize) -> Self {
        Self { size: size.max(1), next: 0, open: Vec::new(), flying: BTreeMap::new(), mutations: Default::default() }
    }

    /// The same, with code broken on purpose.
    pub fn with_mutations(self, mutations: crate::config::Mutations) -> Self {
        Self { mutations, ..self }
    }

    /// A start reached its cloud call: it joins the open batch of its shape that has room, or
    /// opens a new one.
    pub fn join(&mut self, params: StartInstanceParams, reply: R) -> Joined {
        let shape = Shape::of(&params);
        let size = self.size;
        if let Some(open) = self.open.iter_mut().find(|o| o.shape == shape && o.members.len() < size) {
            open.members.push((params, reply));
            return Joined { batch: open.id, opened: false };
        }
        self.next += 1;
        let id = self.next;
        self.open.push(Open { id, shape, members: vec![(params, reply)] });
        Joined { batch: id, opened: true }
    }

    /// The batch's start token is granted: it takes no more members, and its intent (one
    /// client token, the machines in launch order) is recorded. Answers the call to make.
    pub fn close(&mut self, batch: u64) -> Option<BatchStartParams> {
        let pos = self.open.iter().position(|o| o.id == batch)?;
        let open = self.open.remove(pos);
        let n = open.members.len();
        let (members, replies): (Vec<_>, Vec<_>) = open.members.into_iter().unzip();
        let first = members.first()?;
        let params = BatchStartParams {
            zone: open.shape.zone,
            constraints: open.shape.constraints,
            placement: open.shape.placement,
            volumes: open.shape.volumes,
            extra_tags: open.shape.extra_tags,
            client_token: format!("{}+{n}", first.client_token),
            capacity: open.shape.capacity,
            spot_max_price: open.shape.spot_max_price,
            members: members
                .into_iter()
                .map(|p| BatchMember {
                    machine: p.machine,
                    nonce: p.nonce,
                    tags: p.tags,
                    distribution_group: p.distribution_group,
                })
                .collect(),
        };
        self.flying
            .insert(batch, Flying { params: params.clone(), replies, replays: 0, throttled: 0, ambiguous: false });
        Some(params)
    }

    /// Closes every open batch, in the order they opened (`provisioner plan`: a wave of
    /// starts has joined).
    pub fn close_all(&mut self) -> Vec<BatchStartParams> {
        let ids: Vec<u64> = self.open.iter().map(|o| o.id).collect();
        ids.into_iter().filter_map(|id| self.close(id)).collect()
    }

    /// The intent of a batch waiting for its replay: the very call made before.
    pub fn replay(&self, batch: u64) -> Option<BatchStartParams> {
        let f = self.flying.get(&batch)?;
        let mut params = f.params.clone();
        if self.mutations.batch_replay_new_token && f.replays > 0 {
            params.client_token = format!("{}~{}", params.client_token, f.replays);
        }
        Some(params)
    }

    /// The cloud answered a batch's call.
    pub fn answered(&mut self, batch: u64, result: Result<BatchStarted, BrokerError>) -> Answer<R> {
        let Some(flying) = self.flying.get_mut(&batch) else { return Answer::Unknown };
        let err = match result {
            Ok(started) => {
                let Some(f) = self.flying.remove(&batch) else { return Answer::Unknown };
                let n = f.replies.len();
                let launched = started.iter().filter(|r| r.is_ok()).count();
                let with = f.members();
                let mut started = started.into_iter();
                let out = f
                    .replies
                    .into_iter()
                    .map(|reply| {
                        let result = started.next().unwrap_or_else(|| {
                            Err(BrokerError::zone_specific(format!(
                                "the cloud launched {launched} of {n} instances of a batched start"
                            )))
                        });
                        // A member's own ambiguous failure (its instance made but not
                        // tagged, say) may have made its instance: it looks before a new call.
                        let maybe_made = result.as_ref().err().is_some_and(BrokerError::is_ambiguous);
                        (reply, Reply { result, maybe_made, with: with.clone() })
                    })
                    .collect();
                return Answer::Deliver(out);
            }
            Err(e) => e,
        };
        if err.is_ambiguous() {
            flying.ambiguous = true;
            // A zone that did not answer would hang again: no replay; every member is told the
            // call may have made its instance, marks the zone failed and looks before its next
            // call (see `repeats_in_place`).
            let replayable = super::state::repeats_in_place(&err, flying.params.zone.as_deref());
            if replayable && flying.replays < MAX_REPLAYS {
                flying.replays += 1;
                return Answer::Replay { attempt: flying.replays - 1 };
            }
        } else if flying.ambiguous && matches!(err, BrokerError::Throttled { .. }) {
            // A refused replay tells nothing: the first call may still have made instances.
            flying.throttled += 1;
            return Answer::Replay { attempt: flying.throttled - 1 };
        }
        let Some(f) = self.flying.remove(&batch) else { return Answer::Unknown };
        let (maybe_made, with) = (f.ambiguous, f.members());
        let reply = |r| (r, Reply { result: Err(err.clone()), maybe_made, with: with.clone() });
        Answer::Deliver(f.replies.into_iter().map(reply).collect())
    }

    /// The machines of open batch `batch`, in the order they joined (empty if it is not open).
    #[cfg(feature = "mc")]
    pub(crate) fn open_members(&self, batch: u64) -> Vec<crate::model::MachineId> {
        let open = self.open.iter().find(|o| o.id == batch);
        open.map(|o| o.members.iter().map(|(p, _)| p.machine.clone()).collect()).unwrap_or_default()
    }

    /// Batches still taking members.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Intents recorded and not yet answered for good.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.flying.len()
    }
}
