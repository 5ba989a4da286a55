//! [`LimitedBroker`]: any [`Broker`] behind the rate limiter. Each call first waits for a
//! token of its class, then reports whether the cloud throttled it.

use std::sync::Arc;

use actix::Recipient;

use super::messages::{Acquire, CallOutcome};
use crate::config::rate_limits::ApiClass;
use crate::model::{CloudInstance, InstanceId, InstanceTags};
use crate::ports::{AvailabilityZone, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};

/// A broker whose calls are paced by a [`RateLimiter`](super::RateLimiter).
#[derive(Clone)]
pub struct LimitedBroker {
    inner: Arc<dyn Broker>,
    acquire: Recipient<Acquire>,
    outcome: Recipient<CallOutcome>,
}

impl LimitedBroker {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Broker>, acquire: Recipient<Acquire>, outcome: Recipient<CallOutcome>) -> Self {
        Self { inner, acquire, outcome }
    }

    /// Waits for a token, makes the call (built only then: some brokers act when the call is
    /// built, not when it is polled), reports how it went.
    fn gated<T: Send + 'static>(
        &self,
        class: ApiClass,
        call: impl FnOnce(&dyn Broker) -> BrokerFuture<T> + Send + 'static,
    ) -> BrokerFuture<T> {
        let inner = self.inner.clone();
        let acquire = self.acquire.clone();
        let outcome = self.outcome.clone();
        Box::pin(async move {
            // A limiter that is gone does not hold the provisioner up.
            let epoch = acquire.send(Acquire { class }).await.unwrap_or(0);
            let res = call(&*inner).await;
            let throttled = matches!(res, Err(BrokerError::Throttled { .. }));
            outcome.do_send(CallOutcome { class, epoch, throttled });
            res
        })
    }
}

impl Broker for LimitedBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        self.gated(ApiClass::Start, move |b| b.start_instance(params))
    }

    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.gated(ApiClass::Stop, move |b| b.stop_instances(ids))
    }

    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        self.gated(ApiClass::Describe, |b| b.all_instances())
    }

    fn instances_of_start(&self, machine: crate::model::MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        self.gated(ApiClass::Describe, move |b| b.instances_of_start(machine, nonce))
    }

    fn supports_zones(&self) -> bool {
        self.inner.supports_zones()
    }

    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        self.gated(ApiClass::Describe, |b| b.availability_zones())
    }

    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        let params = params.clone();
        self.gated(ApiClass::Describe, move |b| b.derive_availability_zones(&params))
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        self.gated(ApiClass::Stop, move |b| b.retag_instance(id, tags))
    }

    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.gated(ApiClass::Stop, move |b| b.release_instances(ids))
    }
}
