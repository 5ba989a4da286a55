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

pub use actor::{CloudCountsTo, Metrics};
pub use messages::{
    AuditSuppressed, BrokerCallDone, CloudCounts, HttpDone, LeaderChanged, MachinesPending, Render, RenderService,
};
pub use metered::MeteredBroker;
pub use state::{Gauges, Histogram, MetricsBook, CONTENT_TYPE};
