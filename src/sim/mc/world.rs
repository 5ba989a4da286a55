//! The checker's state and its steps: the durable world (cloud, store) and one incarnation
//! of the provisioner's memory (its plain cores), with what may happen next.
//!
//! Each step is one handler of the real system, run whole: the coordinator answering its
//! batch planner's question from the core the actor would ask, a start's question answered
//! by the core, the store or the cloud, the pool's outcomes reaching the coordinator (whose
//! follow-ups go to the registry, the lifecycle, the allocator and the harvest policy as the
//! coordinator sends them), a stop job carried out. The cloud call of a start is a step of
//! its own, with its answer a later one: between them anything may happen (a crash, a death,
//! other starts), and the answer may be lost.
//!
//! As on EC2 (and in the simulator's fake cloud), a start's instance exists from the moment
//! its call reaches the cloud; a call with a client token the cloud knows answers the
//! instance that token made, even if that instance has been terminated since.

use std::collections::{BTreeMap, BTreeSet};

use super::action::{CallOutcome, ListOutcome, McAction};
use super::config::McConfig;
use crate::actors::coordinator::batch::{Answer, Ask, BatchRun, Effect, Next, Steps};
use crate::actors::coordinator::followup::{self, AfterStartStep, Followup};
use crate::actors::coordinator::handover::{HandoverBook, NoticeDecision, Switch};
use crate::actors::coordinator::BatchBook;
use crate::actors::harvest::{HarvestBook, HarvestPlan, UnknownInstance};
use crate::actors::interruptions::NoticeBook;
use crate::actors::lifecycle::LifecycleBook;
use crate::actors::registry::MachineBook;
use crate::actors::workers::batch::{self as pool_batch, BatchBook as PoolBatches};
use crate::actors::workers::run::{StartAnswer, StartAsk, StartRun, StartSettings};
use crate::actors::workers::JobOutcome;
use crate::actors::zones::ZoneBook;
use crate::config::Scope;
use crate::model::{
    CloudInstance, Fence, HeldLease, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine, MachineId,
    MachineStatus, ProvisioningInfo,
};
use crate::ports::{
    BatchStartParams, BatchStarted, BrokerError, InterruptionNotice, NoticeKind, StartInstanceParams, StartedInstance,
};

/// The model's uuid on every instance of ours.
const UUID: &str = "mc-model";

/// The provisioners' host tag (a hand-over's replacement nonce names it: the same for every
/// incarnation).
const HOST_TAG: &str = "mc";

/// How long an interruption warning runs (EC2's two minutes).
const WARNING: std::time::Duration = std::time::Duration::from_secs(120);

/// The lease when incarnation `inc` leads (`service`): each incarnation is a new acquisition
/// (a restart re-acquires after the expiry; a move is another replica's), at epoch `inc + 1`.
fn lease_of(inc: u32) -> HeldLease {
    HeldLease { holder: format!("r{inc}"), epoch: i64::from(inc) + 1, live: true }
}

/// The fence incarnation `inc` writes under.
fn fence_of(inc: u32, mutations: crate::config::Mutations) -> Fence {
    Fence { skip_check: mutations.skip_fence_check, ..Fence::new(UUID, format!("r{inc}"), i64::from(inc) + 1) }
}

/// What a write refused by the fence answers (as the service's model port maps the store's
/// `Fenced`).
fn fenced() -> crate::ports::ModelError {
    crate::ports::ModelError::Fenced("the leader lease is no longer held at this epoch".into())
}

/// One instance in the cloud.
#[derive(Debug, Clone)]
struct Instance {
    machine: Option<MachineId>,
    nonce: Option<String>,
    zone: Option<String>,
    live: bool,
    /// Older than the harvest's grace period.
    old: bool,
    /// The cloud warned it takes it.
    warned: bool,
    /// Released: left running, no longer ours (harvest modes `none` and `unknown`).
    released: bool,
}

/// The cloud: instances, and the client tokens that made them.
#[derive(Debug, Clone, Default)]
struct Cloud {
    instances: BTreeMap<InstanceId, Instance>,
    tokens: BTreeMap<String, InstanceId>,
    /// Batched calls' client tokens and the instances each made, in launch order.
    batch_tokens: BTreeMap<String, Vec<InstanceId>>,
    made: u32,
    /// Interruption notices not acknowledged, by receipt.
    notices: BTreeMap<String, InstanceId>,
}

impl Cloud {
    /// A start call: the instance its token made before, or a new one.
    fn start(&mut self, p: &StartInstanceParams) -> CloudInstance {
        if let Some(id) = self.tokens.get(&p.client_token).cloned() {
            return self.view(&id);
        }
        let id = self.make(&p.tags, &p.zone);
        self.tokens.insert(p.client_token.clone(), id.clone());
        self.view(&id)
    }

    /// A new live instance, tagged for its machine and start.
    fn make(&mut self, tags: &InstanceTags, zone: &Option<String>) -> InstanceId {
        self.made += 1;
        let id = InstanceId::new(format!("i-{}", self.made));
        let instance = Instance {
            machine: tags.machine.clone(),
            nonce: tags.start.clone(),
            zone: zone.clone(),
            live: true,
            old: false,
            warned: false,
            released: false,
        };
        self.instances.insert(id.clone(), instance);
        id
    }

    /// A batched start call: the instances its token made before, or one new instance per
    /// member, in launch order, each tagged for its machine and start.
    fn start_batch(&mut self, p: &BatchStartParams) -> Vec<CloudInstance> {
        if let Some(ids) = self.batch_tokens.get(&p.client_token).cloned() {
            return ids.iter().map(|id| self.view(id)).collect();
        }
        let ids: Vec<InstanceId> = p.members.iter().map(|member| self.make(&member.tags, &p.zone)).collect();
        self.batch_tokens.insert(p.client_token.clone(), ids.clone());
        ids.iter().map(|id| self.view(id)).collect()
    }

    fn view(&self, id: &InstanceId) -> CloudInstance {
        let i = &self.instances[id];
        let tags = if i.released {
            InstanceTags::default()
        } else {
            InstanceTags { model: Some(UUID.into()), machine: i.machine.clone(), start: i.nonce.clone() }
        };
        let state = if i.live { InstanceState::Running } else { InstanceState::Terminated };
        let mut out = CloudInstance::tagged(id.clone(), state, tags);
        out.zone = i.zone.clone();
        out
    }

    /// The notices not acknowledged, as the cloud hands them out (each time with its whole
    /// warning: time is not modelled).
    fn notices(&self) -> Vec<InterruptionNotice> {
        self.notices
            .iter()
            .map(|(receipt, instance)| InterruptionNotice {
                instance: instance.clone(),
                kind: NoticeKind::Interruption,
                deadline: Some(WARNING),
                receipt: receipt.clone(),
            })
            .collect()
    }

    /// The listing: every instance of ours (not released), terminated ones included.
    fn list(&self) -> Vec<CloudInstance> {
        self.instances.iter().filter(|(_, i)| !i.released).map(|(id, _)| self.view(id)).collect()
    }

    /// Live instances of this machine's start `nonce`.
    fn of_start(&self, machine: &MachineId, nonce: &str) -> Vec<CloudInstance> {
        self.instances
            .iter()
            .filter(|(_, i)| {
                i.live && !i.released && i.machine.as_ref() == Some(machine) && i.nonce.as_deref() == Some(nonce)
            })
            .map(|(id, _)| self.view(id))
            .collect()
    }

    fn stop(&mut self, ids: &[InstanceId]) {
        for id in ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.live = false;
            }
        }
    }

    /// Releases instances: they run on, no longer ours.
    fn release(&mut self, ids: &[InstanceId]) {
        for id in ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.released = true;
            }
        }
    }

    /// Live instances of ours (not released) tagged for the machine.
    fn live_of(&self, machine: &MachineId) -> Vec<InstanceId> {
        self.instances
            .iter()
            .filter(|(_, i)| i.live && !i.released && i.machine.as_ref() == Some(machine))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The model's store: its machines, and (`service`) the leader lease and the start intents.
#[derive(Debug, Clone, Default)]
struct Store {
    machines: BTreeMap<MachineId, Machine>,
    removed: BTreeSet<MachineId>,
    lease: Option<HeldLease>,
    /// The model is dying (destroyed).
    dying: bool,
    /// The model's harvest mode (a new incarnation starts with it).
    harvest_mode: crate::model::HarvestMode,
    /// Start intents by client token (`service::cloud::intents`): written before the call,
    /// dropped once it is settled.
    intents: BTreeMap<String, StartInstanceParams>,
}

impl Store {
    fn live(&mut self, id: &MachineId) -> Option<&mut Machine> {
        if self.removed.contains(id) {
            return None;
        }
        self.machines.get_mut(id)
    }
}

/// One start in the pool: its procedure, and its question (none while its cloud call's
/// answer is on its way).
#[derive(Debug, Clone)]
struct Running {
    run: StartRun,
    ask: Option<StartAsk>,
    /// The lifecycle last told it the machine is still wanted after the model's destruction.
    wanted_while_dying: bool,
}

/// One incarnation of the provisioner: its cores and its work in flight.
#[derive(Debug, Clone)]
struct Provisioner {
    inc: u32,
    /// Its fence (`service`): the lease it leads under.
    fence: Option<Fence>,
    batches: BatchBook,
    /// The batch in flight: its planner, its question, and its ids (waiting again if it fails).
    batch: Option<(BatchRun, Ask, Vec<MachineId>)>,
    book: MachineBook,
    lifecycle: LifecycleBook,
    zones: ZoneBook,
    harvest: HarvestBook,
    starts: BTreeMap<MachineId, Running>,
    /// Starts made so far (their nonces).
    started: u32,
    /// Finished jobs on their way to the coordinator.
    done: Vec<JobOutcome>,
    /// The harvest policy's recheck timer is armed (a plan spared young unknown instances).
    recheck: bool,
    /// Spot hand-overs (the coordinator's core for them).
    handovers: HandoverBook,
    /// The interruption poller's book: the notices it handed on and not acknowledged.
    poller: NoticeBook,
    /// Notices to look at again when the coordinator's look-again timer fires.
    later: Vec<InterruptionNotice>,
    /// Hand-overs whose replacement is being prepared, by machine.
    replacing: BTreeMap<MachineId, NoticeDecision>,
    /// Machines whose switch's stop-overdue timer is armed, with their interrupted instance:
    /// the timer fires once the instance's warning ran out, which is when the cloud takes it.
    overdue: BTreeMap<MachineId, InstanceId>,
    /// Hand-overs a predecessor left under way were looked for (after the first batch).
    resumed: bool,
    /// Stop jobs queued in the pool: the instances, and the dead machines to remove after.
    stops: Vec<(Vec<InstanceId>, Vec<MachineId>)>,
    /// Release jobs queued in the pool: the instances, and the dead machines to remove after.
    releases: Vec<(Vec<InstanceId>, Vec<MachineId>)>,
    /// The registry's periodic listing in flight: its number, and the cloud's answer as of
    /// when it was sent.
    listing: Option<(u64, Vec<CloudInstance>)>,
    /// Start calls sent and not yet at the cloud (`service`), with their parameters.
    wire: BTreeMap<MachineId, StartInstanceParams>,
    /// The cloud's answers on their way to their starts, with the call's client token
    /// (`service`: the intent to drop once it settles).
    replies: BTreeMap<MachineId, (Option<String>, StartAnswer)>,
    /// The pool's batcher (`batch_size`): open batches, and the intents in flight, each
    /// member answered by machine.
    pool: PoolBatches<MachineId>,
    /// Batches waiting for their start token: whether the call is a replay.
    awaiting: BTreeMap<u64, bool>,
    /// The cloud's answers to batches' calls, on their way to the pool.
    batch_replies: BTreeMap<u64, Result<BatchStarted, BrokerError>>,
}

impl Provisioner {
    fn new(
        inc: u32,
        ids: impl IntoIterator<Item = MachineId>,
        settings: &Settings,
        mode: crate::model::HarvestMode,
        fence: Option<Fence>,
    ) -> Self {
        let mutations = settings.mutations;
        let config = crate::config::ProvisionerConfig::default();
        let mut batches = BatchBook::new(config.backoff, config.workers).with_seed(u64::from(inc));
        // The model's watcher says every machine at first.
        batches.notify(ids);
        Self {
            inc,
            fence,
            batches,
            batch: None,
            book: MachineBook::with_scope(Scope::Environ).with_mutations(mutations),
            lifecycle: LifecycleBook::default().with_mutations(mutations),
            zones: ZoneBook::new(u64::from(inc)),
            harvest: HarvestBook::new(mode),
            handovers: HandoverBook::new(),
            poller: NoticeBook::new(config.backoff),
            later: Vec::new(),
            replacing: BTreeMap::new(),
            overdue: BTreeMap::new(),
            resumed: false,
            starts: BTreeMap::new(),
            started: 0,
            recheck: false,
            done: Vec::new(),
            stops: Vec::new(),
            releases: Vec::new(),
            listing: None,
            wire: BTreeMap::new(),
            replies: BTreeMap::new(),
            pool: PoolBatches::new(settings.batch_size).with_mutations(mutations),
            awaiting: BTreeMap::new(),
            batch_replies: BTreeMap::new(),
        }
    }
}

/// Fault budgets left.
#[derive(Debug, Clone)]
struct Budget {
    crashes: u8,
    lost: u8,
    refusals: u8,
    deaths: u8,
    listings: u8,
    listing_failures: u8,
    record_failures: u8,
    retries: u8,
    destroys: u8,
    stop_failures: u8,
    lease_changes: u8,
    interruptions: u8,
    mode_changes: u8,
}

/// What the configuration fixes for the whole check.
#[derive(Debug, Clone)]
struct Settings {
    zones: Vec<String>,
    retry_count: u32,
    service: bool,
    /// The cloud warns of interruptions (the poller runs).
    warns: bool,
    /// Starts' calls join batches of at most this many (more than one: batching on).
    batch_size: usize,
    mutations: crate::config::Mutations,
}

/// The checker's state.
#[derive(Debug, Clone)]
pub struct World {
    settings: Settings,
    cloud: Cloud,
    store: Store,
    prov: Provisioner,
    /// The old leader after the lease moved (`service`), acting until it steps down.
    stale: Option<Provisioner>,
    /// Start calls of provisioners that are gone, still on the wire: by incarnation and machine.
    late: BTreeMap<(u32, MachineId), StartInstanceParams>,
    budget: Budget,
    /// Stops of a live machine's instance (a property says there are none).
    wrong_stops: Vec<String>,
    /// Steps the checker met and does not model (a property says there are none).
    unmodelled: Vec<String>,
    /// Writes the store accepted under an epoch that was no longer the lease's (a property
    /// says there are none).
    stale_writes: Vec<String>,
    /// Start calls made after the model's destruction (a property says there are none).
    started_after_destroy: Vec<String>,
}

impl World {
    /// The initial state: `config.machines` pending machines, an empty cloud.
    pub fn new(config: &McConfig) -> Self {
        let first = config.machines.saturating_sub(config.adds);
        let ids: Vec<MachineId> = (0..first).map(|i| MachineId::new(i.to_string())).collect();
        let store = Store {
            machines: ids.iter().map(|id| (id.clone(), Machine::pending(id.clone()))).collect(),
            lease: config.service.then(|| lease_of(0)),
            harvest_mode: config.harvest_mode,
            ..Store::default()
        };
        let fence = config.service.then(|| fence_of(0, config.mutations));
        let settings = Settings {
            zones: config.zones.clone(),
            retry_count: config.retry_count,
            service: config.service,
            warns: config.interruptions > 0,
            batch_size: config.batch_size,
            mutations: config.mutations,
        };
        let prov = Provisioner::new(0, ids, &settings, config.harvest_mode, fence);
        Self {
            settings,
            cloud: Cloud::default(),
            store,
            prov,
            stale: None,
            late: BTreeMap::new(),
            budget: Budget {
                crashes: config.crashes,
                lost: config.lost_answers,
                refusals: config.refusals,
                deaths: config.deaths,
                listings: config.listings,
                listing_failures: config.listing_failures,
                record_failures: config.record_failures,
                retries: config.retries,
                destroys: config.destroys,
                stop_failures: config.stop_failures,
                lease_changes: config.lease_changes,
                interruptions: config.interruptions,
                mode_changes: u8::from(config.mode_change.is_some()),
            },
            wrong_stops: Vec::new(),
            unmodelled: Vec::new(),
            stale_writes: Vec::new(),
            started_after_destroy: Vec::new(),
        }
    }

    /// What may happen next, in a fixed order.
    pub fn actions(&self, config: &McConfig, out: &mut Vec<McAction>) {
        self.provisioner_actions(out);
        if self.stale.is_some() {
            // The stale leader's own steps, as if it were the provisioner (moved, not copied).
            let mut view = self.clone();
            if let Some(stale) = view.stale.take() {
                view.prov = stale;
            }
            let mut steps = Vec::new();
            view.provisioner_actions(&mut steps);
            out.extend(steps.into_iter().map(|a| McAction::Stale(Box::new(a))));
            out.push(McAction::StepsDown);
        }
        out.extend(self.late.keys().map(|(inc, m)| McAction::Late(*inc, m.clone())));
        if self.budget.crashes > 0 {
            out.push(McAction::Crash);
        }
        if self.budget.lease_changes > 0 {
            out.push(McAction::LeaseMoves);
        }
        if let (Some(mode), true) = (config.mode_change, self.budget.mode_changes > 0) {
            out.push(McAction::ChangeMode(mode));
        }
        if self.budget.destroys > 0 && !self.store.dying {
            out.push(McAction::Destroy);
        }
        for (id, i) in &self.cloud.instances {
            if i.live && i.machine.is_some() && !i.warned && self.budget.interruptions > 0 {
                out.push(McAction::Warn(id.clone()));
            }
            if i.live && i.warned {
                out.push(McAction::Reclaim(id.clone()));
            }
        }
        if self.store.harvest_mode.harvests_unknown() && self.cloud.instances.values().any(|i| i.live && !i.old) {
            out.push(McAction::GracePasses);
        }
        // The model's adds (refused once it is dying).
        if !self.store.dying {
            for i in config.machines.saturating_sub(config.adds)..config.machines {
                let id = MachineId::new(i.to_string());
                if !self.store.machines.contains_key(&id) {
                    out.push(McAction::Add(id));
                }
            }
        }
        if self.budget.deaths > 0 {
            let may_die = self.store.machines.iter().take(usize::from(config.deaths));
            for (id, m) in may_die {
                if m.life == Life::Alive && !self.store.removed.contains(id) {
                    out.push(McAction::Die(id.clone()));
                }
            }
        }
        if self.budget.retries > 0 && !self.store.dying {
            for (id, m) in &self.store.machines {
                if m.life == Life::Alive && m.status == MachineStatus::Error && !self.store.removed.contains(id) {
                    out.push(McAction::Retry(id.clone()));
                }
            }
        }
    }

    /// The provisioner's own next steps (its handlers, its calls' outcomes and answers).
    fn provisioner_actions(&self, out: &mut Vec<McAction>) {
        let p = &self.prov;
        if p.batch.is_some() || p.batches.clone().start_batch().is_some() {
            out.push(McAction::Batch);
        }
        let first_listing = matches!(p.batch, Some((_, Ask::Refresh(_), _))) && !p.book.loaded_once();
        if first_listing && self.budget.listing_failures > 0 {
            out.push(McAction::BatchListingFails);
        }
        let call = |m: &MachineId, params: &StartInstanceParams, out: &mut Vec<McAction>| {
            out.push(McAction::Call(m.clone(), CallOutcome::Lands));
            if self.budget.lost > 0 {
                out.push(McAction::Call(m.clone(), CallOutcome::LosesAnswer));
            }
            if self.budget.refusals > 0 && params.zone.is_some() {
                out.push(McAction::Call(m.clone(), CallOutcome::Refused));
            }
        };
        for (m, r) in &p.starts {
            match &r.ask {
                // The engine alone: the call reaches the cloud as it is made.
                Some(StartAsk::Call(params)) if !self.settings.service && !self.batched() => call(m, params, out),
                Some(StartAsk::Record(_)) => {
                    out.push(McAction::Start(m.clone()));
                    if self.budget.record_failures > 0 {
                        out.push(McAction::RecordFails(m.clone()));
                    }
                }
                Some(_) => out.push(McAction::Start(m.clone())),
                None => {}
            }
        }
        for (m, params) in &p.wire {
            call(m, params, out);
        }
        for (b, replay) in &p.awaiting {
            out.push(McAction::BatchCall(*b, CallOutcome::Lands));
            if self.budget.lost > 0 {
                out.push(McAction::BatchCall(*b, CallOutcome::LosesAnswer));
            }
            // A replay's refusal tells nothing new the first call's did not (not modelled).
            if self.budget.refusals > 0 && !replay {
                out.push(McAction::BatchCall(*b, CallOutcome::Refused));
            }
        }
        out.extend(p.batch_replies.keys().map(|b| McAction::BatchReply(*b)));
        out.extend(p.replies.keys().map(|m| McAction::Reply(m.clone())));
        if !p.done.is_empty() {
            out.push(McAction::JobsDone);
        }
        if !p.releases.is_empty() {
            out.push(McAction::Release);
        }
        if !p.stops.is_empty() {
            out.push(McAction::Stop);
            if self.budget.stop_failures > 0 {
                out.push(McAction::StopFails);
            }
        }
        if p.recheck {
            out.push(McAction::Recheck);
        }
        if !p.poller.clone().on_answer(Ok(self.cloud.notices())).forward.is_empty() {
            out.push(McAction::Poll);
        }
        out.extend(p.replacing.keys().map(|m| McAction::Replace(m.clone())));
        if !p.later.is_empty() {
            out.push(McAction::LookAgain);
        }
        let taken = |i: &InstanceId| self.cloud.instances.get(i).is_none_or(|i| !i.live);
        out.extend(p.overdue.iter().filter(|(_, i)| taken(i)).map(|(m, _)| McAction::Overdue(m.clone())));
        match &p.listing {
            None if self.budget.listings > 0 => out.push(McAction::List),
            None => {}
            Some(_) => {
                out.push(McAction::Listed(ListOutcome::Answers));
                if self.budget.listing_failures > 0 {
                    out.push(McAction::Listed(ListOutcome::Fails));
                }
            }
        }
    }

    /// Nothing is left to happen but faults (crashes, deaths): the protocol has run its course.
    /// The cloud's taking of a warned instance is not a fault but bound to happen (its warning
    /// runs out).
    pub fn quiet(&self, config: &McConfig) -> bool {
        let mut next = Vec::new();
        self.actions(config, &mut next);
        next.iter().all(|a| {
            matches!(
                a,
                McAction::Crash
                    | McAction::Die(_)
                    | McAction::Add(_)
                    | McAction::BatchListingFails
                    | McAction::List
                    | McAction::Listed(ListOutcome::Fails)
                    | McAction::RecordFails(_)
                    | McAction::Retry(_)
                    | McAction::LeaseMoves
                    | McAction::Destroy
                    | McAction::StopFails
                    | McAction::Warn(_)
                    | McAction::ChangeMode(_)
            )
        })
    }

    /// Takes one step.
    pub fn step(&mut self, action: &McAction) {
        self.act(action);
        // The batch book draws only the jitter of its delays, and time is not modelled: its
        // generator is set back after each step, so that a batch retried again and again (a
        // machine waiting for a stop) comes back to the same state instead of a new one a draw.
        for p in std::iter::once(&mut self.prov).chain(self.stale.as_mut()) {
            p.batches = p.batches.clone().with_seed(u64::from(p.inc));
        }
    }

    fn act(&mut self, action: &McAction) {
        match action {
            McAction::Batch => self.batch_step(),
            McAction::Start(m) => self.start_step(m),
            McAction::Call(m, outcome) => self.call(m, *outcome),
            McAction::BatchCall(b, outcome) => self.batch_call(*b, *outcome),
            McAction::BatchReply(b) => self.batch_reply(*b),
            McAction::Reply(m) => {
                let Some((token, answer)) = self.prov.replies.remove(m) else { return };
                // The intent broker drops a settled start's intent (a write of the provisioner's
                // own, fenced) before the start hears the answer.
                if let (Some(token), StartAnswer::Called { result, .. }) = (token, &answer) {
                    if crate::ports::start_settled(result) && self.admits(|| format!("machine {m}'s intent dropped")) {
                        self.store.intents.remove(&token);
                    }
                }
                self.answer_start(m, answer);
            }
            McAction::JobsDone => {
                // As the coordinator's `JobsDone`: the hand-overs' switches first, then the
                // follow-ups, then the switched hand-overs' interrupted instances stopped.
                let outcomes = std::mem::take(&mut self.prov.done);
                let seen = self.prov.handovers.on_outcomes(&outcomes, std::time::Duration::ZERO);
                self.acknowledge(seen.acknowledge);
                self.follow(followup::on_jobs_done(outcomes));
                self.after_switches(seen.switches);
                self.on_notices(seen.again);
                let awaiting = self.prov.handovers.awaiting();
                if !awaiting.is_empty() {
                    self.unmodelled.push(format!("replacements not yet running: {awaiting:?}"));
                }
            }
            McAction::Warn(id) => {
                self.budget.interruptions -= 1;
                let receipt = format!("n{}", self.budget.interruptions);
                if let Some(i) = self.cloud.instances.get_mut(id) {
                    i.warned = true;
                    self.cloud.notices.insert(receipt, id.clone());
                }
            }
            McAction::Reclaim(id) => {
                if let Some(i) = self.cloud.instances.get_mut(id) {
                    i.live = false;
                }
            }
            McAction::Poll => {
                let step = self.prov.poller.on_answer(Ok(self.cloud.notices()));
                self.on_notices(step.forward);
            }
            McAction::Replace(m) => self.start_replacement(m),
            McAction::LookAgain => {
                let again = std::mem::take(&mut self.prov.later);
                self.on_notices(again);
            }
            McAction::Overdue(m) => {
                self.prov.overdue.remove(m);
                let again = self.prov.handovers.stop_overdue(m);
                self.on_notices(again);
            }
            McAction::Stop => {
                let (instances, machines) = self.prov.stops.remove(0);
                self.stop_on_cloud(&instances);
                self.prov.done.push(JobOutcome::Stopped { instances, machines });
            }
            McAction::Release => {
                let (instances, machines) = self.prov.releases.remove(0);
                for id in &instances {
                    self.check_stop(id);
                }
                self.cloud.release(&instances);
                self.prov.done.push(JobOutcome::Released { instances, machines });
            }
            McAction::ChangeMode(mode) => {
                // As the coordinator's `ChangeHarvestMode`: the model's mode, then the harvest
                // policy's change and its follow-ups.
                self.budget.mode_changes -= 1;
                self.store.harvest_mode = *mode;
                let change = self.prov.harvest.set_mode(*mode);
                self.follow(followup::on_mode_change(change));
            }
            McAction::StopFails => {
                // At least once: the instances stopped, the job requeued with its next attempt.
                self.budget.stop_failures -= 1;
                let job = self.prov.stops.remove(0);
                self.stop_on_cloud(&job.0);
                self.prov.stops.push(job);
            }
            McAction::Crash => {
                self.budget.crashes -= 1;
                // The crashed provisioner's calls already sent stay on the wire; with the
                // service, the restarted replica takes the lease again at a new epoch.
                let old = self.next_incarnation();
                self.gone(old);
            }
            McAction::LeaseMoves => {
                self.budget.lease_changes -= 1;
                if let Some(older) = self.stale.take() {
                    self.gone(older);
                }
                self.stale = Some(self.next_incarnation());
            }
            McAction::Stale(a) => {
                let Some(mut stale) = self.stale.take() else { return };
                std::mem::swap(&mut self.prov, &mut stale);
                self.act(a);
                std::mem::swap(&mut self.prov, &mut stale);
                self.stale = Some(stale);
            }
            McAction::Destroy => self.destroy(),
            McAction::GracePasses => {
                for i in self.cloud.instances.values_mut().filter(|i| i.live) {
                    i.old = true;
                }
            }
            McAction::Recheck => {
                self.prov.recheck = false;
                let plan = self.harvest_plan(Vec::new());
                self.execute(plan);
            }
            McAction::StepsDown => {
                if let Some(stale) = self.stale.take() {
                    self.gone(stale);
                }
            }
            McAction::Late(inc, m) => {
                if let Some(params) = self.late.remove(&(*inc, m.clone())) {
                    self.cloud.start(&params);
                }
            }
            McAction::Add(m) => {
                // The model's watcher tells the provisioner (not a stale leader: its watch is
                // over with its lease).
                self.store.machines.insert(m.clone(), Machine::pending(m.clone()));
                self.prov.batches.notify(vec![m.clone()]);
            }
            McAction::Die(m) => {
                self.budget.deaths -= 1;
                if let Some(machine) = self.store.live(m) {
                    machine.life = Life::Dead;
                }
                self.prov.batches.notify(vec![m.clone()]);
            }
            McAction::BatchListingFails => self.first_listing_fails(),
            McAction::List => {
                self.budget.listings -= 1;
                let number = self.prov.book.issue_listing();
                self.prov.listing = Some((number, self.cloud.list()));
            }
            McAction::Listed(outcome) => self.listed(*outcome),
            McAction::RecordFails(m) => {
                if let Some(StartAsk::Record(_)) = self.prov.starts.get_mut(m).and_then(|r| r.ask.take()) {
                    self.budget.record_failures -= 1;
                    let refused = crate::ports::ModelError::Other("the model refused the write".into());
                    self.answer_start(m, StartAnswer::Recorded(Err(refused)));
                }
            }
            McAction::Retry(m) => {
                // As the coordinator's retry tick: the machine's status back to pending and
                // its instance status to provisioning, then the machine notified.
                self.budget.retries -= 1;
                if let Some(machine) = self.store.live(m) {
                    machine.status = MachineStatus::Pending;
                    machine.instance_status = InstanceStatus::provisioning();
                }
                self.prov.batches.notify(vec![m.clone()]);
            }
        }
    }

    /// Decides on notices, each with what the registry knows of its instance, as the
    /// coordinator's `on_notices`.
    fn on_notices(&mut self, notices: Vec<InterruptionNotice>) {
        let mut acknowledge = Vec::new();
        for notice in notices {
            let owner = self.prov.book.noticed(&notice.instance);
            match self.prov.handovers.on_notice(notice, owner, std::time::Duration::ZERO) {
                NoticeDecision::Acknowledge(receipt) => acknowledge.push(receipt),
                NoticeDecision::Later(notice) => self.prov.later.push(notice),
                replace @ NoticeDecision::Replace { .. } => self.begin_handover(replace),
                NoticeDecision::StopFirst { machine, instance } => self.stop_interrupted(machine, instance),
                NoticeDecision::Joined | NoticeDecision::Deferred => {}
            }
        }
        self.acknowledge(acknowledge);
    }

    /// A hand-over opened: its replacement to prepare (`McAction::Replace`).
    fn begin_handover(&mut self, replace: NoticeDecision) {
        if let NoticeDecision::Replace { machine, .. } = &replace {
            self.prov.replacing.insert(machine.clone(), replace);
        }
    }

    /// Prepares a hand-over's replacement, as the coordinator's `start_replacement` (the
    /// model's reads fail only for a removed machine) and `begin_replacement` (nothing if the
    /// hand-over is no longer replacing): the lifecycle asked, then the start queued with the interrupted
    /// instance it replaces and the instance to adopt, if any; if the lifecycle refuses, the
    /// hand-over ends and its notices are acknowledged.
    fn start_replacement(&mut self, m: &MachineId) {
        let Some(NoticeDecision::Replace { machine, interrupted, record, adopt, .. }) = self.prov.replacing.remove(m)
        else {
            return;
        };
        if self.store.live(&machine).is_none() {
            // The model's reads fail (the machine is removed): the hand-over ends, its notices
            // released to be handed out again (the retries of the reads are not modelled).
            self.end_handover(&machine, false);
            return;
        }
        if !self.prov.handovers.replacing(&machine) {
            return;
        }
        if !self.prov.lifecycle.begin_replacement(&machine) {
            self.end_handover(&machine, true);
            return;
        }
        let info = std::sync::Arc::new(ProvisioningInfo::default());
        let job = crate::actors::workers::StartJob {
            machine: *record,
            info,
            group: Vec::new(),
            adopt,
            replaces: Some(interrupted),
            trace: crate::trace::Carried::none(),
        };
        self.enqueue_start(job);
    }

    /// A hand-over ends without its switch, as the coordinator's `end_handover`: its notices
    /// acknowledged (`done`) or released, its deferred warnings looked at again.
    fn end_handover(&mut self, machine: &MachineId, done: bool) {
        let ended = self.prov.handovers.end(machine);
        if done {
            self.acknowledge(ended.acknowledge);
        } else {
            self.prov.poller.acknowledged(&ended.acknowledge);
        }
        self.on_notices(ended.again);
    }

    /// After the switches: each interrupted instance stopped if its machine is still alive,
    /// the hand-over ended (its notices acknowledged), the stop-overdue timer armed, as the
    /// coordinator's `after_switches`.
    fn after_switches(&mut self, switches: Vec<Switch>) {
        for s in switches {
            let receipts = self.prov.handovers.end_switched(&s.machine);
            self.acknowledge(receipts);
            if s.lead.is_some() {
                self.prov.overdue.insert(s.machine.clone(), s.interrupted.clone());
            }
            self.stop_interrupted(s.machine, s.interrupted);
        }
    }

    /// A hand-over's interrupted instance stopped if its machine is still alive, as the
    /// coordinator's `stop_interrupted`.
    fn stop_interrupted(&mut self, machine: MachineId, interrupted: InstanceId) {
        let alive = self.prov.book.noticed(&interrupted).is_some_and(|o| o.alive);
        if alive {
            let stop =
                Followup::PlanStops { instances: vec![interrupted], remove_after: Vec::new(), machine: Some(machine) };
            self.follow(vec![stop]);
        }
    }

    /// After the first batch of an incarnation: the hand-overs a predecessor left under way
    /// are resumed, as the coordinator's `resume_handovers_once`.
    fn resume_handovers_once(&mut self) {
        if self.prov.resumed || !self.settings.warns {
            return;
        }
        self.prov.resumed = true;
        for owner in self.prov.book.resumable_handovers() {
            if let Some(replace) = self.prov.handovers.resume(owner, false) {
                self.begin_handover(replace);
            }
        }
    }

    /// Notices acknowledged: out of the poller's book and the cloud's queue.
    fn acknowledge(&mut self, receipts: Vec<String>) {
        self.prov.poller.acknowledged(&receipts);
        for r in &receipts {
            self.cloud.notices.remove(r);
        }
    }

    /// A new incarnation of the provisioner in place of the current one, which it answers. With
    /// the service, the lease passes to it at a new epoch, and it repeats every start intent
    /// by its token before it runs (`IntentBroker::resume`): the cloud makes or finds each
    /// instance (the repeat lands), and the intents settled are dropped. A repeat that cannot be
    /// settled stops the incarnation before it runs (`ResumeError::Unsettled`): the same, here,
    /// as a repeat that lands later, before the next incarnation runs.
    fn next_incarnation(&mut self) -> Provisioner {
        let inc = self.prov.inc + 1;
        let ids: Vec<MachineId> =
            self.store.machines.keys().filter(|id| !self.store.removed.contains(*id)).cloned().collect();
        let fence = self.settings.service.then(|| fence_of(inc, self.settings.mutations));
        let next = Provisioner::new(inc, ids, &self.settings, self.store.harvest_mode, fence);
        let old = std::mem::replace(&mut self.prov, next);
        if self.settings.service {
            self.store.lease = Some(lease_of(inc));
            for params in std::mem::take(&mut self.store.intents).into_values() {
                self.cloud.start(&params);
            }
        }
        old
    }

    /// The operator destroys the model, as the coordinator's `DestroyModel` (`links::destroy`):
    /// the model dying (the operator's write, not fenced), no batch starting anything any more,
    /// the registry's targets (`MachineBook::destroy_targets`), the lifecycle's deaths (starts
    /// in flight stop what they make when they land), the harvest policy's plan, its stops.
    fn destroy(&mut self) {
        self.budget.destroys -= 1;
        self.store.dying = true;
        let machines: Vec<Machine> = self
            .store
            .machines
            .iter()
            .filter(|(id, _)| !self.store.removed.contains(*id))
            .map(|(_, m)| m.clone())
            .collect();
        let p = &mut self.prov;
        p.batches.set_model_dying();
        let targets = p.book.destroy_targets(machines);
        let deaths = p.lifecycle.on_destroy(&targets.machines);
        let plan = p.harvest.plan_destroy(&deaths.stop_now);
        self.execute(plan);
    }

    /// What a dying model still runs, stopped, as the coordinator's `SweepDyingModel`
    /// (`links::plan_sweep`).
    fn sweep(&mut self) {
        let p = &mut self.prov;
        let targets = p.book.sweep_targets();
        let stop_now = p.lifecycle.on_destroy(&targets).into_sweep();
        let plan = p.harvest.plan_destroy(&stop_now);
        self.execute(plan);
    }

    /// A start call leaving for the cloud: only a start the lifecycle last told it is wanted
    /// before the model's destruction may make one (a start the destruction found in flight
    /// makes its call, and what it makes is stopped when it lands: `quiet means converged`).
    fn check_call(&mut self, m: &MachineId) {
        if self.prov.starts.get(m).is_some_and(|r| r.wanted_while_dying) {
            let what = format!("machine {m}'s start was told it is wanted after the model's destruction, and called");
            self.started_after_destroy.push(what);
        }
    }

    /// A provisioner that is gone: its calls already sent stay on the wire.
    fn gone(&mut self, p: Provisioner) {
        for (m, params) in p.wire {
            self.late.insert((p.inc, m), params);
        }
    }

    /// Whether the store admits a write of the provisioner now: its fence against the lease
    /// (`Fence::admits`, as the PostgreSQL store checks it); always without the service. A
    /// write admitted under an epoch the lease has left (a mutation) is noted, as `what`.
    fn admits(&mut self, what: impl FnOnce() -> String) -> bool {
        let (Some(fence), Some(lease)) = (&self.prov.fence, &self.store.lease) else { return true };
        if !fence.admits(Some(lease)) {
            return false;
        }
        if fence.epoch != lease.epoch {
            let (at, now) = (fence.epoch, lease.epoch);
            self.stale_writes.push(format!("{} under epoch {at}, the lease at epoch {now}", what()));
        }
        true
    }

    /// The first refresh's listing fails: the registry hears it ([`MachineBook::listing_failed`]),
    /// and the batch fails as a whole, its machines waiting again (the backoff is over at once:
    /// time is not modelled).
    fn first_listing_fails(&mut self) {
        let Some((mut run, Ask::Refresh(_), ids)) = self.prov.batch.take() else { return };
        self.budget.listing_failures -= 1;
        self.prov.book.issue_listing();
        self.prov.book.listing_failed();
        let error = crate::actors::registry::RegistryError::Listing(BrokerError::transient("the listing failed"));
        match run.answer(Answer::Refreshed(Err(error))) {
            Err(_) => {
                self.prov.batches.batch_failed(ids);
                self.prov.batches.backoff_over();
            }
            Ok(steps) => self.batch_steps(run, steps, ids),
        }
    }

    /// The periodic listing's end, as the registry's resync: the view loaded (and the instance
    /// statuses that changed written), then the coordinator's `ViewRefreshed` (once its first
    /// batch is done): the unknown instances' harvest and the extra instances' stop.
    fn listed(&mut self, outcome: ListOutcome) {
        let Some((number, listing)) = self.prov.listing.take() else { return };
        let book = &mut self.prov.book;
        if outcome == ListOutcome::Fails {
            self.budget.listing_failures -= 1;
            book.listing_failed();
            return;
        }
        book.load_listing(listing, number);
        self.prov.handovers.listing_seen();
        for (id, status, _) in book.status_changes() {
            if !self.admits(|| format!("machine {id}'s instance status")) {
                continue;
            }
            if let Some(m) = self.store.live(&id) {
                m.instance_status = status;
            }
        }
        if !self.prov.batches.first_done() {
            return;
        }
        // As the coordinator's `ViewRefreshed`: a hand-over's instances are never extras; the
        // hand-overs the listing shows under way are resumed.
        let mut extras = self.prov.book.extra_instances();
        extras.retain(|(m, i)| !self.prov.handovers.spares(m, i));
        self.follow(followup::after_listing(extras));
        if self.settings.warns {
            for owner in self.prov.book.resumable_handovers() {
                if let Some(replace) = self.prov.handovers.resume(owner, false) {
                    self.begin_handover(replace);
                }
            }
        }
    }

    /// A stop call reaching the cloud: each instance's stop checked, then made.
    fn stop_on_cloud(&mut self, instances: &[InstanceId]) {
        for id in instances {
            self.check_stop(id);
        }
        self.cloud.stop(instances);
    }

    /// A stop (or release) of `id`: wrong if it is the live instance of a live machine that
    /// records it.
    fn check_stop(&mut self, id: &InstanceId) {
        let Some(machine) = self.cloud.instances.get(id).and_then(|i| i.machine.clone()) else { return };
        let alive = !self.store.dying && self.store.live(&machine).is_some_and(|m| m.life == Life::Alive);
        let recorded = self.store.machines.get(&machine).is_some_and(|m| m.instance.as_ref() == Some(id));
        if alive && recorded && self.cloud.instances[id].live {
            self.wrong_stops.push(format!("instance {id} of live machine {machine} was stopped"));
        }
    }

    // ---- the coordinator

    fn batch_step(&mut self) {
        let (run, steps, ids) = match self.prov.batch.take() {
            None => {
                let Some(start) = self.prov.batches.start_batch() else { return };
                let ids = start.ids.clone();
                let (run, steps) = BatchRun::new(start);
                (run, steps, ids)
            }
            Some((mut run, ask, ids)) => {
                let answer = self.answer_batch(ask);
                match run.answer(answer) {
                    Ok(steps) => (run, steps, ids),
                    Err(e) => {
                        self.unmodelled.push(format!("a batch failed: {e}"));
                        return;
                    }
                }
            }
        };
        self.batch_steps(run, steps, ids);
    }

    /// Carries out a batch's effects; keeps the run with its next question, or ends it.
    fn batch_steps(&mut self, run: BatchRun, steps: Steps, ids: Vec<MachineId>) {
        for effect in steps.effects {
            self.perform(effect);
        }
        match steps.next {
            Next::Ask(ask) => self.prov.batch = Some((run, ask, ids)),
            Next::Done(outcome) => {
                let next = self.prov.batches.batch_done(outcome);
                self.follow(next);
                self.resume_handovers_once();
            }
        }
    }

    /// Answers the batch planner's question as the actors would.
    fn answer_batch(&mut self, ask: Ask) -> Answer {
        let p = &mut self.prov;
        match ask {
            Ask::ModelLife => Answer::Life(Ok(if self.store.dying { Life::Dying } else { Life::Alive })),
            Ask::DestroyWins => Answer::Plan(p.harvest.plan_destroy(&[])),
            Ask::RefreshZones => {
                let zones: Vec<(String, bool)> = self.settings.zones.iter().map(|z| (z.clone(), true)).collect();
                p.zones.update_zones(&zones);
                Answer::Zones(Ok(()))
            }
            Ask::Refresh(ids) => {
                // The registry's first refresh lists the cloud before it reads the machines.
                if !p.book.loaded_once() {
                    let number = p.book.issue_listing();
                    p.book.load_listing(self.cloud.list(), number);
                }
                let ids = p.book.in_scope(ids);
                let reads: Vec<_> = ids
                    .into_iter()
                    .map(|id| {
                        let read = match self.store.machines.get(&id).filter(|_| !self.store.removed.contains(&id)) {
                            Some(m) => Ok(m.clone()),
                            None => Err(crate::ports::ModelError::NotFound(id.clone())),
                        };
                        (id, read)
                    })
                    .collect();
                let (mut refreshed, to_kill) = p.book.absorb(reads);
                let mut results = Vec::new();
                for id in to_kill {
                    if !self.admits(|| format!("machine {id} marked dead")) {
                        results.push((id, Err(fenced())));
                        continue;
                    }
                    if let Some(m) = self.store.live(&id) {
                        m.life = Life::Dead;
                    }
                    results.push((id, Ok(())));
                }
                self.prov.book.killed(results, &mut refreshed);
                Answer::Refreshed(Ok(refreshed))
            }
            Ask::EndSafeMode => Answer::ModeChange(p.harvest.end_safe_mode()),
            Ask::PlanOrphanStops(instances) => Answer::Plan(p.harvest.plan_stops(&instances, &[], None)),
            Ask::ObserveDead(dead) => Answer::Deaths(p.lifecycle.on_deaths(&dead)),
            Ask::PlanDead(dead) => Answer::Plan(self.harvest_plan(dead)),
            Ask::ObservePending(ids) => {
                Answer::ToStart(ids.into_iter().filter(|id| p.lifecycle.want_start(id)).collect())
            }
            Ask::StartInfo(ids) => {
                let infos = ids.iter().map(|_| Ok(ProvisioningInfo::default())).collect();
                let groups = ids.iter().map(|_| Ok(Vec::new())).collect();
                Answer::StartInfo { infos: Ok(infos), groups: Ok(groups) }
            }
            Ask::WriteError { machine, .. } => {
                if !self.admits(|| format!("machine {machine}'s provisioning error")) {
                    return Answer::Written;
                }
                if let Some(m) = self.store.live(&machine) {
                    m.instance_status = InstanceStatus::provisioning_error();
                    m.status = MachineStatus::Error;
                }
                Answer::Written
            }
        }
    }

    /// Carries out one batch effect, as `coordinator::links::perform`.
    fn perform(&mut self, effect: Effect) {
        let p = &mut self.prov;
        match effect {
            Effect::Populate(placements) => p.zones.populate(&placements),
            Effect::Gone(ids) => {
                for m in &ids {
                    p.zones.release(m);
                    p.lifecycle.forget(m);
                }
            }
            Effect::StopsPlanned { ids, machine } => p.book.stops_planned(&ids, machine.as_ref()),
            Effect::Execute(plan) => self.execute(*plan),
            Effect::Start(job) => self.enqueue_start(*job),
            Effect::ForgetLifecycle(ids) => {
                for m in &ids {
                    p.lifecycle.forget(m);
                }
            }
        }
    }

    /// The harvest policy's plan for dead machines (and unknown instances, in a mode that
    /// harvests them), as its `plan_with_unknown`: the registry's unknown instances (none while
    /// its view is stale), each as old as the grace period once it has passed for it (time is
    /// not modelled: `GracePasses`), and the recheck timer armed when the plan asks for one.
    fn harvest_plan(&mut self, dead: Vec<crate::model::DeadMachine>) -> HarvestPlan {
        let p = &mut self.prov;
        if !p.harvest.wants_unknown() {
            return p.harvest.plan(&dead, &[]);
        }
        p.harvest.ask_sent();
        let grace = crate::actors::harvest::HarvestSafety::default().grace;
        let unknown: Vec<UnknownInstance> = p
            .book
            .unknown_instances()
            .unwrap_or_default()
            .into_iter()
            .map(|id| {
                let old = self.cloud.instances.get(&id).is_some_and(|i| i.old);
                UnknownInstance { id, age: if old { grace } else { std::time::Duration::ZERO } }
            })
            .collect();
        let unknown = p.harvest.ask_answered(unknown);
        let plan = p.harvest.plan(&dead, &unknown);
        p.recheck |= plan.recheck_in.is_some();
        plan
    }

    /// A harvest plan's work, as `coordinator::links::execute_plan`.
    fn execute(&mut self, plan: HarvestPlan) {
        if !plan.stop.is_empty() {
            self.prov.book.stops_planned(&plan.stop, None);
            self.prov.stops.push((plan.stop, plan.remove_after_stop));
        }
        if !plan.release.is_empty() {
            self.prov.releases.push((plan.release, plan.remove_after_release));
        }
        self.forget(plan.remove_now);
    }

    /// Machines removed: forgotten by every core, marked for removal in the store.
    fn forget(&mut self, machines: Vec<MachineId>) {
        for m in machines {
            self.prov.zones.release(&m);
            self.prov.lifecycle.forget(&m);
            self.prov.book.remove(&m);
            if self.admits(|| format!("machine {m} removed")) {
                self.store.removed.insert(m);
            }
        }
    }

    /// Carries out follow-ups, as `Coordinator::follow` does: records and finished starts go
    /// to the registry and the lifecycle, each other follow-up to its core.
    fn follow(&mut self, followups: Vec<Followup>) {
        for f in followups {
            match f {
                Followup::Record { machine, instance, constraints } => {
                    self.prov.book.record_started(&machine, *instance, constraints.map(|c| *c))
                }
                Followup::StartFinished { machine, instance, orphan } => {
                    let answer = self.prov.lifecycle.start_finished(&machine, instance);
                    match followup::after_start(Some(answer), machine, orphan) {
                        AfterStartStep::Then(next) => self.follow(next),
                        // The machine died while it started: harvested with what the start made.
                        AfterStartStep::PlanDead(dead) => {
                            let plan = self.harvest_plan(vec![dead]);
                            self.execute(plan);
                        }
                        // The model was destroyed while it started: its instance stopped.
                        AfterStartStep::PlanDestroy(machine) => {
                            let plan = self.prov.harvest.plan_destroy(&[machine]);
                            self.execute(plan);
                        }
                    }
                }
                Followup::Publish(_) => {}
                Followup::HarvestUnknown { .. } => {
                    let plan = self.harvest_plan(Vec::new());
                    self.execute(plan);
                }
                Followup::RetryLater { ids, .. } => self.prov.batches.notify(ids),
                Followup::PlanStops { instances, remove_after, machine } => {
                    if !instances.is_empty() {
                        self.prov.book.stops_planned(&instances, machine.as_ref());
                        let plan = self.prov.harvest.plan_stops(&instances, &remove_after, machine.as_ref());
                        self.execute(plan);
                    }
                }
                Followup::StopExtras(extras) => {
                    // As `coordinator::links::plan_extras`: those whose machine has no start in
                    // flight (the lifecycle), through the harvest policy into a stop job.
                    let extras = self.prov.lifecycle.without_start(extras);
                    if !extras.is_empty() {
                        let instances: Vec<InstanceId> = extras.into_iter().map(|(_, i)| i).collect();
                        let plan = self.prov.harvest.plan_extras(&instances);
                        self.execute(plan);
                    }
                }
                Followup::Forget(machines) => {
                    // As the coordinator's `end_handovers`: their hand-overs end, their notices
                    // acknowledged.
                    let mut acknowledge = Vec::new();
                    for m in &machines {
                        let ended = self.prov.handovers.end(m);
                        acknowledge.extend(ended.acknowledge);
                        acknowledge.extend(ended.again.into_iter().map(|n| n.receipt));
                    }
                    self.acknowledge(acknowledge);
                    self.forget(machines)
                }
                Followup::SweepDyingModel => self.sweep(),
                Followup::Populate(placements) => self.prov.zones.populate(&placements),
                Followup::InstancesGone(ids) => self.prov.book.instances_gone(&ids),
                Followup::StopsDone(instances) => {
                    let again = self.prov.handovers.stopped(&instances);
                    self.on_notices(again);
                    let machines = self.prov.harvest.stops_done(&instances);
                    self.follow(followup::removed(machines));
                }
            }
        }
    }

    // ---- the pool and its starts

    fn enqueue_start(&mut self, job: crate::actors::workers::StartJob) {
        let batched = self.batched();
        let p = &mut self.prov;
        p.started += 1;
        let machine = job.machine.id.clone();
        // As the pool's `dispatch`: a hand-over's replacement has the nonce that names the
        // instance it replaces, the same for every incarnation.
        let nonce = match &job.replaces {
            Some(replaces) => InstanceTags::replacement_nonce(HOST_TAG, replaces),
            None => format!("p{}:{}", p.inc, p.started),
        };
        let settings = StartSettings {
            retry: crate::config::RetryStrategy::new(self.settings.retry_count, std::time::Duration::ZERO),
            backoff: crate::config::ProvisionerConfig::default().backoff,
            supports_zones: false,
            claim: false,
            batched,
            spot_max_price: None,
            model_uuid: UUID.into(),
            mutations: self.settings.mutations,
        };
        let (run, ask) = StartRun::new(job, nonce, settings, u64::from(p.started));
        p.starts.insert(machine, Running { run, ask: Some(ask), wanted_while_dying: false });
    }

    fn start_step(&mut self, m: &MachineId) {
        let Some(ask) = self.prov.starts.get_mut(m).and_then(|r| r.ask.take()) else { return };
        let answer = match ask {
            StartAsk::StillWanted => {
                let wanted = self.prov.lifecycle.still_wanted(m);
                if let Some(r) = self.prov.starts.get_mut(m) {
                    r.wanted_while_dying = wanted && self.store.dying;
                }
                StartAnswer::Wanted(Ok(wanted))
            }
            StartAsk::SendInstanceStatus { status, .. } | StartAsk::SetInstanceStatus { status, .. } => {
                if self.admits(|| format!("machine {m}'s instance status")) {
                    if let Some(machine) = self.store.live(m) {
                        machine.instance_status = status;
                    }
                }
                StartAnswer::Done
            }
            StartAsk::SetMachineError(_) => {
                if self.admits(|| format!("machine {m}'s error")) {
                    if let Some(machine) = self.store.live(m) {
                        machine.status = MachineStatus::Error;
                    }
                }
                StartAnswer::Done
            }
            // Batched: the call joins the open batch of its shape, or opens one (which then
            // waits for its start token); the start waits for its member's answer.
            StartAsk::Call(params) if self.batched() => {
                self.check_call(m);
                let joined = self.prov.pool.join(*params, m.clone());
                if joined.opened {
                    self.prov.awaiting.insert(joined.batch, false);
                }
                return;
            }
            // The service: the intent written (fenced) before the call, then the call sent.
            StartAsk::Call(params) if self.settings.service => {
                if !self.admits(|| format!("machine {m}'s start intent")) {
                    let err = BrokerError::zone_independent(format!("cannot write the start's intent: {}", fenced()));
                    StartAnswer::Called { result: Err(err), maybe_made: false }
                } else {
                    if !self.settings.mutations.no_start_intents {
                        self.store.intents.insert(params.client_token.clone(), (*params).clone());
                    }
                    self.check_call(m);
                    self.prov.wire.insert(m.clone(), *params);
                    return;
                }
            }
            StartAsk::DeriveZones => StartAnswer::Zones(Ok(Vec::new())),
            StartAsk::Sleep(_) | StartAsk::FreeWorker => StartAnswer::Done,
            StartAsk::ClaimReusable { .. } => StartAnswer::Claimed(Ok(None)),
            StartAsk::ChooseZone(request) => StartAnswer::Zone(Ok(self.prov.zones.choose(m, request))),
            StartAsk::MarkZoneFailed { zone, .. } => StartAnswer::Marked(Ok(self.prov.zones.mark_failed(m, &zone))),
            StartAsk::ReleaseReservation => {
                self.prov.zones.release_reservation(m);
                StartAnswer::Done
            }
            StartAsk::ReleaseMachine => {
                self.prov.zones.release(m);
                StartAnswer::Done
            }
            StartAsk::OrphanStopping(instance) => {
                self.prov.book.stops_planned(&[instance], Some(m));
                StartAnswer::Done
            }
            StartAsk::LookForOwn(nonce) => StartAnswer::Found(Ok(self.cloud.of_start(m, &nonce))),
            StartAsk::Record(_) if !self.admits(|| format!("machine {m}'s instance recorded")) => {
                StartAnswer::Recorded(Err(fenced()))
            }
            StartAsk::Record(info) => match self.store.live(m) {
                Some(machine) => {
                    machine.instance = Some(info.instance);
                    machine.instance_status = info.status;
                    machine.status = MachineStatus::Started;
                    StartAnswer::Recorded(Ok(()))
                }
                None => StartAnswer::Recorded(Err(crate::ports::ModelError::NotFound(m.clone()))),
            },
            StartAsk::Finish(outcome) => {
                self.prov.starts.remove(m);
                self.prov.done.push(outcome);
                return;
            }
            other => {
                self.unmodelled.push(format!("machine {m}'s start asked {other:?}"));
                return;
            }
        };
        self.answer_start(m, answer);
    }

    fn answer_start(&mut self, m: &MachineId, answer: StartAnswer) {
        if let Some(r) = self.prov.starts.get_mut(m) {
            r.ask = Some(r.run.answer(answer));
        }
    }

    fn call(&mut self, m: &MachineId, outcome: CallOutcome) {
        let params = if self.settings.service {
            let Some(params) = self.prov.wire.remove(m) else { return };
            params
        } else {
            let Some(StartAsk::Call(params)) = self.prov.starts.get_mut(m).and_then(|r| r.ask.take()) else { return };
            self.check_call(m);
            *params
        };
        let answer = match outcome {
            CallOutcome::Lands => {
                let instance = self.cloud.start(&params);
                StartAnswer::Called {
                    result: Ok(StartedInstance { instance, display_name: String::new() }),
                    maybe_made: false,
                }
            }
            CallOutcome::LosesAnswer => {
                self.budget.lost -= 1;
                self.cloud.start(&params);
                let err = BrokerError::transient("the start call timed out (its answer was lost)");
                StartAnswer::Called { result: Err(err), maybe_made: true }
            }
            CallOutcome::Refused => {
                self.budget.refusals -= 1;
                let err = BrokerError::zone_specific("InsufficientInstanceCapacity: no capacity in the zone");
                StartAnswer::Called { result: Err(err), maybe_made: false }
            }
        };
        let token = self.settings.service.then(|| params.client_token.clone());
        self.prov.replies.insert(m.clone(), (token, answer));
    }

    /// Whether starts' calls are batched (the engine alone: the service's intent broker makes
    /// one call per machine).
    fn batched(&self) -> bool {
        self.settings.batch_size > 1 && !self.settings.service
    }

    /// A batch's start token is granted, as the pool's `await_token`: the batch closed (its
    /// intent recorded) or its intent replayed, and the call made, reaching the cloud as it is
    /// made (the engine alone); its answer goes back to the pool (`McAction::BatchReply`).
    fn batch_call(&mut self, b: u64, outcome: CallOutcome) {
        let Some(replay) = self.prov.awaiting.remove(&b) else { return };
        let params = if replay { self.prov.pool.replay(b) } else { self.prov.pool.close(b) };
        let Some(params) = params else { return };
        let answer = match outcome {
            CallOutcome::Lands => Ok(self
                .cloud
                .start_batch(&params)
                .into_iter()
                .map(|instance| Ok(StartedInstance { instance, display_name: String::new() }))
                .collect()),
            CallOutcome::LosesAnswer => {
                self.budget.lost -= 1;
                self.cloud.start_batch(&params);
                Err(BrokerError::transient("the batched start call timed out (its answer was lost)"))
            }
            CallOutcome::Refused => {
                self.budget.refusals -= 1;
                Err(BrokerError::zone_specific("InsufficientInstanceCapacity: no capacity in the zone"))
            }
        };
        self.prov.batch_replies.insert(b, answer);
    }

    /// The cloud's answer to a batch reaches the pool (`BatchBook::answered`): each member
    /// hears its own answer, or the call is replayed (the backoff is over at once: time is not
    /// modelled).
    fn batch_reply(&mut self, b: u64) {
        let Some(result) = self.prov.batch_replies.remove(&b) else { return };
        match self.prov.pool.answered(b, result) {
            pool_batch::Answer::Deliver(replies) => {
                for (m, reply) in replies {
                    let answer = StartAnswer::Called { result: reply.result, maybe_made: reply.maybe_made };
                    self.answer_start(&m, answer);
                }
            }
            pool_batch::Answer::Replay { .. } => {
                self.prov.awaiting.insert(b, true);
            }
            pool_batch::Answer::Unknown => {}
        }
    }

    /// The machines of batch `b` waiting for its call, in launch order (the export's faults).
    pub fn batch_members(&self, b: u64) -> Vec<MachineId> {
        let closed = self.prov.pool.replay(b).map(|p| p.members.into_iter().map(|m| m.machine).collect());
        closed.unwrap_or_else(|| self.prov.pool.open_members(b))
    }

    /// Whether the provisioner has loaded a listing since it started.
    pub(super) fn listing_loaded(&self) -> bool {
        self.prov.book.loaded_once()
    }

    /// Whether machine `m`'s start is asking for its record (a `Start` step now records it).
    pub(super) fn asks_record(&self, m: &MachineId) -> bool {
        matches!(self.prov.starts.get(m).and_then(|r| r.ask.as_ref()), Some(StartAsk::Record(_)))
    }

    // ---- properties

    /// Machines with two live instances of ours, in words.
    pub fn duplicates(&self) -> Vec<String> {
        let mut out = Vec::new();
        let machines: BTreeSet<&MachineId> = self.cloud.instances.values().filter_map(|i| i.machine.as_ref()).collect();
        for m in machines {
            let live = self.cloud.live_of(m);
            // A marked hand-over: two live instances, one started to replace the other.
            let replaces = |a: &InstanceId, b: &InstanceId| {
                let nonce = self.cloud.instances[a].nonce.clone();
                InstanceTags { start: nonce, ..InstanceTags::default() }.replaces() == Some(b.as_str())
            };
            let handover = live.len() == 2 && (replaces(&live[0], &live[1]) || replaces(&live[1], &live[0]));
            if live.len() > 1 && !handover {
                let ids: Vec<String> = live.iter().map(ToString::to_string).collect();
                out.push(format!("machine {m} has {} live instances: {}", live.len(), ids.join(", ")));
            }
        }
        out
    }

    /// Stops of a live machine's recorded instance, in words.
    pub fn wrong_stops(&self) -> Vec<String> {
        self.wrong_stops.clone()
    }

    /// Start calls made after the model's destruction, in words.
    pub fn started_after_destroy(&self) -> Vec<String> {
        self.started_after_destroy.clone()
    }

    /// Writes the store accepted under a stale epoch, in words.
    pub fn stale_writes(&self) -> Vec<String> {
        self.stale_writes.clone()
    }

    /// Steps the checker does not model, in words.
    pub fn unmodelled(&self) -> Vec<String> {
        self.unmodelled.clone()
    }

    /// What is not as it should be once the protocol has run its course, in words: a live
    /// machine without exactly one live instance recorded (and no provisioning error), a dead
    /// machine's instance still live, an instance of ours without a machine, any instance of a
    /// destroyed model still live.
    pub fn unconverged(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, m) in &self.store.machines {
            let removed = self.store.removed.contains(id);
            let live = self.cloud.live_of(id);
            if self.store.dying {
                if !live.is_empty() {
                    out.push(format!("the model was destroyed and machine {id} still has live instances {live:?}"));
                }
            } else if m.life == Life::Alive && !removed {
                let errored = m.status == MachineStatus::Error;
                let one_recorded = live.len() == 1 && m.instance.as_ref().is_some_and(|i| live.contains(i));
                if !errored && !one_recorded {
                    out.push(format!(
                        "live machine {id} records {:?} and has live instances {live:?}",
                        m.instance.as_ref().map(ToString::to_string)
                    ));
                }
            } else if !live.is_empty() {
                out.push(format!("dead machine {id} still has live instances {live:?}"));
            }
        }
        // Every interruption notice acted on is acknowledged (one held for ever is handed out
        // again only to the next provisioner).
        if !self.cloud.notices.is_empty() {
            out.push(format!("interruption notices never acknowledged: {:?}", self.cloud.notices));
        }
        out
    }
}
