//! Benchmarks on the simulated cloud: the real actors,
//! virtual time for the cloud's latency, real time for our own CPU.
//!
//! - [`throughput`]: provision N pending machines with W workers over Z zones.
//! - [`churn`]: provision N machines (untimed), then apply E single-machine changes (deaths
//!   and additions, one notification each) and time that phase alone.

// Wall-clock time is what a benchmark measures: the only place std time is allowed.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use serde::Serialize;

use crate::config::rate_limits::{BucketLimit, RateLimits};
use crate::config::{ProvisionerConfig, RetryStrategy};
use crate::model::events::ProvisionerEvent;
use crate::model::{Life, Machine, MachineId};
use crate::start;
use crate::testing::{CloudOp, FakeCloud, FakeMachine, FakeModel, PausedSystem};

/// `bench throughput` output.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    /// Machines provisioned.
    pub machines: usize,
    /// Pool size.
    pub workers: usize,
    /// Zones.
    pub zones: usize,
    /// Virtual time from the first notification to the last machine started.
    pub virtual_makespan_s: f64,
    /// ceil(N/W) · latency.
    pub ideal_makespan_s: f64,
    /// ideal / actual (1.0 when the latency is 0).
    pub efficiency: f64,
    /// Real time the run took, from the system's start to the last machine started and the
    /// provisioner shut down (not the teardown of what it built).
    pub wall_s: f64,
    /// Machines per real second.
    pub machines_per_wall_s: f64,
    /// Peak resident memory of the process, MiB (Linux; 0 elsewhere).
    pub peak_rss_mib: f64,
}

/// `bench churn` output.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnReport {
    /// Fleet size before the churn.
    pub machines: usize,
    /// Single-machine changes applied.
    pub events: usize,
    /// Real time of the churn phase.
    pub wall_s: f64,
    /// Real time per change, µs.
    pub per_event_us: f64,
    /// Cloud listings during the churn phase.
    pub all_instances_calls: usize,
    /// Virtual time the churn phase spanned.
    pub virtual_s: f64,
    /// Peak resident memory of the process, MiB (Linux; 0 elsewhere).
    pub peak_rss_mib: f64,
}

/// `bench starts` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartsBench {
    /// Machines to provision.
    pub machines: usize,
    /// Pool size.
    pub workers: usize,
    /// Zones of the cloud.
    pub zones: usize,
    /// Virtual time one start call takes.
    pub start_latency: Duration,
    /// The cloud's start bucket: calls at once.
    pub start_burst: u32,
    /// The cloud's start bucket: calls per second after the burst.
    pub start_per_second: f64,
    /// Batched starts of at most this many machines; `None`: one call per machine.
    pub batch_size: Option<usize>,
    /// The client-side start bucket; `None`: EC2's published one (`RateLimits::ec2()`), as a
    /// provisioner that does not know this cloud's bucket would run.
    pub client_limit: Option<BucketLimit>,
}

/// `bench starts` output.
#[derive(Debug, Clone, Serialize)]
pub struct StartsReport {
    /// Machines provisioned.
    pub machines: usize,
    /// Pool size.
    pub workers: usize,
    /// Zones.
    pub zones: usize,
    /// Whether starts were batched.
    pub batched: bool,
    /// Most machines per call (1 when not batched).
    pub batch_size: usize,
    /// The cloud's start bucket.
    pub start_burst: u32,
    /// The cloud's start refill rate.
    pub start_per_second: f64,
    /// Virtual time from the first notification to the last machine started.
    pub virtual_makespan_s: f64,
    /// One call per machine at the cloud's rate, never throttled:
    /// `max(0, N - burst) / per_second` plus one start latency.
    pub unbatched_ideal_s: f64,
    /// StartInstance calls the cloud received (a batched call counts once).
    pub start_calls: usize,
    /// Of them, refused with `RequestLimitExceeded`.
    pub throttled_calls: usize,
    /// Machines per successful call.
    pub machines_per_call: f64,
    /// Real time the whole run took.
    pub wall_s: f64,
}

/// Provisions `b.machines` pending machines against a cloud whose StartInstance bucket is
/// `b.start_burst` then `b.start_per_second`, batched or not.
pub fn starts(b: StartsBench) -> StartsReport {
    let wall = std::time::Instant::now();
    let (virtual_makespan, calls) = PausedSystem::new().block_on(async move {
        let cloud = cloud(b.zones);
        cloud.record_params(false);
        cloud.log_calls(true);
        cloud.set_latency(b.start_latency, Duration::ZERO);
        cloud.set_rate_limit(RateLimits {
            start: Some(BucketLimit::new(b.start_burst, b.start_per_second)),
            ..RateLimits::unlimited()
        });
        let model = FakeModel::with_machines(fleet(b.machines, 0));
        let counter = Counter { started: 0, removed: 0, waiter: None }.start();
        let config = ProvisionerConfig {
            rate_limits: RateLimits {
                start: Some(b.client_limit.or(RateLimits::ec2().start).unwrap_or(BucketLimit::new(50, 5.0))),
                ..RateLimits::unlimited()
            },
            batch_starts: b.batch_size.is_some(),
            batch_size: b.batch_size.unwrap_or(crate::config::DEFAULT_BATCH_SIZE),
            ..config(b.workers)
        };
        let handle = start(config, Arc::new(cloud.broker()), Arc::new(model.api())).expect("valid bench config");
        handle.subscribe(counter.clone().recipient());
        let epoch = actix_rt::time::Instant::now();
        model.watch(handle.machines_changed());
        wait(&counter, Target::Started(b.machines)).await;
        let makespan = epoch.elapsed();
        let calls = cloud.snapshot().await.calls_of(CloudOp::StartInstance).into_iter().cloned().collect::<Vec<_>>();
        handle.shutdown();
        (makespan, calls)
    });
    let wall_s = wall.elapsed().as_secs_f64();
    // One call per batch id, one per unbatched record.
    let mut start_calls = 0;
    let mut throttled_calls = 0;
    let mut succeeded = 0;
    let mut last_batch = None;
    for c in &calls {
        if c.batch.is_some() && c.batch == last_batch {
            continue;
        }
        last_batch = c.batch.clone();
        start_calls += 1;
        throttled_calls += usize::from(c.throttled);
        succeeded += usize::from(c.ok == Some(true));
    }
    let after_burst = b.machines.saturating_sub(b.start_burst as usize) as f64;
    StartsReport {
        machines: b.machines,
        workers: b.workers,
        zones: b.zones,
        batched: b.batch_size.is_some(),
        batch_size: b.batch_size.unwrap_or(1),
        start_burst: b.start_burst,
        start_per_second: b.start_per_second,
        virtual_makespan_s: virtual_makespan.as_secs_f64(),
        unbatched_ideal_s: after_burst / b.start_per_second + b.start_latency.as_secs_f64(),
        start_calls,
        throttled_calls,
        machines_per_call: if succeeded > 0 { b.machines as f64 / succeeded as f64 } else { 0.0 },
        wall_s,
    }
}

/// Counts machine-started and machine-removed events and wakes a waiter at a target.
struct Counter {
    started: usize,
    removed: usize,
    waiter: Option<(Target, oneshot::Sender<()>)>,
}

#[derive(Clone, Copy)]
enum Target {
    Started(usize),
    Settled { started: usize, removed: usize },
}

impl Counter {
    fn check(&mut self) {
        let done = match self.waiter.as_ref().map(|(t, _)| *t) {
            Some(Target::Started(n)) => self.started >= n,
            Some(Target::Settled { started, removed }) => self.started >= started && self.removed >= removed,
            None => false,
        };
        if done {
            if let Some((_, tx)) = self.waiter.take() {
                let _ = tx.send(());
            }
        }
    }
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<ProvisionerEvent> for Counter {
    type Result = ();
    fn handle(&mut self, msg: ProvisionerEvent, _ctx: &mut Self::Context) {
        match msg {
            ProvisionerEvent::MachineStarted { .. } => self.started += 1,
            ProvisionerEvent::MachineRemoved { .. } => self.removed += 1,
            _ => return,
        }
        self.check();
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct WaitFor(Target, oneshot::Sender<()>);

impl Handler<WaitFor> for Counter {
    type Result = ();
    fn handle(&mut self, msg: WaitFor, _ctx: &mut Self::Context) {
        self.waiter = Some((msg.0, msg.1));
        self.check();
    }
}

async fn wait(counter: &Addr<Counter>, target: Target) {
    let (tx, rx) = oneshot::channel();
    counter.do_send(WaitFor(target, tx));
    let _ = rx.await;
}

/// Peak resident set size of this process in MiB, from `/proc/self/status` (0 if unknown).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn zones(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("az{i}")).collect()
}

fn config(workers: usize) -> ProvisionerConfig {
    ProvisionerConfig {
        model_uuid: super::SIM_MODEL_UUID.into(),
        workers,
        retry: RetryStrategy::new(0, Duration::ZERO),
        // The benchmark's cloud does not throttle: a client-side limit would only measure itself.
        rate_limits: crate::config::rate_limits::RateLimits::unlimited(),
        ..ProvisionerConfig::default()
    }
}

fn fleet(n: usize, offset: usize) -> Vec<FakeMachine> {
    (offset..offset + n).map(|i| FakeMachine::new(Machine::pending(i.to_string().as_str()))).collect()
}

fn cloud(zone_count: usize) -> FakeCloud {
    let names = zones(zone_count);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let cloud = if zone_count == 0 {
        FakeCloud::new(super::SIM_MODEL_UUID)
    } else {
        FakeCloud::with_zones(super::SIM_MODEL_UUID, &refs)
    };
    cloud.record_params(false);
    cloud.log_calls(false);
    cloud
}

/// Provisions `machines` pending machines with `workers` workers over `zones` zones, each
/// start taking `latency` of virtual time.
pub fn throughput(machines: usize, workers: usize, zone_count: usize, latency: Duration) -> ThroughputReport {
    throughput_kept(machines, workers, zone_count, latency).0
}

/// What a benchmark built, still standing: the actor system with the provisioner, the fake
/// model and cloud, and every machine they hold. Dropping it stops the system and frees all of
/// it, entry by entry (at 100,000 machines about a tenth of a second, touching every page of its
/// heap once more); a process that exits next may leave that to the operating system
/// with `std::mem::forget`, as `provisioner bench throughput` does.
#[must_use = "dropping it tears the system down; forget it only when the process exits next"]
pub struct Standing {
    _system: actix_rt::SystemRunner,
}

/// [`throughput`], handing back what it built instead of tearing it down; the report's wall
/// time ends before the teardown.
pub fn throughput_kept(
    machines: usize,
    workers: usize,
    zone_count: usize,
    latency: Duration,
) -> (ThroughputReport, Standing) {
    let wall = std::time::Instant::now();
    let runner = PausedSystem::new();
    let virtual_makespan = runner.block_on(async move {
        let cloud = cloud(zone_count);
        cloud.set_latency(latency, Duration::ZERO);
        let model = FakeModel::with_machines(fleet(machines, 0));
        let counter = Counter { started: 0, removed: 0, waiter: None }.start();
        let handle =
            start(config(workers), Arc::new(cloud.broker()), Arc::new(model.api())).expect("valid bench config");
        handle.subscribe(counter.clone().recipient());
        let epoch = actix_rt::time::Instant::now();
        model.watch(handle.machines_changed());
        wait(&counter, Target::Started(machines)).await;
        let makespan = epoch.elapsed();
        handle.shutdown();
        makespan
    });
    let wall_s = wall.elapsed().as_secs_f64();
    let ideal = machines.div_ceil(workers.max(1)) as f64 * latency.as_secs_f64();
    let actual = virtual_makespan.as_secs_f64();
    let efficiency = if latency.is_zero() {
        1.0
    } else if actual > 0.0 {
        ideal / actual
    } else {
        0.0
    };
    let report = ThroughputReport {
        machines,
        workers,
        zones: zone_count,
        virtual_makespan_s: actual,
        ideal_makespan_s: ideal,
        efficiency,
        wall_s,
        machines_per_wall_s: if wall_s > 0.0 { machines as f64 / wall_s } else { 0.0 },
        peak_rss_mib: peak_rss_mib(),
    };
    (report, Standing { _system: runner })
}

/// Provisions `machines` machines, then applies `events` single-machine changes — deaths of
/// provisioned machines and additions of new ones, alternately, 10 ms of virtual time apart,
/// each with its own notification — and times that phase.
pub fn churn(machines: usize, events: usize) -> ChurnReport {
    PausedSystem::new().block_on(async move {
        let cloud = cloud(3);
        let model = FakeModel::with_machines(fleet(machines, 0));
        let counter = Counter { started: 0, removed: 0, waiter: None }.start();
        let handle = start(config(16), Arc::new(cloud.broker()), Arc::new(model.api())).expect("valid bench config");
        handle.subscribe(counter.clone().recipient());
        model.watch(handle.machines_changed());
        wait(&counter, Target::Started(machines)).await;
        let listings_before = cloud.snapshot().await.counts.get(&CloudOp::AllInstances).copied().unwrap_or(0);

        let epoch = actix_rt::time::Instant::now();
        let wall = std::time::Instant::now();
        let (mut deaths, mut additions) = (0usize, 0usize);
        for i in 0..events {
            if i % 2 == 0 && deaths < machines {
                model.set_life(&deaths.to_string(), Life::Dead);
                deaths += 1;
            } else {
                model.add_machine(FakeMachine::new(Machine::pending(
                    MachineId::new((machines + additions).to_string()).as_str(),
                )));
                additions += 1;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        wait(&counter, Target::Settled { started: machines + additions, removed: deaths }).await;
        let wall_s = wall.elapsed().as_secs_f64();
        let virtual_s = epoch.elapsed().as_secs_f64();
        let listings =
            cloud.snapshot().await.counts.get(&CloudOp::AllInstances).copied().unwrap_or(0) - listings_before;
        handle.shutdown();
        ChurnReport {
            machines,
            events,
            wall_s,
            per_event_us: if events > 0 { wall_s * 1e6 / events as f64 } else { 0.0 },
            all_instances_calls: listings,
            virtual_s,
            peak_rss_mib: peak_rss_mib(),
        }
    })
}
