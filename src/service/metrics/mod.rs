//! Metrics: counters and latency histograms of HTTP requests, broker calls and provisioner
//! events, rendered with the state gauges on the `prometheus-client` crate in OpenMetrics text (`GET /metrics`).
//!
//! [`MetricsBook`] is the plain core (counting and rendering, unit-tested); [`Metrics`] the
//! actor that owns it; everything that counts sends it a message. [`MeteredBroker`] wraps the
//! service's broker to time its calls and count those in flight (which graceful shutdown
//! waits for).

mod actor;
mod messages;
mod metered;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use actor::{CloudCountsTo, Metrics};
#[cfg(feature = "postgres")]
pub(crate) use messages::LeaderChanged;
pub(crate) use messages::{AuditSuppressed, HttpDone, MachinesPending, Render, RenderService};
pub(crate) use metered::MeteredBroker;
pub(crate) use state::{Gauges, CONTENT_TYPE};
