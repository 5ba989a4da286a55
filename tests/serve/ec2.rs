//! The EC2 broker through the service: `serve --broker ec2` against moto's EC2 server
//! (`provisioner::testing::moto`, features `ec2` and `test-util`). Machines are added, the
//! service is killed (`kill -9`) while their starts are under way, and restarted: every machine
//! ends with exactly one instance in the cloud (those started before the crash are adopted, not
//! started again), and removing a machine terminates its instance; readers are served from the
//! listings the service made, not one cloud listing each.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use provisioner::testing::moto;
use serde_json::Value;

use crate::support::{moto_serve_args, poll, sample, temp_dir, Server};

/// Issue 30, item 8: readers do not drive the cloud's API. 300 concurrent `GET /v1/instances`
/// with a read-only token (and status polls beside them) are served from the listings the
/// service made, with their age in the `Age` header: a bounded, small number of
/// `DescribeInstances` calls (`provisioner_broker_calls_total{op="all_instances"}`), not one
/// per request (300 before).
#[test]
fn readers_are_served_from_the_listings_made_not_one_cloud_listing_each() {
    let moto = moto::Moto::shared();
    let dir = temp_dir("ec2-readers");
    let s = Server::start(&dir, &moto_serve_args(moto));
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    let ro = s.json(&["token", "create", "--read-only", "--json"])["token"].as_str().unwrap().to_owned();
    let listings = |s: &Server| {
        sample(&s.metrics(), "provisioner_broker_calls_total{op=\"all_instances\",result=\"ok\"}").unwrap_or(0.0)
    };
    let before = listings(&s);
    let began = Instant::now();
    let threads: Vec<_> = (0..30)
        .map(|t| {
            let (url, ro) = (s.url.clone(), ro.clone());
            std::thread::spawn(move || {
                let mut ages = Vec::new();
                for i in 0..10 {
                    let path = if t == 0 && i % 2 == 0 { "status" } else { "instances" };
                    let r = ureq::get(&format!("{url}/v1/{path}"))
                        .set("Authorization", &format!("Bearer {ro}"))
                        .call()
                        .unwrap();
                    if path == "instances" {
                        ages.push(r.header("Age").unwrap().parse::<u64>().unwrap());
                        assert_eq!(r.into_json::<Value>().unwrap().as_array().unwrap().len(), 2);
                    }
                }
                ages
            })
        })
        .collect();
    let ages: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let took = began.elapsed().as_secs_f64();
    let made = listings(&s) - before;
    eprintln!("300 reads in {took:.2} s made {made} cloud listings; ages {:?}", ages.iter().max());
    assert!(ages.iter().all(|a| *a <= 5), "no listing older than 5 s is served: {ages:?}");
    // At most one listing per 5 s of reading, plus the provisioner's own.
    assert!(made <= 3.0 + (took / 5.0).ceil(), "{made} listings for 300 reads in {took:.1} s");
}

#[test]
fn the_ec2_broker_service_adopts_after_a_crash_and_terminates_on_removal() {
    let moto = moto::Moto::shared();
    let dir = temp_dir("ec2");
    let args = moto_serve_args(moto);
    let mut s = Server::start(&dir, &args);
    let added = s.json(&["machine", "add", "-n", "8", "--json"]);
    assert_eq!(added.as_array().unwrap().len(), 8);
    std::thread::sleep(Duration::from_millis(150));
    s.crash();
    let s = Server::start(&dir, &args);
    let mut last = Vec::new();
    let machines = poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let ms = s.machines();
        if ms.iter().all(|m| m["instance"].is_string()) {
            return Some(ms);
        }
        last = ms;
        None
    });
    let machines = machines.unwrap_or_else(|| panic!("not all provisioned: {last:?}\n{}", s.log_text()));
    // The cloud's own view, by the service's instance list (our model's tag only).
    let instances = s.instances();
    let live: Vec<&Value> = instances.iter().filter(|i| i["state"] != "terminated").collect();
    assert_eq!(live.len(), 8, "one instance per machine: {instances:?}");
    let mut per_machine = BTreeMap::new();
    for i in &live {
        *per_machine.entry(i["machine"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    assert!(per_machine.values().all(|n| *n == 1), "{per_machine:?}");
    for m in &machines {
        assert!(m["zone"].as_str().unwrap().starts_with("us-east-1"), "{m}");
    }
    // Removing a machine terminates its instance in the cloud.
    let first = machines[0]["id"].as_str().unwrap().to_owned();
    let gone = machines[0]["instance"].as_str().unwrap().to_owned();
    let out = s.cli(&["machine", "remove", &first]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let terminated = poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let still = s.instances().iter().any(|i| i["id"] == gone.as_str() && i["state"] != "terminated");
        (!still).then_some(())
    });
    assert!(terminated.is_some(), "instance {gone} not terminated");
}
