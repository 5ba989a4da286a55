//! What the EC2 broker needs to know, and its validation.

use std::time::Duration;

use thiserror::Error;

pub use crate::model::instance_types::{DEFAULT_CAPACITY_MEMORY, DEFAULT_TYPES_PER_ZONE};

/// The EC2 broker's settings. Credentials are not here: they come from the standard AWS chain
/// (environment, shared config and credentials files, SSO, instance or container role).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ec2Config {
    /// The model's uuid, tagged on every instance; instances without it are not ours.
    pub model_uuid: String,
    /// The region, e.g. `us-east-1`. `None`: from the AWS chain (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// An EC2-compatible endpoint instead of AWS's (e.g. a local moto server).
    pub endpoint: Option<String>,
    /// The image (AMI) every instance starts from.
    pub image_id: String,
    /// The instance type of a machine without hardware constraints, e.g. `t3.micro`. `None`:
    /// the cheapest `amd64` type with at least 1 GiB (see [`crate::model::instance_types`]).
    /// Machines with `arch`/`cores`/`mem`/`instance-type` constraints get the cheapest type
    /// that satisfies them from `DescribeInstanceTypes` and the shipped price table.
    pub instance_type: Option<String>,
    /// A subnet to start instances in (its zone then wins over the chosen one).
    pub subnet_id: Option<String>,
    /// Security groups for new instances.
    pub security_group_ids: Vec<String>,
    /// How long a type that ran out of capacity in a zone is tried last there; `None`:
    /// [`DEFAULT_CAPACITY_MEMORY`]; zero: no memory.
    pub capacity_memory: Option<Duration>,
    /// Most candidate types one start tries in one zone; `None`: [`DEFAULT_TYPES_PER_ZONE`].
    pub types_per_zone: Option<usize>,
    /// The SQS queue (its URL) EventBridge delivers EC2's spot interruption warnings and
    /// rebalance recommendations to (see [`super::InterruptionQueue`]); `None`: not read.
    pub interruption_queue: Option<String>,
}

/// Settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Ec2ConfigError {
    /// A required setting is empty.
    #[error("EC2 broker: {0} is required (see `provisioner serve --help`)")]
    Missing(&'static str),
    /// The endpoint is not a URL.
    #[error("EC2 broker: endpoint {0:?} is not an http(s) URL")]
    Endpoint(String),
    /// No region given and none in the AWS chain.
    #[error("EC2 broker: no region: pass --region or set AWS_REGION")]
    NoRegion,
}

impl Ec2Config {
    /// Checks every field; the error names the first problem.
    pub fn validate(&self) -> Result<(), Ec2ConfigError> {
        if self.model_uuid.trim().is_empty() {
            return Err(Ec2ConfigError::Missing("the model uuid"));
        }
        if self.image_id.trim().is_empty() {
            return Err(Ec2ConfigError::Missing("an image (--ec2-image AMI)"));
        }
        if self.instance_type.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(Ec2ConfigError::Missing("an instance type (--ec2-instance-type TYPE, or leave it out)"));
        }
        if self.types_per_zone == Some(0) {
            return Err(Ec2ConfigError::Missing("at least one instance type per zone"));
        }
        if let Some(e) = &self.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(Ec2ConfigError::Endpoint(e.clone()));
            }
        }
        if self.region.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err(Ec2ConfigError::NoRegion);
        }
        Ok(())
    }
}
