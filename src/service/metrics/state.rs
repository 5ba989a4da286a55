//! The metrics' plain core: counters, histograms and the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Upper bounds of the latency histograms' buckets, in seconds.
pub const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A latency histogram with fixed buckets (`BUCKETS`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            self.counts[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

/// What is read from the service's state at each scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
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
}

/// Every counter and histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsBook {
    http: BTreeMap<(&'static str, String, u16), u64>,
    http_latency: BTreeMap<String, Histogram>,
    broker: BTreeMap<(&'static str, &'static str), u64>,
    broker_latency: BTreeMap<&'static str, Histogram>,
    events: BTreeMap<&'static str, u64>,
    /// With replicas: whether this replica leads, and its transitions so far.
    lease: Option<(bool, u64)>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl MetricsBook {
    /// Counts one HTTP request on `route` (the matched pattern, not the raw path). `method`
    /// is one of a fixed set of labels (the caller maps the rest to `other`), `code` the
    /// status the service answered: every label takes a bounded set of values.
    pub fn http(&mut self, method: &'static str, route: &str, code: u16, seconds: f64) {
        *self.http.entry((method, route.to_owned(), code)).or_default() += 1;
        self.http_latency.entry(route.to_owned()).or_default().observe(seconds);
    }

    /// Counts one broker call.
    /// `result` is `ok` or the kind of failure (`throttled`, `zone_specific`, ...).
    pub fn broker(&mut self, op: &'static str, result: &'static str, seconds: f64) {
        *self.broker.entry((op, result)).or_default() += 1;
        self.broker_latency.entry(op).or_default().observe(seconds);
    }

    /// Counts one provisioner event.
    pub fn event(&mut self, name: &'static str) {
        *self.events.entry(name).or_default() += 1;
    }

    /// This replica's role (replicas on PostgreSQL only; the lease metrics appear with it).
    pub fn leader(&mut self, leader: bool, transition: bool) {
        let (l, n) = self.lease.get_or_insert((false, 0));
        *l = leader;
        if transition {
            *n += 1;
        }
    }

    /// The HTTP requests counted for `route`.
    pub fn http_count(&self, route: &str) -> u64 {
        self.http.iter().filter(|((_, r, _), _)| r == route).map(|(_, n)| n).sum()
    }

    /// Everything, in Prometheus' text exposition format (version 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "provisioner_http_requests_total",
            "counter",
            "HTTP requests by method, route and status code.",
        );
        for ((method, route, code), n) in &self.http {
            let _ = writeln!(
                out,
                "provisioner_http_requests_total{{method=\"{}\",route=\"{}\",code=\"{code}\"}} {n}",
                escape(method),
                escape(route)
            );
        }
        header(&mut out, "provisioner_http_request_duration_seconds", "histogram", "HTTP request latency by route.");
        for (route, h) in &self.http_latency {
            h.render(&mut out, "provisioner_http_request_duration_seconds", &format!("route=\"{}\"", escape(route)));
        }
        header(
            &mut out,
            "provisioner_broker_calls_total",
            "counter",
            "Cloud broker calls by operation and result (ok, or the kind of failure).",
        );
        for ((op, result), n) in &self.broker {
            let _ = writeln!(out, "provisioner_broker_calls_total{{op=\"{op}\",result=\"{result}\"}} {n}");
        }
        header(
            &mut out,
            "provisioner_broker_call_duration_seconds",
            "histogram",
            "Cloud broker call latency by operation.",
        );
        for (op, h) in &self.broker_latency {
            h.render(&mut out, "provisioner_broker_call_duration_seconds", &format!("op=\"{op}\""));
        }
        header(&mut out, "provisioner_broker_calls_in_flight", "gauge", "Cloud broker calls in flight.");
        let _ = writeln!(out, "provisioner_broker_calls_in_flight {}", g.broker_in_flight);
        header(&mut out, "provisioner_events_total", "counter", "Provisioner events by name.");
        for (name, n) in &self.events {
            let _ = writeln!(out, "provisioner_events_total{{event=\"{name}\"}} {n}");
        }
        header(&mut out, "provisioner_machines", "gauge", "Machines in the model by status.");
        for (status, n) in &g.machines_by_status {
            let _ = writeln!(out, "provisioner_machines{{status=\"{}\"}} {n}", escape(status));
        }
        header(&mut out, "provisioner_machines_by_life", "gauge", "Machines in the model by life.");
        for (life, n) in &g.machines_by_life {
            let _ = writeln!(out, "provisioner_machines_by_life{{life=\"{}\"}} {n}", escape(life));
        }
        header(&mut out, "provisioner_instances", "gauge", "The cloud's instances by state.");
        for (state, n) in &g.instances_by_state {
            let _ = writeln!(out, "provisioner_instances{{state=\"{}\"}} {n}", escape(state));
        }
        header(&mut out, "provisioner_workers", "gauge", "Broker worker pool size.");
        let _ = writeln!(out, "provisioner_workers {}", g.workers);
        header(&mut out, "provisioner_jobs_in_flight", "gauge", "Start and stop jobs running on the pool.");
        let _ = writeln!(out, "provisioner_jobs_in_flight {}", g.jobs_in_flight);
        header(&mut out, "provisioner_jobs_queued", "gauge", "Start and stop jobs waiting for a worker.");
        let _ = writeln!(out, "provisioner_jobs_queued {}", g.jobs_queued);
        type Pick = fn(&(f64, u64, u64)) -> String;
        let limiter: [(&str, &str, &str, Pick); 3] = [
            (
                "provisioner_rate_limit_per_second",
                "gauge",
                "Client-side rate limit in force, by API class (adapted down when the cloud throttles).",
                |c| c.0.to_string(),
            ),
            (
                "provisioner_rate_limit_waiting",
                "gauge",
                "Cloud calls waiting for a rate-limit token, by API class.",
                |c| c.1.to_string(),
            ),
            (
                "provisioner_throttled_calls_total",
                "counter",
                "Cloud calls refused with RequestLimitExceeded, by API class.",
                |c| c.2.to_string(),
            ),
        ];
        for (name, kind, help, pick) in limiter {
            header(&mut out, name, kind, help);
            for (class, c) in &g.rate_limits {
                let _ = writeln!(out, "{name}{{class=\"{}\"}} {}", escape(class), pick(c));
            }
        }
        header(&mut out, "provisioner_harvest_mode", "gauge", "The harvest mode in force (1 for the mode in force).");
        let _ = writeln!(out, "provisioner_harvest_mode{{mode=\"{}\"}} 1", escape(&g.harvest_mode));
        header(&mut out, "provisioner_model_life", "gauge", "The model's life (1 for its life).");
        let _ = writeln!(out, "provisioner_model_life{{life=\"{}\"}} 1", escape(&g.model_life));
        if let Some((leader, transitions)) = self.lease {
            header(&mut out, "provisioner_leader", "gauge", "1 while this replica holds the leader lease, else 0.");
            let _ = writeln!(out, "provisioner_leader {}", u8::from(leader));
            header(
                &mut out,
                "provisioner_leader_transitions_total",
                "counter",
                "Changes of this replica's role (leader to follower and back).",
            );
            let _ = writeln!(out, "provisioner_leader_transitions_total {transitions}");
        }
        header(&mut out, "provisioner_uptime_seconds", "gauge", "Seconds since the service started.");
        let _ = writeln!(out, "provisioner_uptime_seconds {:.3}", g.uptime_seconds);
        header(
            &mut out,
            "provisioner_store_operations_total",
            "counter",
            "Operations the database thread has run (reads and writes; a scrape runs none).",
        );
        let _ = writeln!(out, "provisioner_store_operations_total {}", g.store_operations);
        header(
            &mut out,
            "provisioner_event_streams_dropped_total",
            "counter",
            "Event-stream clients dropped because they fell too far behind.",
        );
        let _ = writeln!(out, "provisioner_event_streams_dropped_total {}", g.event_streams_dropped);
        out
    }
}
