//! The model's vocabulary, shared by every layer: identifiers, lives, statuses, constraints,
//! harvest modes, the cloud's view of an instance ([`types`], re-exported here), the events
//! the provisioner publishes ([`events`]), and the instance-type catalogue with its per-type
//! capacity fail-over ([`instance_types`]), the leader's fence as a plain decision ([`lease`]), the flat multimap the books index instances
//! with ([`multimap`]), and when the books' growing maps are rebuilt packed ([`packing`]).
//!
//! Everything here is plain data with no actix import; every other module may use it, and it
//! uses nothing above it.

pub mod capacity;
pub mod constraints;
pub mod drift;
pub mod events;
pub mod instance_types;
pub mod lease;
pub mod multimap;
pub mod packing;
pub mod placement;
pub mod seeded;
pub mod types;

pub use capacity::{CapacityError, CapacityPreference, CapacityType, UsdPerHour};
pub use constraints::ConstraintsError;
pub use events::ProvisionerEvent;
pub use lease::{Fence, HeldLease};
pub use multimap::MultiMap;
pub use packing::{repack, Packing};
pub use placement::{check_application_name, Placement, PlacementError};
pub use types::*;
