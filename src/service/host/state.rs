//! The model host's plain core: the directory as last written, each model's slot (running, or
//! why not) and the dying models this process reaps. No actix, no I/O: the shell
//! ([`super::actor`]) owns one and asks it what to answer and what to do next.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::directory::{Directory, ModelEntry, ModelLife, ModelsError};
use super::HostError;
use crate::service::runtime::ModelRuntime;

/// A model's place in the host: running, or why not.
#[derive(Clone)]
pub(super) enum Slot {
    /// It runs here.
    Running(Box<ModelRuntime>),
    /// It could not start: why.
    Failed(String),
}

/// One model as listed: its entry and, when it runs, its state.
pub(crate) struct Listed {
    /// The directory's entry.
    pub entry: ModelEntry,
    /// Its state, when it runs here.
    pub state: Option<ModelRuntime>,
    /// Why it does not run, if it does not.
    pub error: Option<String>,
}

/// What a replica following the directory another replica wrote does next
/// ([`HostState::follow`]).
#[derive(Default)]
pub(super) struct FollowPlan {
    /// The models removed elsewhere: stopped here (their runtime, if they run) and forgotten.
    pub stop: Vec<(String, Option<ModelRuntime>)>,
    /// The models added elsewhere (their store created, their uuid recorded): started here.
    pub start: Vec<ModelEntry>,
    /// The dying models: each gets a reaper here too.
    pub reap: Vec<String>,
}

/// The directory's changes, one at a time (adds, destructions, removals, a replica's sync): the
/// ones waiting their turn, in order, and whether one is under way. `J` is a change to run.
pub(super) struct Turns<J> {
    waiting: VecDeque<J>,
    busy: bool,
}

impl<J> Default for Turns<J> {
    fn default() -> Self {
        Self { waiting: VecDeque::new(), busy: false }
    }
}

impl<J> Turns<J> {
    /// A change asked for: the one to run now (this one, when none is under way), else `None`
    /// (it waits its turn).
    pub(super) fn ask(&mut self, change: J) -> Option<J> {
        self.waiting.push_back(change);
        self.next()
    }

    /// The change under way is done: the next one to run, if any.
    pub(super) fn done(&mut self) -> Option<J> {
        self.busy = false;
        self.next()
    }

    fn next(&mut self) -> Option<J> {
        if self.busy {
            return None;
        }
        let next = self.waiting.pop_front();
        self.busy = next.is_some();
        next
    }
}

/// The models of a service as this process knows them.
pub(super) struct HostState {
    /// The directory as last written.
    directory: Directory,
    slots: BTreeMap<String, Slot>,
    /// The dying models this process runs a reaper for.
    reaping: BTreeSet<String>,
}

impl HostState {
    /// No model running yet, over `directory`.
    pub(super) fn new(directory: Directory) -> Self {
        Self { directory, slots: BTreeMap::new(), reaping: BTreeSet::new() }
    }

    /// The directory as last written.
    pub(super) fn directory(&self) -> &Directory {
        &self.directory
    }

    /// The directory as just written.
    pub(super) fn set_directory(&mut self, d: Directory) {
        self.directory = d;
    }

    /// Puts model `name` in `slot` (`None`: takes it out).
    pub(super) fn set_slot(&mut self, name: &str, slot: Option<Slot>) {
        match slot {
            Some(s) => self.slots.insert(name.to_owned(), s),
            None => self.slots.remove(name),
        };
    }

    /// The running model `name`: unknown (404), or not running (503) saying why.
    pub(super) fn state(&self, name: &str) -> Result<ModelRuntime, HostError> {
        match self.slots.get(name) {
            Some(Slot::Running(s)) => Ok(*s.clone()),
            Some(Slot::Failed(why)) => Err(HostError::NotRunning { name: name.to_owned(), why: why.clone() }),
            // In the directory, not started here yet (a replica following another's add).
            None if self.directory.get(name).is_ok() => {
                Err(HostError::NotRunning { name: name.to_owned(), why: "it is starting".to_owned() })
            }
            None => Err(ModelsError::Unknown(name.to_owned()).into()),
        }
    }

    /// Every model in name order, with its state when it runs.
    pub(super) fn list(&self) -> Vec<Listed> {
        self.directory
            .models
            .values()
            .map(|entry| {
                let (state, error) = match self.slots.get(&entry.name) {
                    Some(Slot::Running(s)) => (Some(*s.clone()), None),
                    Some(Slot::Failed(why)) => (None, Some(why.clone())),
                    None => (None, Some("starting".to_owned())),
                };
                Listed { entry: entry.clone(), state, error }
            })
            .collect()
    }

    /// Checks that `name` may be destroyed (`default` only with `force`), without changing
    /// anything: the model's entry.
    pub(super) fn may_destroy(&self, name: &str, force: bool) -> Result<ModelEntry, HostError> {
        let mut d = self.directory.clone();
        let entry = d.get(name)?.clone();
        d.destroy(name, force)?;
        Ok(entry)
    }

    /// Every running model's state, in name order.
    pub(super) fn running(&self) -> Vec<ModelRuntime> {
        self.slots
            .values()
            .filter_map(|s| match s {
                Slot::Running(st) => Some(*st.clone()),
                Slot::Failed(_) => None,
            })
            .collect()
    }

    /// Every running model that has a lease (replicas on PostgreSQL), in name order: its name,
    /// uuid and lease actor.
    #[cfg(feature = "postgres")]
    pub(super) fn leases(&self) -> Vec<(String, String, actix::Addr<crate::service::lease::actor::LeaseActor>)> {
        self.slots
            .iter()
            .filter_map(|(name, s)| match s {
                Slot::Running(st) => {
                    st.replica.as_ref().map(|r| (name.clone(), st.model_uuid.clone(), r.lease.clone()))
                }
                Slot::Failed(_) => None,
            })
            .collect()
    }

    /// Whether a reaper for `name` is to start: `false` when one runs already (one per model).
    pub(super) fn begin_reaping(&mut self, name: &str) -> bool {
        self.reaping.insert(name.to_owned())
    }

    /// The reaper of `name` is done.
    pub(super) fn end_reaping(&mut self, name: &str) {
        self.reaping.remove(name);
    }

    /// Whether the reaper of `name` goes on: the model is still in the directory, dying.
    pub(super) fn still_dying(&self, name: &str) -> bool {
        self.directory.get(name).map(|e| e.life) == Ok(ModelLife::Dying)
    }

    /// Takes `d`, the directory another replica may have changed, as the one last written, and
    /// answers what to do to follow it: the models this process knows that it no longer has
    /// are stopped (and then taken out: [`HostState::set_slot`]); the ones it has that this process does not know
    /// are started once their adder has recorded their uuid (opened before, a model's schema
    /// would be created here and then moved aside by the adder's fresh creation, this replica
    /// running the old one); every dying one gets a reaper.
    pub(super) fn follow(&mut self, d: Directory) -> FollowPlan {
        self.directory = d;
        let known: Vec<String> = self.slots.keys().cloned().collect();
        let mut plan = FollowPlan::default();
        for gone in known.iter().filter(|n| !self.directory.models.contains_key(*n)) {
            plan.stop.push((gone.clone(), self.state(gone).ok()));
        }
        for entry in self.directory.models.values() {
            if !known.contains(&entry.name) && entry.uuid.is_some() {
                plan.start.push(entry.clone());
            }
            if entry.life == ModelLife::Dying {
                plan.reap.push(entry.name.clone());
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::host::directory::{CloudSettings, DEFAULT_MODEL};

    #[test]
    fn changes_run_one_at_a_time_in_order() {
        let mut turns = Turns::default();
        assert_eq!(turns.ask(1), Some(1), "none under way: at once");
        assert_eq!(turns.ask(2), None);
        assert_eq!(turns.ask(3), None);
        assert_eq!(turns.done(), Some(2));
        assert_eq!(turns.done(), Some(3));
        assert_eq!(turns.done(), None);
        assert_eq!(turns.ask(4), Some(4), "idle again");
    }

    #[test]
    fn a_model_not_running_is_unknown_starting_or_failed() {
        let mut d = Directory::with_default();
        d.add(ModelEntry::new("a", CloudSettings::default()), "sim").unwrap();
        let mut host = HostState::new(d);
        assert_eq!(host.state("nope").err().map(|e| e.status()), Some(404));
        let starting = host.state("a").err().unwrap();
        assert_eq!((starting.status(), starting.to_string().contains("it is starting")), (503, true));
        host.set_slot("a", Some(Slot::Failed("no store".into())));
        assert!(host.state("a").err().unwrap().to_string().contains("no store"));
        let listed: Vec<_> = host.list().into_iter().map(|l| (l.entry.name, l.error)).collect();
        assert_eq!(
            listed,
            [("a".to_owned(), Some("no store".to_owned())), ("default".into(), Some("starting".into()))]
        );
        assert!(host.running().is_empty());
        assert_eq!(host.may_destroy(DEFAULT_MODEL, false).err().map(|e| e.status()), Some(409));
        assert_eq!(host.may_destroy("a", false).unwrap().name, "a");
        assert_eq!(host.directory().get("a").unwrap().life, ModelLife::Alive, "may_destroy changes nothing");
    }

    #[test]
    fn following_another_replica_starts_its_adds_stops_its_removals_and_reaps_the_dying() {
        let mut d = Directory::with_default();
        d.add(ModelEntry::new("gone", CloudSettings::default()), "sim").unwrap();
        let mut host = HostState::new(d.clone());
        host.set_slot("gone", Some(Slot::Failed("x".into())));
        host.set_slot(DEFAULT_MODEL, Some(Slot::Failed("y".into())));
        d.remove("gone");
        d.add(ModelEntry::new("fresh", CloudSettings::default()), "sim").unwrap();
        d.add(ModelEntry::new("uuid", CloudSettings::default()), "sim").unwrap();
        d.set_uuid("uuid", "u-1").unwrap();
        d.destroy(DEFAULT_MODEL, true).unwrap();
        let plan = host.follow(d.clone());
        assert_eq!(plan.stop.iter().map(|(n, st)| (n.as_str(), st.is_some())).collect::<Vec<_>>(), [("gone", false)]);
        assert_eq!(plan.start.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["uuid"], "once its uuid is there");
        assert_eq!(plan.reap, [DEFAULT_MODEL]);
        assert_eq!(host.directory(), &d);
        host.set_slot("gone", None);
        assert!(host.state("gone").is_err_and(|e| e.status() == 404));
        assert!(host.begin_reaping("x") && !host.begin_reaping("x"), "one reaper per model");
        host.end_reaping("x");
        assert!(host.begin_reaping("x"));
        assert!(host.still_dying(DEFAULT_MODEL) && !host.still_dying("uuid") && !host.still_dying("gone"));
    }
}
