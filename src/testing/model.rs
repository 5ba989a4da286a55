//! The fake model.

use std::collections::{BTreeMap, VecDeque};

use actix::prelude::*;

use crate::model::{InstanceId, InstanceStatus, Life, Machine, MachineId, MachineStatus, ProvisioningInfo};
use crate::ports::{ModelApi, ModelError, ModelFuture, ProvisionedInstance};
use crate::{MachinesChanged, RetryTick};

use super::compact::{Name, Names};

/// A kind of model call, for `fail_next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ModelOp {
    /// `machines`.
    Machines,
    /// `machines_with_transient_errors`.
    TransientErrors,
    /// `provisioning_info`.
    ProvisioningInfo,
    /// `distribution_groups`.
    DistributionGroups,
    /// `set_instance_info`.
    SetInstanceInfo,
    /// `set_status`.
    SetStatus,
    /// `set_instance_status`.
    SetInstanceStatus,
    /// `ensure_dead`.
    EnsureDead,
    /// `mark_for_removal`.
    MarkForRemoval,
    /// `destroy_model`.
    DestroyModel,
}

/// A machine in the fake model, with everything the provisioner may read or write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeMachine {
    /// The machine as `machines` reports it.
    pub machine: Machine,
    /// Its provisioning info.
    pub info: ProvisioningInfo,
    /// Its distribution group, or the error looking it up returns.
    pub group: Result<Vec<MachineId>, String>,
    /// The machine status message.
    pub status_message: String,
    /// The instance status message.
    pub instance_status_message: String,
    /// The zone recorded with its instance.
    pub zone: Option<String>,
    /// Marked for removal.
    pub removed: bool,
    /// Its provisioning error was marked transient (`retry-provisioning`).
    pub transient: bool,
    /// Per-machine error returned by `machines` for it.
    pub read_error: Option<String>,
    /// When it became dead, since the model was created.
    pub died_at: Option<std::time::Duration>,
    /// When it was marked for removal.
    pub removed_at: Option<std::time::Duration>,
    /// Every instance-info write for it that failed: when (the end of the write) and the
    /// instance it would have recorded. A record that failed makes that instance an orphan
    /// whose stop the provisioner decides then (and retries until it succeeds).
    pub record_failures: Vec<(std::time::Duration, InstanceId)>,
    /// When its instance was last recorded (the end of the instance-info write).
    pub recorded_at: Option<std::time::Duration>,
}

impl FakeMachine {
    /// A fake machine with empty provisioning info and no distribution group.
    pub fn new(machine: Machine) -> Self {
        Self {
            machine,
            info: ProvisioningInfo::default(),
            group: Ok(Vec::new()),
            status_message: String::new(),
            instance_status_message: String::new(),
            zone: None,
            removed: false,
            transient: false,
            read_error: None,
            died_at: None,
            removed_at: None,
            record_failures: Vec::new(),
            recorded_at: None,
        }
    }
}

/// A machine as the fake model keeps it: what every machine of a fleet has (the machine, its
/// instance's zone, when that was recorded, the instance status message every start writes)
/// inline, everything else boxed and only while it differs from a fresh machine's. A
/// 100,000-machine fleet then costs about 150 bytes a machine here instead of a whole
/// [`FakeMachine`] (520 bytes: its provisioning info, messages and timestamps are empty for
/// nearly every machine): the zone is interned (a fleet has a few), the time a number.
/// [`FakeMachine`] stays the form tests build and read (snapshots, `update`).
#[derive(Debug, Clone)]
struct Slot {
    machine: Machine,
    /// When its instance was recorded, in nanoseconds since the model's creation
    /// ([`NOT_RECORDED`]: never).
    recorded_at: u64,
    instance_status_message: Box<str>,
    zone: Name,
    removed: bool,
    transient: bool,
    /// `None`: every field of [`Rare`] at its default.
    rare: Option<Box<Rare>>,
}

/// The fields of a [`FakeMachine`] that a fleet's machines leave at their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rare {
    info: ProvisioningInfo,
    group: Result<Vec<MachineId>, String>,
    status_message: String,
    read_error: Option<String>,
    died_at: Option<std::time::Duration>,
    removed_at: Option<std::time::Duration>,
    record_failures: Vec<(std::time::Duration, InstanceId)>,
}

impl Default for Rare {
    fn default() -> Self {
        Self {
            info: ProvisioningInfo::default(),
            group: Ok(Vec::new()),
            status_message: String::new(),
            read_error: None,
            died_at: None,
            removed_at: None,
            record_failures: Vec::new(),
        }
    }
}

impl Rare {
    fn is_default(&self) -> bool {
        self.info == ProvisioningInfo::default()
            && matches!(&self.group, Ok(g) if g.is_empty())
            && self.status_message.is_empty()
            && self.read_error.is_none()
            && self.died_at.is_none()
            && self.removed_at.is_none()
            && self.record_failures.is_empty()
    }
}

/// [`Slot::recorded_at`] of a machine whose instance was never recorded.
const NOT_RECORDED: u64 = u64::MAX;

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(NOT_RECORDED - 1)
}

impl Slot {
    fn new(f: FakeMachine, names: &mut Names) -> Self {
        let rare = Rare {
            info: f.info,
            group: f.group,
            status_message: f.status_message,
            read_error: f.read_error,
            died_at: f.died_at,
            removed_at: f.removed_at,
            record_failures: f.record_failures,
        };
        Self {
            machine: f.machine,
            zone: names.intern_opt(f.zone.as_deref()),
            recorded_at: f.recorded_at.map_or(NOT_RECORDED, nanos),
            instance_status_message: f.instance_status_message.into_boxed_str(),
            removed: f.removed,
            transient: f.transient,
            rare: (!rare.is_default()).then(|| Box::new(rare)),
        }
    }

    /// The machine in its full form.
    fn to_fake(&self, names: &Names) -> FakeMachine {
        let rare = self.rare.as_deref().cloned().unwrap_or_default();
        FakeMachine {
            machine: self.machine.clone(),
            info: rare.info,
            group: rare.group,
            status_message: rare.status_message,
            instance_status_message: self.instance_status_message.to_string(),
            zone: names.get(self.zone).map(str::to_owned),
            removed: self.removed,
            transient: self.transient,
            read_error: rare.read_error,
            died_at: rare.died_at,
            removed_at: rare.removed_at,
            record_failures: rare.record_failures,
            recorded_at: (self.recorded_at != NOT_RECORDED).then(|| std::time::Duration::from_nanos(self.recorded_at)),
        }
    }

    /// Changes the rarely set fields; drops their box again if that leaves them all default.
    fn with_rare<T>(&mut self, f: impl FnOnce(&mut Rare) -> T) -> T {
        let rare = self.rare.get_or_insert_with(Box::default);
        let out = f(rare);
        if rare.is_default() {
            self.rare = None;
        }
        out
    }

    fn read_error(&self) -> Option<&String> {
        self.rare.as_ref().and_then(|r| r.read_error.as_ref())
    }
}

/// The fake model's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSnapshot {
    /// Every machine ever added, by id.
    pub machines: BTreeMap<MachineId, FakeMachine>,
    /// Machines EnsureDead was called for, in order.
    pub ensure_dead: Vec<MachineId>,
    /// Machines MarkForRemoval was called for, in order.
    pub marked_for_removal: Vec<MachineId>,
    /// How many `machines` calls were made.
    pub machines_calls: usize,
    /// When the model last changed, since its creation.
    pub last_activity: std::time::Duration,
    /// The model's life.
    pub life: Life,
    /// Every error an operation on the model returned, in order.
    pub errors: Vec<String>,
    /// The manual machines each destruction refused without `force` named, in order (their
    /// error's text is in `errors` too).
    pub refused_destroys: Vec<Vec<MachineId>>,
    /// Instance-info writes under way (see [`FakeModel::set_write_latency`]).
    pub writes_in_flight: usize,
}

impl ModelSnapshot {
    /// An alive model of these machines, with nothing else recorded.
    pub fn of(machines: impl IntoIterator<Item = (MachineId, FakeMachine)>) -> Self {
        ModelSnapshot { machines: machines.into_iter().collect(), ..Self::default() }
    }

    /// A machine.
    pub fn machine(&self, id: &str) -> Option<&FakeMachine> {
        self.machines.get(&MachineId::new(id))
    }
}

struct ModelActor {
    machines: BTreeMap<MachineId, Slot>,
    /// The zones the machines' instances are in.
    names: Names,
    watchers: Vec<Recipient<MachinesChanged>>,
    retry_watchers: Vec<Recipient<RetryTick>>,
    fail_next: BTreeMap<ModelOp, VecDeque<String>>,
    ensure_dead: Vec<MachineId>,
    marked: Vec<MachineId>,
    machines_calls: usize,
    epoch: actix_rt::time::Instant,
    last_activity: std::time::Duration,
    life: Life,
    errors: Vec<String>,
    refused_destroys: Vec<Vec<MachineId>>,
    /// How long an instance-info write takes (the instance is recorded when it ends).
    write_latency: std::time::Duration,
    /// Instance-info writes under way.
    writes_in_flight: usize,
}

impl Actor for ModelActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
    }
}

impl ModelActor {
    fn scripted(&mut self, op: ModelOp) -> Result<(), ModelError> {
        let Some(q) = self.fail_next.get_mut(&op) else { return Ok(()) };
        let msg = q.pop_front();
        if q.is_empty() {
            self.fail_next.remove(&op);
        }
        match msg {
            Some(m) => Err(ModelError::Other(m)),
            None => Ok(()),
        }
    }

    fn touch_clock(&mut self) -> std::time::Duration {
        self.last_activity = self.epoch.elapsed();
        self.last_activity
    }

    fn notify(&self, ids: Vec<MachineId>) {
        for w in &self.watchers {
            w.do_send(MachinesChanged { ids: ids.clone() });
        }
    }

    /// A write to machine `id`: the failure scripted for `op` if one is due; else the clock
    /// touched, and the machine (live) with the time of the write.
    fn write(&mut self, op: ModelOp, id: &MachineId) -> Result<(&mut Slot, std::time::Duration), ModelError> {
        self.scripted(op)?;
        let now = self.touch_clock();
        Ok((self.live(id)?, now))
    }

    fn live(&mut self, id: &MachineId) -> Result<&mut Slot, ModelError> {
        match self.machines.get_mut(id) {
            Some(m) if !m.removed => Ok(m),
            _ => Err(ModelError::NotFound(id.clone())),
        }
    }

    fn handle_call(&mut self, call: Call) -> CallResult {
        match call {
            Call::Machines(ids) => {
                self.machines_calls += 1;
                self.scripted(ModelOp::Machines)?;
                Ok(Answer::Machines(
                    ids.iter()
                        .map(|id| match self.machines.get(id) {
                            Some(m) if !m.removed => match m.read_error() {
                                Some(e) => Err(ModelError::Other(e.clone())),
                                None => Ok(m.machine.clone()),
                            },
                            _ => Err(ModelError::NotFound(id.clone())),
                        })
                        .collect(),
                ))
            }
            Call::TransientErrors => {
                self.scripted(ModelOp::TransientErrors)?;
                Ok(Answer::List(
                    self.machines
                        .values()
                        .filter(|m| {
                            !m.removed
                                && m.transient
                                && m.machine.instance.is_none()
                                && m.machine.instance_status.is_error()
                        })
                        .map(|m| m.machine.clone())
                        .collect(),
                ))
            }
            Call::ProvisioningInfo(ids) => {
                self.scripted(ModelOp::ProvisioningInfo)?;
                Ok(Answer::Infos(
                    ids.iter()
                        .map(|id| {
                            self.machines
                                .get(id)
                                .map(|m| m.rare.as_ref().map(|r| r.info.clone()).unwrap_or_default())
                                .ok_or_else(|| ModelError::NotFound(id.clone()))
                        })
                        .collect(),
                ))
            }
            Call::Groups(ids) => {
                self.scripted(ModelOp::DistributionGroups)?;
                Ok(Answer::Groups(
                    ids.iter()
                        .map(|id| match self.machines.get(id) {
                            Some(m) => match &m.rare {
                                Some(r) => r.group.clone().map_err(ModelError::Other),
                                None => Ok(Vec::new()),
                            },
                            None => Err(ModelError::NotFound(id.clone())),
                        })
                        .collect(),
                ))
            }
            Call::SetInstanceInfo(id, info) => {
                let zone = self.names.intern_opt(info.zone.as_deref());
                let m = match self.write(ModelOp::SetInstanceInfo, &id) {
                    Ok((m, now)) => {
                        m.recorded_at = nanos(now);
                        m
                    }
                    Err(e) => {
                        let now = self.epoch.elapsed();
                        if let Some(m) = self.machines.get_mut(&id) {
                            m.with_rare(|r| r.record_failures.push((now, info.instance)));
                        }
                        return Err(e);
                    }
                };
                m.machine.instance = Some(info.instance);
                m.zone = zone;
                m.machine.instance_status = info.status;
                // Emptied (not cleared): a fleet's machines keep no capacity.
                m.instance_status_message = Box::default();
                // The simulated machine agent comes up with its instance.
                m.machine.status = MachineStatus::Started;
                Ok(Answer::Done)
            }
            Call::SetStatus(id, status, message) => {
                let (m, _) = self.write(ModelOp::SetStatus, &id)?;
                m.machine.status = status;
                if m.rare.is_some() || !message.is_empty() {
                    m.with_rare(|r| r.status_message = message);
                }
                if status == MachineStatus::Pending {
                    m.transient = false;
                }
                Ok(Answer::Done)
            }
            Call::SetInstanceStatus(id, status, message) => {
                let (m, _) = self.write(ModelOp::SetInstanceStatus, &id)?;
                m.machine.instance_status = status;
                m.instance_status_message = message.into_boxed_str();
                Ok(Answer::Done)
            }
            Call::EnsureDead(id) => {
                let (m, now) = self.write(ModelOp::EnsureDead, &id)?;
                let changed = m.machine.life != Life::Dead;
                m.machine.life = Life::Dead;
                m.with_rare(|r| {
                    r.died_at.get_or_insert(now);
                });
                self.ensure_dead.push(id.clone());
                if changed {
                    self.notify(vec![id]);
                }
                Ok(Answer::Done)
            }
            Call::ModelLife => Ok(Answer::Life(self.life)),
            Call::Zone(id) => {
                Ok(Answer::Zone(self.machines.get(&id).and_then(|m| self.names.get(m.zone)).map(str::to_owned)))
            }
            Call::Destroy => {
                self.scripted(ModelOp::DestroyModel)?;
                if self.life != Life::Alive {
                    return Err(ModelError::ModelDying);
                }
                self.touch_clock();
                self.life = Life::Dying;
                Ok(Answer::List(self.machines.values().filter(|m| !m.removed).map(|m| m.machine.clone()).collect()))
            }
            Call::MarkForRemoval(id) => {
                let (m, now) = self.write(ModelOp::MarkForRemoval, &id)?;
                if m.machine.life != Life::Dead {
                    return Err(ModelError::Other(format!("machine {id} is not dead")));
                }
                m.removed = true;
                m.with_rare(|r| r.removed_at = Some(now));
                self.marked.push(id);
                Ok(Answer::Done)
            }
        }
    }
}

enum Call {
    Machines(Vec<MachineId>),
    TransientErrors,
    ProvisioningInfo(Vec<MachineId>),
    Groups(Vec<MachineId>),
    SetInstanceInfo(MachineId, ProvisionedInstance),
    SetStatus(MachineId, MachineStatus, String),
    SetInstanceStatus(MachineId, InstanceStatus, String),
    EnsureDead(MachineId),
    MarkForRemoval(MachineId),
    ModelLife,
    Zone(MachineId),
    Destroy,
}

enum Answer {
    Machines(Vec<Result<Machine, ModelError>>),
    List(Vec<Machine>),
    Infos(Vec<Result<ProvisioningInfo, ModelError>>),
    Groups(Vec<Result<Vec<MachineId>, ModelError>>),
    Life(Life),
    Zone(Option<String>),
    Done,
}

type CallResult = Result<Answer, ModelError>;

struct ApiCall(Call);
impl Message for ApiCall {
    type Result = CallResult;
}

impl Handler<ApiCall> for ModelActor {
    type Result = ActorResponse<Self, CallResult>;
    fn handle(&mut self, msg: ApiCall, _ctx: &mut Self::Context) -> Self::Result {
        if matches!(msg.0, Call::SetInstanceInfo(..)) && !self.write_latency.is_zero() {
            // The write lands after the latency even if the caller is gone by then (a crash).
            self.writes_in_flight += 1;
            let wait = actix_rt::time::sleep(self.write_latency);
            return ActorResponse::r#async(wait.into_actor(self).map(move |(), act, _ctx| {
                act.writes_in_flight -= 1;
                act.handle_call(msg.0)
            }));
        }
        // Answered at once, without a boxed future.
        ActorResponse::reply(self.handle_call(msg.0))
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Control(Box<dyn FnOnce(&mut ModelActor) + Send>);

impl Handler<Control> for ModelActor {
    type Result = ();
    fn handle(&mut self, msg: Control, _ctx: &mut Self::Context) {
        (msg.0)(self);
    }
}

#[derive(Message)]
#[rtype(result = "ModelSnapshot")]
struct Snapshot;

impl Handler<Snapshot> for ModelActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _msg: Snapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(ModelSnapshot {
            machines: self.machines.iter().map(|(id, m)| (id.clone(), m.to_fake(&self.names))).collect(),
            ensure_dead: self.ensure_dead.clone(),
            marked_for_removal: self.marked.clone(),
            machines_calls: self.machines_calls,
            last_activity: self.last_activity,
            life: self.life,
            errors: self.errors.clone(),
            refused_destroys: self.refused_destroys.clone(),
            writes_in_flight: self.writes_in_flight,
        })
    }
}

#[derive(Message)]
#[rtype(result = "usize")]
struct WritesInFlight;

impl Handler<WritesInFlight> for ModelActor {
    type Result = usize;
    fn handle(&mut self, _msg: WritesInFlight, _ctx: &mut Self::Context) -> usize {
        self.writes_in_flight
    }
}

/// A handle on the fake model. Cheap to clone.
#[derive(Clone)]
pub struct FakeModel {
    addr: Addr<ModelActor>,
}

impl FakeModel {
    /// A model with these machines. Must be called inside an actix system.
    pub fn new(machines: Vec<Machine>) -> Self {
        Self::with_machines(machines.into_iter().map(FakeMachine::new).collect())
    }

    /// A model with these fully described machines.
    pub fn with_machines(machines: Vec<FakeMachine>) -> Self {
        let mut names = Names::default();
        let actor = ModelActor {
            machines: machines.into_iter().map(|m| (m.machine.id.clone(), Slot::new(m, &mut names))).collect(),
            names,
            watchers: Vec::new(),
            retry_watchers: Vec::new(),
            fail_next: BTreeMap::new(),
            ensure_dead: Vec::new(),
            marked: Vec::new(),
            machines_calls: 0,
            epoch: actix_rt::time::Instant::now(),
            last_activity: std::time::Duration::ZERO,
            life: Life::Alive,
            errors: Vec::new(),
            refused_destroys: Vec::new(),
            write_latency: std::time::Duration::ZERO,
            writes_in_flight: 0,
        };
        Self { addr: actor.start() }
    }

    /// Makes every instance-info write take this long: the instance is recorded when it ends,
    /// whether or not its caller is still there (a crash between a start and its record).
    pub fn set_write_latency(&self, latency: std::time::Duration) {
        self.control(move |m| m.write_latency = latency);
    }

    /// Instance-info writes under way.
    pub async fn writes_in_flight(&self) -> usize {
        self.addr.send(WritesInFlight).await.unwrap_or(0)
    }

    /// The model API port over this model.
    pub fn api(&self) -> FakeModelApi {
        FakeModelApi { addr: self.addr.clone() }
    }

    fn control(&self, f: impl FnOnce(&mut ModelActor) + Send + 'static) {
        self.addr.do_send(Control(Box::new(f)));
    }

    /// Subscribes a machine watcher: it gets every machine now, then the ids that change.
    pub fn watch(&self, to: Recipient<MachinesChanged>) {
        self.control(move |m| {
            let ids = m.machines.iter().filter(|(_, f)| !f.removed).map(|(id, _)| id.clone()).collect();
            to.do_send(MachinesChanged { ids });
            m.watchers.retain(|w| w.connected());
            m.watchers.push(to);
        });
    }

    /// Subscribes a transient-retry watcher.
    pub fn watch_retries(&self, to: Recipient<RetryTick>) {
        self.control(move |m| {
            m.retry_watchers.retain(|w| w.connected());
            m.retry_watchers.push(to);
        });
    }

    /// Adds a machine and notifies; a dying model refuses it (the refusal is in `errors`).
    pub fn add_machine(&self, machine: FakeMachine) {
        self.control(move |m| {
            let id = machine.machine.id.clone();
            if m.life != Life::Alive {
                m.errors.push(format!("cannot add machine {id}: model is dying"));
                return;
            }
            if m.machines.contains_key(&id) {
                m.errors.push(format!("cannot add machine {id}: it already exists"));
                return;
            }
            m.touch_clock();
            let slot = Slot::new(machine, &mut m.names);
            m.machines.insert(id.clone(), slot);
            m.notify(vec![id]);
        });
    }

    /// Changes a machine's life and notifies.
    pub fn set_life(&self, id: &str, life: Life) {
        let id = MachineId::new(id);
        self.control(move |m| {
            let now = m.touch_clock();
            if let Some(f) = m.machines.get_mut(&id) {
                if f.machine.life < life {
                    f.machine.life = life;
                    if life == Life::Dead {
                        f.with_rare(|r| {
                            r.died_at.get_or_insert(now);
                        });
                    }
                    m.notify(vec![id]);
                }
            }
        });
    }

    /// Changes a machine in place and notifies watchers (status written by someone else).
    pub fn update_and_notify(&self, id: &str, f: impl FnOnce(&mut FakeMachine) + Send + 'static) {
        let id = MachineId::new(id);
        self.control(move |m| {
            m.touch_clock();
            if let Some(slot) = m.machines.get_mut(&id) {
                let mut machine = slot.to_fake(&m.names);
                f(&mut machine);
                *slot = Slot::new(machine, &mut m.names);
                m.notify(vec![id]);
            }
        });
    }

    /// Changes a machine in place (no notification).
    pub fn update(&self, id: &str, f: impl FnOnce(&mut FakeMachine) + Send + 'static) {
        let id = MachineId::new(id);
        self.control(move |m| {
            if let Some(slot) = m.machines.get_mut(&id) {
                let mut machine = slot.to_fake(&m.names);
                f(&mut machine);
                *slot = Slot::new(machine, &mut m.names);
            }
        });
    }

    /// Notifies watchers that these machines changed.
    pub fn touch(&self, ids: &[&str]) {
        let ids: Vec<MachineId> = ids.iter().map(|i| MachineId::new(*i)).collect();
        self.control(move |m| m.notify(ids));
    }

    /// Marks these machines' provisioning errors transient and ticks the retry watchers.
    pub fn retry_provisioning(&self, ids: &[&str]) {
        let ids: Vec<MachineId> = ids.iter().map(|i| MachineId::new(*i)).collect();
        self.control(move |m| {
            for id in &ids {
                if let Some(f) = m.machines.get_mut(id) {
                    f.transient = true;
                }
            }
            for w in &m.retry_watchers {
                w.do_send(RetryTick);
            }
        });
    }

    /// The next `times` calls of `op` fail with `message`.
    pub fn fail_next(&self, op: ModelOp, times: u32, message: &str) {
        let message = message.to_owned();
        self.control(move |m| m.fail_next.entry(op).or_default().extend((0..times).map(|_| message.clone())));
    }

    /// Records an error an operation on the model returned (e.g. a refused destroy).
    pub fn record_error(&self, error: String) {
        self.control(move |m| m.errors.push(error));
    }

    /// Records the error a destruction returned: its text, and the manual machines it named
    /// if it refused them.
    pub fn record_destroy_error(&self, error: &crate::DestroyError) {
        let manual = match error {
            crate::DestroyError::ManualMachines { ids, .. } => Some(ids.clone()),
            _ => None,
        };
        let text = error.to_string();
        self.control(move |m| {
            m.errors.push(text);
            m.refused_destroys.extend(manual);
        });
    }

    /// Everything the model knows.
    pub async fn snapshot(&self) -> ModelSnapshot {
        self.addr.send(Snapshot).await.unwrap_or_default()
    }
}

/// The [`ModelApi`] over a [`FakeModel`].
#[derive(Clone)]
pub struct FakeModelApi {
    addr: Addr<ModelActor>,
}

impl FakeModelApi {
    fn call<T: Send + 'static>(&self, call: Call, pick: fn(Answer) -> Option<T>) -> ModelFuture<T> {
        let req = self.addr.send(ApiCall(call));
        Box::pin(async move {
            let answer = req.await.map_err(|e| ModelError::Other(format!("fake model unavailable: {e}")))??;
            pick(answer).ok_or_else(|| ModelError::Other("fake model answered the wrong call".into()))
        })
    }
}

impl ModelApi for FakeModelApi {
    fn machines(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Machine, ModelError>>> {
        self.call(Call::Machines(ids), |a| if let Answer::Machines(m) = a { Some(m) } else { None })
    }
    fn machines_with_transient_errors(&self) -> ModelFuture<Vec<Machine>> {
        self.call(Call::TransientErrors, |a| if let Answer::List(m) = a { Some(m) } else { None })
    }
    fn provisioning_info(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<ProvisioningInfo, ModelError>>> {
        self.call(Call::ProvisioningInfo(ids), |a| if let Answer::Infos(m) = a { Some(m) } else { None })
    }
    fn distribution_groups(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Vec<MachineId>, ModelError>>> {
        self.call(Call::Groups(ids), |a| if let Answer::Groups(m) = a { Some(m) } else { None })
    }
    fn set_instance_info(&self, id: MachineId, info: ProvisionedInstance) -> ModelFuture<()> {
        self.call(Call::SetInstanceInfo(id, info), |a| matches!(a, Answer::Done).then_some(()))
    }
    fn set_status(&self, id: MachineId, status: MachineStatus, message: String) -> ModelFuture<()> {
        self.call(Call::SetStatus(id, status, message), |a| matches!(a, Answer::Done).then_some(()))
    }
    fn set_instance_status(&self, id: MachineId, status: InstanceStatus, message: String) -> ModelFuture<()> {
        self.call(Call::SetInstanceStatus(id, status, message), |a| matches!(a, Answer::Done).then_some(()))
    }
    fn ensure_dead(&self, id: MachineId) -> ModelFuture<()> {
        self.call(Call::EnsureDead(id), |a| matches!(a, Answer::Done).then_some(()))
    }
    fn mark_for_removal(&self, id: MachineId) -> ModelFuture<()> {
        self.call(Call::MarkForRemoval(id), |a| matches!(a, Answer::Done).then_some(()))
    }
    fn availability_zone(&self, id: MachineId) -> ModelFuture<Option<String>> {
        self.call(Call::Zone(id), |a| if let Answer::Zone(z) = a { Some(z) } else { None })
    }
    fn model_life(&self) -> ModelFuture<Life> {
        self.call(Call::ModelLife, |a| if let Answer::Life(l) = a { Some(l) } else { None })
    }
    fn destroy_model(&self) -> ModelFuture<Vec<Machine>> {
        self.call(Call::Destroy, |a| if let Answer::List(m) = a { Some(m) } else { None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet's machine keeps nothing boxed, through the writes every start makes; the rare
    /// fields round-trip, and their box goes once they are back at their defaults.
    #[test]
    fn a_fleet_machine_is_kept_small_and_round_trips() {
        assert!(std::mem::size_of::<Slot>() <= 120, "a slot is {} bytes", std::mem::size_of::<Slot>());
        let mut names = Names::default();
        let plain = Slot::new(FakeMachine::new(Machine::pending("1")), &mut names);
        assert!(plain.rare.is_none());
        assert_eq!(plain.to_fake(&names), FakeMachine::new(Machine::pending("1")));

        let mut full = FakeMachine::new(Machine::pending("2"));
        full.status_message = "cannot start".into();
        full.instance_status_message = "starting".into();
        full.group = Err("no group".into());
        full.died_at = Some(std::time::Duration::from_secs(3));
        full.record_failures.push((std::time::Duration::from_secs(1), InstanceId::new("i-1")));
        full.zone = Some("az2".into());
        full.recorded_at = Some(std::time::Duration::from_nanos(1_234_567_891));
        let mut slot = Slot::new(full.clone(), &mut names);
        assert!(slot.rare.is_some());
        assert_eq!(slot.to_fake(&names), full);

        slot.with_rare(|r| *r = Rare::default());
        assert!(slot.rare.is_none(), "a box of defaults is dropped");
        full.status_message.clear();
        full.group = Ok(Vec::new());
        full.died_at = None;
        full.record_failures.clear();
        assert_eq!(slot.to_fake(&names), full);
    }
}
