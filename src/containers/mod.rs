//! Lazy container provisioners (seed 003).
//!
//! Container machines (`HOST/TYPE/N`) are not the environ provisioner's business. For every
//! host and container type a [`supervisor`] listens until the first container of that type
//! appears on a provisioned host, makes sure the host can run that type through a pluggable
//! [`ContainerInitialiser`] (idempotent; failures retried with backoff and shown on the
//! containers' instance status), then runs a provisioner scoped to those containers, with its
//! own broker and pool (4 workers by default, valid 1..=25), no transient-retry path, and the
//! host's zone for every container. It stops when its host dies.
//!
//! The [`manager`] stands in for the machine agents: it watches the model, creates a
//! supervisor per provisioned host and supported type, and routes container changes to it.

pub mod manager;
pub mod supervisor;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::ports::{AvailabilityZone, Broker, BrokerFuture, StartInstanceParams, StartedInstance};
use crate::types::{CloudInstance, InstanceId, MachineId};

/// The container types a host can run unless told otherwise.
pub const DEFAULT_CONTAINER_TYPES: &[&str] = &["lxd", "kvm"];

/// Makes a host ready to run containers of a type (installs and configures LXD, ...).
/// Must be idempotent: it is called again after a failure, and after a restart.
pub trait ContainerInitialiser: Send + Sync + 'static {
    /// Prepares `host` for `kind` containers; the error text is shown on their status.
    fn initialise(&self, host: MachineId, kind: String) -> BoxFuture<'static, Result<(), String>>;
}

/// Builds the broker a container provisioner uses for `kind` containers on `host`, whose
/// instance is in `zone`.
pub type BrokerFactory = Arc<dyn Fn(&MachineId, &str, Option<String>) -> Arc<dyn Broker> + Send + Sync>;

/// A broker for containers on one host: every container takes the host's zone, and there is
/// no zone choice to make (the allocator sees a zoneless cloud).
pub struct HostZoneBroker {
    inner: Arc<dyn Broker>,
    zone: Option<String>,
}

impl HostZoneBroker {
    /// Wraps `inner`, placing everything in `zone`.
    pub fn new(inner: Arc<dyn Broker>, zone: Option<String>) -> Self {
        Self { inner, zone }
    }

    /// A [`BrokerFactory`] wrapping one broker for every host.
    pub fn factory(inner: Arc<dyn Broker>) -> BrokerFactory {
        Arc::new(move |_host, _kind, zone| Arc::new(HostZoneBroker::new(inner.clone(), zone)) as Arc<dyn Broker>)
    }
}

impl Broker for HostZoneBroker {
    fn start_instance(&self, mut params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        params.zone = self.zone.clone();
        self.inner.start_instance(params)
    }
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.inner.stop_instances(ids)
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        self.inner.all_instances()
    }
    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        self.inner.availability_zones()
    }
    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        self.inner.release_instances(ids)
    }
    fn retag_instance(&self, id: InstanceId, tags: crate::types::InstanceTags) -> BrokerFuture<()> {
        self.inner.retag_instance(id, tags)
    }
}
