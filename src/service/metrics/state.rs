//! The metrics' plain core: families on the `prometheus-client` crate, in one [`Registry`]
//! built once ([`MetricsBook::default`]), rendered as OpenMetrics text.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;

use actix_rt::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::registry::Registry;

use crate::model::{CapacityType, InstanceId};

/// Upper bounds of the latency histograms' buckets, in seconds.
pub(super) const BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Upper bounds of the pending-to-running histogram's buckets, in seconds.
pub(super) const START_BUCKETS: [f64; 10] = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// Upper bounds of the hand-over lead time histogram's buckets, in seconds (a spot warning
/// gives about two minutes; `0` counts the replacements that ran only after the warning's end).
pub(super) const LEAD_BUCKETS: [f64; 11] = [0.0, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0];

/// The `zone` label of `provisioner_instances_by_capacity` for an instance in no zone.
pub(crate) const NO_ZONE: &str = "none";

/// The content type of [`MetricsBook::render`]'s text.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The outcome of a start: the `outcome` label of `provisioner_start_outcomes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartOutcome {
    /// The machine got its instance.
    Started,
    /// The start failed for good.
    Failed,
}

impl StartOutcome {
    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            StartOutcome::Started => "started",
            StartOutcome::Failed => "failed",
        }
    }
}

type Labels = Vec<(String, String)>;
type HistFamily = Family<Labels, PromHistogram, fn() -> PromHistogram>;

fn latency() -> PromHistogram {
    PromHistogram::new(BUCKETS)
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), escape(v))).collect()
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What is read from the service's state at each scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Gauges {
    /// Machines by status.
    pub machines_by_status: BTreeMap<String, u64>,
    /// Machines by life.
    pub machines_by_life: BTreeMap<String, u64>,
    /// The simulated cloud's instances by state (terminated ones included).
    pub instances_by_state: BTreeMap<String, u64>,
    /// Worker pool size.
    pub workers: u64,
    /// Jobs running on the pool.
    pub jobs_in_flight: u64,
    /// Jobs waiting for a worker.
    pub jobs_queued: u64,
    /// Broker calls in flight.
    pub broker_in_flight: u64,
    /// The harvest mode in force.
    pub harvest_mode: String,
    /// The model's life.
    pub model_life: String,
    /// Seconds since the service started.
    pub uptime_seconds: f64,
    /// The client-side rate limiter: per API class, (current rate per second, calls waiting,
    /// calls the cloud throttled).
    pub rate_limits: BTreeMap<String, (f64, u64, u64)>,
    /// Operations the store has run (a scrape adds none: the state gauges above come from
    /// counts the store keeps as it writes).
    pub store_operations: u64,
    /// Event-stream clients dropped for falling behind.
    pub event_streams_dropped: u64,
    /// Finished spans the trace export dropped because its queue was full (issue 37).
    pub trace_spans_dropped: u64,
    /// The cloud's instances by zone ([`NO_ZONE`] for none) and capacity type (`spot`,
    /// `on-demand`), from [`CapacityBook::counts`].
    pub instances_by_capacity: BTreeMap<(String, &'static str), u64>,
}

/// The lease's families, registered when a replica first reports its role.
struct Lease {
    leader: Gauge,
    transitions: Counter,
}

/// Every family, in one registry.
pub(crate) struct MetricsBook {
    registry: Registry,
    http: Family<Labels, Counter>,
    http_latency: HistFamily,
    broker: Family<Labels, Counter>,
    broker_latency: HistFamily,
    broker_in_flight: Gauge,
    events: Family<Labels, Counter>,
    start_outcomes: Family<Labels, Counter>,
    time_to_running: PromHistogram,
    retries: Counter,
    audit_suppressed: Counter,
    harvest: Family<Labels, Counter>,
    interruptions: Counter,
    replacements: Counter,
    replacement_lead: PromHistogram,
    repairs: Family<Labels, Counter>,
    unhealthy: Counter,
    drift_replacements: Counter,
    drifted: Family<Labels, Gauge>,
    instances_by_capacity: Family<Labels, Gauge>,
    machines: Family<Labels, Gauge>,
    machines_by_life: Family<Labels, Gauge>,
    instances: Family<Labels, Gauge>,
    workers: Gauge,
    jobs_in_flight: Gauge,
    jobs_queued: Gauge,
    rate: Family<Labels, Gauge<f64, AtomicU64>>,
    rate_waiting: Family<Labels, Gauge>,
    throttled: Family<Labels, Counter>,
    harvest_mode: Family<Labels, Gauge>,
    model_life: Family<Labels, Gauge>,
    lease: Option<Lease>,
    uptime: Gauge<f64, AtomicU64>,
    store_operations: Counter,
    streams_dropped: Counter,
    spans_dropped: Counter,
    /// HTTP requests per route (for tests and `http_count`).
    http_counts: BTreeMap<String, u64>,
    /// Handles on the series the hot paths bump (see [`Handles`]).
    handles: Handles,
}

/// Handles on the series bumped at every broker call, event and start, by their labels: a
/// family's `get_or_create` takes owned labels, so each bump built and escaped them again (five
/// allocations a broker call); a handle shares its series with the family (the same atomic),
/// made at the series' first bump as before, so the rendered text is unchanged.
#[derive(Default)]
struct Handles {
    broker: std::collections::HashMap<(&'static str, &'static str), Counter>,
    broker_latency: std::collections::HashMap<&'static str, PromHistogram>,
    events: std::collections::HashMap<&'static str, Counter>,
    /// By zone, then outcome.
    start_outcomes: std::collections::HashMap<String, std::collections::HashMap<&'static str, Counter>>,
}

impl std::fmt::Debug for MetricsBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsBook").field("http_counts", &self.http_counts).finish_non_exhaustive()
    }
}

impl Default for MetricsBook {
    fn default() -> Self {
        let mut r = Registry::default();
        macro_rules! reg {
            ($name:expr, $help:expr, $m:expr) => {{
                let m = $m;
                r.register($name, $help, m.clone());
                m
            }};
        }
        // Counters are registered without `_total`: OpenMetrics adds it to the sample.
        let http =
            reg!("provisioner_http_requests", "HTTP requests by method, route and status code", Family::default());
        let http_latency = reg!(
            "provisioner_http_request_duration_seconds",
            "HTTP request latency by route",
            HistFamily::new_with_constructor(latency)
        );
        let broker = reg!(
            "provisioner_broker_calls",
            "Cloud broker calls by operation and result (ok, or the kind of failure)",
            Family::default()
        );
        let broker_latency = reg!(
            "provisioner_broker_call_duration_seconds",
            "Cloud broker call latency by operation",
            HistFamily::new_with_constructor(latency)
        );
        let broker_in_flight =
            reg!("provisioner_broker_calls_in_flight", "Cloud broker calls in flight", Gauge::default());
        let events = reg!("provisioner_events", "Provisioner events by name", Family::default());
        let start_outcomes = reg!(
            "provisioner_start_outcomes",
            "Machine starts by zone and outcome (started, failed; zone unknown when the event names none)",
            Family::default()
        );
        let time_to_running = reg!(
            "provisioner_time_to_running_seconds",
            "Time from a machine's addition (pending) to its instance running",
            PromHistogram::new(START_BUCKETS)
        );
        let audit_suppressed = reg!(
            "provisioner_audit_lines_suppressed",
            "Audit lines of requests refused for want of a valid token not written (past the rate per peer)",
            Counter::default()
        );
        let retries = reg!(
            "provisioner_retries",
            "Batches of machines with transient errors queued for another start",
            Counter::default()
        );
        let harvest = reg!(
            "provisioner_harvest_decisions",
            "Harvest decisions on instances by decision (stopped, spared_by_grace, held_back_by_cap, extra_instance)",
            Family::default()
        );
        let interruptions = reg!(
            "provisioner_interruptions",
            "Machines whose instance the cloud warned it takes away (spot interruptions; a replacement starts)",
            Counter::default()
        );
        let replacements = reg!(
            "provisioner_replacements",
            "Hand-overs done: a replacement runs and the interrupted instance is being stopped",
            Counter::default()
        );
        let replacement_lead = reg!(
            "provisioner_replacement_lead_seconds",
            "Time from a replacement running to the end of its interrupted instance's warning (0: ran after it)",
            PromHistogram::new(LEAD_BUCKETS)
        );
        let repairs = reg!(
            "provisioner_repairs",
            "Repairs of unhealthy machines by outcome: started (a replacement starts), replaced (it runs; the \
             old instance is being stopped), held (more unhealthy at once than repair-max-unhealthy: none repaired)",
            Family::default()
        );
        let unhealthy = reg!(
            "provisioner_unhealthy_machines",
            "Machines found unhealthy (an instance stopped longer than repair-after), each once per instance",
            Counter::default()
        );
        let drift_replacements = reg!(
            "provisioner_drift_replacements",
            "Drifted machines replaced (replace-drifted): the replacement runs, the drifted instance is being stopped",
            Counter::default()
        );
        let drifted = reg!(
            "provisioner_drifted_machines",
            "Machines whose instance has drifted, by reason (instance-type, image, zone, tags), as the leader's \
             last drift judgement showed them (at every listing while replace-drifted is on, else every 5 minutes)",
            Family::<Labels, Gauge>::default()
        );
        for reason in crate::model::drift::KINDS {
            drifted.get_or_create(&l(&[("reason", reason)])).set(0);
        }
        let instances_by_capacity = reg!(
            "provisioner_instances_by_capacity",
            "The cloud's instances by zone (none without one) and capacity type (spot, on-demand)",
            Family::default()
        );
        let machines = reg!("provisioner_machines", "Machines in the model by status", Family::default());
        let machines_by_life = reg!("provisioner_machines_by_life", "Machines in the model by life", Family::default());
        let instances = reg!("provisioner_instances", "The cloud's instances by state", Family::default());
        let workers = reg!("provisioner_workers", "Broker worker pool size", Gauge::default());
        let jobs_in_flight =
            reg!("provisioner_jobs_in_flight", "Start and stop jobs running on the pool", Gauge::default());
        let jobs_queued = reg!("provisioner_jobs_queued", "Start and stop jobs waiting for a worker", Gauge::default());
        let rate = reg!(
            "provisioner_rate_limit_per_second",
            "Client-side rate limit in force, by API class (adapted down when the cloud throttles)",
            Family::default()
        );
        let rate_waiting = reg!(
            "provisioner_rate_limit_waiting",
            "Cloud calls waiting for a rate-limit token, by API class",
            Family::default()
        );
        let throttled = reg!(
            "provisioner_throttled_calls",
            "Cloud calls refused with RequestLimitExceeded, by API class",
            Family::default()
        );
        let harvest_mode =
            reg!("provisioner_harvest_mode", "The harvest mode in force (1 for the mode in force)", Family::default());
        let model_life = reg!("provisioner_model_life", "The model's life (1 for its life)", Family::default());
        let uptime = reg!("provisioner_uptime_seconds", "Seconds since the service started", Gauge::default());
        let store_operations = reg!(
            "provisioner_store_operations",
            "Operations the database thread has run (reads and writes; a scrape runs none)",
            Counter::default()
        );
        let streams_dropped = reg!(
            "provisioner_event_streams_dropped",
            "Event-stream clients dropped because they fell too far behind",
            Counter::default()
        );
        let spans_dropped = reg!(
            "provisioner_trace_spans_dropped",
            "Finished spans the trace export dropped because its queue was full (0 with export off)",
            Counter::default()
        );
        Self {
            registry: r,
            http,
            http_latency,
            broker,
            broker_latency,
            broker_in_flight,
            events,
            start_outcomes,
            time_to_running,
            retries,
            audit_suppressed,
            harvest,
            interruptions,
            replacements,
            replacement_lead,
            repairs,
            unhealthy,
            drift_replacements,
            drifted,
            instances_by_capacity,
            machines,
            machines_by_life,
            instances,
            workers,
            jobs_in_flight,
            jobs_queued,
            rate,
            rate_waiting,
            throttled,
            harvest_mode,
            model_life,
            lease: None,
            uptime,
            store_operations,
            streams_dropped,
            spans_dropped,
            http_counts: BTreeMap::new(),
            handles: Handles::default(),
        }
    }
}

/// Sets a cumulative counter to `total` (counts kept elsewhere; never goes down).
fn catch_up(c: &Counter, total: u64) {
    let now = c.get();
    if total > now {
        c.inc_by(total - now);
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn set_by(family: &Family<Labels, Gauge>, key: &str, values: &BTreeMap<String, u64>) {
    family.clear();
    for (v, n) in values {
        family.get_or_create(&l(&[(key, v)])).set(to_i64(*n));
    }
}

impl MetricsBook {
    /// Counts one audit line not written (a refused request past its peer's rate).
    pub(crate) fn audit_suppressed(&mut self) {
        self.audit_suppressed.inc();
    }

    /// Counts one HTTP request on `route` (the matched pattern, not the raw path). `method`
    /// is one of a fixed set of labels (the caller maps the rest to `other`), `code` the
    /// status the service answered: every label takes a bounded set of values.
    pub(crate) fn http(&mut self, method: &'static str, route: &str, code: u16, seconds: f64) {
        self.http.get_or_create(&l(&[("method", method), ("route", route), ("code", &code.to_string())])).inc();
        self.http_latency.get_or_create(&l(&[("route", route)])).observe(seconds);
        *self.http_counts.entry(route.to_owned()).or_default() += 1;
    }

    /// Counts one broker call.
    /// `result` is `ok` or the kind of failure (`throttled`, `zone_specific`, ...).
    pub(crate) fn broker(&mut self, op: &'static str, result: &'static str, seconds: f64) {
        let family = &self.broker;
        let calls = self
            .handles
            .broker
            .entry((op, result))
            .or_insert_with(|| family.get_or_create(&l(&[("op", op), ("result", result)])).clone());
        calls.inc();
        let family = &self.broker_latency;
        let latency =
            self.handles.broker_latency.entry(op).or_insert_with(|| family.get_or_create(&l(&[("op", op)])).clone());
        latency.observe(seconds);
    }

    /// Counts one provisioner event.
    pub(crate) fn event(&mut self, name: &'static str) {
        let family = &self.events;
        let count =
            self.handles.events.entry(name).or_insert_with(|| family.get_or_create(&l(&[("event", name)])).clone());
        count.inc();
        if name == "retried-machines-with-errors" {
            self.retries.inc();
        }
    }

    /// Counts one start outcome in `zone` (`unknown` if none).
    pub(crate) fn start_outcome(&mut self, zone: Option<&str>, outcome: StartOutcome) {
        let zone = zone.unwrap_or("unknown");
        let by_outcome = match self.handles.start_outcomes.get_mut(zone) {
            Some(m) => m,
            None => self.handles.start_outcomes.entry(zone.to_owned()).or_default(),
        };
        let family = &self.start_outcomes;
        let count = by_outcome
            .entry(outcome.label())
            .or_insert_with(|| family.get_or_create(&l(&[("zone", zone), ("outcome", outcome.label())])).clone());
        count.inc();
    }

    /// Records a machine's time from pending to running.
    pub(crate) fn time_to_running(&mut self, seconds: f64) {
        self.time_to_running.observe(seconds);
    }

    /// Counts harvest decisions: `n` instances `decision` (`stopped`, `spared_by_grace`, `held_back_by_cap`,
    /// `extra_instance`).
    pub(crate) fn harvest(&mut self, decision: &'static str, n: u64) {
        self.harvest.get_or_create(&l(&[("decision", decision)])).inc_by(n);
    }

    /// Counts one machine whose instance the cloud warned it takes away (`machine-interrupted`).
    pub(crate) fn interrupted(&mut self) {
        self.interruptions.inc();
    }

    /// Counts one hand-over done (`machine-replaced`), and its lead time when known.
    pub(crate) fn replaced(&mut self, lead_seconds: Option<f64>) {
        self.replacements.inc();
        if let Some(s) = lead_seconds {
            self.replacement_lead.observe(s);
        }
    }

    /// Counts one repair outcome: `started`, `replaced` or `held` (issue 34).
    pub(crate) fn repair(&mut self, outcome: &'static str) {
        self.repairs.get_or_create(&l(&[("outcome", outcome)])).inc();
    }

    /// Counts one drifted machine replaced (`machine-replaced` of a drift replacement).
    pub(crate) fn drift_replaced(&mut self) {
        self.drift_replacements.inc();
    }

    /// The drifted machines by reason (`drift-seen`).
    pub(crate) fn drifted(&mut self, by_reason: &[(&'static str, usize)]) {
        for (reason, n) in by_reason {
            self.drifted.get_or_create(&l(&[("reason", reason)])).set(*n as i64);
        }
    }

    /// Counts one machine found unhealthy (`machine-unhealthy`).
    pub(crate) fn unhealthy(&mut self) {
        self.unhealthy.inc();
    }

    /// This replica's role (replicas on PostgreSQL only; the lease metrics appear with it).
    pub(crate) fn leader(&mut self, leader: bool, transition: bool) {
        let registry = &mut self.registry;
        let lease = self.lease.get_or_insert_with(|| {
            let lease = Lease { leader: Gauge::default(), transitions: Counter::default() };
            registry.register(
                "provisioner_leader",
                "1 while this replica holds the leader lease, else 0",
                lease.leader.clone(),
            );
            registry.register(
                "provisioner_leader_transitions",
                "Changes of this replica's role (leader to follower and back)",
                lease.transitions.clone(),
            );
            lease
        });
        lease.leader.set(i64::from(leader));
        if transition {
            lease.transitions.inc();
        }
    }

    /// The HTTP requests counted for `route`.
    #[cfg(test)]
    pub(crate) fn http_count(&self, route: &str) -> u64 {
        self.http_counts.get(route).copied().unwrap_or(0)
    }

    /// Everything, in the OpenMetrics text format ([`CONTENT_TYPE`]), ending in `# EOF`.
    pub(crate) fn render(&self, g: &Gauges) -> String {
        self.broker_in_flight.set(to_i64(g.broker_in_flight));
        set_by(&self.machines, "status", &g.machines_by_status);
        set_by(&self.machines_by_life, "life", &g.machines_by_life);
        set_by(&self.instances, "state", &g.instances_by_state);
        self.instances_by_capacity.clear();
        for ((zone, capacity), n) in &g.instances_by_capacity {
            self.instances_by_capacity.get_or_create(&l(&[("zone", zone), ("capacity", capacity)])).set(to_i64(*n));
        }
        self.workers.set(to_i64(g.workers));
        self.jobs_in_flight.set(to_i64(g.jobs_in_flight));
        self.jobs_queued.set(to_i64(g.jobs_queued));
        self.rate.clear();
        self.rate_waiting.clear();
        for (class, (rate, waiting, throttled)) in &g.rate_limits {
            let labels = l(&[("class", class)]);
            self.rate.get_or_create(&labels).set(*rate);
            self.rate_waiting.get_or_create(&labels).set(to_i64(*waiting));
            catch_up(&self.throttled.get_or_create(&labels), *throttled);
        }
        // No mode or life (the service's families alone, no model as `default`): no series.
        self.harvest_mode.clear();
        if !g.harvest_mode.is_empty() {
            self.harvest_mode.get_or_create(&l(&[("mode", &g.harvest_mode)])).set(1);
        }
        self.model_life.clear();
        if !g.model_life.is_empty() {
            self.model_life.get_or_create(&l(&[("life", &g.model_life)])).set(1);
        }
        self.uptime.set(g.uptime_seconds);
        catch_up(&self.store_operations, g.store_operations);
        catch_up(&self.streams_dropped, g.event_streams_dropped);
        catch_up(&self.spans_dropped, g.trace_spans_dropped);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// What one listing says of one instance: its id, zone and capacity type (when the cloud says).
pub(crate) type ListedInstance = (InstanceId, Option<String>, Option<CapacityType>);

/// One instance counted by [`CapacityBook`].
#[derive(Debug, Clone)]
struct Counted {
    zone: Option<String>,
    /// `None`: no listing nor start said (counted as on-demand).
    capacity: Option<CapacityType>,
    /// When a start answered it (`None`: seen in a listing since).
    started: Option<Instant>,
}

/// The cloud's instances by zone and capacity type (`provisioner_instances_by_capacity`), kept
/// from what the metered broker sees: each listing of the cloud replaces the view, a start
/// answered adds its instance, a stop or release answered removes its instances, so the gauge
/// follows the service's own changes between listings (made at each batch and resync). A
/// listing that does not say what capacity an instance runs on (the simulated cloud's, LXD's)
/// keeps what its start answered (as the registry does); unknown either way (an instance
/// listed but not started by this process: after a restart, or started by another
/// replica) it counts as on-demand.
#[derive(Debug, Default)]
pub(crate) struct CapacityBook {
    instances: HashMap<InstanceId, Counted>,
    /// Instances stopped or released, and when the call was answered (until a listing begun
    /// after that).
    gone: HashMap<InstanceId, Instant>,
}

impl CapacityBook {
    /// A start answered at `at`: its instance runs in `zone` on `capacity`.
    pub(crate) fn started(
        &mut self,
        id: InstanceId,
        zone: Option<String>,
        capacity: Option<CapacityType>,
        at: Instant,
    ) {
        self.gone.remove(&id);
        self.instances.insert(id, Counted { zone, capacity, started: Some(at) });
    }

    /// A stop or release of `ids` answered at `at`: they are no longer counted.
    pub(crate) fn gone(&mut self, ids: &[InstanceId], at: Instant) {
        for id in ids {
            self.instances.remove(id);
            self.gone.insert(id.clone(), at);
        }
    }

    /// A listing of every instance (terminated ones left out), whose call was made at `at`:
    /// the instances started after `at` (not in it yet) stay, those stopped after `at` (still
    /// in it) are left out.
    pub(crate) fn listed(&mut self, list: Vec<ListedInstance>, at: Instant) {
        let mut before = std::mem::take(&mut self.instances);
        for (id, zone, capacity) in list {
            if self.gone.get(&id).is_some_and(|g| *g >= at) {
                continue;
            }
            let known = before.remove(&id).and_then(|c| c.capacity);
            self.instances.insert(id, Counted { zone, capacity: capacity.or(known), started: None });
        }
        self.instances.extend(before.into_iter().filter(|(_, c)| c.started.is_some_and(|s| s >= at)));
        self.gone.retain(|_, g| *g >= at);
    }

    /// The instances by zone ([`NO_ZONE`] for none) and capacity type; every zone with an
    /// instance has both capacity types (0 when it has none of one).
    pub(crate) fn counts(&self) -> BTreeMap<(String, &'static str), u64> {
        let mut by_zone: BTreeMap<&str, [u64; 2]> = BTreeMap::new();
        for c in self.instances.values() {
            let n = by_zone.entry(c.zone.as_deref().unwrap_or(NO_ZONE)).or_default();
            n[usize::from(c.capacity == Some(CapacityType::Spot))] += 1;
        }
        let mut out = BTreeMap::new();
        for (zone, [on_demand, spot]) in by_zone {
            out.insert((zone.to_owned(), CapacityType::OnDemand.as_str()), on_demand);
            out.insert((zone.to_owned(), CapacityType::Spot.as_str()), spot);
        }
        out
    }
}
