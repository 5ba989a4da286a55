//! A broker decorator that times every call for the metrics and counts calls in flight, and
//! hands each listing it makes to the listings readers are served from (`service::cloud::listing`).
//! It tells the metrics what it sees of the cloud's instances (each listing, each start, stop
//! and release answered): `provisioner_instances_by_capacity`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::Addr;
use actix_rt::time::Instant;

use super::actor::Metrics;
use super::messages::{BrokerCallDone, InstanceStarted, InstancesGone, InstancesListed};
use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags};
use crate::ports::{AvailabilityZone, Broker, BrokerFuture, StartInstanceParams, StartedInstance};
use crate::service::cloud::listing::{Changed, InstanceListings, Listed, ReadInstances};

/// Wraps a broker; every call is timed and counted.
#[derive(Clone)]
pub(crate) struct MeteredBroker {
    inner: Arc<dyn Broker>,
    metrics: Addr<Metrics>,
    in_flight: Arc<AtomicUsize>,
    /// Where listings go, and readers ask (`None`: readers list the cloud themselves).
    listings: Option<Addr<InstanceListings>>,
}

impl MeteredBroker {
    /// Meters `inner`, reporting to `metrics`.
    pub(crate) fn new(inner: Arc<dyn Broker>, metrics: Addr<Metrics>) -> Self {
        Self { inner, metrics, in_flight: Arc::new(AtomicUsize::new(0)), listings: None }
    }

    /// The same broker, its listings handed to `listings`, which readers ask
    /// ([`MeteredBroker::read_instances`]).
    pub(crate) fn with_listings(self, listings: Addr<InstanceListings>) -> Self {
        Self { listings: Some(listings), ..self }
    }

    /// `call`, which changes the cloud: once it ends (answered or not: a failed call may have
    /// taken effect), the listings readers are served from are outdated.
    fn changing<T: Send + 'static>(&self, call: BrokerFuture<T>) -> BrokerFuture<T> {
        let Some(listings) = self.listings.clone() else { return call };
        Box::pin(async move {
            let result = call.await;
            listings.do_send(Changed);
            result
        })
    }

    /// The cloud's instances for a reader: a listing at most `max_age` old (made now only if
    /// none is, and once for every reader that asks meanwhile), and its age.
    pub(crate) fn read_instances(
        &self,
        max_age: std::time::Duration,
    ) -> BrokerFuture<(Arc<Vec<CloudInstance>>, std::time::Duration)> {
        match &self.listings {
            Some(l) => {
                let asked = l.send(ReadInstances { max_age });
                Box::pin(async move {
                    asked.await.map_err(|_| crate::ports::BrokerError::transient("the instance listings stopped"))?
                })
            }
            None => {
                let call = self.all_instances();
                Box::pin(async move { Ok((Arc::new(call.await?), std::time::Duration::ZERO)) })
            }
        }
    }

    /// Calls in flight now (a counter shared by every clone).
    pub(crate) fn in_flight(&self) -> usize {
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

impl MeteredBroker {
    /// `call`, which stops or releases `ids`: once answered, the metrics count them no more.
    fn removing(&self, ids: &[InstanceId], call: BrokerFuture<()>) -> BrokerFuture<()> {
        let (metrics, instances) = (self.metrics.clone(), ids.to_vec());
        Box::pin(async move {
            let result = call.await;
            if result.is_ok() {
                metrics.do_send(InstancesGone { instances, at: Instant::now() });
            }
            result
        })
    }
}

impl Broker for MeteredBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let call = self.changing(self.meter("start_instance", self.inner.start_instance(params)));
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let result = call.await;
            if let Ok(started) = &result {
                let i = &started.instance;
                metrics.do_send(InstanceStarted {
                    instance: i.id.clone(),
                    zone: i.zone.clone(),
                    capacity: i.capacity_type,
                    at: Instant::now(),
                });
            }
            result
        })
    }
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let call = self.changing(self.meter("stop_instances", self.inner.stop_instances(ids.clone())));
        self.removing(&ids, call)
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let call = self.meter("all_instances", self.inner.all_instances());
        let (listings, metrics) = (self.listings.clone(), self.metrics.clone());
        Box::pin(async move {
            let at = Instant::now();
            let result = call.await;
            if let Ok(list) = &result {
                let instances = list
                    .iter()
                    .filter(|i| i.state != InstanceState::Terminated)
                    .map(|i| (i.id.clone(), i.zone.clone(), i.capacity_type))
                    .collect();
                metrics.do_send(InstancesListed { instances, at });
                if let Some(listings) = listings {
                    listings.do_send(Listed { list: Arc::new(list.clone()), at });
                }
            }
            result
        })
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
        let call = self.changing(self.meter("release_instances", self.inner.release_instances(ids.clone())));
        self.removing(&ids, call)
    }
    crate::forward_broker!(inner: pace_follow_ups, supports_zones, zones_change, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}
