//! The metrics actor: owns the [`MetricsBook`].

use actix::prelude::*;

use std::collections::BTreeMap;

use actix_rt::time::Instant;

use super::messages::{
    AuditSuppressed, BrokerCallDone, CloudCounts, HttpDone, InstanceStarted, InstancesGone, InstancesListed,
    LeaderChanged, MachinesPending, Render, RenderService,
};
use super::state::{CapacityBook, MetricsBook, StartOutcome};
use crate::model::events::{HandoverCause, ProvisionerEvent};
use crate::model::MachineId;
use crate::service::store::{CountsChanged, StoreCounts};

/// Owns the counters; everything that counts sends it a message. The state gauges come from
/// the counts the store publishes after its writes (a scrape reads no table).
#[derive(Default)]
pub(crate) struct Metrics {
    book: MetricsBook,
    counts: StoreCounts,
    /// The simulated cloud's instances by state, when its instances are written on a store of
    /// their own ([`CloudCounts`]; `None`: in `counts`).
    cloud_instances: Option<BTreeMap<String, u64>>,
    /// When each machine added here became pending (until it starts, fails or goes).
    pending: BTreeMap<MachineId, Instant>,
    /// The cloud's instances by zone and capacity type, from what the metered broker saw.
    capacity: CapacityBook,
}

impl Handler<InstancesListed> for Metrics {
    type Result = ();
    fn handle(&mut self, m: InstancesListed, _ctx: &mut Self::Context) {
        self.capacity.listed(m.instances, m.at);
    }
}

impl Handler<InstanceStarted> for Metrics {
    type Result = ();
    fn handle(&mut self, m: InstanceStarted, _ctx: &mut Self::Context) {
        self.capacity.started(m.instance, m.zone, m.capacity, m.at);
    }
}

impl Handler<InstancesGone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: InstancesGone, _ctx: &mut Self::Context) {
        self.capacity.gone(&m.instances, m.at);
    }
}

impl Handler<MachinesPending> for Metrics {
    type Result = ();
    fn handle(&mut self, m: MachinesPending, _ctx: &mut Self::Context) {
        let now = Instant::now();
        for id in m.0 {
            self.pending.entry(id).or_insert(now);
        }
    }
}

impl Handler<CountsChanged> for Metrics {
    type Result = ();
    fn handle(&mut self, m: CountsChanged, _ctx: &mut Self::Context) {
        self.counts = m.0;
    }
}

impl Actor for Metrics {
    type Context = Context<Self>;
}

impl Handler<CloudCounts> for Metrics {
    type Result = ();
    fn handle(&mut self, m: CloudCounts, _ctx: &mut Self::Context) {
        self.cloud_instances = Some(m.0);
    }
}

/// Hands the counts a cloud's own store publishes to the metrics as [`CloudCounts`] (its
/// machine counts are not the model's: only its instances are taken).
pub(crate) struct CloudCountsTo(pub Addr<Metrics>);

impl Actor for CloudCountsTo {
    type Context = Context<Self>;
}

impl Handler<CountsChanged> for CloudCountsTo {
    type Result = ();
    fn handle(&mut self, m: CountsChanged, _ctx: &mut Self::Context) {
        self.0.do_send(CloudCounts(m.0.instances_by_state));
    }
}

impl Handler<HttpDone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: HttpDone, _ctx: &mut Self::Context) {
        self.book.http(m.method, &m.route, m.code, m.seconds);
    }
}

impl Handler<AuditSuppressed> for Metrics {
    type Result = ();
    fn handle(&mut self, _m: AuditSuppressed, _ctx: &mut Self::Context) {
        self.book.audit_suppressed();
    }
}

impl Handler<BrokerCallDone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: BrokerCallDone, _ctx: &mut Self::Context) {
        self.book.broker(m.op, m.result, m.seconds);
    }
}

impl Handler<ProvisionerEvent> for Metrics {
    type Result = ();
    fn handle(&mut self, e: ProvisionerEvent, _ctx: &mut Self::Context) {
        self.book.event(e.name());
        match &e {
            ProvisionerEvent::MachineStarted { machine, zone, .. } => {
                self.book.start_outcome(zone.as_deref(), StartOutcome::Started);
                if let Some(at) = self.pending.remove(machine) {
                    self.book.time_to_running(at.elapsed().as_secs_f64());
                }
            }
            ProvisionerEvent::MachineFailed { machine, zone, .. } => {
                self.book.start_outcome(zone.as_deref(), StartOutcome::Failed);
                self.pending.remove(machine);
            }
            ProvisionerEvent::MachineRemoved { machine } => {
                self.pending.remove(machine);
            }
            ProvisionerEvent::InstancesStopped { instances } => {
                self.book.harvest("stopped", instances.len() as u64);
            }
            ProvisionerEvent::ExtraInstances { instances, .. } => {
                self.book.harvest("extra_instance", instances.len() as u64);
            }
            ProvisionerEvent::HarvestDeferred { spared_by_grace, held_back_by_cap } => {
                self.book.harvest("spared_by_grace", *spared_by_grace as u64);
                self.book.harvest("held_back_by_cap", *held_back_by_cap as u64);
            }
            ProvisionerEvent::MachineInterrupted { .. } => self.book.interrupted(),
            ProvisionerEvent::MachineReplaced { cause: HandoverCause::Repair, .. } => self.book.repair("replaced"),
            ProvisionerEvent::MachineReplaced { cause: HandoverCause::Drift, .. } => self.book.drift_replaced(),
            ProvisionerEvent::MachineReplaced { lead, .. } => {
                self.book.replaced(lead.map(|d| d.as_secs_f64()));
            }
            ProvisionerEvent::MachineUnhealthy { .. } => self.book.unhealthy(),
            ProvisionerEvent::MachineRepairing { .. } => self.book.repair("started"),
            ProvisionerEvent::RepairsHeld { .. } => self.book.repair("held"),
            ProvisionerEvent::DriftSeen { by_reason } => self.book.drifted(by_reason),
            _ => {}
        }
    }
}

impl Handler<LeaderChanged> for Metrics {
    type Result = ();
    fn handle(&mut self, m: LeaderChanged, _ctx: &mut Self::Context) {
        self.book.leader(m.leader, m.transition);
    }
}

impl Handler<Render> for Metrics {
    type Result = String;
    fn handle(&mut self, m: Render, _ctx: &mut Self::Context) -> String {
        let mut g = m.0;
        g.machines_by_status = self.counts.machines_by_status.clone();
        g.machines_by_life = self.counts.machines_by_life.clone();
        g.instances_by_state = self.cloud_instances.as_ref().unwrap_or(&self.counts.instances_by_state).clone();
        g.model_life = self.counts.model_life.clone();
        g.instances_by_capacity = self.capacity.counts();
        self.book.render(&g)
    }
}

impl Handler<RenderService> for Metrics {
    type Result = String;
    fn handle(&mut self, m: RenderService, _ctx: &mut Self::Context) -> String {
        // The gauges as given: no model's counts (their families render empty).
        self.book.render(&m.0)
    }
}
