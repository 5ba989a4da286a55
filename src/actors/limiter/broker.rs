//! [`LimitedBroker`]: any [`Broker`] behind the rate limiter. Each call first waits for a
//! token of its class, then reports whether the cloud throttled it.

use std::sync::Arc;

use actix::Recipient;

use super::messages::{Acquire, CallOutcome};
use crate::config::rate_limits::ApiClass;
use crate::model::{CloudInstance, InstanceId, InstanceTags};
use crate::ports::{
    AvailabilityZone, BatchStartParams, BatchStarted, Broker, BrokerError, BrokerFuture, StartInstanceParams,
    StartedInstance,
};

/// The limiter's two ends of a call: wait for a token, report how the call went. What
/// [`LimitedBroker`] wraps around every call, and what the worker pool's batcher takes
/// around a batched start (it closes the batch only once the token is granted).
#[derive(Clone)]
pub struct CallGate {
    acquire: Recipient<Acquire>,
    outcome: Recipient<CallOutcome>,
}

impl CallGate {
    /// A gate over the limiter's two messages.
    pub fn new(acquire: Recipient<Acquire>, outcome: Recipient<CallOutcome>) -> Self {
        Self { acquire, outcome }
    }

    /// Waits for a token of `class`; answers the epoch to report with [`CallGate::report`]. A
    /// limiter that is gone does not hold the provisioner up.
    pub fn token(&self, class: ApiClass) -> impl std::future::Future<Output = u64> + 'static {
        let acquire = self.acquire.send(Acquire { class });
        async move { acquire.await.unwrap_or(0) }
    }

    /// Reports how a call let through under `epoch` went.
    pub fn report<T>(&self, class: ApiClass, epoch: u64, res: &Result<T, BrokerError>) {
        let throttled = matches!(res, Err(BrokerError::Throttled { .. }));
        self.outcome.do_send(CallOutcome { class, epoch, throttled });
    }
}

/// The gate paces a broker's follow-up calls too (a batched start's tagging).
impl crate::ports::Pacer for CallGate {
    fn token(&self, class: ApiClass) -> futures::future::BoxFuture<'static, u64> {
        Box::pin(CallGate::token(self, class))
    }
    fn report(&self, class: ApiClass, epoch: u64, throttled: bool) {
        self.outcome.do_send(CallOutcome { class, epoch, throttled });
    }
}

/// A broker whose calls are paced by a [`RateLimiter`](super::RateLimiter).
#[derive(Clone)]
pub struct LimitedBroker {
    inner: Arc<dyn Broker>,
    gate: CallGate,
}

impl LimitedBroker {
    /// Wraps `inner`, its calls passing through `gate`.
    pub fn new(inner: Arc<dyn Broker>, gate: CallGate) -> Self {
        Self { inner, gate }
    }

    /// Waits for a token, makes the call (built only then: some brokers act when the call is
    /// built, not when it is polled), reports how it went.
    fn gated<T: Send + 'static>(
        &self,
        class: ApiClass,
        call: impl FnOnce(&dyn Broker) -> BrokerFuture<T> + Send + 'static,
    ) -> BrokerFuture<T> {
        let inner = self.inner.clone();
        let gate = self.gate.clone();
        Box::pin(async move {
            // The wait, in the trace of the call it holds up (issue 37; disabled unless exported;
            // none for a call outside any trace, a listing's).
            let waiting = match tracing::Span::current() {
                current if current.is_none() => current,
                _ => tracing::info_span!(target: crate::trace::TRACE_TARGET, "rate limit wait", api.class = ?class),
            };
            let epoch = tracing::Instrument::instrument(gate.token(class), waiting).await;
            let res = call(&*inner).await;
            gate.report(class, epoch, &res);
            res
        })
    }
}

impl Broker for LimitedBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        self.gated(ApiClass::Start, move |b| b.start_instance(params))
    }

    /// One token of the start bucket for the whole call, however many machines it carries.
    fn start_instances(&self, params: BatchStartParams) -> BrokerFuture<BatchStarted> {
        self.gated(ApiClass::Start, move |b| b.start_instances(params))
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
    crate::forward_broker!(inner: pace_follow_ups, batches_starts, supports_zones, zones_change, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}
