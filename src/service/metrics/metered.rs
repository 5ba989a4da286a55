//! A broker decorator that times every call for the metrics and counts calls in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::Recipient;
use actix_rt::time::Instant;

use super::messages::BrokerCallDone;
use crate::model::{CloudInstance, InstanceId, InstanceTags};
use crate::ports::{AvailabilityZone, Broker, BrokerFuture, StartInstanceParams, StartedInstance};

/// Wraps a broker; every call is timed and counted.
#[derive(Clone)]
pub struct MeteredBroker {
    inner: Arc<dyn Broker>,
    metrics: Recipient<BrokerCallDone>,
    in_flight: Arc<AtomicUsize>,
}

impl MeteredBroker {
    /// Meters `inner`, reporting to `metrics`.
    pub fn new(inner: Arc<dyn Broker>, metrics: Recipient<BrokerCallDone>) -> Self {
        Self { inner, metrics, in_flight: Arc::new(AtomicUsize::new(0)) }
    }

    /// Calls in flight now (a counter shared by every clone).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn meter<T: Send + 'static>(&self, op: &'static str, call: BrokerFuture<T>) -> BrokerFuture<T> {
        let metrics = self.metrics.clone();
        let in_flight = self.in_flight.clone();
        in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(in_flight);
        Box::pin(async move {
            let began = Instant::now();
            let result = call.await;
            let kind = match &result {
                Ok(_) => "ok",
                Err(e) => e.kind(),
            };
            metrics.do_send(BrokerCallDone { op, result: kind, seconds: began.elapsed().as_secs_f64() });
            drop(guard);
            result
        })
    }
}

/// Decrements the in-flight count when the call ends or is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Broker for MeteredBroker {
    fn pace_follow_ups(&self, pacer: std::sync::Arc<dyn crate::ports::Pacer>) {
        self.inner.pace_follow_ups(pacer)
    }
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        self.meter("start_instance", self.inner.start_instance(params))
    }
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.meter("stop_instances", self.inner.stop_instances(ids))
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        self.meter("all_instances", self.inner.all_instances())
    }
    fn supports_zones(&self) -> bool {
        self.inner.supports_zones()
    }
    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        self.meter("availability_zones", self.inner.availability_zones())
    }
    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        self.meter("derive_availability_zones", self.inner.derive_availability_zones(params))
    }
    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        self.meter("retag_instance", self.inner.retag_instance(id, tags))
    }
    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.meter("release_instances", self.inner.release_instances(ids))
    }
}
