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
    /// The last machines (of `machines`), this many, are not in the model at first: the model
    /// adds each at any point (`add_machine`).
    pub adds: u8,
    /// Periodic listings of the registry, at most (each may lag: sent, then answered later).
    pub listings: u8,
    /// Listings that fail (the first refresh's or a periodic one), at most.
    pub listing_failures: u8,
    /// Writes of a start's record the model refuses, at most (a start gives up after three).
    pub record_failures: u8,
    /// Retries of a machine in provisioning error (`retry-provisioning`), at most.
    pub retries: u8,
    /// The harvest mode at first: `destroyed` (the default), `all` (unknown instances
    /// harvested too, once older than the grace period), `unknown` (those, and dead machines'
    /// instances released) or `none` (dead machines' instances released).
    pub harvest_mode: crate::model::HarvestMode,
    /// A change of the harvest mode by the operator, to this mode, at any point (at most one).
    pub mode_change: Option<crate::model::HarvestMode>,
    /// Stop calls that take effect and lose their answer, at most: the pool retries the job
    /// later (an at-least-once stop).
    pub stop_failures: u8,
    /// Destructions of the model (`destroy-model`), at most (0 or 1).
    pub destroys: u8,
    /// Spot interruption warnings the cloud gives, at most (issue 33): the cloud warns that it
    /// takes a live instance of ours, hands the notice to the provisioner's poller until it is
    /// acknowledged, and may take the instance at any point after (time is not modelled). A
    /// warned machine's instance is handed over to a replacement (`HandoverBook`).
    pub interruptions: u8,
    /// The service's protocol around the engine: a leader lease whose epoch fences the
    /// provisioner's writes to the store (`model::Fence`), a start intent written (fenced)
    /// before each start call and repeated by a new incarnation before it runs, and start calls
    /// on the wire (sent in one step, reaching the cloud in a later one, across a crash or a
    /// change of leader). Off: the engine alone (a call reaches the cloud as it is made).
    pub service: bool,
    /// Changes of leader, at most (`service` only): the lease moves to another replica, whose
    /// provisioner starts at once while the old leader, stale, may go on acting until it steps
    /// down (its clock or its pauses beyond the lease's timing assumptions: the fence is what
    /// keeps its writes out).
    pub lease_changes: u8,
    /// Batched starts (`ProvisionerConfig::batch_starts`, the engine alone): starts of one zone
    /// and shape share one cloud call of at most this many machines, which the pool's batcher
    /// (`workers::batch::BatchBook`) closes, replays after an ambiguous failure and answers
    /// member by member. `0` or `1`: one call per machine.
    pub batch_size: usize,
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
            adds: 0,
            listings: 0,
            listing_failures: 0,
            record_failures: 0,
            retries: 0,
            destroys: 0,
            interruptions: 0,
            stop_failures: 0,
            harvest_mode: crate::model::HarvestMode::Destroyed,
            mode_change: None,
            service: false,
            lease_changes: 0,
            batch_size: 0,
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

    /// The model's destruction: two machines in one zone, the model destroyed once at any
    /// point, one crash, one lost answer and one stop call that loses its answer.
    pub fn destroy() -> Self {
        Self {
            name: "destroy",
            stop_failures: 1,
            machines: 2,
            zones: vec!["az1".into()],
            destroys: 1,
            crashes: 1,
            lost_answers: 1,
            refusals: 0,
            deaths: 0,
            ..Self::small()
        }
    }

    /// Harvest mode `all`: one machine, one zone, the grace period passing at any point; one
    /// crash, one lost answer, one death, one periodic listing, one stop call that loses its
    /// answer.
    pub fn harvest_all() -> Self {
        Self {
            name: "harvest-all",
            harvest_mode: crate::model::HarvestMode::All,
            stop_failures: 1,
            listings: 1,
            crashes: 1,
            lost_answers: 1,
            ..Self::one_machine()
        }
    }

    /// Harvest modes that release: one machine, one zone, mode `unknown` (dead machines'
    /// instances released, unknown instances stopped once older than the grace period), changed
    /// to `destroyed` at any point; one death, one crash, one lost answer, one periodic listing,
    /// one stop call that loses its answer.
    pub fn harvest_modes() -> Self {
        Self {
            name: "harvest-modes",
            stop_failures: 1,
            harvest_mode: crate::model::HarvestMode::Unknown,
            mode_change: Some(crate::model::HarvestMode::Destroyed),
            listings: 1,
            crashes: 1,
            lost_answers: 1,
            ..Self::one_machine()
        }
    }

    /// The nightly-style configuration of harvest mode `all` (`MODEL_CHECK_LONG=1`):
    /// [`McConfig::harvest_all`] with the service's protocol and one change of leader instead
    /// of the crash and the lost answer (a stale leader's late call lands for a machine removed
    /// meanwhile: an unknown instance to harvest), depth first.
    pub fn harvest_all_long() -> Self {
        Self {
            name: "harvest-all-long",
            service: true,
            lease_changes: 1,
            crashes: 0,
            lost_answers: 0,
            max_depth: 300,
            depth_first: true,
            ..Self::harvest_all()
        }
    }

    /// Spot interruptions and their hand-overs (one machine, one zone): the cloud warns twice
    /// (the machine's instance, then maybe its replacement, or the replacement before the
    /// switch), may take each warned instance at any point; one crash (a hand-over under way
    /// resumed from the listing, the notices handed out again) and one lost answer.
    pub fn interruptions() -> Self {
        Self { name: "interruptions", interruptions: 2, crashes: 1, lost_answers: 1, ..Self::one_machine() }
    }

    /// Batched starts (the pool's batcher): two machines in one zone share a call of two, the
    /// second added at any point, with one crash, one lost answer (the call replayed by its
    /// token), one refusal and one death.
    pub fn batched() -> Self {
        Self { name: "batched", zones: vec!["az1".into()], batch_size: 2, adds: 1, ..Self::small() }
    }

    /// The nightly-style configuration of the hand-overs (`MODEL_CHECK_LONG=1`):
    /// [`McConfig::interruptions`] with a periodic listing (a hand-over resumed from it, extras
    /// judged beside a hand-over, held notices counted) and a stop call that loses its answer,
    /// depth first.
    pub fn interruptions_long() -> Self {
        Self {
            name: "interruptions-long",
            listings: 1,
            stop_failures: 1,
            max_depth: 300,
            depth_first: true,
            ..Self::interruptions()
        }
    }

    /// The service's protocol (one machine, one zone): the lease moves once to another
    /// replica while the old leader goes on acting, one lost answer; start intents and calls
    /// on the wire.
    pub fn leases() -> Self {
        Self { name: "leases", service: true, lease_changes: 1, crashes: 0, lost_answers: 1, ..Self::one_machine() }
    }

    /// The nightly-style configuration of the service's protocol (`MODEL_CHECK_LONG=1`):
    /// [`McConfig::leases`] with a crash as well, a periodic listing and a failed listing,
    /// depth first.
    pub fn leases_long() -> Self {
        Self {
            name: "leases-long",
            crashes: 1,
            listings: 1,
            listing_failures: 1,
            max_depth: 300,
            depth_first: true,
            ..Self::leases()
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
