//! The allocator's plain core: the zone book.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::Rng;

pub use crate::model::ZoneRequest;
use crate::model::{repack, FailOutcome, MachineId, Packing};

pub use crate::model::ZoneError;

/// A zone's name as the book holds it per machine: its index in [`ZoneBook`]'s interned names.
type ZoneIndex = u16;

/// How many zone names the book interns at most (those listed after them are never used).
pub const MAX_ZONE_NAMES: usize = ZoneIndex::MAX as usize + 1;

#[derive(Debug, Clone)]
struct Zone {
    /// Its interned name.
    index: ZoneIndex,
    available: bool,
    listed: bool,
    /// How many machines are placed or reserved there (those `placed` puts there).
    population: usize,
    failed: BTreeSet<MachineId>,
}

/// A zone's state, for snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneView {
    /// Its name.
    pub name: String,
    /// Whether new machines may go there.
    pub available: bool,
    /// Machines placed or reserved there.
    pub machines: Vec<MachineId>,
    /// Machines that failed there this round.
    pub failed: Vec<MachineId>,
}

/// Per-zone machine sets, failure marks, requests, and the capacity memory.
#[derive(Debug, Clone)]
pub struct ZoneBook {
    zones: BTreeMap<String, Zone>,
    /// Every zone name the book has seen, each once: a zone's index is its place here (a zone
    /// dropped and listed again gets its index back).
    names: Vec<String>,
    /// Each name's index in `names`.
    index_of: BTreeMap<String, ZoneIndex>,
    /// Each placed or reserved machine's zone (a zone's machines are those placed there).
    placed: BTreeMap<MachineId, ZoneIndex>,
    /// When `placed` is rebuilt packed (it fills in id order).
    packing: Packing,
    requests: BTreeMap<MachineId, ZoneRequest>,
    rng: crate::model::seeded::SeededRng,
    /// (shape, zone) → until when a zone failure steers that shape elsewhere.
    capacity: BTreeMap<(String, String), Duration>,
    memory: Duration,
    now: Duration,
}

impl ZoneBook {
    /// An empty book with a seeded tie-breaker.
    pub fn new(seed: u64) -> Self {
        Self {
            zones: BTreeMap::new(),
            names: Vec::new(),
            index_of: BTreeMap::new(),
            placed: BTreeMap::new(),
            packing: Packing::default(),
            requests: BTreeMap::new(),
            rng: crate::model::seeded::SeededRng::seed_from_u64(seed),
            capacity: BTreeMap::new(),
            memory: Duration::ZERO,
            now: Duration::ZERO,
        }
    }

    /// The same book remembering, for `memory`, each zone where a start failed for its zone
    /// (typically no capacity): machines of the same shape avoid it meanwhile, as long as
    /// another eligible zone is left. Zero = no memory.
    pub fn with_capacity_memory(mut self, memory: Duration) -> Self {
        self.memory = memory;
        self
    }

    /// The time the next decisions are taken at (the actor's clock); expired memories go.
    pub fn set_clock(&mut self, now: Duration) {
        self.now = now;
        if self.capacity.values().any(|until| *until <= now) {
            self.capacity.retain(|_, until| *until > now);
        }
    }

    /// Zones this shape is steered away from now, in name order.
    #[cfg(test)]
    pub fn remembered(&self, shape: &str) -> Vec<&str> {
        remembered_in(&self.capacity, self.now, shape)
    }

    /// Whether the cloud has zones at all (none = start without a zone).
    pub fn is_zoned(&self) -> bool {
        !self.zones.is_empty()
    }

    /// Applies the cloud's zone list (a zone no longer available is not chosen): new zones are
    /// added empty; zones no longer listed are dropped unless they hold machines (then kept, never
    /// chosen); unavailable zones are never chosen.
    pub fn update_zones(&mut self, list: &[(String, bool)]) {
        for z in self.zones.values_mut() {
            z.listed = false;
            z.available = false;
        }
        for (name, available) in list {
            let index = match self.index_of.get(name) {
                Some(i) => *i,
                None => match ZoneIndex::try_from(self.names.len()) {
                    Ok(i) => {
                        self.names.push(name.clone());
                        self.index_of.insert(name.clone(), i);
                        i
                    }
                    // A cloud listing more zone names than that is broken: the rest are ignored.
                    Err(_) => {
                        tracing::warn!(zone = %name, limit = MAX_ZONE_NAMES, "too many zone names; zone ignored");
                        continue;
                    }
                },
            };
            let z = self.zones.entry(name.clone()).or_insert_with(|| Zone {
                index,
                available: false,
                listed: false,
                population: 0,
                failed: BTreeSet::new(),
            });
            z.listed = true;
            z.available = *available;
        }
        self.zones.retain(|name, z| {
            let keep = z.listed || z.population > 0;
            if !keep {
                tracing::debug!(zone = %name, "zone no longer listed; dropped");
            } else if !z.listed {
                tracing::warn!(zone = %name, "zone no longer listed but holds machines; kept, not chosen");
            }
            keep
        });
    }

    /// Counts machines already in a zone (their instances' zones), e.g. after a restart.
    pub fn populate(&mut self, placements: &[(MachineId, String)]) {
        for (m, zone) in placements {
            if self.zones.contains_key(zone) {
                self.place(m, zone);
            }
        }
    }

    /// Puts a machine in a zone of the book (out of the one it was in, if another).
    fn place(&mut self, machine: &MachineId, zone: &str) {
        let z = self.zones.get_mut(zone).expect("a zone of the book");
        let index = z.index;
        let before = self.placed.insert(machine.clone(), index);
        if before != Some(index) {
            z.population += 1;
            if let Some(before) = before {
                self.leave(before);
            }
        }
        if before.is_none() && self.packing.due(self.placed.len()) {
            repack(&mut self.placed);
        }
    }

    /// One machine fewer in the zone of this index.
    fn leave(&mut self, index: ZoneIndex) {
        leave(&mut self.zones, &self.names, index);
    }

    /// Chooses and reserves a zone for a machine: among eligible zones, the lowest population
    /// (of its distribution group, or of all machines), ties broken at random. `Ok(None)` on a
    /// zoneless cloud.
    pub fn choose(&mut self, machine: &MachineId, req: ZoneRequest) -> Result<Option<String>, ZoneError> {
        if !self.is_zoned() {
            return Ok(None);
        }
        let Self { zones, names, placed, packing, requests, rng, capacity, now, .. } = self;
        let group_counts: Option<BTreeMap<&str, usize>> = req.group.as_ref().map(|g| {
            let mut counts = BTreeMap::new();
            for m in g.iter().filter(|m| *m != machine) {
                if let Some(z) = placed.get(m) {
                    *counts.entry(names[usize::from(*z)].as_str()).or_insert(0) += 1;
                }
            }
            counts
        });
        // The machine's own reservation, if it holds one, is let go first; its entry is where
        // the new one goes (one search of the placements, not a removal and then an insert).
        let slot = placed.entry(machine.clone());
        if let Entry::Occupied(e) = &slot {
            leave(zones, names, *e.get());
        }
        // Zones recently out of capacity for this shape are skipped while others are eligible.
        let avoid: Vec<&str> = match &req.shape {
            Some(shape) if !capacity.is_empty() => {
                let remembered = remembered_in(capacity, *now, shape);
                let spare = zones
                    .iter()
                    .any(|(name, z)| eligible(machine, name, z, &req) && !remembered.contains(&name.as_str()));
                if spare {
                    remembered
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        let mut best: Vec<&str> = Vec::new();
        let mut best_pop = usize::MAX;
        for (name, z) in zones.iter() {
            if !eligible(machine, name, z, &req) || avoid.contains(&name.as_str()) {
                continue;
            }
            let pop = match &group_counts {
                Some(c) => c.get(name.as_str()).copied().unwrap_or(0),
                None => z.population,
            };
            if pop < best_pop {
                best_pop = pop;
                best.clear();
            }
            if pop == best_pop {
                best.push(name);
            }
        }
        let pick = match best.len() {
            0 => None,
            1 => Some(0),
            n => Some(rng.random_range(0..n)),
        };
        let zone = pick.map(|i| best[i].to_owned());
        let Some((zone, z)) = zone.and_then(|zone| zones.get_mut(&zone).map(|z| (zone, z))) else {
            if let Entry::Occupied(e) = slot {
                e.remove();
            }
            return Err(ZoneError::NoSuitableZone(machine.clone()));
        };
        z.population += 1;
        let newly = match slot {
            Entry::Occupied(mut e) => {
                e.insert(z.index);
                false
            }
            Entry::Vacant(e) => {
                e.insert(z.index);
                true
            }
        };
        if newly && packing.due(placed.len()) {
            repack(placed);
        }
        // Only a restricted request changes which zones are eligible after a failure.
        if req.allowed.is_some() || !req.derived.is_empty() {
            requests.insert(machine.clone(), req);
        }
        Ok(Some(zone))
    }

    /// Drops the machine's reservation (its start failed or is retried elsewhere).
    pub fn release_reservation(&mut self, machine: &MachineId) {
        if let Some(index) = self.placed.remove(machine) {
            self.leave(index);
        }
    }

    /// A zone-specific failure: the machine leaves the zone and is marked failed
    /// there; if no eligible zone is left, its marks are cleared and a round is used.
    pub fn mark_failed(&mut self, machine: &MachineId, zone: &str) -> FailOutcome {
        self.release_reservation(machine);
        if let Some(z) = self.zones.get_mut(zone) {
            z.failed.insert(machine.clone());
        }
        let req = self.requests.get(machine).cloned().unwrap_or_default();
        let any_left = self.zones.iter().any(|(name, z)| eligible(machine, name, z, &req));
        if any_left {
            FailOutcome::TryAnotherZone
        } else {
            for z in self.zones.values_mut() {
                z.failed.remove(machine);
            }
            FailOutcome::RoundExhausted
        }
    }

    /// A start of this shape failed in `zone` for the zone's sake (typically no capacity):
    /// machines of the shape avoid the zone for the memory's length (nothing if it is zero).
    pub fn remember_capacity(&mut self, shape: &str, zone: &str) {
        if self.memory.is_zero() {
            return;
        }
        tracing::info!(%zone, %shape, for_ = ?self.memory, "zone failed a start: machines of this shape avoid it for a while");
        self.capacity.insert((shape.to_owned(), zone.to_owned()), self.now + self.memory);
    }

    /// Forgets a machine everywhere (final failure, or removal): reservation, failure marks
    /// and request.
    pub fn release(&mut self, machine: &MachineId) {
        self.release_reservation(machine);
        self.requests.remove(machine);
        for z in self.zones.values_mut() {
            z.failed.remove(machine);
        }
        self.zones.retain(|_, z| z.listed || z.population > 0);
    }

    /// The zone a machine is placed in.
    #[cfg(test)]
    pub fn zone_of(&self, machine: &MachineId) -> Option<&str> {
        self.placed.get(machine).map(|z| self.names[usize::from(*z)].as_str())
    }

    /// Every zone, in name order.
    pub fn view(&self) -> Vec<ZoneView> {
        let mut machines: BTreeMap<ZoneIndex, Vec<MachineId>> = BTreeMap::new();
        for (m, z) in &self.placed {
            machines.entry(*z).or_default().push(m.clone());
        }
        self.zones
            .iter()
            .map(|(name, z)| ZoneView {
                name: name.clone(),
                available: z.available && z.listed,
                machines: machines.remove(&z.index).unwrap_or_default(),
                failed: z.failed.iter().cloned().collect(),
            })
            .collect()
    }
}

/// One machine fewer in the zone of this index (a book's fields, for callers that hold others).
fn leave(zones: &mut BTreeMap<String, Zone>, names: &[String], index: ZoneIndex) {
    if let Some(z) = zones.get_mut(&names[usize::from(index)]) {
        z.population -= 1;
    }
}

/// Whether a machine may be placed in this zone for this request.
fn eligible(machine: &MachineId, name: &str, z: &Zone, req: &ZoneRequest) -> bool {
    z.available
        && z.listed
        && !z.failed.contains(machine)
        && req.allowed.as_ref().is_none_or(|a| a.iter().any(|x| x == name))
        && (req.derived.is_empty() || req.derived.iter().any(|x| x == name))
}

/// Zones this shape is steered away from at `now`, in name order.
fn remembered_in<'a>(capacity: &'a BTreeMap<(String, String), Duration>, now: Duration, shape: &str) -> Vec<&'a str> {
    capacity.iter().filter(|((s, _), until)| s == shape && **until > now).map(|((_, z), _)| z.as_str()).collect()
}

/// The zones, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneSnapshot {
    /// Each zone's state.
    pub zones: Vec<ZoneView>,
}
