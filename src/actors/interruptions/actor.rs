//! The interruption poller actor: a thin shell over [`NoticeBook`].

use std::sync::Arc;

use actix::prelude::*;

use super::messages::{AcknowledgeNotices, CapacityShort, ImpairedInstances, ReleaseNotices, ReplacementStates};
use super::state::{NextPoll, NoticeBook};
use crate::actors::coordinator::InterruptionsNoticed;
use crate::config::Backoff;
use crate::ports::Broker;

/// Polls the broker for interruption notices and hands the new ones on.
pub struct InterruptionPoller {
    broker: Arc<dyn Broker>,
    book: NoticeBook,
    to: Recipient<InterruptionsNoticed>,
}

impl InterruptionPoller {
    /// A poller over `broker`, handing notices `to` the coordinator.
    pub fn new(broker: Arc<dyn Broker>, backoff: Backoff, to: Recipient<InterruptionsNoticed>) -> Self {
        Self { broker, book: NoticeBook::new(backoff), to }
    }

    fn poll(&mut self, ctx: &mut Context<Self>) {
        let call = self.broker.interruption_notices();
        ctx.spawn(call.into_actor(self).map(|answer, act, ctx| {
            match &answer {
                // A cloud that gives no notices: said once, quietly (repairs still use the poller).
                Err(crate::ports::BrokerError::NotSupported(_)) => {
                    tracing::debug!("the cloud gives no interruption notices");
                }
                Err(e) => tracing::warn!(error = %e, "reading interruption notices failed"),
                Ok(_) => {}
            }
            let step = act.book.on_answer(answer);
            if !step.forward.is_empty() {
                act.to.do_send(InterruptionsNoticed(step.forward));
            }
            match step.next {
                NextPoll::Now => act.poll(ctx),
                NextPoll::After(d) => {
                    ctx.run_later(d, |act, ctx| act.poll(ctx));
                }
                NextPoll::Never => {}
            }
        }));
    }
}

impl Actor for InterruptionPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
        self.poll(ctx);
    }
}

impl Handler<ImpairedInstances> for InterruptionPoller {
    type Result = ResponseFuture<Vec<crate::model::InstanceId>>;
    fn handle(&mut self, _msg: ImpairedInstances, _ctx: &mut Self::Context) -> Self::Result {
        let call = self.broker.impaired_instances();
        Box::pin(async move {
            call.await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading the cloud's status checks failed");
                Vec::new()
            })
        })
    }
}

impl Handler<ReplacementStates> for InterruptionPoller {
    type Result = ResponseFuture<Vec<Option<crate::model::InstanceState>>>;
    fn handle(&mut self, msg: ReplacementStates, _ctx: &mut Self::Context) -> Self::Result {
        let calls: Vec<_> = msg.0.into_iter().map(|(m, nonce)| self.broker.instances_of_start(m, nonce)).collect();
        Box::pin(async move {
            let answers = futures::future::join_all(calls).await;
            answers.into_iter().map(|a| a.ok().and_then(|found| super::state::replacement_state(&found))).collect()
        })
    }
}

impl Handler<CapacityShort> for InterruptionPoller {
    type Result = ();
    fn handle(&mut self, msg: CapacityShort, _ctx: &mut Self::Context) {
        let spot = crate::model::CapacityType::Spot;
        self.broker.capacity_short(msg.zone.as_deref(), &msg.instance_type, spot);
    }
}

impl Handler<ReleaseNotices> for InterruptionPoller {
    type Result = ();
    fn handle(&mut self, msg: ReleaseNotices, _ctx: &mut Self::Context) {
        self.book.acknowledged(&msg.0);
    }
}

impl Handler<AcknowledgeNotices> for InterruptionPoller {
    type Result = ();
    fn handle(&mut self, msg: AcknowledgeNotices, ctx: &mut Self::Context) {
        self.book.acknowledged(&msg.0);
        let call = self.broker.acknowledge_notices(msg.0);
        ctx.spawn(call.into_actor(self).map(|res, _act, _ctx| {
            if let Err(e) = res {
                // The cloud hands them out again; the coordinator acknowledges them again then.
                tracing::warn!(error = %e, "acknowledging interruption notices failed");
            }
        }));
    }
}
