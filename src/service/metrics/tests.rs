//! Unit tests of the metrics core.

use std::time::Duration;

use actix_rt::time::Instant;

use super::state::{CapacityBook, Gauges, MetricsBook, StartOutcome};
use crate::model::{CapacityType, InstanceId};

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

#[test]
fn interruptions_replacements_and_their_lead_times_are_counted() {
    let mut book = MetricsBook::default();
    let text = book.render(&Gauges::default());
    assert_contains_all(
        &text,
        &[
            "# TYPE provisioner_interruptions counter\n",
            "provisioner_interruptions_total 0\n",
            "provisioner_replacements_total 0\n",
            "# TYPE provisioner_replacement_lead_seconds histogram\n",
            "provisioner_replacement_lead_seconds_count 0\n",
        ],
    );
    book.interrupted();
    book.interrupted();
    book.interrupted();
    book.replaced(Some(100.0));
    book.replaced(Some(0.0));
    // A warning that did not say when it ends: counted, no lead time.
    book.replaced(None);
    let text = book.render(&Gauges::default());
    assert_contains_all(
        &text,
        &[
            "provisioner_interruptions_total 3\n",
            "provisioner_replacements_total 3\n",
            "provisioner_replacement_lead_seconds_count 2\n",
            "provisioner_replacement_lead_seconds_sum 100.0\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"0.0\"} 1\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"90.0\"} 1\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"120.0\"} 2\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"300.0\"} 2\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"+Inf\"} 2\n",
        ],
    );
}

fn id(s: &str) -> InstanceId {
    InstanceId::from(s)
}

#[test]
fn instances_by_capacity_render_per_zone_with_both_capacity_types() {
    let book = MetricsBook::default();
    let mut g = Gauges::default();
    g.instances_by_capacity.insert(("az1".into(), "spot"), 2);
    g.instances_by_capacity.insert(("az1".into(), "on-demand"), 1);
    g.instances_by_capacity.insert(("none".into(), "on-demand"), 4);
    let text = book.render(&g);
    assert_contains_all(
        &text,
        &[
            "# TYPE provisioner_instances_by_capacity gauge\n",
            "provisioner_instances_by_capacity{zone=\"az1\",capacity=\"spot\"} 2\n",
            "provisioner_instances_by_capacity{zone=\"az1\",capacity=\"on-demand\"} 1\n",
            "provisioner_instances_by_capacity{zone=\"none\",capacity=\"on-demand\"} 4\n",
        ],
    );
    // A zone gone from the counts is gone from the gauge.
    g.instances_by_capacity.retain(|(z, _), _| z == "none");
    let text = book.render(&g);
    assert!(!text.contains("zone=\"az1\""), "{text}");
}

#[test]
fn the_capacity_book_counts_listings_starts_and_stops_spot_and_on_demand_per_zone() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut book = CapacityBook::default();
    assert!(book.counts().is_empty());
    // A listing that says the capacity type (EC2's), one that does not (on-demand), no zone.
    book.listed(
        vec![
            (id("i-1"), Some("az1".into()), Some(CapacityType::Spot)),
            (id("i-2"), Some("az1".into()), None),
            (id("i-3"), None, Some(CapacityType::OnDemand)),
        ],
        at(1),
    );
    let counts = book.counts();
    assert_eq!(counts.get(&("az1".to_owned(), "spot")), Some(&1));
    assert_eq!(counts.get(&("az1".to_owned(), "on-demand")), Some(&1));
    assert_eq!(counts.get(&("none".to_owned(), "on-demand")), Some(&1));
    assert_eq!(counts.get(&("none".to_owned(), "spot")), Some(&0));
    // A spot start answered while a listing is in flight (begun at 2): the listing does not
    // have it yet and does not say its capacity later; its start's word is kept.
    book.started(id("i-4"), Some("az2".into()), Some(CapacityType::Spot), at(3));
    book.listed(
        vec![
            (id("i-1"), Some("az1".into()), Some(CapacityType::Spot)),
            (id("i-2"), Some("az1".into()), None),
            (id("i-3"), None, None),
        ],
        at(2),
    );
    assert_eq!(book.counts().get(&("az2".to_owned(), "spot")), Some(&1));
    book.listed(vec![(id("i-4"), Some("az2".into()), None)], at(4));
    let counts = book.counts();
    assert_eq!(counts.get(&("az2".to_owned(), "spot")), Some(&1));
    assert!(!counts.contains_key(&("az1".to_owned(), "spot")), "{counts:?}");
    // A stop answered while a listing is in flight: the listing still has it, it is not counted.
    book.started(id("i-5"), Some("az2".into()), Some(CapacityType::OnDemand), at(5));
    book.gone(&[id("i-4")], at(7));
    assert_eq!(book.counts().get(&("az2".to_owned(), "spot")), Some(&0));
    book.listed(vec![(id("i-4"), Some("az2".into()), None), (id("i-5"), Some("az2".into()), None)], at(6));
    let counts = book.counts();
    assert_eq!(counts.get(&("az2".to_owned(), "spot")), Some(&0));
    assert_eq!(counts.get(&("az2".to_owned(), "on-demand")), Some(&1));
    // A listing begun after the stop lists what the cloud has.
    book.listed(vec![(id("i-5"), Some("az2".into()), None)], at(8));
    assert_eq!(book.counts().values().sum::<u64>(), 1);
}

/// The actor feeds the families from the provisioner's events and from what the metered broker
/// saw of the cloud (a listing, a start, a stop).
#[actix_rt::test]
async fn the_actor_counts_hand_overs_and_instances_by_capacity() {
    use actix::Actor;

    use super::actor::Metrics;
    use super::messages::{InstanceStarted, InstancesGone, InstancesListed, Render};
    use crate::model::events::ProvisionerEvent;
    use crate::model::MachineId;

    let metrics = Metrics::default().start();
    let at = Instant::now();
    metrics.do_send(ProvisionerEvent::MachineInterrupted {
        machine: MachineId::new("0"),
        instance: id("i-1"),
        warning: Some(Duration::from_secs(120)),
    });
    metrics.do_send(ProvisionerEvent::MachineReplaced {
        cause: crate::model::events::HandoverCause::Interruption,
        machine: MachineId::new("0"),
        interrupted: id("i-1"),
        replacement: id("i-2"),
        lead: Some(Duration::from_secs(100)),
    });
    metrics.do_send(InstancesListed {
        instances: vec![(id("i-1"), Some("az1".into()), None), (id("i-3"), None, None)],
        at,
    });
    metrics.do_send(InstanceStarted {
        instance: id("i-2"),
        zone: Some("az2".into()),
        capacity: Some(CapacityType::Spot),
        at: at + Duration::from_secs(1),
    });
    metrics.do_send(InstancesGone { instances: vec![id("i-1")], at: at + Duration::from_secs(2) });
    let text = metrics.send(Render(Gauges::default())).await.unwrap();
    assert_contains_all(
        &text,
        &[
            "provisioner_interruptions_total 1\n",
            "provisioner_replacements_total 1\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"90.0\"} 0\n",
            "provisioner_replacement_lead_seconds_bucket{le=\"120.0\"} 1\n",
            "provisioner_events_total{event=\"machine-interrupted\"} 1\n",
            "provisioner_events_total{event=\"machine-replaced\"} 1\n",
            "provisioner_instances_by_capacity{zone=\"az2\",capacity=\"spot\"} 1\n",
            "provisioner_instances_by_capacity{zone=\"az2\",capacity=\"on-demand\"} 0\n",
            "provisioner_instances_by_capacity{zone=\"none\",capacity=\"on-demand\"} 1\n",
        ],
    );
    assert!(!text.contains("zone=\"az1\""), "the stopped instance is not counted:\n{text}");
}
