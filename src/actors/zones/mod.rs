//! The availability-zone allocator actor: owns which machines are in (or reserved for) each zone,
//! which zones failed for which machine this round, and which zones a machine may never use;
//! chooses zones (never an unavailable one) and fails over between them on zone-specific failures.
//!
//! Choice is O(zones + distribution-group size): lowest population first, ties broken by a
//! seeded RNG, so a seed reproduces every placement.

mod actor;
mod messages;
mod state;
#[cfg(test)]
mod tests;

pub use actor::ZoneAllocator;
pub use messages::{
    ChooseZone, GetZoneSnapshot, MarkZoneFailed, PopulateZones, RefreshZones, ReleaseMachine, ReleaseReservation,
    RememberCapacity,
};
pub use state::{ZoneBook, ZoneError, ZoneSnapshot, ZoneView};
