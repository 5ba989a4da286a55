//! `/metrics`: bounded labels and scrapes that read no database, a failed start counted under
//! its zone, and OpenMetrics that the Prometheus project's parser reads.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::support::{config_file, eventually, field, ids_of, raw_http, sample, temp_dir, Server};

/// Made-up HTTP methods do not add series (every label is bounded), and a
/// scrape reads counters kept up to date by the store's writes, not the database.
#[test]
fn metrics_labels_are_bounded_and_a_scrape_reads_no_database() {
    let dir = temp_dir("metrics-bounds");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    let series = |m: &str| m.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count();
    // Every family and label set a made-up method can reach exists after one such request.
    raw_http(&s, "MADEUP", "/nowhere", false, None);
    s.metrics();
    let before = series(&s.metrics());
    for i in 0..300 {
        let (code, _, _) = raw_http(&s, &format!("MADEUP{i}"), &format!("/nowhere/{i}"), false, None);
        assert!(code >= 400, "{code}");
    }
    let m = s.metrics();
    let http: Vec<&str> = m.lines().filter(|l| l.starts_with("provisioner_http_requests_total{")).collect();
    for l in &http {
        let method = l.split("method=\"").nth(1).and_then(|r| r.split('"').next()).unwrap();
        assert!(
            ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"].contains(&method),
            "unbounded method label: {l}"
        );
    }
    assert_eq!(series(&m), before, "300 made-up methods added series:\n{m}");
    assert_eq!(
        sample(&m, "provisioner_http_requests_total{method=\"other\",route=\"unmatched\",code=\"404\"}"),
        Some(301.0),
        "{m}"
    );
    // The gauges are right, and come from counters: a scrape makes no store call.
    assert_eq!(sample(&m, "provisioner_machines{status=\"started\"}"), Some(3.0), "{m}");
    assert_eq!(sample(&m, "provisioner_instances{state=\"running\"}"), Some(3.0), "{m}");
    assert_eq!(sample(&m, "provisioner_machines_by_life{life=\"alive\"}"), Some(3.0), "{m}");
    let ops =
        |m: &str| sample(m, "provisioner_store_operations_total").unwrap_or_else(|| panic!("no store counter: {m}"));
    let first = ops(&s.metrics());
    for _ in 0..20 {
        s.metrics();
    }
    let after = ops(&s.metrics());
    assert_eq!(after, first, "scrapes ran {} store operations", after - first);
    assert!(s.cli(&["machine", "remove", &ids[0]]).status.success());
    eventually(Duration::from_secs(10), "the gauges to follow the removal", || {
        let m = s.metrics();
        sample(&m, "provisioner_instances{state=\"terminated\"}") == Some(1.0)
            && sample(&m, "provisioner_machines{status=\"started\"}") == Some(2.0)
    });
}

/// A start that fails for good is counted under the zone of its last cloud call (seen failing
/// before the event named one: the failure was counted under `unknown`).
#[test]
fn a_failed_start_is_counted_under_its_zone() {
    let dir = temp_dir("failed-zone");
    std::fs::create_dir_all(&dir).unwrap();
    let config = config_file(&dir, "once.toml", "[retry]\ncount = 0\n");
    let args = ["--sim-start-latency", "50ms", "--sim-zones", "az2", "--sim-start-failures", "1"];
    let s = Server::start(&dir, &[&args[..], &["--config", &config]].concat());
    s.json(&["machine", "add", "-n", "1", "--json"]);
    eventually(Duration::from_secs(10), "the failed start to be counted in az2", || {
        sample(&s.metrics(), "provisioner_start_outcomes_total{zone=\"az2\",outcome=\"failed\"}") == Some(1.0)
    });
    assert_eq!(sample(&s.metrics(), "provisioner_start_outcomes_total{zone=\"unknown\",outcome=\"failed\"}"), None);
}

/// `/metrics` is OpenMetrics (its content type, `# EOF` at the end), the whole scrape parses
/// with the Prometheus project's own parser (`.ci/metrics-check`: PyPI `prometheus-client`,
/// pinned, in a venv), and the new families move: after adding machines, the start outcomes
/// of their zones and the pending-to-running histogram's count reach the number of machines.
#[test]
fn metrics_are_openmetrics_that_prometheus_parses_and_count_starts_per_zone() {
    let dir = temp_dir("openmetrics");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "4", "--wait", "--json"]));
    let response = ureq::get(&format!("{}/metrics", s.url)).call().unwrap();
    assert_eq!(response.header("Content-Type"), Some("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    let m = response.into_string().unwrap();
    assert!(m.ends_with("# EOF\n"), "{m}");
    // Per zone, the started count is the number of machines in that zone.
    let mut per_zone: BTreeMap<String, f64> = BTreeMap::new();
    for machine in s.machines() {
        *per_zone.entry(field(&machine, "zone").to_owned()).or_default() += 1.0;
    }
    assert_eq!(per_zone.values().sum::<f64>(), ids.len() as f64);
    eventually(Duration::from_secs(10), "the start metrics to reach the machines", || {
        let m = s.metrics();
        per_zone.iter().all(|(zone, n)| {
            sample(&m, &format!("provisioner_start_outcomes_total{{zone=\"{zone}\",outcome=\"started\"}}")) == Some(*n)
        }) && sample(&m, "provisioner_time_to_running_seconds_count") == Some(ids.len() as f64)
    });
    // The instances by zone and capacity type: every one on-demand (the default preference).
    eventually(Duration::from_secs(10), "the instances by capacity to reach the machines", || {
        let m = s.metrics();
        per_zone.iter().all(|(zone, n)| {
            let series = |c: &str| format!("provisioner_instances_by_capacity{{zone=\"{zone}\",capacity=\"{c}\"}}");
            sample(&m, &series("on-demand")) == Some(*n) && sample(&m, &series("spot")) == Some(0.0)
        })
    });
    let m = s.metrics();
    assert_eq!(sample(&m, "provisioner_interruptions_total"), Some(0.0), "{m}");
    assert_eq!(sample(&m, "provisioner_replacements_total"), Some(0.0), "{m}");
    assert_eq!(sample(&m, "provisioner_time_to_running_seconds_bucket{le=\"+Inf\"}"), Some(ids.len() as f64), "{m}");
    assert!(sample(&m, "provisioner_time_to_running_seconds_sum").unwrap_or(0.0) > 0.0, "{m}");
    // The whole scrape, through a real OpenMetrics parser.
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED the OpenMetrics parser check: python3 is not installed");
        return;
    }
    let scrape = dir.join("scrape.txt");
    std::fs::write(&scrape, &m).unwrap();
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/metrics-check")).arg(&scrape).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the scrape does not parse: {}\n{m}", String::from_utf8_lossy(&out.stderr));
    for family in [
        "provisioner_start_outcomes counter",
        "provisioner_time_to_running_seconds histogram",
        "provisioner_interruptions counter",
        "provisioner_replacements counter",
        "provisioner_replacement_lead_seconds histogram",
        "provisioner_instances_by_capacity gauge",
    ] {
        assert!(stdout.lines().any(|l| l.starts_with(family)), "the parser saw no {family}: {stdout}");
    }
}

/// Spot machines' instances are counted as spot in their zone (the simulated cloud runs what a
/// start asks for; its listing does not say, the start's answer does), and a removed machine's
/// instance is no longer counted.
#[test]
fn instances_are_counted_by_zone_and_capacity_type() {
    let dir = temp_dir("by-capacity");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--sim-zones", "az1"]);
    let spot = ids_of(&s.json(&["machine", "add", "-n", "2", "--capacity", "spot", "--wait", "--json"]));
    s.json(&["machine", "add", "-n", "1", "--wait", "--json"]);
    let series = |c: &str| format!("provisioner_instances_by_capacity{{zone=\"az1\",capacity=\"{c}\"}}");
    eventually(Duration::from_secs(10), "2 spot and 1 on-demand instances in az1", || {
        let m = s.metrics();
        sample(&m, &series("spot")) == Some(2.0) && sample(&m, &series("on-demand")) == Some(1.0)
    });
    assert!(s.cli(&["machine", "remove", &spot[0]]).status.success());
    eventually(Duration::from_secs(10), "the removed machine's spot instance to go", || {
        let m = s.metrics();
        sample(&m, &series("spot")) == Some(1.0) && sample(&m, &series("on-demand")) == Some(1.0)
    });
}
