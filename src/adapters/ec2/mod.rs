//! The EC2 broker (feature `ec2`): the [`Broker`](crate::ports::Broker) port over the AWS SDK
//! for Rust, for EC2 or an EC2-compatible endpoint.
//!
//! - Zones: `DescribeAvailabilityZones`; only zones in state `available` take new instances.
//!   `derive_availability_zones`: `zone=NAME` pins that zone; `subnet=ID` (or the configured
//!   subnet) the subnet's zone from `DescribeSubnets`, an unknown subnet being the machine's
//!   zone-independent provisioning error.
//! - Starts: `RunInstances` of one instance with `Placement.AvailabilityZone`, the configured
//!   image (and optional subnet and security groups; a `subnet=ID` placement's subnet wins as
//!   `SubnetId`), a `ClientToken` derived from the
//!   provisioner's per-attempt token (so a retried call returns the instance the first one
//!   made), and `TagSpecifications` carrying the model uuid, the machine id and the start
//!   nonce ([`TAG_MODEL`], [`TAG_MACHINE`], [`TAG_START`]), the model's tags and the `tags=`
//!   constraint ([`constraint_tags`]).
//! - Capacity types (issue 33): a spot call (`StartInstanceParams::capacity`) launches with
//!   `InstanceMarketOptions` (one-time spot, terminated when EC2 takes it back, `MaxPrice` from
//!   the call's spot price cap); the per-type fail-over remembers spot and on-demand capacity
//!   apart; listings say each instance's capacity type (`InstanceLifecycle`).
//!   `InsufficientInstanceCapacity` and `SpotMaxPriceTooLow` for spot are zone-specific (no spot
//!   capacity there), so a `prefer-spot` machine tries spot in every allowed zone, then
//!   on-demand.
//! - Interruption notices ([`InterruptionQueue`], with `interruption_queue` set): EC2's spot
//!   interruption warnings, rebalance recommendations and terminations, read from the SQS queue
//!   EventBridge delivers them to (one long poll per `interruption_notices`), each deleted once
//!   acted on (`acknowledge_notices`); `supports_interruptions` is true when the queue is
//!   configured, and the provisioner then hands a warned machine over to a replacement.
//! - Instance types: a machine without hardware constraints gets the configured type
//!   (`--ec2-instance-type`; without one, the cheapest `amd64` type with 1 GiB); one with
//!   `arch`/`cores`/`mem` the cheapest type that satisfies them, from `DescribeInstanceTypes`
//!   (read once per broker) priced by the shipped table; `instance-type=` that type only (see
//!   [`crate::model::instance_types`]). `root-disk=` sizes the root volume
//!   (`BlockDeviceMappings` on the image's root device, [`DEFAULT_ROOT_DEVICE`] if unknown).
//! - Capacity fail-over per type: `InsufficientInstanceCapacity` (any zone-specific error) for
//!   one type in a zone makes the start try the next satisfying type in the same zone (at most
//!   [`DEFAULT_TYPES_PER_ZONE`]), each under its own client token (the start's token for the
//!   best type, `<token>/<type>` for the others, so a retried call repeats exactly); the pair is
//!   tried last for [`DEFAULT_CAPACITY_MEMORY`]. Only when every type failed there does the
//!   start fail zone-specifically and the provisioner move zone.
//! - Batched starts (`batches_starts()` is true): `start_instances` is ONE `RunInstances` with
//!   `MinCount` 1 and `MaxCount` the members, one `ClientToken` derived from the batch's token
//!   (per type, as above), and `TagSpecifications` carrying the model, the batch token
//!   ([`TAG_BATCH`]) and the shared tags; the instance with `AmiLaunchIndex` i is member i's
//!   and gets its machine, start and `Name` tags by `CreateTags` (tried again while EC2 does
//!   not see it yet). A member left out of a partial launch fails zone-specifically; one whose
//!   tagging failed is answered ambiguously, and its look-up (`instances_of_start`) tags the
//!   instance first. A repeated batch gets the first call's reservation from EC2 and is tagged
//!   again (no change). See `docs/batched-starts.md`.
//! - Listings: `DescribeInstances` filtered by our model tag and the states pending, running,
//!   stopping and stopped, every page. Instances without our model tag are never listed, so
//!   they can never be adopted or harvested.
//! - Stops: `TerminateInstances` in batches of 1,000 (an instance already gone is not an
//!   error). `StopInstances` is never used to mean "remove".
//! - Released instances lose the model tag (`DeleteTags`); reuse re-tags (`CreateTags`).
//! - Errors: see [`classify`]. Throttling becomes [`BrokerError::Throttled`] (the client-side
//!   limiter slows down), capacity and zone problems zone-specific, auth and quota problems
//!   zone-independent, with AWS's message on the machine's status.
//!
//! [`BrokerError::Throttled`]: crate::ports::BrokerError::Throttled

mod broker;
mod config;
mod errors;
mod interruptions;
mod memory;
#[cfg(test)]
mod tests;

pub use broker::{
    client_token, constraint_tags, placement_subnet, root_disk_gib, Ec2Broker, DEFAULT_ROOT_DEVICE, TAG_BATCH,
    TAG_CONSTRAINT_PREFIX, TAG_MACHINE, TAG_MODEL, TAG_START,
};
pub use config::{Ec2Config, Ec2ConfigError, DEFAULT_CAPACITY_MEMORY, DEFAULT_TYPES_PER_ZONE};
pub use errors::classify;
pub use interruptions::{parse_event, InterruptionQueue, Notice, NoticeKind, INTERRUPTION_NOTICE, MAX_WAIT};
