//! Runs a scenario: the real provisioner actors against the fake cloud and model, on a paused
//! clock, with events applied at their virtual times.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_rt::time::Instant;

use super::check::{check, ModeTimeline};
use super::report::{CallReport, FleetCost, InstanceReport, MachineReport, ModelReport, ProvisionerReport, Report};
use super::scenario::{format_duration, Action, FailCall, MachineSpec, Scenario};
use crate::actors::containers::{HostZoneBroker, DEFAULT_CONTAINER_TYPES};
use crate::actors::wiring::{start, start_containers, ProvisionerHandle};
use crate::config::{ProvisionerConfig, RetryStrategy};
use crate::model::events::ProvisionerEvent;
use crate::model::{InstanceState, InstanceStatus, MachineId};
use crate::testing::{CloudOp, FakeCloud, FakeMachine, FakeModel, Fault, ModelOp, PausedSystem};

/// The model uuid every simulated instance of ours carries.
pub const SIM_MODEL_UUID: &str = "00000000-5151-4000-8000-000000000001";

/// How often the driver looks for due events and quiescence, in virtual time.
const TICK: Duration = Duration::from_secs(1);

/// Runs a scenario to its end and reports. `seed` overrides the file's.
pub fn run(scenario: &Scenario, seed: Option<u64>) -> Report {
    let scenario = scenario.clone();
    PausedSystem::new().block_on(async move { drive(&scenario, seed.unwrap_or(scenario.seed)).await })
}

#[derive(Default)]
struct EventLog(Vec<ProvisionerEvent>);

impl Actor for EventLog {
    type Context = Context<Self>;
}

impl Handler<ProvisionerEvent> for EventLog {
    type Result = ();
    fn handle(&mut self, msg: ProvisionerEvent, _ctx: &mut Self::Context) {
        self.0.push(msg);
    }
}

#[derive(Message)]
#[rtype(result = "Vec<ProvisionerEvent>")]
struct TakeEvents;

impl Handler<TakeEvents> for EventLog {
    type Result = MessageResult<TakeEvents>;
    fn handle(&mut self, _msg: TakeEvents, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.0))
    }
}

fn fake_machine(spec: &MachineSpec) -> FakeMachine {
    let mut f = FakeMachine::new(spec.to_machine());
    f.info.constraints = spec.constraints();
    f.info.placement = spec.placement.clone();
    f.info.capacity = spec.capacity;
    f.group = if spec.distribution_group_error.is_empty() {
        Ok(spec.distribution_group.clone().unwrap_or_default().into_iter().map(MachineId::from).collect())
    } else {
        Err(spec.distribution_group_error.clone())
    };
    f
}

struct World {
    cloud: FakeCloud,
    model: FakeModel,
    config: ProvisionerConfig,
    handle: Option<ProvisionerHandle>,
    containers: Option<crate::ContainersHandle>,
    initialiser: crate::testing::FakeInitialiser,
    log: Addr<EventLog>,
    events: Vec<ProvisionerEvent>,
    restarts: u32,
    modes: ModeTimeline,
    epoch: Instant,
}

impl World {
    fn start_provisioner(&mut self) {
        let mut config = self.config.clone();
        // Each incarnation draws its own nonces.
        config.seed = config.seed.wrapping_add(u64::from(self.restarts).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let containers = start_containers(
            config.clone(),
            HostZoneBroker::factory(Arc::new(self.cloud.broker())),
            Arc::new(self.model.api()),
            Arc::new(self.initialiser.clone()),
            DEFAULT_CONTAINER_TYPES.iter().map(|k| (*k).to_owned()).collect(),
            vec![self.log.clone().recipient()],
        );
        match (start(config, Arc::new(self.cloud.broker()), Arc::new(self.model.api())), containers) {
            (Ok(h), Ok(c)) => {
                h.subscribe(self.log.clone().recipient());
                h.subscribe(c.provisioner_events());
                self.model.watch(h.machines_changed());
                self.model.watch(c.machines_changed());
                self.model.watch_retries(h.retry_ticks());
                self.handle = Some(h);
                self.containers = Some(c);
            }
            (Err(e), _) | (_, Err(e)) => tracing::error!(error = %e, "cannot start the provisioner"),
        }
    }

    async fn apply(&mut self, action: &Action, started: bool) {
        let now = self.epoch.elapsed();
        match action {
            Action::AddMachine(m) => self.model.add_machine(fake_machine(m)),
            Action::SetLife(s) => self.model.set_life(&s.machine, s.life),
            Action::SetStatus(s) => {
                let (status, inst) = (s.status, s.instance_status.clone());
                self.model.update_and_notify(&s.machine, move |m| {
                    if let Some(st) = status {
                        m.machine.status = st;
                    }
                    if let Some(is) = inst {
                        m.machine.instance_status = InstanceStatus::other(is);
                    }
                });
            }
            Action::SetHarvestMode(mode) => {
                // The model config changes: a restarted provisioner reads the new value.
                self.modes.set(now, *mode);
                self.config.harvest_mode = *mode;
                if let (Some(h), true) = (&self.handle, started) {
                    h.set_harvest_mode(*mode);
                }
                // Container provisioners honour it from the same moment.
                if let (Some(c), true) = (&self.containers, started) {
                    c.set_harvest_mode(*mode);
                }
            }
            Action::SetWorkers(n) => {
                self.config.workers = *n;
                if let (Some(h), true) = (&self.handle, started) {
                    if let Err(e) = h.set_workers(*n).await {
                        tracing::warn!(error = %e, "resize refused");
                    }
                }
            }
            Action::RetryProvisioning(ids) => {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                self.model.retry_provisioning(&ids);
            }
            Action::SetZones(z) => {
                let a: Vec<&str> = z.zones.iter().map(String::as_str).collect();
                let u: Vec<&str> = z.unavailable_zones.iter().map(String::as_str).collect();
                self.cloud.set_zones(&a, &u);
            }
            Action::CloudStop(id) => self.cloud.set_state(id, InstanceState::Stopped),
            Action::CloudStart(id) => self.cloud.set_state(id, InstanceState::Running),
            Action::CloudTerminate(id) => self.cloud.set_state(id, InstanceState::Terminated),
            Action::CloudImpair(id) => self.cloud.set_impaired(id, true),
            Action::SetImage(image) => self.cloud.set_image(Some(image)),
            Action::SetConstraints(c) => {
                // Checked at load: the constraints parse.
                let constraints = crate::model::Constraints::parse(&c.constraints).unwrap_or_default();
                self.model.update(&c.machine, move |m| m.info.constraints = constraints);
            }
            Action::CloudRecover(id) => self.cloud.set_impaired(id, false),
            Action::Interrupt(i) => self.cloud.interrupt(&i.instance, i.warning.0),
            Action::CloudLaunch(l) => self.cloud.launch_aged(
                &l.id,
                l.zone.as_deref(),
                l.machine.as_deref(),
                InstanceState::Running,
                l.foreign,
                l.age.map_or(Duration::ZERO, |a| a.0),
            ),
            Action::FailNext(f) => match f.call {
                FailCall::AllInstances => self.cloud.fail_next(CloudOp::AllInstances, f.times, &f.message),
                FailCall::StopInstances => self.cloud.fail_next(CloudOp::StopInstances, f.times, &f.message),
                FailCall::AvailabilityZones => self.cloud.fail_next(CloudOp::AvailabilityZones, f.times, &f.message),
                FailCall::Machines => self.model.fail_next(ModelOp::Machines, f.times, &f.message),
                FailCall::SetInstanceInfo => self.model.fail_next(ModelOp::SetInstanceInfo, f.times, &f.message),
                FailCall::ProvisioningInfo => self.model.fail_next(ModelOp::ProvisioningInfo, f.times, &f.message),
            },
            Action::Restart => {
                if started {
                    if let Some(h) = self.handle.take() {
                        h.shutdown();
                    }
                    if let Some(c) = self.containers.take() {
                        c.shutdown();
                    }
                    self.events.extend(self.log.send(TakeEvents).await.unwrap_or_default());
                    self.restarts += 1;
                    self.start_provisioner();
                }
            }
            Action::DestroyModel(d) => match &self.handle {
                Some(h) if started => {
                    if let Err(e) = h.destroy_model(d.force).await {
                        self.model.record_destroy_error(&e);
                    }
                    // Containers are in the destruction's scope too.
                    let life = crate::ports::ModelApi::model_life(&self.model.api()).await;
                    if let (Some(c), Ok(crate::model::Life::Dying | crate::model::Life::Dead)) =
                        (&self.containers, life)
                    {
                        c.model_destroyed();
                    }
                }
                _ => {
                    // Before the provisioner starts: the model is simply dying already (the
                    // provisioner finds it so and sweeps it), and the manual-machines check
                    // reports as it does later.
                    match crate::ports::ModelApi::destroy_model(&self.model.api()).await {
                        Ok(machines) if !d.force => {
                            let scope = crate::config::Scope::Environ;
                            let ids: Vec<MachineId> = machines
                                .iter()
                                .filter(|m| crate::actors::registry::blocks_destroy(m, &scope))
                                .map(|m| m.id.clone())
                                .collect();
                            if !ids.is_empty() {
                                let summary = crate::DestroySummary::default();
                                let e = crate::DestroyError::ManualMachines { ids, summary };
                                self.model.record_destroy_error(&e);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => self.model.record_destroy_error(&crate::DestroyError::Model(e)),
                    }
                }
            },
        }
    }

    async fn idle(&self) -> bool {
        let in_flight = self.cloud.in_flight().await;
        let prov = match &self.handle {
            Some(h) => h.is_idle().await,
            None => true,
        };
        let containers = match &self.containers {
            Some(c) => c.is_idle().await,
            None => true,
        };
        let writes = self.model.writes_in_flight().await;
        in_flight == 0 && writes == 0 && prov && containers
    }
}

async fn drive(s: &Scenario, seed: u64) -> Report {
    let epoch = Instant::now();
    // Virtual time 0 for `simulate --trace` (issue 37).
    tracing::info!(target: crate::trace::TRACE_TARGET, "simulation starts");
    let cloud = if s.cloud.zones.is_empty() && s.cloud.unavailable_zones.is_empty() {
        FakeCloud::new(SIM_MODEL_UUID)
    } else {
        let c = FakeCloud::with_zones(SIM_MODEL_UUID, &[]);
        let a: Vec<&str> = s.cloud.zones.iter().map(String::as_str).collect();
        let u: Vec<&str> = s.cloud.unavailable_zones.iter().map(String::as_str).collect();
        c.set_zones(&a, &u);
        c
    };
    // A cloud that interrupts instances warns of it: the provisioner polls for its notices.
    let interrupts = s.timeline().iter().any(|(_, a)| matches!(a, Action::Interrupt(_)));
    let cloud = if interrupts { cloud.with_interruptions() } else { cloud };
    cloud.set_latency(s.cloud.start_latency.0, s.cloud.stop_latency.0);
    if let Some(r) = &s.cloud.rate_limit {
        cloud.set_rate_limit(r.limits(crate::config::rate_limits::RateLimits::unlimited()));
    }
    cloud.set_image(s.cloud.image.as_deref());
    for i in &s.cloud.instances {
        cloud.launch_aged(&i.id, i.zone.as_deref(), i.machine.as_deref(), i.state.into(), i.foreign, i.age());
    }
    cloud.set_default_instance_type(s.cloud.instance_type.as_deref());
    cloud.set_spot_price(s.cloud.spot_price);
    for f in s.cloud.faults.iter().filter(|f| f.spot_capacity) {
        cloud.add_spot_fault(crate::testing::SpotFault {
            zone: f.zone.clone(),
            instance_type: f.instance_type.clone(),
            machine: (!f.machine.is_empty()).then(|| f.machine.as_str().into()),
            times: f.times,
            message: (f.message != super::scenario::default_fault_message()).then(|| f.message.clone()),
        });
    }
    for f in s.cloud.faults.iter().filter(|f| !f.spot_capacity && f.instance_type.is_some()) {
        cloud.add_type_fault(crate::testing::TypeFault {
            instance_type: f.instance_type.clone().unwrap_or_default(),
            zone: f.zone.clone(),
            machine: (!f.machine.is_empty()).then(|| f.machine.as_str().into()),
            times: f.times,
            message: f.message.clone(),
        });
    }
    for f in s.cloud.faults.iter().filter(|f| !f.spot_capacity && f.instance_type.is_none() && f.partial.is_some()) {
        cloud.add_partial_launch(crate::testing::PartialLaunch {
            zone: f.zone.clone(),
            machine: (!f.machine.is_empty()).then(|| f.machine.as_str().into()),
            launched: f.partial.unwrap_or_default(),
            times: f.times,
            message: f.message.clone(),
        });
    }
    for f in s.cloud.faults.iter().filter(|f| !f.spot_capacity && f.instance_type.is_none() && f.partial.is_none()) {
        cloud.add_fault(Fault {
            machine: f.machine.as_str().into(),
            times: f.times,
            zone: f.zone.clone(),
            zone_independent: f.zone_independent,
            message: f.message.clone(),
            lost_response: f.lost_response,
        });
    }
    if !s.cloud.subnets.is_empty() {
        cloud.set_subnets(s.cloud.subnets.clone());
    }
    for d in &s.cloud.derived_zones {
        let z: Vec<&str> = d.zones.iter().map(String::as_str).collect();
        cloud.set_derived_zones(&d.machine, &z);
    }
    let model = FakeModel::with_machines(
        s.machines
            .iter()
            .map(|spec| {
                let mut m = fake_machine(spec);
                // A pre-provisioned machine's zone is its instance's.
                m.zone = spec
                    .instance
                    .as_ref()
                    .and_then(|i| s.cloud.instances.iter().find(|c| &c.id == i))
                    .and_then(|c| c.zone.clone());
                m
            })
            .collect(),
    );
    model.set_write_latency(s.model.write_latency.0);
    let config = ProvisionerConfig {
        model_uuid: SIM_MODEL_UUID.into(),
        harvest_mode: s.provisioner.harvest_mode,
        workers: s.provisioner.workers.0,
        retry: RetryStrategy::new(s.provisioner.retry_count, s.provisioner.retry_delay.0),
        resync_interval: if s.provisioner.resync_interval.0.is_zero() {
            Duration::from_secs(60)
        } else {
            s.provisioner.resync_interval.0
        },
        seed,
        reuse: s.provisioner.reuse,
        reuse_window: s.provisioner.reuse_window.0,
        spot_max_price: s.provisioner.spot_max_price,
        mutations: s.provisioner.mutations,
        repair: crate::config::repair::RepairPolicy {
            after: s.provisioner.repair_after.map(|d| d.0),
            max_unhealthy: s.provisioner.repair_max_unhealthy,
            replace_drifted: s.provisioner.replace_drifted,
            drift_budget: s.provisioner.drift_budget,
        },
        rate_limits: match &s.provisioner.rate_limit {
            Some(r) => r.limits(crate::config::rate_limits::RateLimits::ec2()),
            None => crate::config::rate_limits::RateLimits::ec2(),
        },
        harvest_grace: s.provisioner.harvest_grace.0,
        harvest_max_stops: s.provisioner.harvest_max_stops,
        capacity_memory: s.provisioner.capacity_memory.0,
        batch_starts: s.provisioner.batch_starts,
        batch_size: s.provisioner.batch_size,
        ..ProvisionerConfig::default()
    };
    let mut world = World {
        cloud,
        model,
        modes: ModeTimeline::new(config.harvest_mode),
        config,
        handle: None,
        containers: None,
        initialiser: crate::testing::FakeInitialiser::new(
            s.cloud.init_faults.iter().map(|f| (f.host.clone(), f.kind.clone(), f.times, f.message.clone())).collect(),
        ),
        log: EventLog::default().start(),
        events: Vec::new(),
        restarts: 0,
        epoch,
    };

    let mut timeline = s.timeline().into_iter().peekable();
    while let Some((_, action)) = timeline.next_if(|(at, _)| at.is_zero()) {
        world.apply(&action, false).await;
    }
    world.start_provisioner();

    let until = s.until.0;
    let mut last_event = Duration::ZERO;
    loop {
        let now = epoch.elapsed();
        while let Some((at, action)) = timeline.next_if(|(at, _)| *at <= now) {
            last_event = at;
            world.apply(&action, true).await;
        }
        if now >= until {
            break;
        }
        if timeline.peek().is_none() && world.idle().await {
            break;
        }
        let next = timeline.peek().map(|(at, _)| *at).unwrap_or(until);
        let step = TICK.min(next.saturating_sub(now)).min(until.saturating_sub(now)).max(Duration::from_millis(1));
        actix_rt::time::sleep(step).await;
    }

    let cloud = world.cloud.snapshot().await;
    let model = world.model.snapshot().await;
    world.events.extend(world.log.send(TakeEvents).await.unwrap_or_default());
    let alive = world.handle.as_ref().is_some_and(ProvisionerHandle::is_running);
    let ended =
        if epoch.elapsed() >= until { until } else { cloud.last_activity.max(model.last_activity).max(last_event) };
    let violations = check(s, &cloud, &model, &world.modes);
    if let Some(h) = &world.handle {
        h.shutdown();
    }
    if let Some(c) = &world.containers {
        c.shutdown();
    }

    let contract =
        ["processed-machines", "retried-machines-with-errors", "resized-worker-pool", "harvest-mode-changed"];
    let names: Vec<&str> = world.events.iter().map(ProvisionerEvent::name).collect();
    let mut report = Report {
        name: s.name.clone().unwrap_or_default(),
        seed,
        ended_at: format_duration(ended),
        provisioner: ProvisionerReport { alive, error: None, restarts: world.restarts },
        calls: cloud
            .calls
            .iter()
            .filter(|c| c.op != CloudOp::ReleaseInstances && c.op != CloudOp::RetagInstance)
            .map(|c| {
                let start = c.op == CloudOp::StartInstance;
                let stop = c.op == CloudOp::StopInstances;
                CallReport {
                    at: format_duration(c.at),
                    op: c.op.as_str().into(),
                    machine: c.machine.as_ref().filter(|_| start).map(ToString::to_string),
                    zone: start.then(|| c.zone.clone()),
                    instances: stop.then(|| c.instances.iter().map(ToString::to_string).collect()),
                    ok: c.ok.unwrap_or(false),
                    instance: if start && c.ok == Some(true) {
                        c.instances.first().map(ToString::to_string)
                    } else {
                        None
                    },
                    error: c.error.clone(),
                    throttled: c.throttled,
                    instance_type: c.instance_type.clone(),
                    failed_types: c.failed_types.clone(),
                    batch: c.batch.clone(),
                    capacity: c.params.as_ref().map(|p| p.capacity).filter(|c| !c.is_on_demand()),
                }
            })
            .collect(),
        machines: model
            .machines
            .iter()
            .map(|(id, m)| {
                let instance = m.machine.instance.as_ref().map(ToString::to_string);
                let zone = m.zone.clone().or_else(|| {
                    let inst = m.machine.instance.as_ref()?;
                    cloud.instances.get(inst).and_then(|i| i.instance.zone.clone())
                });
                // What the machine got, shown for a machine that asked for spot or got it.
                let got = m.machine.instance.as_ref().and_then(|i| cloud.instances.get(i)?.instance.capacity_type);
                let capacity_type =
                    got.filter(|t| !m.info.capacity.is_default() || *t == crate::model::CapacityType::Spot);
                let message = if m.instance_status_message.is_empty() {
                    m.status_message.clone()
                } else {
                    m.instance_status_message.clone()
                };
                (
                    id.to_string(),
                    MachineReport {
                        life: m.machine.life.to_string(),
                        removed: m.removed,
                        instance,
                        zone,
                        status: m.machine.status.to_string(),
                        instance_status: m.machine.instance_status.to_string(),
                        message,
                        capacity: m.info.capacity,
                        capacity_type,
                    },
                )
            })
            .collect(),
        instances: cloud
            .instances
            .iter()
            .map(|(id, i)| {
                (
                    id.to_string(),
                    InstanceReport {
                        state: i.instance.state.to_string(),
                        zone: i.instance.zone.clone(),
                        machine: i.instance.tags.machine.as_ref().map(ToString::to_string),
                        foreign: i.foreign,
                        instance_type: i.instance.instance_type.clone(),
                        capacity_type: i.instance.capacity_type.filter(|t| *t == crate::model::CapacityType::Spot),
                        image: i.instance.image.clone(),
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
        events: names.iter().filter(|n| contract.contains(n)).map(|n| (*n).to_owned()).collect(),
        activity: names.iter().filter(|n| !contract.contains(n)).map(|n| (*n).to_owned()).collect(),
        released: cloud
            .calls_of(CloudOp::ReleaseInstances)
            .iter()
            .filter(|c| c.ok == Some(true))
            .flat_map(|c| c.instances.iter().map(ToString::to_string))
            .collect(),
        model: ModelReport { life: model.life.to_string(), errors: model.errors.clone() },
        violations,
        cost: None,
        drift: drift_report(&model, &cloud, s.images_until(Duration::MAX).pop().flatten()),
    };
    report.cost = FleetCost::of(&report.instances, s.cloud.spot_price);
    report
}

/// Live machines whose recorded instance (listed live) has drifted at the end (issue 34).
fn drift_report(
    model: &crate::testing::ModelSnapshot,
    cloud: &crate::testing::CloudSnapshot,
    image: Option<String>,
) -> BTreeMap<String, crate::sim::report::DriftReport> {
    use crate::model::drift::{drift_of, Expected};
    let catalogue = crate::model::instance_types::shipped();
    let mut out = BTreeMap::new();
    for (id, m) in &model.machines {
        let Some(instance) =
            m.machine.instance.as_ref().filter(|_| m.machine.life == crate::model::Life::Alive && !m.removed)
        else {
            continue;
        };
        let Some(i) = cloud.instances.get(instance).filter(|i| i.instance.state != InstanceState::Terminated) else {
            continue;
        };
        let expected = Expected {
            machine: id,
            constraints: &m.info.constraints,
            placement: m.info.placement.as_deref(),
            catalogue: &catalogue,
            image: image.as_deref(),
        };
        let reasons = drift_of(&expected, &i.instance);
        if !reasons.is_empty() {
            out.insert(
                id.to_string(),
                crate::sim::report::DriftReport {
                    instance: instance.to_string(),
                    kinds: reasons.iter().map(|r| r.kind().to_owned()).collect(),
                    reasons: reasons.iter().map(ToString::to_string).collect(),
                },
            );
        }
    }
    out
}
