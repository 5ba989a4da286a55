//! The shell of the instance listings readers are served from.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use tokio::time::Instant;

use super::state::{ListingBook, Read};
use crate::model::CloudInstance;
use crate::ports::{Broker, BrokerError};

type Answer = Result<(Arc<Vec<CloudInstance>>, Duration), BrokerError>;

/// Serves readers from the listings the service made; makes one when none is fresh.
pub(crate) struct InstanceListings {
    book: ListingBook,
    /// The cloud, metered (not the one that reports back here: no loop).
    broker: Arc<dyn Broker>,
    waiting: Vec<oneshot::Sender<Answer>>,
}

impl InstanceListings {
    /// Starts it on the current arbiter, listing through `broker`.
    pub(crate) fn start(broker: Arc<dyn Broker>) -> Addr<Self> {
        Self { book: ListingBook::default(), broker, waiting: Vec::new() }.start()
    }
}

impl Actor for InstanceListings {
    type Context = Context<Self>;
}

/// A listing at most `max_age` old, and its age.
#[derive(Debug, Message)]
#[rtype(result = "Result<(Arc<Vec<CloudInstance>>, Duration), BrokerError>")]
pub(crate) struct ReadInstances {
    /// The oldest listing the reader takes.
    pub max_age: Duration,
}

impl Handler<ReadInstances> for InstanceListings {
    type Result = ResponseFuture<Answer>;

    fn handle(&mut self, m: ReadInstances, ctx: &mut Self::Context) -> Self::Result {
        let list = match self.book.read(Instant::now(), m.max_age) {
            Read::Fresh(list, age) => return Box::pin(async move { Ok((list, age)) }),
            Read::Wait { list } => list,
        };
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        if list {
            self.list(ctx, true);
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(BrokerError::transient("the listing was abandoned"))) })
    }
}

impl InstanceListings {
    /// Lists the cloud and answers every reader waiting; a listing overtaken by a change made
    /// through the service while it was in flight is made once `again`.
    fn list(&mut self, ctx: &mut Context<Self>, again: bool) {
        let began = Instant::now();
        ctx.spawn(self.broker.all_instances().into_actor(self).map(move |result, act, ctx| {
            let answer = match result {
                Ok(l) => {
                    let list = Arc::new(l);
                    if !act.book.listed(list.clone(), began) && again {
                        act.list(ctx, false);
                        return;
                    }
                    Ok((list, Instant::now().saturating_duration_since(began)))
                }
                Err(e) => Err(e),
            };
            act.book.ended();
            for w in act.waiting.drain(..) {
                let _ = w.send(answer.clone());
            }
        }));
    }
}

/// The cloud changed through this service (a start, stop or release answered).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Changed;

impl Handler<Changed> for InstanceListings {
    type Result = ();
    fn handle(&mut self, _m: Changed, _ctx: &mut Self::Context) {
        self.book.changed(Instant::now());
    }
}

/// A listing the provisioner made itself (through the metered broker), at `at`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Listed {
    /// The instances.
    pub list: Arc<Vec<CloudInstance>>,
    /// When the call was made.
    pub at: Instant,
}

impl Handler<Listed> for InstanceListings {
    type Result = ();
    fn handle(&mut self, m: Listed, _ctx: &mut Self::Context) {
        let _ = self.book.listed(m.list, m.at);
    }
}
