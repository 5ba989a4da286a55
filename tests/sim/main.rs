//! The simulator end to end: determinism, the property test over random scenarios, and the
//! scenario files under `tests/scenarios/` with their expected outcomes.

mod batching;
mod bench;
mod checker;
mod cost;
mod files;
mod plan;
mod property;
