//! Lazy container provisioners: one per host and container type, started on its first container.
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

use actix::Recipient;

use crate::config::{ConfigError, ProvisionerConfig};
use crate::model::events::ProvisionerEvent;
use crate::model::{HarvestMode, MachineId};
use crate::ports::{Broker, BrokerFuture, ModelApi, StartInstanceParams, StartedInstance};

/// The container types a host can run unless told otherwise.
pub const DEFAULT_CONTAINER_TYPES: &[&str] = &["lxd", "kvm"];

/// Makes a host ready to run containers of a type (installs and configures LXD, ...).
/// Must be idempotent: it is called again after a failure, and after a restart.
pub trait ContainerInitialiser: Send + Sync + 'static {
    /// Prepares `host` for `kind` containers; the error's message is shown on their status.
    fn initialise(&self, host: MachineId, kind: String) -> BoxFuture<'static, Result<(), InitialiseError>>;
}

/// Why a host could not be made ready for containers: a message for the containers' status
/// line and, when there is one, the error that caused it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InitialiseError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl InitialiseError {
    /// A failure described by `message` alone.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), source: None }
    }

    /// A failure described by `message`, caused by `source`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self { message: message.into(), source: Some(source.into()) }
    }

    /// The text shown on the containers' status.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for InitialiseError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for InitialiseError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

/// Builds the broker a container provisioner uses for `kind` containers on `host`, whose
/// instance is in `zone`.
pub type BrokerFactory = Arc<dyn Fn(&MachineId, &str, Option<String>) -> Arc<dyn Broker> + Send + Sync>;

/// A running container provisioner, as its supervisor drives it. Implemented by
/// [`ProvisionerHandle`](crate::actors::wiring::ProvisionerHandle); injected through a
/// [`ProvisionerFactory`] so that the supervisor never imports the wiring that builds it.
pub trait ContainerProvisioner: Send + Sync + 'static {
    /// Forward machine changes.
    fn notify(&self, ids: Vec<MachineId>);
    /// The harvest mode changed.
    fn set_harvest_mode(&self, mode: HarvestMode);
    /// Hear its events.
    fn subscribe(&self, to: Recipient<ProvisionerEvent>);
    /// Start nothing any more.
    fn close_starts(&self);
    /// The model was destroyed.
    fn model_destroyed(&self);
    /// Stop it.
    fn shutdown(&self);
    /// Whether it is quiescent.
    fn is_idle(&self) -> BoxFuture<'static, bool>;
    /// Resolves once it is quiescent (at once if it is, or if it stopped), without polling.
    fn wait_idle(&self) -> BoxFuture<'static, ()>;
    /// Whether its registry caches no machine (also when it cannot be asked).
    fn holds_no_machine(&self) -> BoxFuture<'static, bool>;
}

/// Starts a container provisioner from its configuration, broker and model (the wiring
/// builds one over [`crate::start`]).
pub type ProvisionerFactory = Arc<
    dyn Fn(ProvisionerConfig, Arc<dyn Broker>, Arc<dyn ModelApi>) -> Result<Arc<dyn ContainerProvisioner>, ConfigError>
        + Send
        + Sync,
>;

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
    crate::forward_broker!(inner: pace_follow_ups, stop_instances, all_instances, availability_zones, release_instances, retag_instance, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}
