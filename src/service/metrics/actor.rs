//! The metrics actor: owns the [`MetricsBook`].

use actix::prelude::*;

use super::messages::{BrokerCallDone, HttpDone, Render};
use super::state::MetricsBook;
use crate::events::ProvisionerEvent;

/// Owns the counters; everything that counts sends it a message.
#[derive(Default)]
pub struct Metrics {
    book: MetricsBook,
}

impl Actor for Metrics {
    type Context = Context<Self>;
}

impl Handler<HttpDone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: HttpDone, _ctx: &mut Self::Context) {
        self.book.http(&m.method, &m.route, m.code, m.seconds);
    }
}

impl Handler<BrokerCallDone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: BrokerCallDone, _ctx: &mut Self::Context) {
        self.book.broker(m.op, m.result, m.seconds);
    }
}

impl Handler<ProvisionerEvent> for Metrics {
    type Result = ();
    fn handle(&mut self, e: ProvisionerEvent, _ctx: &mut Self::Context) {
        self.book.event(e.name());
    }
}

impl Handler<Render> for Metrics {
    type Result = String;
    fn handle(&mut self, m: Render, _ctx: &mut Self::Context) -> String {
        self.book.render(&m.0)
    }
}
