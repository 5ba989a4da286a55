//! Messages the EC2 broker's memory handles.

use std::sync::Arc;
use std::time::Duration;

use actix::Message;
use futures::future::BoxFuture;

use super::state::{Attempted, StartKey, Untagged};
use crate::model::instance_types::{InstanceType, TypeAttempt};
use crate::ports::{BrokerError, Pacer};

/// The attempts of one launch (start `token` in `zone`, over `candidates` best first), in the
/// fail-over's order.
#[derive(Debug, Message)]
#[rtype(result = "Vec<TypeAttempt>")]
pub(crate) struct OrderTypes {
    /// The broker's time.
    pub now: Duration,
    /// The zone of the launch.
    pub zone: Option<String>,
    /// Its capacity type.
    pub capacity: crate::model::CapacityType,
    /// The provisioner's token of the launch.
    pub token: String,
    /// The types it may use, best first.
    pub candidates: Vec<InstanceType>,
}

/// How one attempt of a launch went.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Attempt {
    /// The broker's time.
    pub now: Duration,
    /// The zone of the launch.
    pub zone: Option<String>,
    /// Its capacity type.
    pub capacity: crate::model::CapacityType,
    /// The provisioner's token of the launch.
    pub token: String,
    /// The outcome.
    pub outcome: Attempted,
}

/// Remember the instance a batched start launched for `start` but could not tag.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct RememberUntagged {
    /// The member's start.
    pub start: StartKey,
    /// Its instance and the tags it still needs.
    pub untagged: Untagged,
}

/// The untagged instance of `start`, if one is remembered; forgotten.
#[derive(Debug, Message)]
#[rtype(result = "Option<Untagged>")]
pub(crate) struct TakeUntagged {
    /// The member's start.
    pub start: StartKey,
}

/// Pace the broker's own calls by this pacer from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct SetPacer(pub Arc<dyn Pacer>);

/// The pacer, if one was handed over.
#[derive(Debug, Message)]
#[rtype(result = "Option<Arc<dyn Pacer>>")]
pub(crate) struct GetPacer;

/// The catalogue, read by `read` unless known (or under way).
#[derive(Message)]
#[rtype(result = "Result<Arc<Vec<InstanceType>>, BrokerError>")]
pub(crate) struct ReadCatalogue {
    /// How to read it (`DescribeInstanceTypes`).
    pub read: BoxFuture<'static, Result<Arc<Vec<InstanceType>>, BrokerError>>,
}

/// The image's root device name, read by `read` unless known (or under way); `None` when it
/// cannot be read.
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub(crate) struct ReadRootDevice {
    /// How to read it (`DescribeImages`; `None` when it cannot).
    pub read: BoxFuture<'static, Option<String>>,
}
