//! The plain core of the EC2 broker's memory (no actix): the per-type fail-over, the untagged
//! instances of batched starts, the pacer, and the once-read values.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::Tag;

use crate::model::instance_types::{InstanceType, TypeAttempt, TypeFailover};
use crate::model::{CapacityType, MachineId};
use crate::ports::Pacer;

/// An instance launched for a member of a batched start and not yet tagged with it: its id
/// and the tags it still needs.
pub(crate) type Untagged = (String, Vec<Tag>);

/// A start, by its machine and nonce.
pub(crate) type StartKey = (MachineId, String);

/// How one attempt of a launch (one `RunInstances` of one type) went, for the fail-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempted {
    /// The launch ended (an instance, a definite failure, or every type tried): nothing to
    /// repeat.
    Settled,
    /// This type had no capacity in the zone (a zone-specific failure).
    OutOfCapacity(String),
    /// This type's call failed ambiguously: a retry of the start tries it first.
    Ambiguous(String),
}

/// Where a launch goes, for the fail-over's memory: its zone and its capacity type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place<'a> {
    /// The zone (`None`: the region).
    pub zone: Option<&'a str>,
    /// Spot or on-demand.
    pub capacity: CapacityType,
}

/// What the broker remembers between calls.
pub(crate) struct MemoryBook {
    /// The per-type fail-over of on-demand starts.
    failover: TypeFailover,
    /// The same for spot starts, apart: a type out of spot capacity in a zone may still have
    /// on-demand capacity there (and the other way round).
    spot_failover: TypeFailover,
    /// `(machine, nonce)` → the instance a batched start launched for it whose `CreateTags`
    /// failed, with the tags it still needs.
    untagged: BTreeMap<StartKey, Untagged>,
    /// What paces the broker's own calls (the provisioner's client-side limiter).
    pacer: Option<Arc<dyn Pacer>>,
}

impl MemoryBook {
    /// An empty memory whose fail-over remembers capacity failures for `memory`.
    pub(crate) fn new(memory: Duration) -> Self {
        Self {
            failover: TypeFailover::new(memory),
            spot_failover: TypeFailover::new(memory),
            untagged: BTreeMap::new(),
            pacer: None,
        }
    }

    fn failover(&mut self, capacity: CapacityType) -> &mut TypeFailover {
        match capacity {
            CapacityType::OnDemand => &mut self.failover,
            CapacityType::Spot => &mut self.spot_failover,
        }
    }

    /// The attempts of start `token` (of `capacity`) in `place`'s zone, in the fail-over's
    /// order.
    pub(crate) fn order(
        &mut self,
        now: Duration,
        place: Place<'_>,
        token: &str,
        candidates: &[InstanceType],
    ) -> Vec<TypeAttempt> {
        self.failover(place.capacity).order(now, place.zone, token, candidates)
    }

    /// Records how an attempt of start `token` in `place` went.
    pub(crate) fn attempted(&mut self, now: Duration, place: Place<'_>, token: &str, outcome: Attempted) {
        let failover = self.failover(place.capacity);
        match outcome {
            Attempted::Settled => failover.settled(token),
            Attempted::OutOfCapacity(t) => failover.capacity_failed(now, &t, place.zone),
            Attempted::Ambiguous(t) => failover.ambiguous(now, token, &t),
        }
    }

    /// Whether `(instance_type, place)` is remembered as out of capacity at `now`.
    #[cfg(test)]
    pub(crate) fn is_remembered(&mut self, now: Duration, instance_type: &str, place: Place<'_>) -> bool {
        self.failover(place.capacity).is_remembered(now, instance_type, place.zone)
    }

    /// Remembers the untagged instance of `start` (replacing any earlier one).
    pub(crate) fn remember_untagged(&mut self, start: StartKey, untagged: Untagged) {
        self.untagged.insert(start, untagged);
    }

    /// The untagged instance of `start`, forgotten.
    pub(crate) fn take_untagged(&mut self, start: &StartKey) -> Option<Untagged> {
        self.untagged.remove(start)
    }

    /// Replaces the pacer.
    pub(crate) fn set_pacer(&mut self, pacer: Arc<dyn Pacer>) {
        self.pacer = Some(pacer);
    }

    /// The pacer, if one was handed over.
    pub(crate) fn pacer(&self) -> Option<Arc<dyn Pacer>> {
        self.pacer.clone()
    }
}

/// A value read once: the first caller reads it, callers that come during its read wait for
/// it, and every later one gets it as known. A read that fails leaves it unknown: the next
/// waiting caller reads it in turn (as a lock held over the read would). `J` is a caller's
/// job (its read and where to answer), which the owner runs.
pub(crate) struct OnceRead<T, J> {
    value: Option<T>,
    reading: bool,
    waiting: VecDeque<J>,
}

/// What to do with a caller's job.
pub(crate) enum Ask<T, J> {
    /// The value is known: answer the job with it (its read is not made).
    Known(T, J),
    /// Make this job's read now.
    Read(J),
    /// A read is under way: the job waits.
    Wait,
}

/// What to do when a read ended.
pub(crate) enum After<T, J> {
    /// It read the value: answer these waiting jobs with it.
    Known(T, Vec<J>),
    /// It failed: make this job's read next (if one waits).
    Next(Option<J>),
}

impl<T, J> Default for OnceRead<T, J> {
    fn default() -> Self {
        Self { value: None, reading: false, waiting: VecDeque::new() }
    }
}

impl<T: Clone, J> OnceRead<T, J> {
    /// A caller asks for the value with `job`.
    pub(crate) fn ask(&mut self, job: J) -> Ask<T, J> {
        if let Some(v) = &self.value {
            return Ask::Known(v.clone(), job);
        }
        if self.reading {
            self.waiting.push_back(job);
            return Ask::Wait;
        }
        self.reading = true;
        Ask::Read(job)
    }

    /// The read under way ended: with the value, or without (`None`, a failed read).
    pub(crate) fn read(&mut self, value: Option<T>) -> After<T, J> {
        match value {
            Some(v) => {
                self.value = Some(v.clone());
                self.reading = false;
                After::Known(v, self.waiting.drain(..).collect())
            }
            None => {
                let next = self.waiting.pop_front();
                self.reading = next.is_some();
                After::Next(next)
            }
        }
    }
}
