//! Actor-level tests: the real actors against the fake cloud and fake model, on a paused
//! clock. Each test is named after the behaviour it proves; the Juju test or rule it ports is
//! named in its doc comment.

mod contract;
mod harvesting;
mod idle;
mod interruptions;
mod resilience;
mod safety;
mod seeds;
mod spot;
mod starting;
mod support;
mod unreachable;
mod zones;
