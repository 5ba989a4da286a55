//! What may happen next in the checker's world: one handler of the real system, a cloud
//! call's outcome, a fault or a model event ([`McAction`]), as counterexamples name them.

use std::fmt;

use crate::model::{InstanceId, MachineId};

/// What may happen next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McAction {
    /// The coordinator starts a batch (machines were notified), or answers its batch
    /// planner's question.
    Batch,
    /// A start's question (other than its cloud call) is answered.
    Start(MachineId),
    /// A start's cloud call reaches the cloud.
    Call(MachineId, CallOutcome),
    /// An answer of the cloud reaches its start.
    Reply(MachineId),
    /// The pool's batch (`McConfig::batch_size`) gets its start token: it takes no more
    /// members (the first time) and its call, or the replay of that call, reaches the cloud.
    BatchCall(u64, CallOutcome),
    /// The cloud's answer to a batch's call reaches the pool, which hands each member its
    /// answer or replays the call.
    BatchReply(u64),
    /// The pool's finished jobs reach the coordinator.
    JobsDone,
    /// The pool carries out its first stop job.
    Stop,
    /// The pool carries out its first release job (harvest modes `none` and `unknown`): the
    /// instances run on, no longer ours.
    Release,
    /// The operator changes the model's harvest mode (`ChangeHarvestMode`).
    ChangeMode(crate::model::HarvestMode),
    /// The pool's first stop job calls the cloud, which stops the instances, and the answer is
    /// lost: the pool retries the job later.
    StopFails,
    /// The provisioner dies; a new one starts (the cloud and the store are kept).
    Crash,
    /// The model: a machine dies.
    Die(MachineId),
    /// The model: a machine is added (`McConfig::adds`).
    Add(MachineId),
    /// The coordinator's first refresh after a start lists the cloud, and the listing fails.
    BatchListingFails,
    /// The registry's periodic listing is sent: the cloud answers as of now (the answer may
    /// reach the registry later: a lagging listing).
    List,
    /// The periodic listing's answer reaches the registry, or the listing fails.
    Listed(ListOutcome),
    /// The model refuses a start's record of its instance (one failed write).
    RecordFails(MachineId),
    /// The operator retries a machine in provisioning error (`retry-provisioning`).
    Retry(MachineId),
    /// The grace period passes (harvest modes that harvest unknown instances): every instance
    /// live now is older than it.
    GracePasses,
    /// The harvest policy's recheck timer fires (a plan spared young unknown instances): it
    /// plans the unknown instances again.
    Recheck,
    /// The operator destroys the model (`DestroyModel` to the coordinator): the model dying,
    /// the registry's targets, the lifecycle's and the harvest policy's decisions, the stops.
    Destroy,
    /// The lease moves to another replica (`service`): the store's lease takes a new epoch,
    /// a new provisioner starts under it (repeating the start intents first), and the old
    /// one, stale, may go on acting until it steps down.
    LeaseMoves,
    /// The stale leader takes a step (any of the provisioner's own actions above).
    Stale(Box<McAction>),
    /// The stale leader steps down: its actors stop (its calls already sent stay on the wire).
    StepsDown,
    /// The cloud warns that it takes this instance away (a spot interruption): a notice the
    /// poller is handed until it is acknowledged.
    Warn(InstanceId),
    /// The cloud takes a warned instance (its warning ran out).
    Reclaim(InstanceId),
    /// The interruption poller hands the cloud's notices it does not hold yet to the
    /// coordinator, which decides on each with what the registry knows of its instance.
    Poll,
    /// A hand-over's replacement is prepared, as the coordinator's `start_replacement`: the
    /// model read, the lifecycle asked (`BeginReplacement`), the start queued ahead of others.
    Replace(MachineId),
    /// The coordinator's look-again timer fires: notices about instances no machine was known
    /// to own are looked at again.
    LookAgain,
    /// The timer after a hand-over's switch fires: the machine's deferred warnings are looked
    /// at again, whatever became of the interrupted instance's stop.
    Overdue(MachineId),
    /// A start call of a provisioner that is gone (crashed, or stepped down) reaches the cloud,
    /// which makes or finds its instance by its token; the answer reaches no one.
    Late(u32, MachineId),
}

/// How a periodic listing ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListOutcome {
    /// The cloud's answer (as of when it was sent) reaches the registry.
    Answers,
    /// It fails.
    Fails,
}

/// How a start's cloud call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It makes (or finds, by its token) the instance, and answers it.
    Lands,
    /// It makes (or finds) the instance, and its answer is lost: the start sees a timeout.
    LosesAnswer,
    /// The zone has no capacity: refused, nothing made.
    Refused,
}

impl fmt::Display for McAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McAction::Batch => write!(f, "the coordinator's batch takes a step"),
            McAction::Start(m) => write!(f, "machine {m}'s start takes a step"),
            McAction::Call(m, CallOutcome::Lands) => write!(f, "machine {m}'s start call lands"),
            McAction::Call(m, CallOutcome::LosesAnswer) => {
                write!(f, "machine {m}'s start call lands and its answer is lost")
            }
            McAction::Call(m, CallOutcome::Refused) => write!(f, "machine {m}'s start call is refused (no capacity)"),
            McAction::Reply(m) => write!(f, "the cloud's answer reaches machine {m}'s start"),
            McAction::BatchCall(b, CallOutcome::Lands) => write!(f, "batch {b}'s start call lands"),
            McAction::BatchCall(b, CallOutcome::LosesAnswer) => {
                write!(f, "batch {b}'s start call lands and its answer is lost")
            }
            McAction::BatchCall(b, CallOutcome::Refused) => {
                write!(f, "batch {b}'s start call is refused (no capacity)")
            }
            McAction::BatchReply(b) => write!(f, "the cloud's answer to batch {b} reaches the pool"),
            McAction::JobsDone => write!(f, "the finished jobs reach the coordinator"),
            McAction::Stop => write!(f, "the pool stops instances"),
            McAction::Release => write!(f, "the pool releases instances"),
            McAction::ChangeMode(m) => write!(f, "the operator sets the harvest mode to {m}"),
            McAction::StopFails => write!(f, "the pool's stop call takes effect and its answer is lost"),
            McAction::Crash => write!(f, "the provisioner crashes and restarts"),
            McAction::Die(m) => write!(f, "machine {m} dies"),
            McAction::Add(m) => write!(f, "machine {m} is added"),
            McAction::BatchListingFails => write!(f, "the first refresh's cloud listing fails"),
            McAction::List => write!(f, "the registry's periodic listing is sent"),
            McAction::Listed(ListOutcome::Answers) => write!(f, "the periodic listing's answer reaches the registry"),
            McAction::Listed(ListOutcome::Fails) => write!(f, "the periodic listing fails"),
            McAction::RecordFails(m) => write!(f, "the model refuses machine {m}'s record"),
            McAction::Retry(m) => write!(f, "the operator retries machine {m}"),
            McAction::Destroy => write!(f, "the operator destroys the model"),
            McAction::GracePasses => write!(f, "the grace period passes"),
            McAction::Recheck => write!(f, "the harvest policy's recheck timer fires"),
            McAction::LeaseMoves => write!(f, "the lease moves to another replica (a new epoch)"),
            McAction::Stale(a) => write!(f, "the stale leader: {a}"),
            McAction::StepsDown => write!(f, "the stale leader steps down"),
            McAction::Warn(i) => write!(f, "the cloud warns that it takes instance {i} (an interruption)"),
            McAction::Reclaim(i) => write!(f, "the cloud takes instance {i}"),
            McAction::Poll => write!(f, "the poller hands the interruption notices to the coordinator"),
            McAction::Replace(m) => write!(f, "machine {m}'s replacement is prepared and queued"),
            McAction::LookAgain => write!(f, "the coordinator looks at notices again"),
            McAction::Overdue(m) => write!(f, "machine {m}'s interrupted instance's stop is overdue"),
            McAction::Late(inc, m) => {
                write!(f, "machine {m}'s start call of provisioner {inc} (gone) reaches the cloud late")
            }
        }
    }
}
