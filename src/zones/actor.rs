//! The zone allocator actor: a thin shell over [`ZoneBook`].

use std::sync::Arc;

use actix::prelude::*;

use super::messages::*;
use super::state::ZoneBook;
use crate::ports::{Broker, BrokerError};

/// Owns the zone book.
pub struct ZoneAllocator {
    book: ZoneBook,
    broker: Arc<dyn Broker>,
}

impl ZoneAllocator {
    /// An allocator over this broker, with a seeded tie-breaker.
    pub fn new(broker: Arc<dyn Broker>, seed: u64) -> Self {
        Self { book: ZoneBook::new(seed), broker }
    }
}

impl Actor for ZoneAllocator {
    type Context = Context<Self>;
}

impl Handler<RefreshZones> for ZoneAllocator {
    type Result = ResponseActFuture<Self, Result<bool, BrokerError>>;

    fn handle(&mut self, _msg: RefreshZones, _ctx: &mut Self::Context) -> Self::Result {
        if !self.broker.supports_zones() {
            return Box::pin(fut::ready(Ok(false)));
        }
        let call = self.broker.availability_zones();
        Box::pin(call.into_actor(self).map(|res, act, _ctx| match res {
            Ok(zones) => {
                let list: Vec<(String, bool)> = zones.into_iter().map(|z| (z.name, z.available)).collect();
                act.book.update_zones(&list);
                Ok(act.book.is_zoned())
            }
            Err(BrokerError::NotSupported(_)) => Ok(false),
            Err(e) => Err(e),
        }))
    }
}

impl Handler<PopulateZones> for ZoneAllocator {
    type Result = ();
    fn handle(&mut self, msg: PopulateZones, _ctx: &mut Self::Context) {
        self.book.populate(&msg.placements);
    }
}

impl Handler<ChooseZone> for ZoneAllocator {
    type Result = Result<Option<String>, super::ZoneError>;
    fn handle(&mut self, msg: ChooseZone, _ctx: &mut Self::Context) -> Self::Result {
        self.book.choose(&msg.machine, msg.request)
    }
}

impl Handler<MarkZoneFailed> for ZoneAllocator {
    type Result = MessageResult<MarkZoneFailed>;
    fn handle(&mut self, msg: MarkZoneFailed, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.mark_failed(&msg.machine, &msg.zone))
    }
}

impl Handler<ReleaseReservation> for ZoneAllocator {
    type Result = ();
    fn handle(&mut self, msg: ReleaseReservation, _ctx: &mut Self::Context) {
        self.book.release_reservation(&msg.machine);
    }
}

impl Handler<ReleaseMachine> for ZoneAllocator {
    type Result = ();
    fn handle(&mut self, msg: ReleaseMachine, _ctx: &mut Self::Context) {
        self.book.release(&msg.machine);
    }
}

impl Handler<GetZoneSnapshot> for ZoneAllocator {
    type Result = MessageResult<GetZoneSnapshot>;
    fn handle(&mut self, _msg: GetZoneSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(ZoneSnapshot { zones: self.book.view() })
    }
}
