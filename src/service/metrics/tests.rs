//! Unit tests of the metrics core.

use super::state::{Gauges, MetricsBook, StartOutcome};

/// Asserts that the rendered `text` contains every one of `samples`.
fn assert_contains_all(text: &str, samples: &[&str]) {
    for sample in samples {
        assert!(text.contains(sample), "{sample} is not in:\n{text}");
    }
}

#[test]
fn histogram_buckets_are_cumulative_and_count_everything() {
    let mut book = MetricsBook::default();
    book.broker("start_instance", "ok", 0.0005);
    book.broker("start_instance", "ok", 0.2);
    book.broker("start_instance", "throttled", 100.0);
    let text = book.render(&Gauges::default());
    assert_contains_all(
        &text,
        &[
            "provisioner_broker_call_duration_seconds_bucket{le=\"0.001\",op=\"start_instance\"} 1",
            "provisioner_broker_call_duration_seconds_bucket{le=\"0.25\",op=\"start_instance\"} 2",
            "provisioner_broker_call_duration_seconds_bucket{le=\"+Inf\",op=\"start_instance\"} 3",
            "provisioner_broker_call_duration_seconds_count{op=\"start_instance\"} 3",
            "provisioner_broker_calls_total{op=\"start_instance\",result=\"throttled\"} 1",
            "provisioner_broker_calls_total{op=\"start_instance\",result=\"ok\"} 2",
        ],
    );
}

#[test]
fn render_has_a_type_line_per_family_and_escapes_labels() {
    let mut book = MetricsBook::default();
    book.http("GET", "/v1/machines", 200, 0.01);
    book.http("GET", "/v1/machines", 200, 0.02);
    book.http("POST", "/v1/\"odd\"", 401, 0.001);
    book.event("machine-started");
    let mut g =
        Gauges { workers: 16, harvest_mode: "destroyed".into(), model_life: "alive".into(), ..Gauges::default() };
    g.machines_by_status.insert("started".into(), 5);
    let text = book.render(&g);
    assert_contains_all(
        &text,
        &[
            "provisioner_http_requests_total{method=\"GET\",route=\"/v1/machines\",code=\"200\"} 2",
            "route=\"/v1/\\\"odd\\\"\"",
            "provisioner_events_total{event=\"machine-started\"} 1",
            "provisioner_machines{status=\"started\"} 5",
            "provisioner_workers 16",
            "provisioner_harvest_mode{mode=\"destroyed\"} 1",
        ],
    );
    for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
        let kind = line.rsplit(' ').next().unwrap_or_default();
        assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
    }
    // Every sample line is `name{labels} value` with a numeric value.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
    }
    assert_eq!(book.http_count("/v1/machines"), 2);
}

#[test]
fn the_rate_limiter_shows_its_rate_waiting_calls_and_throttling_per_class() {
    let mut g = Gauges::default();
    g.rate_limits.insert("start".into(), (3.5, 2, 6));
    let text = MetricsBook::default().render(&g);
    assert_contains_all(
        &text,
        &[
            "provisioner_rate_limit_per_second{class=\"start\"} 3.5",
            "provisioner_rate_limit_waiting{class=\"start\"} 2",
            "provisioner_throttled_calls_total{class=\"start\"} 6",
        ],
    );
}

#[test]
fn the_lease_metrics_appear_with_replicas_only_and_count_transitions() {
    let mut book = MetricsBook::default();
    assert!(!book.render(&Gauges::default()).contains("provisioner_leader"), "no lease metrics on SQLite");
    book.leader(false, false);
    let text = book.render(&Gauges::default());
    assert!(text.contains("# TYPE provisioner_leader gauge\nprovisioner_leader 0\n"), "{text}");
    // OpenMetrics names the counter family without `_total` (its sample has it).
    assert!(text.contains("# TYPE provisioner_leader_transitions counter\n"), "{text}");
    assert!(text.contains("provisioner_leader_transitions_total 0\n"), "{text}");
    book.leader(true, true);
    book.leader(false, true);
    book.leader(true, true);
    let text = book.render(&Gauges::default());
    assert!(text.contains("provisioner_leader 1\n"), "{text}");
    assert!(text.contains("provisioner_leader_transitions_total 3\n"), "{text}");
}

#[test]
fn the_output_is_openmetrics_and_ends_in_eof() {
    let text = MetricsBook::default().render(&Gauges::default());
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE provisioner_http_requests counter\n"), "{text}");
    assert!(text.contains("# TYPE provisioner_time_to_running_seconds histogram\n"), "{text}");
}

#[test]
fn start_outcomes_count_per_zone_and_the_time_to_running_histogram_counts_each_start() {
    let mut book = MetricsBook::default();
    book.start_outcome(Some("zone-a"), StartOutcome::Started);
    book.start_outcome(Some("zone-a"), StartOutcome::Started);
    book.start_outcome(Some("zone-b"), StartOutcome::Started);
    book.start_outcome(None, StartOutcome::Failed);
    book.time_to_running(0.3);
    book.time_to_running(7.0);
    book.time_to_running(1000.0);
    book.event("retried-machines-with-errors");
    book.harvest("stopped", 2);
    let text = book.render(&Gauges::default());
    assert_contains_all(
        &text,
        &[
            "provisioner_start_outcomes_total{zone=\"zone-a\",outcome=\"started\"} 2\n",
            "provisioner_start_outcomes_total{zone=\"zone-b\",outcome=\"started\"} 1\n",
            "provisioner_start_outcomes_total{zone=\"unknown\",outcome=\"failed\"} 1\n",
            "provisioner_time_to_running_seconds_count 3\n",
            "provisioner_time_to_running_seconds_bucket{le=\"0.5\"} 1\n",
            "provisioner_time_to_running_seconds_bucket{le=\"10.0\"} 2\n",
            "provisioner_time_to_running_seconds_bucket{le=\"+Inf\"} 3\n",
            "provisioner_retries_total 1\n",
            "provisioner_harvest_decisions_total{decision=\"stopped\"} 2\n",
        ],
    );
}

#[test]
fn counters_read_from_elsewhere_never_go_down_and_state_gauges_drop_gone_labels() {
    let book = MetricsBook::default();
    let mut g = Gauges { store_operations: 5, harvest_mode: "destroyed".into(), ..Gauges::default() };
    g.machines_by_status.insert("pending".into(), 2);
    book.render(&g);
    g.store_operations = 9;
    g.harvest_mode = "all".into();
    g.machines_by_status.clear();
    g.machines_by_status.insert("started".into(), 2);
    let text = book.render(&g);
    assert!(text.contains("provisioner_store_operations_total 9\n"), "{text}");
    assert!(text.contains("provisioner_harvest_mode{mode=\"all\"} 1\n"), "{text}");
    assert!(!text.contains("mode=\"destroyed\""), "{text}");
    assert!(!text.contains("status=\"pending\""), "{text}");
}

#[test]
fn harvest_decisions_count_stops_spares_and_holds() {
    let mut book = MetricsBook::default();
    book.harvest("stopped", 3);
    book.harvest("spared_by_grace", 2);
    book.harvest("held_back_by_cap", 0);
    book.harvest("spared_by_grace", 1);
    let text = book.render(&Gauges::default());
    assert_contains_all(
        &text,
        &[
            "provisioner_harvest_decisions_total{decision=\"stopped\"} 3",
            "provisioner_harvest_decisions_total{decision=\"spared_by_grace\"} 3",
            "provisioner_harvest_decisions_total{decision=\"held_back_by_cap\"} 0",
        ],
    );
}
