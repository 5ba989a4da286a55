//! The zone allocator actor: a thin shell over [`ZoneBook`].

use std::sync::Arc;

use actix::prelude::*;

use super::messages::*;
use super::state::{ZoneBook, ZoneSnapshot};
use crate::ports::{Broker, BrokerError};

/// Owns the zone book.
pub struct ZoneAllocator {
    book: ZoneBook,
    epoch: actix_rt::time::Instant,
    broker: Arc<dyn Broker>,
    refresh_interval: std::time::Duration,
}

impl ZoneAllocator {
    /// An allocator over this broker, with a seeded tie-breaker, re-reading the zone list every
    /// `refresh_interval` (the zone list only, as Juju does for later batches) once it was first
    /// loaded.
    pub fn new(broker: Arc<dyn Broker>, seed: u64, refresh_interval: std::time::Duration) -> Self {
        Self { book: ZoneBook::new(seed), epoch: actix_rt::time::Instant::now(), broker, refresh_interval }
    }

    /// The same allocator with a capacity memory (see [`ZoneBook::with_capacity_memory`]).
    pub fn with_capacity_memory(mut self, memory: std::time::Duration) -> Self {
        self.book = self.book.with_capacity_memory(memory);
        self
    }

    fn tick(&mut self) {
        self.book.set_clock(self.epoch.elapsed());
    }

    fn schedule_refresh(&self, ctx: &mut Context<Self>) {
        // Zones that cannot change are not asked for again: no timer.
        if !self.broker.supports_zones() || !self.broker.zones_change() {
            return;
        }
        ctx.run_later(self.refresh_interval, |act, ctx| {
            let call = act.broker.availability_zones();
            ctx.spawn(call.into_actor(act).map(|res, act, ctx| {
                match res {
                    Ok(zones) => act.apply(zones),
                    Err(e) => tracing::warn!(error = %e, "refreshing availability zones failed; keeping the last list"),
                }
                act.schedule_refresh(ctx);
            }));
        });
    }

    fn apply(&mut self, zones: Vec<crate::ports::AvailabilityZone>) {
        let list: Vec<(String, bool)> = zones.into_iter().map(|z| (z.name, z.available)).collect();
        self.book.update_zones(&list);
    }
}

impl Actor for ZoneAllocator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::actors::unlimited_mailbox(ctx);
        self.schedule_refresh(ctx);
    }
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
                act.apply(zones);
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
        self.tick();
        self.book.choose(&msg.machine, msg.request)
    }
}

impl Handler<MarkZoneFailed> for ZoneAllocator {
    type Result = MessageResult<MarkZoneFailed>;
    fn handle(&mut self, msg: MarkZoneFailed, _ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        if let Some(shape) = &msg.shape {
            self.book.remember_capacity(shape, &msg.zone);
        }
        MessageResult(self.book.mark_failed(&msg.machine, &msg.zone))
    }
}

impl Handler<RememberCapacity> for ZoneAllocator {
    type Result = ();
    fn handle(&mut self, msg: RememberCapacity, _ctx: &mut Self::Context) {
        self.tick();
        self.book.remember_capacity(&msg.shape, &msg.zone);
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
