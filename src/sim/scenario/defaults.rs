//! The defaults of the scenario file: what a key that is left out means. Most are the
//! provisioner's own defaults (`crate::config`), so a scenario that says nothing runs the
//! provisioner as a deployment would.

use std::time::Duration;

use super::units::Dur;

/// The age of a pre-existing instance whose `age` is not given.
pub const PRE_EXISTING_AGE: Duration = Duration::from_secs(24 * 3600);

pub(super) fn default_until() -> Dur {
    Dur(Duration::from_secs(3600))
}
pub(super) fn default_retry_count() -> u32 {
    crate::config::DEFAULT_RETRY_COUNT
}
pub(super) fn default_retry_delay() -> Dur {
    Dur(crate::config::DEFAULT_RETRY_DELAY)
}
pub(super) fn default_resync() -> Dur {
    Dur(crate::config::DEFAULT_RESYNC_INTERVAL)
}
pub(super) fn default_reuse_window() -> Dur {
    Dur(crate::config::DEFAULT_REUSE_WINDOW)
}
pub(super) fn default_harvest_grace() -> Dur {
    Dur(crate::config::DEFAULT_HARVEST_GRACE)
}
pub(super) fn default_harvest_max_stops() -> usize {
    crate::config::DEFAULT_HARVEST_MAX_STOPS
}
pub(super) fn default_capacity_memory() -> Dur {
    Dur(crate::config::DEFAULT_CAPACITY_MEMORY)
}
pub(super) fn default_batch_size() -> usize {
    crate::config::DEFAULT_BATCH_SIZE
}
pub(super) fn is_default_batch_size(n: &usize) -> bool {
    *n == crate::config::DEFAULT_BATCH_SIZE
}
pub(super) fn default_times() -> u32 {
    1
}
pub(crate) fn default_fault_message() -> String {
    "injected failure".into()
}
pub(super) fn is_false(b: &bool) -> bool {
    !*b
}
