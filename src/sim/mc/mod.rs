//! The exhaustive model checker (issue 35): every interleaving of the start protocol, driven
//! through the engine's own plain cores, explored by [`stateright`].
//!
//! The simulator (`sim::run`) samples interleavings: each scenario is one deterministic run
//! of the real actors, and the random scenarios are ten thousand samples. This module instead
//! enumerates them, within bounds ([`McConfig`]): its state ([`world::World`]) is the durable
//! world (a cloud keyed by client token, the model's store) and the provisioner's memory (the
//! coordinator's batch book and batch planner, the registry's machine book, the lifecycle, the
//! zone allocator, the harvest policy, one start procedure per machine started), and its
//! actions are what may happen next in any order: a core answers the question its procedure
//! asked, a cloud call lands with its answer, lands and loses its answer, or is refused, an
//! answer is delivered, the provisioner crashes and restarts (its memory lost, the cloud and
//! the store kept), a machine dies.
//!
//! The cores are driven, not re-implemented: the batch planner is the coordinator's
//! `BatchRun`, a start is the pool's `StartRun` (`actors/workers/run.rs`), what follows a job
//! is the coordinator's `followup::on_jobs_done`; the checker answers their questions
//! from the other cores as the actors' handlers do, one handler at a time.
//!
//! With warnings of spot interruptions (`McConfig::interruptions`), the cloud warns of its
//! instances and takes warned ones at any point, the poller's `NoticeBook` and the
//! coordinator's `HandoverBook` decide, and a hand-over's replacement, switch and stop run
//! through the same cores.
//!
//! Properties (checked on every state, [`World::duplicates`] and its siblings): never two
//! live instances of ours for one machine; never an instance of a live machine stopped; and, once nothing is left to happen
//! but faults, every live machine has exactly one live instance and it is the one recorded,
//! or a provisioning error, and every dead machine's instance is stopped. A mutation
//! ([`Mutations`]) breaks the code on purpose, and the tests check the checker finds it.
//!
//! States are told apart by a hash of their `Debug` text (the cores print every field they
//! decide by, in a fixed order: `BTreeMap`s, and the seeded generators print their next
//! draw): a few microseconds a state, enough for the bounded configurations here.

mod action;
mod config;
mod export;
mod world;

use std::hash::{Hash, Hasher};

use stateright::{Checker, HasDiscoveries, Model, Property};

pub use crate::config::Mutations;
pub use action::{CallOutcome, ListOutcome, McAction};
pub use config::{Counterexample, McConfig};
pub use export::{to_scenario, Replay};
pub use world::World;

/// What one check found.
#[derive(Debug, Clone)]
pub struct McReport {
    /// The configuration.
    pub config: McConfig,
    /// States generated, and distinct states explored.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// Each property broken, with the shortest path found to it: its actions, and the
    /// violations the last state shows.
    pub violations: Vec<Counterexample>,
}

/// The model stateright explores.
struct Protocol(McConfig);

/// A state as stateright keeps it: hashed and compared by its `Debug` text.
#[derive(Clone, Debug)]
pub struct State(pub World);

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        format!("{:?}", self.0).hash(h);
    }
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = McAction;

    fn init_states(&self) -> Vec<State> {
        vec![State(World::new(&self.0))]
    }

    fn actions(&self, state: &State, actions: &mut Vec<McAction>) {
        state.0.actions(&self.0, actions);
    }

    fn next_state(&self, last: &State, action: McAction) -> Option<State> {
        let mut next = last.0.clone();
        next.step(&action);
        Some(State(next))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one live instance per machine", |_, s: &State| s.0.duplicates().is_empty()),
            Property::always("no live machine's instance stopped", |_, s: &State| s.0.wrong_stops().is_empty()),
            Property::always("the checker models every step", |_, s: &State| s.0.unmodelled().is_empty()),
            Property::always("no write accepted under a stale epoch", |_, s: &State| s.0.stale_writes().is_empty()),
            Property::always("nothing started after destroy_model", |_, s: &State| {
                s.0.started_after_destroy().is_empty()
            }),
            Property::always("quiet means converged", |m: &Protocol, s: &State| {
                !s.0.quiet(&m.0) || s.0.unconverged().is_empty()
            }),
        ]
    }

    fn within_boundary(&self, _state: &State) -> bool {
        true
    }
}

/// Explores every interleaving `config` allows, breadth first, on `threads` threads, until
/// a property breaks; then looks again among shorter paths until none breaks it, so the
/// counterexample reported is a shortest one. (stateright records the last violating state of
/// the block of states a thread checks at once, not the first.)
pub fn check(config: &McConfig, threads: usize) -> McReport {
    let builder = |max_depth: usize| {
        Protocol(config.clone())
            .checker()
            .threads(threads.max(1))
            .target_max_depth(max_depth)
            .finish_when(HasDiscoveries::AnyFailures)
    };
    let run = |max_depth: usize| builder(max_depth).spawn_bfs().join();
    let checker = if config.depth_first {
        let c = builder(config.max_depth).spawn_dfs().join();
        (c.state_count(), c.unique_state_count(), c.max_depth(), PROPERTIES.map(|p| c.discovery(p)))
    } else {
        let c = run(config.max_depth);
        (c.state_count(), c.unique_state_count(), c.max_depth(), PROPERTIES.map(|p| c.discovery(p)))
    };
    let (states, unique_states, max_depth, found) = checker;
    let mut violations = Vec::new();
    for (name, path) in PROPERTIES.into_iter().zip(found) {
        let Some(mut path) = path else { continue };
        // Paths of fewer steps only. stateright neither expands nor checks a state at the target
        // depth or deeper, and the initial state is at depth 1: a path of `n` steps ends at
        // depth `n + 1`, so a target of `n + 1` checks every path of fewer than `n` steps.
        loop {
            let shorter = run(path.clone().into_actions().len() + 1);
            match shorter.discovery(name) {
                Some(p) if p.clone().into_actions().len() < path.clone().into_actions().len() => path = p,
                _ => break,
            }
        }
        let last = path.last_state().0.clone();
        let mut broken = last.duplicates();
        broken.extend(last.wrong_stops());
        broken.extend(last.unmodelled());
        broken.extend(last.stale_writes());
        broken.extend(last.started_after_destroy());
        if last.quiet(config) {
            broken.extend(last.unconverged());
        }
        violations.push(Counterexample { property: name, actions: path.into_actions(), broken });
    }
    McReport { config: config.clone(), states, unique_states, max_depth, violations }
}

/// The properties, by name.
const PROPERTIES: [&str; 6] = [
    "one live instance per machine",
    "no live machine's instance stopped",
    "the checker models every step",
    "no write accepted under a stale epoch",
    "nothing started after destroy_model",
    "quiet means converged",
];
