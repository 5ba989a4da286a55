//! Unit tests of the metrics core.

use super::state::{Gauges, Histogram, MetricsBook};

#[test]
fn histogram_buckets_are_cumulative_and_count_everything() {
    let mut h = Histogram::default();
    h.observe(0.0005);
    h.observe(0.2);
    h.observe(100.0);
    let mut book = MetricsBook::default();
    book.broker("start_instance", "ok", 0.0005);
    book.broker("start_instance", "ok", 0.2);
    book.broker("start_instance", "throttled", 100.0);
    let text = book.render(&Gauges::default());
    assert!(
        text.contains("provisioner_broker_call_duration_seconds_bucket{op=\"start_instance\",le=\"0.001\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("provisioner_broker_call_duration_seconds_bucket{op=\"start_instance\",le=\"0.25\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("provisioner_broker_call_duration_seconds_bucket{op=\"start_instance\",le=\"+Inf\"} 3"),
        "{text}"
    );
    assert!(text.contains("provisioner_broker_call_duration_seconds_count{op=\"start_instance\"} 3"), "{text}");
    assert!(text.contains("provisioner_broker_calls_total{op=\"start_instance\",result=\"throttled\"} 1"), "{text}");
    assert!(text.contains("provisioner_broker_calls_total{op=\"start_instance\",result=\"ok\"} 2"), "{text}");
    assert_eq!(h.count(), 3);
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
    assert!(text.contains("provisioner_http_requests_total{method=\"GET\",route=\"/v1/machines\",code=\"200\"} 2"));
    assert!(text.contains("route=\"/v1/\\\"odd\\\"\""), "{text}");
    assert!(text.contains("provisioner_events_total{event=\"machine-started\"} 1"));
    assert!(text.contains("provisioner_machines{status=\"started\"} 5"));
    assert!(text.contains("provisioner_workers 16"));
    assert!(text.contains("provisioner_harvest_mode{mode=\"destroyed\"} 1"));
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
    assert!(text.contains("provisioner_rate_limit_per_second{class=\"start\"} 3.5"), "{text}");
    assert!(text.contains("provisioner_rate_limit_waiting{class=\"start\"} 2"), "{text}");
    assert!(text.contains("provisioner_throttled_calls_total{class=\"start\"} 6"), "{text}");
}

#[test]
fn the_lease_metrics_appear_with_replicas_only_and_count_transitions() {
    let mut book = MetricsBook::default();
    assert!(!book.render(&Gauges::default()).contains("provisioner_leader"), "no lease metrics on SQLite");
    book.leader(false, false);
    let text = book.render(&Gauges::default());
    assert!(text.contains("# TYPE provisioner_leader gauge\nprovisioner_leader 0\n"), "{text}");
    assert!(text.contains("# TYPE provisioner_leader_transitions_total counter\n"), "{text}");
    assert!(text.contains("provisioner_leader_transitions_total 0\n"), "{text}");
    book.leader(true, true);
    book.leader(false, true);
    book.leader(true, true);
    let text = book.render(&Gauges::default());
    assert!(text.contains("provisioner_leader 1\n"), "{text}");
    assert!(text.contains("provisioner_leader_transitions_total 3\n"), "{text}");
}
