//! The coordinator's plain core: batching, coalescing and backoff of machine notifications.

use std::collections::BTreeSet;
use std::time::Duration;

use super::batch::{BatchOutcome, BatchStart};
use super::followup::Followup;
use crate::actors::harvest::ModeChange;
use crate::config::Backoff;
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceId, MachineId};
use crate::ports::ModelError;

/// Notifications waiting, the batch in flight, and dead machines whose stop is deferred.
#[derive(Debug, Clone)]
pub struct BatchBook {
    pending: BTreeSet<MachineId>,
    seen: bool,
    in_flight: bool,
    backing_off: bool,
    first_done: bool,
    zones_loaded: bool,
    failures: u32,
    backoff: Backoff,
    rng: crate::model::seeded::SeededRng,
    workers: usize,
    model_dying: bool,
    starts_closed: bool,
}

impl BatchBook {
    /// Nothing pending; `workers` is the pool's size.
    pub fn new(backoff: Backoff, workers: usize) -> Self {
        Self {
            pending: BTreeSet::new(),
            seen: false,
            in_flight: false,
            backing_off: false,
            first_done: false,
            zones_loaded: false,
            failures: 0,
            backoff,
            rng: crate::model::seeded::SeededRng::seed_from_u64(0),
            workers,
            model_dying: false,
            starts_closed: false,
        }
    }

    /// The same book drawing its backoff jitter from this seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = crate::model::seeded::SeededRng::seed_from_u64(seed);
        self
    }

    /// Adds changed ids to the next batch.
    pub fn notify(&mut self, ids: impl IntoIterator<Item = MachineId>) {
        self.seen = true;
        self.pending.extend(ids);
    }

    /// The next batch, if none is in flight and something is waiting. The first batch may be
    /// empty (a model with no machines still ends safe mode).
    pub fn take_batch(&mut self) -> Option<Vec<MachineId>> {
        if self.in_flight || self.backing_off || (self.pending.is_empty() && (self.first_done || !self.seen)) {
            return None;
        }
        self.in_flight = true;
        Some(std::mem::take(&mut self.pending).into_iter().collect())
    }

    /// The next batch to run (see [`BatchBook::take_batch`]), with what the batch planner
    /// needs to know.
    pub fn start_batch(&mut self) -> Option<BatchStart> {
        let ids = self.take_batch()?;
        Some(BatchStart {
            ids,
            first: !self.first_done,
            need_zones: !self.zones_loaded,
            model_dying: self.model_dying,
            starts_closed: self.starts_closed,
        })
    }

    /// The batch ran to its end: what follows, in order (a retry of the ids it could not
    /// settle, the event, and after the first batch the dying model's sweep and the first
    /// harvest of unknown instances, the cache being complete).
    pub fn batch_done(&mut self, outcome: BatchOutcome) -> Vec<Followup> {
        self.model_dying |= outcome.model_dying;
        self.zones_loaded |= outcome.zones_loaded;
        let mut out = Vec::new();
        if !outcome.retry_later.is_empty() {
            out.push(Followup::RetryLater { delay: self.retry_later_delay(), ids: outcome.retry_later });
        }
        self.batch_succeeded();
        out.push(Followup::Publish(ProvisionerEvent::ProcessedMachines));
        if let Some(change) = outcome.mode_change {
            if self.model_dying {
                // A dying model found at start-up: finish its destruction (a crash may have
                // lost starts in flight or the destroy's own stop).
                out.push(Followup::SweepDyingModel);
            }
            if let ModeChange::Changed { mode, .. } = change {
                out.push(Followup::Publish(ProvisionerEvent::HarvestModeChanged { mode }));
            }
            out.push(Followup::HarvestUnknown { announce: false, fresher_than: None });
        }
        out
    }

    /// The model is dying (destroyed here or elsewhere): no batch starts anything any more.
    pub fn set_model_dying(&mut self) {
        self.model_dying = true;
    }

    /// Starts are closed: no batch starts anything any more.
    pub fn close_starts(&mut self) {
        self.starts_closed = true;
    }

    /// The batch succeeded. Answers whether it was the first one.
    pub fn batch_succeeded(&mut self) -> bool {
        self.in_flight = false;
        self.failures = 0;
        !std::mem::replace(&mut self.first_done, true)
    }

    /// The batch failed as a whole: its ids wait again, and no batch is taken until
    /// [`BatchBook::backoff_over`]; answers the delay before the retry.
    pub fn batch_failed(&mut self, ids: Vec<MachineId>) -> Duration {
        self.in_flight = false;
        self.backing_off = true;
        self.pending.extend(ids);
        let d = self.backoff.delay(self.failures, &mut self.rng);
        self.failures += 1;
        d
    }

    /// The backoff after a failed batch has run out: batches may be taken again.
    pub fn backoff_over(&mut self) {
        self.backing_off = false;
    }

    /// Work not yet done: waiting ids, a batch in flight, a backoff running.
    pub fn busy(&self) -> usize {
        self.pending.len() + usize::from(self.in_flight) + usize::from(self.backing_off)
    }

    /// Whether the first full notification was processed.
    pub fn first_done(&self) -> bool {
        self.first_done
    }

    /// Whether the zone list has been loaded.
    #[cfg(test)]
    pub fn zones_loaded(&self) -> bool {
        self.zones_loaded
    }

    /// The zone list was loaded.
    #[cfg(test)]
    pub fn set_zones_loaded(&mut self) {
        self.zones_loaded = true;
    }

    /// Ids to retry later (a per-machine read failed): they wait for the next batch after a
    /// backoff; answers that delay.
    pub fn retry_later_delay(&mut self) -> Duration {
        self.backoff.delay(self.failures, &mut self.rng)
    }

    /// The pool size in force.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Records a new pool size; answers whether it changed.
    pub fn set_workers(&mut self, n: usize) -> bool {
        std::mem::replace(&mut self.workers, n) != n
    }
}

/// What a destruction set in motion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroySummary {
    /// Instances being stopped (one call).
    pub stopping: Vec<InstanceId>,
    /// Machines whose start is in flight: their instances are stopped as they land.
    pub awaiting_starts: Vec<MachineId>,
}

/// Why a destruction was refused or is incomplete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestroyError {
    /// The model is already dying: nothing changed.
    #[error("model is already dying")]
    AlreadyDying,
    /// The model refused.
    #[error("destroying the model: {0}")]
    Model(#[source] ModelError),
    /// Everything killable is being stopped, but manual machines remain.
    #[error("manually provisioned machines must first be destroyed: {}", ids.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(", "))]
    ManualMachines {
        /// The manual machines.
        ids: Vec<MachineId>,
        /// What was set in motion anyway.
        summary: DestroySummary,
    },
    /// The provisioner stopped (an actor it needs no longer takes messages).
    #[error("provisioner unavailable: {0}")]
    Unavailable(#[source] actix::MailboxError),
}
