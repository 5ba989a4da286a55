//! The EC2 broker's memory actor: a thin shell over [`MemoryBook`] and the once-read values,
//! which runs their reads on its own context (so a read goes on, and its waiting callers get
//! its value, when the caller that brought it went away).

use std::sync::Arc;

use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::BoxFuture;

use super::messages::*;
use super::state::{After, Ask, MemoryBook, OnceRead, Place};
use crate::model::instance_types::InstanceType;
use crate::ports::BrokerError;

/// A caller's job for a once-read value: the read to make, and where to answer.
struct Job<T, E> {
    read: BoxFuture<'static, Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

/// The catalogue, as the broker shares it.
type Catalogue = Arc<Vec<InstanceType>>;

/// A once-read value of the actor, by the field that holds it.
type Field<T, E> = fn(&mut BrokerMemory) -> &mut OnceRead<T, Job<T, E>>;

/// Owns what the EC2 broker remembers.
pub(crate) struct BrokerMemory {
    book: MemoryBook,
    catalogue: OnceRead<Catalogue, Job<Catalogue, BrokerError>>,
    root_device: OnceRead<String, Job<String, ()>>,
}

impl BrokerMemory {
    /// Starts the memory of a broker whose fail-over remembers capacity failures for
    /// `memory`.
    pub(crate) fn start(memory: std::time::Duration) -> Addr<Self> {
        Self::create(|ctx| {
            crate::actors::unlimited_mailbox(ctx);
            Self { book: MemoryBook::new(memory), catalogue: OnceRead::default(), root_device: OnceRead::default() }
        })
    }

    /// Asks the value of `field` with `read`; answers it (or the read's failure) when known.
    fn ask<T, E>(
        &mut self,
        field: Field<T, E>,
        read: BoxFuture<'static, Result<T, E>>,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<Result<T, E>>
    where
        T: Clone + 'static,
        E: 'static,
    {
        let (reply, answer) = oneshot::channel();
        match field(self).ask(Job { read, reply }) {
            Ask::Known(value, job) => {
                let _ = job.reply.send(Ok(value));
            }
            Ask::Read(job) => Self::read(field, job, ctx),
            Ask::Wait => {}
        }
        answer
    }

    /// Makes `job`'s read of `field`, then answers it and whoever waits.
    fn read<T, E>(field: Field<T, E>, job: Job<T, E>, ctx: &mut Context<Self>)
    where
        T: Clone + 'static,
        E: 'static,
    {
        let Job { read, reply } = job;
        ctx.spawn(actix::fut::wrap_future::<_, Self>(read).map(move |res, act, ctx| {
            let value = res.as_ref().ok().cloned();
            // The caller may have gone: the value is kept all the same.
            let _ = reply.send(res);
            match field(act).read(value) {
                After::Known(value, waiting) => {
                    for job in waiting {
                        let _ = job.reply.send(Ok(value.clone()));
                    }
                }
                After::Next(Some(job)) => Self::read(field, job, ctx),
                After::Next(None) => {}
            }
        }));
    }
}

impl Actor for BrokerMemory {
    type Context = Context<Self>;
}

impl Handler<OrderTypes> for BrokerMemory {
    type Result = MessageResult<OrderTypes>;
    fn handle(&mut self, msg: OrderTypes, _ctx: &mut Self::Context) -> Self::Result {
        let place = Place { zone: msg.zone.as_deref(), capacity: msg.capacity };
        MessageResult(self.book.order(msg.now, place, &msg.token, &msg.candidates))
    }
}

impl Handler<Attempt> for BrokerMemory {
    type Result = ();
    fn handle(&mut self, msg: Attempt, _ctx: &mut Self::Context) {
        let place = Place { zone: msg.zone.as_deref(), capacity: msg.capacity };
        self.book.attempted(msg.now, place, &msg.token, msg.outcome);
    }
}

impl Handler<RememberUntagged> for BrokerMemory {
    type Result = ();
    fn handle(&mut self, msg: RememberUntagged, _ctx: &mut Self::Context) {
        self.book.remember_untagged(msg.start, msg.untagged);
    }
}

impl Handler<TakeUntagged> for BrokerMemory {
    type Result = MessageResult<TakeUntagged>;
    fn handle(&mut self, msg: TakeUntagged, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.take_untagged(&msg.start))
    }
}

impl Handler<SetPacer> for BrokerMemory {
    type Result = ();
    fn handle(&mut self, msg: SetPacer, _ctx: &mut Self::Context) {
        self.book.set_pacer(msg.0);
    }
}

impl Handler<GetPacer> for BrokerMemory {
    type Result = MessageResult<GetPacer>;
    fn handle(&mut self, _msg: GetPacer, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.pacer())
    }
}

impl Handler<ReadCatalogue> for BrokerMemory {
    type Result = ResponseFuture<Result<Catalogue, BrokerError>>;
    fn handle(&mut self, msg: ReadCatalogue, ctx: &mut Self::Context) -> Self::Result {
        let answer = self.ask(|m| &mut m.catalogue, msg.read, ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(BrokerError::transient("the EC2 broker's catalogue read was dropped")))
        })
    }
}

impl Handler<ReadRootDevice> for BrokerMemory {
    type Result = ResponseFuture<Option<String>>;
    fn handle(&mut self, msg: ReadRootDevice, ctx: &mut Self::Context) -> Self::Result {
        let read = Box::pin(async move { msg.read.await.ok_or(()) });
        let answer = self.ask(|m| &mut m.root_device, read, ctx);
        Box::pin(async move { answer.await.ok().and_then(Result::ok) })
    }
}
