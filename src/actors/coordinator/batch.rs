//! The coordinator's batch planner: what one batch of machine notifications does, step by step,
//! as values. Plain (no actix): the coordinator's shell asks the other actors what a step
//! names ([`Ask`]), feeds their answers back ([`Answer`]) and carries out the fire-and-forget
//! [`Effect`]s in order; `provisioner plan` (`sim::plan`) drives the same run over the plain
//! cores, so plan and run cannot drift.
//!
//! It reads the plain data of the other cores (the registry's [`Refreshed`], the harvest
//! policy's [`HarvestPlan`], the lifecycle's [`Deaths`], the pool's [`StartJob`]), never a
//! shell or a message.
//!
//! The order is the safety argument: the zone list before the first start; the cache before
//! safe mode ends; orphans before dead machines (a dead machine's removal waits for its
//! orphans' stops); dead machines' stops before any start (no instance is duplicated); a
//! dying model or closed starts start nothing; a machine starts only once the lifecycle
//! clears it; a machine with an instance already tagged for it adopts it (no lookup that
//! could fail first); a per-machine lookup failure is that machine's provisioning error; a
//! failed lookup call retries the whole lot later.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::actors::harvest::{HarvestPlan, ModeChange};
use crate::actors::lifecycle::Deaths;
use crate::actors::registry::{Refreshed, RegistryError};
use crate::actors::workers::StartJob;
use crate::model::{CloudInstance, DeadMachine, InstanceId, Life, Machine, MachineId, ProvisioningInfo};
use crate::ports::{BrokerError, ModelError};
use crate::trace::Carried;

/// What a batch starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchStart {
    /// The notified ids (sorted, deduplicated).
    pub ids: Vec<MachineId>,
    /// The first batch: read the model's life and end safe mode.
    pub first: bool,
    /// The zone list was never loaded: load it first (a failure fails the batch).
    pub need_zones: bool,
    /// The model is known to be dying.
    pub model_dying: bool,
    /// Starts are closed (a container provisioner whose host died).
    pub starts_closed: bool,
}

/// A question for another actor (or the model) whose answer the run waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The model's life (first batch). Answer: [`Answer::Life`].
    ModelLife,
    /// Tell the harvest policy the destruction wins over releases (an empty destroy plan).
    /// Answer: [`Answer::Plan`] (ignored).
    DestroyWins,
    /// Reload the availability zones. Answer: [`Answer::Zones`].
    RefreshZones,
    /// Classify these machines (the registry). Answer: [`Answer::Refreshed`].
    Refresh(Vec<MachineId>),
    /// Leave safe mode (first batch). Answer: [`Answer::ModeChange`].
    EndSafeMode,
    /// Plan the stop of orphaned instances (their `StopsPlanned` effects come first). Answer:
    /// [`Answer::Plan`].
    PlanOrphanStops(Vec<InstanceId>),
    /// The lifecycle's view of dead machines. Answer: [`Answer::Deaths`].
    ObserveDead(Vec<DeadMachine>),
    /// Plan the harvest of dead machines. Answer: [`Answer::Plan`].
    PlanDead(Vec<DeadMachine>),
    /// Which pending machines the lifecycle clears to start. Answer: [`Answer::ToStart`].
    ObservePending(Vec<MachineId>),
    /// Provisioning info and distribution groups, one batched call each. Answer:
    /// [`Answer::StartInfo`].
    StartInfo(Vec<MachineId>),
    /// Write a machine's provisioning error (instance status, then machine status). Answer:
    /// [`Answer::Written`].
    WriteError {
        /// The machine.
        machine: MachineId,
        /// The status message (the model's error).
        message: String,
    },
}

/// The answer to an [`Ask`].
#[derive(Debug, Clone)]
pub enum Answer {
    /// The model's life, or why it could not be read.
    Life(Result<Life, ModelError>),
    /// The zone list was reloaded, or why not.
    Zones(Result<(), BrokerError>),
    /// The classified batch, or why it failed.
    Refreshed(Result<Refreshed, RegistryError>),
    /// Safe mode ended.
    ModeChange(ModeChange),
    /// A harvest plan.
    Plan(HarvestPlan),
    /// The lifecycle's decision on dead machines.
    Deaths(Deaths),
    /// The pending machines cleared to start.
    ToStart(Vec<MachineId>),
    /// The two batched reads.
    StartInfo {
        /// `provisioning_info`.
        infos: Result<Vec<Result<ProvisioningInfo, ModelError>>, ModelError>,
        /// `distribution_groups`.
        groups: Result<Vec<Result<Vec<MachineId>, ModelError>>, ModelError>,
    },
    /// A status write returned (its failure is ignored: the machine is retried anyway).
    Written,
}

/// Something to do without waiting for an answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The allocator counts these placements.
    Populate(Vec<(MachineId, String)>),
    /// Machines gone from the model: the allocator and the lifecycle forget them.
    Gone(Vec<MachineId>),
    /// The registry hears these instances are being stopped (never adopted).
    StopsPlanned {
        /// The instances.
        ids: Vec<InstanceId>,
        /// The machine they are tagged for.
        machine: Option<MachineId>,
    },
    /// Carry out a harvest plan (stops and releases through the pool, removals now). Boxed: a
    /// plan is large and rare, and a fleet's first batch holds an effect per machine.
    Execute(Box<HarvestPlan>),
    /// Queue a start.
    Start(Box<StartJob>),
    /// The lifecycle forgets these machines (their start is not queued).
    ForgetLifecycle(Vec<MachineId>),
}

/// How a batch ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// This batch loaded the zone list.
    pub zones_loaded: bool,
    /// Ids to notify again after a backoff.
    pub retry_later: Vec<MachineId>,
    /// Safe mode ended (first batch).
    pub mode_change: Option<ModeChange>,
    /// The model is dying (known before, or read now).
    pub model_dying: bool,
}

/// What to do now: effects, then the next question or the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// Fire-and-forget, in order, before the next question.
    pub effects: Vec<Effect>,
    /// The next question, or how the batch ended.
    pub next: Next,
}

/// The next question, or the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Ask this and feed the answer to [`BatchRun::answer`].
    Ask(Ask),
    /// The batch is done.
    Done(BatchOutcome),
}

/// Why a batch failed as a whole (its ids are retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum BatchFailure {
    /// The first zone list could not be loaded.
    #[error("refreshing zones: {0}")]
    Zones(#[source] BrokerError),
    /// The registry could not classify the batch.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The model's life could not be read.
    #[error("reading the model's life: {0}")]
    Model(#[source] ModelError),
    /// An answer that does not answer the question asked (a shell bug).
    #[error("unexpected answer {answer} while waiting for {waiting}")]
    Unexpected {
        /// What was waited for.
        waiting: &'static str,
        /// What came.
        answer: &'static str,
    },
}

/// Why a machine's start could not be prepared: a per-machine model read failed. The status line
/// shows the model's error (the cause); the log shows which read failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartInfoError {
    /// Reading the machine's provisioning info failed.
    #[error("fetching provisioning info for machine {:?}: {source}", machine.as_str())]
    ProvisioningInfo {
        /// The machine.
        machine: MachineId,
        /// The model's error.
        #[source]
        source: ModelError,
    },
    /// Reading the machine's distribution group failed.
    #[error("fetching distribution groups for machine {:?}: {source}", machine.as_str())]
    DistributionGroups {
        /// The machine.
        machine: MachineId,
        /// The model's error.
        #[source]
        source: ModelError,
    },
}

impl StartInfoError {
    /// The machine.
    pub fn machine(&self) -> &MachineId {
        match self {
            Self::ProvisioningInfo { machine, .. } | Self::DistributionGroups { machine, .. } => machine,
        }
    }

    /// The model's error, shown in the machine's status.
    pub fn cause(&self) -> &ModelError {
        match self {
            Self::ProvisioningInfo { source, .. } | Self::DistributionGroups { source, .. } => source,
        }
    }
}

/// Where the run stands: the question outstanding.
/// Why a batch's provisioning info or distribution groups could not be read at all (the
/// machines are read again later).
#[derive(Debug, thiserror::Error)]
enum BatchInfoError {
    /// The model refused one of the two calls.
    #[error("{0}")]
    Model(#[source] ModelError),
    /// The model answered for a different number of machines than it was asked about.
    #[error("result count mismatch")]
    CountMismatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Life,
    DestroyWins,
    Zones,
    Refresh,
    SafeMode,
    OrphanStops { then: Resume },
    Dead,
    DeadPlan,
    Pending,
    ZonesAgain,
    StartInfo,
    Written,
    Nothing,
}

/// Where to go on from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    Zones,
    Refresh,
    SafeMode,
    Classified,
    Dead,
    Pending,
    Starts,
    Queue,
    Prepared,
    Finish,
}

/// A machine cleared to start, as its job (made as soon as its provisioning info and
/// distribution group are read, so the large answers are not held), or why its reads failed.
type Prepared = Result<Box<StartJob>, StartInfoError>;

/// One batch in flight: the planner's state between questions.
#[derive(Debug, Clone)]
pub struct BatchRun {
    start: BatchStart,
    waiting: Waiting,
    outcome: BatchOutcome,
    refreshed: Refreshed,
    pending_orphans: Vec<(MachineId, InstanceId)>,
    to_start: Vec<Machine>,
    adopt: BTreeMap<MachineId, CloudInstance>,
    asked_info: Vec<Machine>,
    prepared: VecDeque<Prepared>,
    failed: Vec<MachineId>,
}

impl BatchRun {
    /// A run for this batch, and its first steps.
    pub fn new(start: BatchStart) -> (Self, Steps) {
        let outcome = BatchOutcome { model_dying: start.model_dying, ..BatchOutcome::default() };
        let mut run = Self {
            start,
            waiting: Waiting::Nothing,
            outcome,
            refreshed: Refreshed::default(),
            pending_orphans: Vec::new(),
            to_start: Vec::new(),
            adopt: BTreeMap::new(),
            asked_info: Vec::new(),
            prepared: VecDeque::new(),
            failed: Vec::new(),
        };
        let steps = if run.start.first {
            run.ask(Vec::new(), Waiting::Life, Ask::ModelLife)
        } else {
            run.resume(Resume::Zones, Vec::new())
        };
        (run, steps)
    }

    /// Feeds the answer to the question outstanding; answers the next steps, or why the batch
    /// failed as a whole.
    pub fn answer(&mut self, answer: Answer) -> Result<Steps, BatchFailure> {
        let waiting = std::mem::replace(&mut self.waiting, Waiting::Nothing);
        let mut effects = Vec::new();
        let resume = match (waiting, answer) {
            (Waiting::Life, Answer::Life(life)) => {
                // A dying model gets no new instances, even from a restarted provisioner.
                self.outcome.model_dying |= life.map_err(BatchFailure::Model)? != Life::Alive;
                if self.outcome.model_dying {
                    // The destruction wins over releases from the first plan on (every
                    // instance stopped, whatever the mode).
                    return Ok(self.ask(effects, Waiting::DestroyWins, Ask::DestroyWins));
                }
                Resume::Zones
            }
            (Waiting::DestroyWins, Answer::Plan(_)) => Resume::Zones,
            (Waiting::Zones, Answer::Zones(res)) => {
                res.map_err(BatchFailure::Zones)?;
                self.outcome.zones_loaded = true;
                Resume::Refresh
            }
            (Waiting::Refresh, Answer::Refreshed(res)) => {
                self.refreshed = res?;
                Resume::SafeMode
            }
            (Waiting::SafeMode, Answer::ModeChange(change)) => {
                self.outcome.mode_change = Some(change);
                Resume::Classified
            }
            (Waiting::OrphanStops { then }, Answer::Plan(plan)) => {
                effects.push(Effect::Execute(Box::new(plan)));
                then
            }
            (Waiting::Dead, Answer::Deaths(Deaths { stop_now, deferred })) => {
                if !deferred.is_empty() {
                    tracing::info!(machines = ?deferred, "machines died while starting; their stop waits for the start");
                }
                if !stop_now.is_empty() {
                    return Ok(self.ask(effects, Waiting::DeadPlan, Ask::PlanDead(stop_now)));
                }
                Resume::Pending
            }
            (Waiting::DeadPlan, Answer::Plan(plan)) => {
                effects.push(Effect::Execute(Box::new(plan)));
                Resume::Pending
            }
            (Waiting::Pending, Answer::ToStart(ids)) => {
                if !self.pending_orphans.is_empty() {
                    let cleared: BTreeSet<&MachineId> = ids.iter().collect();
                    self.pending_orphans.retain(|(m, _)| cleared.contains(m));
                }
                let pending = std::mem::take(&mut self.refreshed.pending);
                self.to_start = cleared_of(pending, &ids);
                let orphans = std::mem::take(&mut self.pending_orphans);
                if let Some(ask) = stop_orphans(orphans, &mut effects) {
                    return Ok(self.ask(effects, Waiting::OrphanStops { then: Resume::Starts }, ask));
                }
                Resume::Starts
            }
            (Waiting::ZonesAgain, Answer::Zones(res)) => {
                if let Err(e) = res {
                    tracing::warn!(error = %e, "refreshing availability zones failed; using the last list");
                }
                Resume::Queue
            }
            (Waiting::StartInfo, Answer::StartInfo { infos, groups }) => {
                let machines = std::mem::take(&mut self.asked_info);
                let n = machines.len();
                match (infos, groups) {
                    (Ok(i), Ok(g)) if i.len() == n && g.len() == n => {
                        let empty = Arc::new(ProvisioningInfo::default());
                        self.prepared =
                            machines.into_iter().zip(i).zip(g).map(|((m, i), g)| prepare(m, i, g, &empty)).collect();
                        Resume::Prepared
                    }
                    (i, g) => {
                        let ids: Vec<MachineId> = machines.into_iter().map(|m| m.id).collect();
                        let err = i.err().or(g.err()).map_or(BatchInfoError::CountMismatch, BatchInfoError::Model);
                        tracing::warn!(machines = ?ids, error = %err, "cannot read provisioning info; will retry");
                        effects.push(Effect::ForgetLifecycle(ids.clone()));
                        self.outcome.retry_later.extend(ids);
                        Resume::Finish
                    }
                }
            }
            (Waiting::Written, Answer::Written) => Resume::Prepared,
            (waiting, answer) => {
                self.waiting = waiting;
                return Err(BatchFailure::Unexpected { waiting: waiting.name(), answer: answer.name() });
            }
        };
        Ok(self.resume(resume, effects))
    }

    fn ask(&mut self, effects: Vec<Effect>, waiting: Waiting, ask: Ask) -> Steps {
        self.waiting = waiting;
        Steps { effects, next: Next::Ask(ask) }
    }

    /// Goes on from `at` until the next question or the end.
    fn resume(&mut self, mut at: Resume, mut effects: Vec<Effect>) -> Steps {
        loop {
            at = match at {
                Resume::Zones if self.start.need_zones => {
                    return self.ask(effects, Waiting::Zones, Ask::RefreshZones);
                }
                Resume::Zones => Resume::Refresh,
                Resume::Refresh => {
                    let ids = std::mem::take(&mut self.start.ids);
                    return self.ask(effects, Waiting::Refresh, Ask::Refresh(ids));
                }
                // The first full notification is in the cache: leave safe mode before harvesting.
                Resume::SafeMode if self.start.first => return self.ask(effects, Waiting::SafeMode, Ask::EndSafeMode),
                Resume::SafeMode => Resume::Classified,
                Resume::Classified => {
                    let r = &mut self.refreshed;
                    if !r.placements.is_empty() {
                        effects.push(Effect::Populate(r.placements.clone()));
                    }
                    if !r.gone.is_empty() {
                        effects.push(Effect::Gone(r.gone.clone()));
                    }
                    // Orphans (instances tagged for a live machine that it will never own: a
                    // record that failed, maybe a predecessor's whose stop a crash lost, or a
                    // second start whose result was lost; or for a dead machine in provisioning
                    // error): stopped until the stop succeeds, never adopted. A pending
                    // machine's only once the lifecycle clears it to start (or adopt) now:
                    // never while a start of its own is in flight. Planned before the dead
                    // machines, so that a dead machine's removal waits for its orphans' stops.
                    let pending: BTreeSet<&MachineId> = r.pending.iter().map(|m| &m.id).collect();
                    let (of_pending, others): (Vec<_>, Vec<_>) =
                        std::mem::take(&mut r.orphans).into_iter().partition(|(m, _)| pending.contains(m));
                    self.pending_orphans = of_pending;
                    self.adopt = std::mem::take(&mut r.adopt).into_iter().collect();
                    self.outcome.retry_later = std::mem::take(&mut r.retry_later);
                    match stop_orphans(others, &mut effects) {
                        Some(ask) => return self.ask(effects, Waiting::OrphanStops { then: Resume::Dead }, ask),
                        None => Resume::Dead,
                    }
                }
                // Dead machines first, so their stops are queued ahead of the starts (so no
                // instance is duplicated).
                Resume::Dead if !self.refreshed.dead.is_empty() => {
                    let dead = std::mem::take(&mut self.refreshed.dead);
                    return self.ask(effects, Waiting::Dead, Ask::ObserveDead(dead));
                }
                Resume::Dead => Resume::Pending,
                Resume::Pending if self.refreshed.pending.is_empty() => Resume::Finish,
                Resume::Pending if self.outcome.model_dying || self.start.starts_closed => {
                    tracing::info!(
                        machines = self.refreshed.pending.len(),
                        "model is dying or starts are closed: not starting pending machines"
                    );
                    Resume::Finish
                }
                Resume::Pending => {
                    let ids = self.refreshed.pending.iter().map(|m| m.id.clone()).collect();
                    return self.ask(effects, Waiting::Pending, Ask::ObservePending(ids));
                }
                // Re-read the zone list once per batch of starts (a zone no longer available is
                // not chosen), not per machine; a failure keeps the last list (the start fails
                // over if a zone is gone).
                Resume::Starts if !self.to_start.is_empty() && !self.outcome.zones_loaded => {
                    return self.ask(effects, Waiting::ZonesAgain, Ask::RefreshZones);
                }
                Resume::Starts => Resume::Queue,
                Resume::Queue => {
                    // A machine with an instance already tagged for it adopts that instance: it
                    // needs neither provisioning info nor a distribution group, so no failing
                    // lookup can leave the tagged instance unowned.
                    let (adopters, rest): (Vec<Machine>, Vec<Machine>) =
                        std::mem::take(&mut self.to_start).into_iter().partition(|m| self.adopt.contains_key(&m.id));
                    let empty = Arc::new(ProvisioningInfo::default());
                    for machine in adopters {
                        let adopt = self.adopt.remove(&machine.id).map(Box::new);
                        let job = StartJob {
                            machine,
                            info: Arc::clone(&empty),
                            group: Vec::new(),
                            adopt,
                            replaces: None,
                            trace: Carried::none(),
                        };
                        effects.push(Effect::Start(Box::new(job)));
                    }
                    if rest.is_empty() {
                        Resume::Finish
                    } else {
                        let ids = rest.iter().map(|m| m.id.clone()).collect();
                        self.asked_info = rest;
                        return self.ask(effects, Waiting::StartInfo, Ask::StartInfo(ids));
                    }
                }
                Resume::Prepared => match self.prepared.pop_front() {
                    Some(Ok(job)) => {
                        effects.push(Effect::Start(job));
                        continue;
                    }
                    Some(Err(err)) => {
                        let machine = err.machine().clone();
                        tracing::warn!(%machine, "{err}");
                        let message = err.cause().to_string();
                        self.failed.push(machine.clone());
                        return self.ask(effects, Waiting::Written, Ask::WriteError { machine, message });
                    }
                    None => {
                        // The queue's buffer goes now, not with the run.
                        self.prepared = VecDeque::new();
                        if !self.failed.is_empty() {
                            effects.push(Effect::ForgetLifecycle(std::mem::take(&mut self.failed)));
                        }
                        Resume::Finish
                    }
                },
                Resume::Finish => {
                    self.waiting = Waiting::Nothing;
                    return Steps { effects, next: Next::Done(std::mem::take(&mut self.outcome)) };
                }
            };
        }
    }
}

/// The machines of `pending` whose ids the lifecycle cleared to start (`ids`), in `pending`'s
/// order. The lifecycle answers with the ids it was asked about in the order asked, so one walk
/// of both lists does, with no search; an answer in any other order is looked up in a set.
pub(super) fn cleared_of(pending: Vec<Machine>, ids: &[MachineId]) -> Vec<Machine> {
    let mut walk = ids.iter().peekable();
    for m in &pending {
        walk.next_if(|id| **id == m.id);
    }
    if walk.peek().is_none() {
        let mut next = ids.iter().peekable();
        pending.into_iter().filter(|m| next.next_if(|id| **id == m.id).is_some()).collect()
    } else {
        let cleared: BTreeSet<&MachineId> = ids.iter().collect();
        pending.into_iter().filter(|m| cleared.contains(&m.id)).collect()
    }
}

/// A machine's job from its reads (its provisioning info shared with `empty` when it is the
/// default), or the first read that failed.
fn prepare(
    machine: Machine,
    info: Result<ProvisioningInfo, ModelError>,
    group: Result<Vec<MachineId>, ModelError>,
    empty: &Arc<ProvisioningInfo>,
) -> Prepared {
    match (info, group) {
        (Ok(info), Ok(group)) => {
            let info = StartJob::shared_info(info, empty);
            Ok(Box::new(StartJob { machine, info, group, adopt: None, replaces: None, trace: Carried::none() }))
        }
        (Err(source), _) => Err(StartInfoError::ProvisioningInfo { machine: machine.id, source }),
        (_, Err(source)) => Err(StartInfoError::DistributionGroups { machine: machine.id, source }),
    }
}

/// The `StopsPlanned` effects for orphaned instances and the question that plans their stop;
/// `None` if there are none.
fn stop_orphans(orphans: Vec<(MachineId, InstanceId)>, effects: &mut Vec<Effect>) -> Option<Ask> {
    if orphans.is_empty() {
        return None;
    }
    let mut instances = Vec::new();
    for (machine, inst) in orphans {
        effects.push(Effect::StopsPlanned { ids: vec![inst.clone()], machine: Some(machine) });
        instances.push(inst);
    }
    tracing::info!(instances = ?instances, "stopping instances tagged for machines that will never own them");
    Some(Ask::PlanOrphanStops(instances))
}

impl Waiting {
    fn name(self) -> &'static str {
        match self {
            Self::Life => "the model's life",
            Self::DestroyWins => "the destroy plan",
            Self::Zones | Self::ZonesAgain => "the zone list",
            Self::Refresh => "the classified batch",
            Self::SafeMode => "the end of safe mode",
            Self::OrphanStops { .. } => "the orphans' stop plan",
            Self::Dead => "the lifecycle's deaths",
            Self::DeadPlan => "the dead machines' harvest plan",
            Self::Pending => "the machines cleared to start",
            Self::StartInfo => "the provisioning info",
            Self::Written => "a status write",
            Self::Nothing => "nothing",
        }
    }
}

impl Answer {
    fn name(&self) -> &'static str {
        match self {
            Self::Life(_) => "Life",
            Self::Zones(_) => "Zones",
            Self::Refreshed(_) => "Refreshed",
            Self::ModeChange(_) => "ModeChange",
            Self::Plan(_) => "Plan",
            Self::Deaths(_) => "Deaths",
            Self::ToStart(_) => "ToStart",
            Self::StartInfo { .. } => "StartInfo",
            Self::Written => "Written",
        }
    }
}
