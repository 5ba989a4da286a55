//! `provisioner plan`: what the provisioner would do next agrees with what it then does.

use provisioner::sim::scenario::Format;
use provisioner::sim::{plan, run, Plan, Report, Scenario};

/// A start: the machine, its zone, the batched call it is in (if any).
type Start = (String, Option<String>, Option<u64>);

/// The plan's starts, in order.
fn planned_starts(p: &Plan) -> Vec<Start> {
    p.starts.iter().map(|st| (st.machine.clone(), st.zone.clone(), st.batch)).collect()
}

/// The run's start calls, in order.
fn done_starts(r: &Report) -> Vec<Start> {
    r.calls
        .iter()
        .filter(|c| c.op == "start_instance")
        .map(|c| (c.machine.clone().unwrap(), c.zone.clone().flatten(), c.batch.as_deref().map(|b| b.parse().unwrap())))
        .collect()
}

/// The machines and zones of some starts.
fn zones(starts: Vec<Start>) -> Vec<(String, Option<String>)> {
    starts.into_iter().map(|(m, z, _)| (m, z)).collect()
}

const SCENARIO: &str = r#"
seed = 3
[provisioner]
harvest_mode = "all"
retry_count = 0
workers = 1
[cloud]
zones = ["az1", "az2", "az3"]
unavailable_zones = ["az4"]
[[cloud.instances]]
id = "i-0"
zone = "az1"
machine = "0"
[[cloud.instances]]
id = "stray"
[[cloud.instances]]
id = "lost-2"
zone = "az2"
machine = "2"
[[machines]]
id = "0"
instance = "i-0"
status = "started"
life = "dead"
[[machines]]
id = "1"
zones = ["az2"]
[[machines]]
id = "2"
[[machines]]
id = "3"
zones = ["az9"]
[[machines]]
id = "4"
life = "dying"
[[machines]]
id = "5"
[[machines]]
id = "6"
[[machines]]
id = "7"
"#;

/// With one worker, starts choose their zones in queue order, so the plan's tie-breaks are the
/// provisioner's exactly (with more workers the same zones are chosen, possibly by different
/// machines, as concurrent starts interleave).
#[test]
fn the_plan_is_what_the_provisioner_then_does() {
    let s = Scenario::parse(SCENARIO, Format::Toml, "plan.toml").unwrap();
    let p = plan(&s, None);
    let r = run(&s, None);

    // Starts, with their zones, in order.
    let planned = zones(planned_starts(&p));
    let done = zones(done_starts(&r));
    assert_eq!(planned, done);
    assert!(planned.iter().all(|(_, z)| z.as_deref() != Some("az4")));

    // Adoption, failure, ensure-dead, one stop call, removals.
    assert_eq!(
        p.adoptions.iter().map(|a| (a.machine.as_str(), a.detail.as_str())).collect::<Vec<_>>(),
        vec![("2", "lost-2")]
    );
    assert_eq!(r.machines["2"].instance.as_deref(), Some("lost-2"));
    assert_eq!(p.failures.len(), 1);
    assert_eq!(r.machines["3"].message, p.failures[0].detail);
    assert_eq!(p.ensure_dead, vec!["4".to_string()]);
    let stops: Vec<&Vec<String>> = r.calls.iter().filter_map(|c| c.instances.as_ref()).collect();
    assert_eq!(stops, vec![&p.stops]);
    let mut removals = p.removals.clone();
    removals.sort();
    let mut removed: Vec<String> = r.machines.iter().filter(|(_, m)| m.removed).map(|(id, _)| id.clone()).collect();
    removed.sort();
    assert_eq!(removals, removed);
}

/// Careful harvesting in the plan: unknown instances younger than the grace period, or over the
/// cap per pass, are listed as harvested later, with when the harvest looks again; the
/// simulation then stops them at that time.
#[test]
fn the_plan_shows_what_the_harvest_holds_back_and_when_it_looks_again() {
    let text = r#"
        [provisioner]
        harvest_mode = "all"
        harvest_max_stops = 1
        [[cloud.instances]]
        id = "old-1"
        [[cloud.instances]]
        id = "old-2"
        [[cloud.instances]]
        id = "young"
        age = "4m"
    "#;
    let s = Scenario::parse(text, Format::Toml, "harvest.toml").unwrap();
    let p = plan(&s, None);
    assert_eq!(p.stops, vec!["old-1"]);
    assert_eq!(p.harvest_later, vec!["old-2", "young"]);
    assert_eq!(
        p.harvest_again_in.as_deref(),
        Some("1m"),
        "the young one is due in 1m too; the pass interval wins ties"
    );
    assert!(p.to_human().contains("harvest later"));
    let r = run(&s, None);
    let stops: Vec<(String, Vec<String>)> = r
        .calls
        .iter()
        .filter(|c| c.op == "stop_instances")
        .map(|c| (c.at.clone(), c.instances.clone().unwrap_or_default()))
        .collect();
    assert_eq!(stops[0], ("0s".to_owned(), vec!["old-1".to_owned()]));
    assert_eq!(stops[1].0, "1m");
    assert_eq!(stops.iter().map(|(_, i)| i.len()).sum::<usize>(), 3);
}

/// The plan runs the coordinator's own batch planner: machines listed out of order in the file
/// are started in the order the coordinator batches them (sorted ids, not the file's order),
/// container machines are left to their own provisioners, and the zones are the ones the run
/// then picks.
#[test]
fn the_plan_follows_the_coordinators_batch_order_and_scope() {
    let text = r#"
        seed = 5
        [provisioner]
        workers = 1
        retry_count = 0
        [cloud]
        zones = ["az1", "az2"]
        [[machines]]
        id = "2"
        [[machines]]
        id = "0"
        [[machines]]
        id = "1"
        zones = ["az2"]
        [[machines]]
        id = "0/lxd/0"
    "#;
    let s = Scenario::parse(text, Format::Toml, "order.toml").unwrap();
    let p = plan(&s, None);
    let r = run(&s, None);
    let planned = zones(planned_starts(&p));
    let mut done = zones(done_starts(&r));
    // The container is started by its host's container provisioner, not planned here.
    done.retain(|(m, _)| !m.contains('/'));
    assert_eq!(planned, done);
    assert_eq!(planned.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), vec!["0", "1", "2"]);
}

/// Batched starts (issue 17, point 1): the plan groups the starts into calls as the run does,
/// from the same batcher core: one call per zone and shape while the batch has room. Without
/// batching no planned start names a call.
#[test]
fn the_plan_groups_batched_starts_as_the_run_does() {
    let mut text = String::from(
        "[provisioner]\nbatch_starts = true\nworkers = 4\n[cloud]\nzones = [\"az1\", \"az2\"]\nstart_latency = \"2s\"\n",
    );
    for i in 0..6 {
        text.push_str(&format!("[[machines]]\nid = \"{i}\"\n"));
    }
    text.push_str("[[machines]]\nid = \"9\"\nmem_mb = 8192\n");
    let s = Scenario::parse(&text, Format::Toml, "batch.toml").unwrap();
    let p = plan(&s, None);
    let r = run(&s, None);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    // Machine → (zone, call), planned and done; calls are numbered in the order they open.
    let planned = planned_starts(&p);
    let done = done_starts(&r);
    // The same calls, each with the same machines in the same zone (calls of one wave may
    // open in another order).
    let calls = |starts: &[Start]| {
        let mut by_call: std::collections::BTreeMap<u64, Vec<(String, Option<String>)>> = Default::default();
        for (m, z, b) in starts {
            by_call.entry(b.expect("every start batched")).or_default().push((m.clone(), z.clone()));
        }
        let mut calls: Vec<Vec<(String, Option<String>)>> = by_call.into_values().collect();
        calls.sort();
        calls
    };
    assert_eq!(calls(&planned), calls(&done));
    assert_eq!(calls(&done).len(), 3, "one call per zone and shape: {done:?}");
    // The machine of another shape gets a call alone.
    let big = planned.iter().find(|(m, ..)| m == "9").and_then(|(_, _, b)| *b);
    assert_eq!(planned.iter().filter(|(.., b)| *b == big).count(), 1);
    assert!(p.to_human().contains("(batched call 1)"));

    let unbatched = Scenario::parse(&text.replace("batch_starts = true", ""), Format::Toml, "b.toml").unwrap();
    assert!(plan(&unbatched, None).starts.iter().all(|st| st.batch.is_none()));
    assert!(run(&unbatched, None).calls.iter().all(|c| c.batch.is_none()));
}
