//! The metrics actor: owns the [`MetricsBook`].

use actix::prelude::*;

use super::messages::{BrokerCallDone, HttpDone, LeaderChanged, Render};
use super::state::MetricsBook;
use crate::model::events::ProvisionerEvent;
use crate::service::store::{CountsChanged, StoreCounts};

/// Owns the counters; everything that counts sends it a message. The state gauges come from
/// the counts the store publishes after its writes (a scrape reads no table).
#[derive(Default)]
pub struct Metrics {
    book: MetricsBook,
    counts: StoreCounts,
}

impl Handler<CountsChanged> for Metrics {
    type Result = ();
    fn handle(&mut self, m: CountsChanged, _ctx: &mut Self::Context) {
        self.counts = m.0;
    }
}

impl Actor for Metrics {
    type Context = Context<Self>;
}

impl Handler<HttpDone> for Metrics {
    type Result = ();
    fn handle(&mut self, m: HttpDone, _ctx: &mut Self::Context) {
        self.book.http(m.method, &m.route, m.code, m.seconds);
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

impl Handler<LeaderChanged> for Metrics {
    type Result = ();
    fn handle(&mut self, m: LeaderChanged, _ctx: &mut Self::Context) {
        self.book.leader(m.leader, m.transition);
    }
}

impl Handler<Render> for Metrics {
    type Result = String;
    fn handle(&mut self, m: Render, _ctx: &mut Self::Context) -> String {
        let mut g = m.0;
        g.machines_by_status = self.counts.machines_by_status.clone();
        g.machines_by_life = self.counts.machines_by_life.clone();
        g.instances_by_state = self.counts.instances_by_state.clone();
        g.model_life = self.counts.model_life.clone();
        self.book.render(&g)
    }
}
