//! The bounds of one check ([`McConfig`]) and what a broken property looks like
//! ([`Counterexample`]): read by the state's steps, the search and the export alike.

use crate::config::Mutations;

use super::action::McAction;

/// The bounds of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McConfig {
    /// A name for reports.
    pub name: &'static str,
    /// The machines (`0`, `1`, ...), alive and pending at first.
    pub machines: u8,
    /// The cloud's zones (none: a zoneless cloud).
    pub zones: Vec<String>,
    /// Retry rounds of a start after its first (the provisioner's `retry_count`).
    pub retry_count: u32,
    /// Crashes and restarts of the provisioner, at most.
    pub crashes: u8,
    /// Start calls that land and lose their answer (ambiguous failures), at most.
    pub lost_answers: u8,
    /// Start calls refused by their zone (no capacity), at most.
    pub refusals: u8,
    /// Machines that may die (each at most once), in id order: `1` lets machine 0 die.
    pub deaths: u8,
    /// Periodic listings of the registry, at most (each may lag: sent, then answered later).
    pub listings: u8,
    /// Listings that fail (the first refresh's or a periodic one), at most.
    pub listing_failures: u8,
    /// Writes of a start's record the model refuses, at most (a start gives up after three).
    pub record_failures: u8,
    /// Retries of a machine in provisioning error (`retry-provisioning`), at most.
    pub retries: u8,
    /// Code broken on purpose (none: the code as shipped).
    pub mutations: Mutations,
    /// The longest path explored (a bound on the search, not on the protocol: a path deeper
    /// is cut off; the report's `max_depth` shows whether any got there).
    pub max_depth: usize,
    /// Search depth first: memory for the path alone (and a fingerprint a state), where
    /// breadth first holds a whole frontier of states; a counterexample it finds is then
    /// shortened by a breadth-first search among shorter paths.
    pub depth_first: bool,
}

impl McConfig {
    /// The configuration CI checks: two machines in two zones, one retry, at most one crash,
    /// one lost answer, one refusal and one death.
    pub fn small() -> Self {
        Self {
            name: "small",
            machines: 2,
            zones: vec!["az1".into(), "az2".into()],
            retry_count: 1,
            crashes: 1,
            lost_answers: 1,
            refusals: 1,
            deaths: 1,
            listings: 0,
            listing_failures: 0,
            record_failures: 0,
            retries: 0,
            mutations: Mutations::default(),
            max_depth: 200,
            depth_first: false,
        }
    }

    /// The nightly-style configuration (`MODEL_CHECK_LONG=1`): [`McConfig::small`] with two
    /// crashes, two lost answers and both machines allowed to die.
    pub fn long() -> Self {
        Self {
            name: "long",
            crashes: 2,
            lost_answers: 2,
            deaths: 2,
            max_depth: 300,
            depth_first: true,
            ..Self::small()
        }
    }

    /// One machine, one zone: the start protocol alone, with two crashes and two lost answers.
    pub fn one_machine() -> Self {
        Self {
            name: "one-machine",
            machines: 1,
            zones: vec!["az1".into()],
            crashes: 2,
            lost_answers: 2,
            ..Self::small()
        }
    }

    /// One machine, one zone, with the registry's listings: at most two periodic listings
    /// (each may lag), one failed listing, a start whose record the model refuses three times
    /// (it gives up, the instance an orphan to stop), one retry of the machine in error, one
    /// crash and one lost answer.
    pub fn listings() -> Self {
        Self {
            name: "listings",
            crashes: 1,
            lost_answers: 1,
            refusals: 0,
            deaths: 0,
            listings: 2,
            listing_failures: 1,
            record_failures: 3,
            retries: 1,
            ..Self::one_machine()
        }
    }

    /// The nightly-style configuration of the listings (`MODEL_CHECK_LONG=1`):
    /// [`McConfig::listings`] with two crashes, two lost answers, a refusal and a death, depth
    /// first.
    pub fn listings_long() -> Self {
        Self {
            name: "listings-long",
            crashes: 2,
            lost_answers: 2,
            refusals: 1,
            deaths: 1,
            max_depth: 300,
            depth_first: true,
            ..Self::listings()
        }
    }
}

/// A property broken, and how.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The property.
    pub property: &'static str,
    /// The actions from the initial state, in order.
    pub actions: Vec<McAction>,
    /// What the last state breaks, in words.
    pub broken: Vec<String>,
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "property {:?} broken after {} steps:", self.property, self.actions.len())?;
        for (i, a) in self.actions.iter().enumerate() {
            writeln!(f, "  {:>3}. {a}", i + 1)?;
        }
        for b in &self.broken {
            writeln!(f, "  => {b}")?;
        }
        Ok(())
    }
}
