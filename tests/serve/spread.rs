//! The models' leaders spread over the replicas (issue 18), on real binaries and a PostgreSQL of
//! the test's own: three replicas and 12 models of 5 machines each: every model provisioned and
//! each replica leading 3 to 5 of them; `kill -9` of one: its models led by the others within
//! the fail-over time, nothing duplicated; a fourth replica started: models move to it in
//! controlled hand-overs, while machines are added, with no write under a stale epoch in any
//! model's epochs record and no start lost or doubled.
//!
//! The lease is shortened as in the HA tests (`--lease 3s --lease-renew-deadline 2s
//! --lease-retry 500ms`). About a minute on two cores (debug build).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::{eventually, field, fresh_postgres, Server};

const LEASE: &[&str] =
    &["--lease", "3s", "--lease-renew-deadline", "2s", "--lease-retry", "500ms", "--sim-start-latency", "50ms"];
const MODELS: usize = 12;
const MACHINES: usize = 5;

/// The models: `default` and `m01` to `m11`.
fn names() -> Vec<String> {
    std::iter::once("default".to_owned()).chain((1..MODELS).map(|i| format!("m{i:02}"))).collect()
}

/// `model list --json` of `s`: each model's leader ("" while none is known) and epoch.
fn leaders(s: &Server) -> BTreeMap<String, (String, i64)> {
    let list = s.json(&["model", "list", "--json"]);
    list.as_array()
        .unwrap()
        .iter()
        .map(|m| (field(m, "name").to_owned(), (field(m, "leader").to_owned(), m["epoch"].as_i64().unwrap_or(0))))
        .collect()
}

/// How many models run on this replica (`model list` gives their machine count; `null` for one
/// still opening).
fn running(s: &Server) -> usize {
    let list = s.json(&["model", "list", "--json"]);
    list.as_array().unwrap().iter().filter(|m| m["machines"].is_u64()).count()
}

/// How many models each replica leads, by `model list`.
fn loads(s: &Server) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for (leader, _) in leaders(s).into_values() {
        *n.entry(leader).or_default() += 1;
    }
    n
}

/// `/v1/status`'s `models_led` of `s`.
fn models_led(s: &Server) -> u64 {
    s.json(&["status", "--json"])["models_led"].as_u64().expect("status --json has models_led")
}

/// Every machine of `model` started, with exactly one live instance, the one recorded: the
/// machines' count.
fn once_each(s: &Server, model: &str) -> Result<usize, String> {
    let machines = s.json(&["machine", "list", "--json", "-m", model]);
    let instances = s.json(&["instance", "list", "--json", "-m", model]);
    let mut per_machine: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for i in instances.as_array().unwrap() {
        per_machine.entry(field(i, "machine")).or_default().push(field(i, "id"));
    }
    let machines = machines.as_array().unwrap();
    for m in machines {
        let live = per_machine.get(field(m, "id")).cloned().unwrap_or_default();
        if field(m, "status") != "started" || live != [field(m, "instance")] {
            return Err(format!("{model}: machine {m} has live instances {live:?}"));
        }
    }
    if per_machine.len() != machines.len() {
        return Err(format!("{model}: instances without a machine: {per_machine:?}"));
    }
    Ok(machines.len())
}

/// Every model has `n` machines, each started once.
fn all_provisioned(s: &Server, n: usize) -> bool {
    names().iter().all(|m| once_each(s, m) == Ok(n))
}

/// Every model's epochs record (`lease_epochs`, `epoch_writes` in its schema): the acquisitions'
/// holders in epoch order, after checking that the epochs follow each other by one and that no
/// write committed under a stale epoch.
fn epochs(url: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for name in names() {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
        let schema = if name == "default" { "public".to_owned() } else { format!("model_{name}") };
        c.batch_execute(&format!("SET search_path TO {schema}")).unwrap();
        let uuid: String = c.query_one("SELECT value FROM meta WHERE key = 'model_uuid'", &[]).unwrap().get(0);
        let a = provisioner::service::audit_epochs(&mut c, &uuid).unwrap();
        assert!(a.stale.is_empty(), "{name}: writes committed under a stale epoch: {:?}", a.stale);
        let numbers: Vec<i64> = a.acquisitions.iter().map(|(e, _)| *e).collect();
        let first = numbers.first().copied().unwrap_or(1);
        assert_eq!(numbers, (first..first + numbers.len() as i64).collect::<Vec<_>>(), "{name}: {a:?}");
        out.insert(name, a.acquisitions.into_iter().map(|(_, h)| h).collect());
    }
    out
}

/// Adds `n` machines to every model through `s` (no wait).
fn add_everywhere(s: &Server, n: usize) {
    for m in names() {
        s.json(&["machine", "add", "-n", &n.to_string(), "-m", &m, "--json"]);
    }
}

#[test]
fn leaders_spread_over_replicas_fail_over_and_move_to_a_new_replica_in_hand_overs() {
    let (_pg, url, dir) = fresh_postgres("spread");
    let start = |id: &str| {
        let data = dir.join(id);
        if id != "r0" {
            std::fs::create_dir_all(&data).unwrap();
            std::fs::copy(dir.join("r0").join("token"), data.join("token")).unwrap();
        }
        let mut args = vec!["--store", url.as_str(), "--replica-id", id];
        args.extend_from_slice(LEASE);
        Server::start_on(&data, &dir, &args)
    };
    let r0 = start("r0");
    let mut r1 = start("r1");
    let r2 = start("r2");
    for m in names().iter().skip(1) {
        r0.json(&["model", "add", m, "--json"]);
    }
    // Listed is not yet running: a model a replica is still opening has no machine count.
    eventually(Duration::from_secs(30), "every replica to run the 12 models", || {
        [&r0, &r1, &r2].iter().all(|s| running(s) == MODELS)
    });
    add_everywhere(&r1, MACHINES);

    // Every model provisioned; the leaders spread: each replica leads 3 to 5 (the share is 4).
    eventually(Duration::from_secs(60), "every model's 5 machines started once", || all_provisioned(&r2, MACHINES));
    eventually(Duration::from_secs(30), "each replica to lead 3 to 5 models", || {
        let n = loads(&r0);
        ["r0", "r1", "r2"].iter().all(|r| (3..=5).contains(n.get(*r).unwrap_or(&0)))
    });
    eprintln!("spread over three replicas: {:?}", loads(&r0));
    let led: Vec<u64> = [&r0, &r1, &r2].iter().map(|s| models_led(s)).collect();
    assert_eq!(led.iter().sum::<u64>(), MODELS as u64, "status' models_led: {led:?}");
    assert!(led.iter().all(|n| (3..=5).contains(n)), "status' models_led: {led:?}");
    let text = String::from_utf8(r0.cli(&["status"]).stdout).unwrap();
    assert!(text.contains(&format!("models led by this replica: {}", led[0])), "{text}");

    // kill -9 r1 with starts in flight: the others lead its models within the fail-over time
    // (the lease, 3 s, and a few retries), and nothing is duplicated.
    let r1_models: Vec<String> = leaders(&r0).into_iter().filter(|(_, l)| l.0 == "r1").map(|(m, _)| m).collect();
    add_everywhere(&r0, 2);
    let killed = Instant::now();
    r1.crash();
    eventually(Duration::from_secs(15), "r0 and r2 to lead every model", || {
        leaders(&r0).values().all(|(l, _)| l == "r0" || l == "r2")
    });
    let fail_over = killed.elapsed();
    eprintln!("r1's {} models taken over in {:.2} s: {:?}", r1_models.len(), fail_over.as_secs_f64(), loads(&r0));
    assert!(fail_over < Duration::from_secs(10), "fail-over took {fail_over:?}");
    eventually(Duration::from_secs(60), "every model's 7 machines started once", || all_provisioned(&r2, 7));
    let before = epochs(&url);
    let handed = |s: &Server| std::fs::read_to_string(&s.log).unwrap().matches("handing the model over").count();
    let handed_before = handed(&r0) + handed(&r2);

    // A fourth replica: models move to it in controlled hand-overs while machines are added.
    let r3 = start("r3");
    add_everywhere(&r0, 2);
    eventually(Duration::from_secs(30), "r3 to lead its share", || {
        let n = loads(&r0);
        n.get("r3").is_some_and(|k| (3..=5).contains(k)) && n.values().sum::<usize>() == MODELS && !n.contains_key("")
    });
    eprintln!("after r3 joined: {:?}", loads(&r0));
    eventually(Duration::from_secs(60), "every model's 9 machines started once", || all_provisioned(&r3, 9));
    eventually(Duration::from_secs(30), "each live replica to lead 3 to 5 models", || {
        let n = loads(&r3);
        ["r0", "r2", "r3"].iter().all(|r| (3..=5).contains(n.get(*r).unwrap_or(&0)))
    });
    let led: Vec<u64> = [&r0, &r2, &r3].iter().map(|s| models_led(s)).collect();
    assert_eq!(led.iter().sum::<u64>(), MODELS as u64, "status' models_led: {led:?}");

    // The epochs: every model's acquisitions follow each other by one, no write is stale; the
    // models r3 leads came from live replicas that handed them over (released, not expired).
    let after = epochs(&url);
    let moved: Vec<&String> =
        after.iter().filter(|(m, holders)| holders.len() > before[*m].len()).map(|(m, _)| m).collect();
    for m in &moved {
        let holders = &after[*m];
        let (prev, last) = (&holders[holders.len() - 2], &holders[holders.len() - 1]);
        assert_eq!(last, "r3", "{m}: {holders:?}");
        assert!(prev == "r0" || prev == "r2", "{m}: handed over by a live replica: {holders:?}");
    }
    assert!(moved.len() >= 3, "models moved to r3: {moved:?}");
    assert_eq!(handed(&r0) + handed(&r2) - handed_before, moved.len(), "one controlled hand-over per model moved");
    eprintln!("{} models handed over to r3: {moved:?}", moved.len());
}
