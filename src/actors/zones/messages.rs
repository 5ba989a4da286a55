//! Messages the zone allocator handles.

use actix::Message;

use super::state::{ZoneError, ZoneRequest, ZoneSnapshot};
use crate::model::FailOutcome;
use crate::model::MachineId;
use crate::ports::BrokerError;

/// Re-read the cloud's zone list. Answers `Ok(false)` for a zoneless cloud.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<bool, BrokerError>")]
pub struct RefreshZones;

/// Count these machines in these zones (instances that already exist).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct PopulateZones {
    /// Machine and the zone of its instance.
    pub placements: Vec<(MachineId, String)>,
}

/// Choose and reserve a zone for a machine.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<String>, ZoneError>")]
pub struct ChooseZone {
    /// The machine.
    pub machine: MachineId,
    /// Its constraints, derived zones and distribution group.
    pub request: ZoneRequest,
}

/// A start failed because of its zone.
#[derive(Debug, Clone, Message)]
#[rtype(result = "FailOutcome")]
pub struct MarkZoneFailed {
    /// The machine.
    pub machine: MachineId,
    /// The zone that failed.
    pub zone: String,
    /// The machine's shape (see [`ZoneRequest::shape`]), for the capacity memory.
    pub shape: Option<String>,
}

/// A zone is short of capacity for a shape though no start failed there (issue 33: the cloud
/// warned that it takes a spot instance of the shape away there): machines of the shape avoid
/// the zone for the capacity memory's length.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RememberCapacity {
    /// The shape (see [`ZoneRequest::shape`]; a spot start's ends in ` capacity=spot`).
    pub shape: String,
    /// The zone.
    pub zone: String,
}

/// A start failed for a reason unrelated to its zone: drop the reservation.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ReleaseReservation {
    /// The machine.
    pub machine: MachineId,
}

/// The machine is gone or failed for good: forget it everywhere.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ReleaseMachine {
    /// The machine.
    pub machine: MachineId,
}

/// A copy of the zone book.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ZoneSnapshot")]
pub struct GetZoneSnapshot;

impl ZoneSnapshot {
    /// The zone a machine is placed in.
    pub fn zone_of(&self, machine: &MachineId) -> Option<&str> {
        self.zones.iter().find(|z| z.machines.contains(machine)).map(|z| z.name.as_str())
    }
}
