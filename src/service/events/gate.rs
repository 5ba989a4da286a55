//! [`StreamGate`], the replica's one gate of every model's event streams: it admits a stream
//! only within the caps and ends a revoked token's streams (the decisions are the plain
//! core's, `state.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;

use super::state::{StreamBook, StreamRefused};
use super::view::revoked_frame;
use crate::service::settings::EventsSettings;
use crate::service::store::Store;

/// How often the gate re-reads the tokens that hold streams (to end a revoked one's streams
/// when it was revoked through another replica).
pub(crate) const REVOCATION_CHECK: Duration = Duration::from_millis(500);

/// A stream's place in the gate's count: let go (its stream dropped) it makes room.
pub(crate) struct Ticket {
    pub(super) id: u64,
    pub(super) gate: Recipient<Release>,
    pub(super) end: Option<oneshot::Receiver<String>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.do_send(Release(self.id));
    }
}

/// The replica's gate of every model's event streams (see the module's documentation).
pub(crate) struct StreamGate {
    book: StreamBook,
    /// Each open stream's word to end (given once).
    ends: BTreeMap<u64, oneshot::Sender<String>>,
    /// The service's store, where the tokens are.
    store: Store,
    /// A re-read of the tokens is in flight.
    checking: bool,
}

impl StreamGate {
    /// No stream open; the caps are `limits`'; tokens are read from `store`.
    pub(crate) fn new(limits: EventsSettings, store: Store) -> Self {
        Self { book: StreamBook::new(limits), ends: BTreeMap::new(), store, checking: false }
    }

    /// Ends the streams of the tokens in `revoked`, each with its last frame.
    fn end(&mut self, revoked: &std::collections::BTreeSet<String>) {
        for (id, token) in self.book.end_revoked(revoked) {
            if let Some(end) = self.ends.remove(&id) {
                let _ = end.send(revoked_frame(&token));
            }
        }
    }

    /// Re-reads the tokens that hold streams (one read at a time, bounded).
    fn check(&mut self, ctx: &mut Context<Self>) {
        let holding = self.book.tokens_to_check();
        if self.checking || holding.is_empty() {
            return;
        }
        self.checking = true;
        let read = self.store.read(|s| s.tokens());
        let bounded = actix_rt::time::timeout(REVOCATION_CHECK * 4, read);
        ctx.spawn(bounded.into_actor(self).map(move |read, gate, _ctx| {
            gate.checking = false;
            match read {
                Ok(Ok(tokens)) => {
                    let revoked =
                        tokens.into_iter().filter(|t| t.revoked.is_some() && holding.contains(&t.id)).map(|t| t.id);
                    gate.end(&revoked.collect());
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "event streams: the tokens could not be read"),
                Err(_) => tracing::debug!("event streams: the tokens' read timed out"),
            }
        }));
    }
}

impl Actor for StreamGate {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(REVOCATION_CHECK, StreamGate::check);
    }
}

/// Admits a stream for the token with this id, within the caps.
#[derive(Message)]
#[rtype(result = "Result<Ticket, StreamRefused>")]
pub(crate) struct Admit(pub String);

/// A stream is gone.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Release(pub u64);

/// The token with this id was revoked (through this replica): its streams end now.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Revoked(pub String);

impl Handler<Admit> for StreamGate {
    type Result = Result<Ticket, StreamRefused>;
    fn handle(&mut self, Admit(token): Admit, ctx: &mut Self::Context) -> Self::Result {
        let id = self.book.admit(&token)?;
        let (tx, rx) = oneshot::channel();
        self.ends.insert(id, tx);
        Ok(Ticket { id, gate: ctx.address().recipient(), end: Some(rx) })
    }
}

impl Handler<Release> for StreamGate {
    type Result = ();
    fn handle(&mut self, Release(id): Release, _ctx: &mut Self::Context) {
        self.book.release(id);
        self.ends.remove(&id);
    }
}

impl Handler<Revoked> for StreamGate {
    type Result = ();
    fn handle(&mut self, Revoked(token): Revoked, _ctx: &mut Self::Context) {
        self.end(&std::collections::BTreeSet::from([token]));
    }
}
