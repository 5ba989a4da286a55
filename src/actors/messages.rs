//! The messages every actor handles: the actors' shared vocabulary for shutting down and for
//! telling whether they are quiescent. Defined below every actor, so that none imports the
//! crate root for them.

/// Hear the [`ProvisionerEvent`]s an actor publishes (the coordinator's and the harvest
/// policy's: a provisioner's subscribers subscribe to both).
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct Subscribe(pub actix::Recipient<crate::model::events::ProvisionerEvent>);

/// Stops an actor (every actor handles it).
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// How much one-shot work an actor still has (queued jobs, calls in flight, retries waiting
/// on a timer). Periodic timers do not count. Zero everywhere = quiescent.
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "usize")]
pub struct Busy;

/// Answered once the provisioner has no one-shot work left: the total of its actors'
/// [`WorkCount`](crate::actors::work::WorkCount)s reaches zero (at once if it is zero). Handled
/// by the coordinator, which owns the count its siblings share.
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "()")]
pub struct WhenIdle;
