//! Crash safety: `kill -9` with starts or stops in flight, then a restart on the same data
//! directory, loses no acknowledged machine and gives none a second instance; SIGTERM waits for
//! the starts in flight and a restart finds everything; a full disk during starts makes no
//! second instance either.

use std::time::{Duration, Instant};

use crate::support::{
    assert_provisioned_once, config_file, eventually, field, ids_of, mount_tmpfs, sample, temp_dir, Server,
};

#[test]
fn sigterm_stops_cleanly_and_a_restart_finds_everything() {
    let dir = temp_dir("sigterm");
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    let before = s.machines();
    assert_eq!(s.terminate().code(), Some(0), "{}", s.log_text());
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    assert_eq!(s.machines(), before, "the model changed across a clean restart");
    assert_provisioned_once(&s, &ids);
    let more = ids_of(&s.json(&["machine", "add", "--wait", "--json"]));
    assert_eq!(more, ["3"], "machine ids are never reused");
    let all: Vec<String> = (0..4).map(|i| i.to_string()).collect();
    assert_provisioned_once(&s, &all);
    assert_eq!(s.instances().len(), 4);
    let status = s.json(&["status", "--json"]);
    assert_eq!(status["machines"], 4);
    assert_eq!(status["model_life"], "alive");
}

/// `kill -9` while starts are in flight (1 s latency): after a restart on the same data
/// directory every acknowledged machine is there and ends provisioned, and no machine ever has
/// two live instances (the restarted provisioner adopts the instances the crash left behind).
#[test]
fn a_crash_with_starts_in_flight_loses_nothing_and_duplicates_nothing() {
    let dir = temp_dir("crash");
    let cfg = config_file(&dir, "serve.toml", "resync = \"1s\"\n[retry]\ndelay = \"1s\"\n");
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    // Crash safety: 30 machines, kill -9 while their starts are in flight, restart: all 30
    // provisioned, each with exactly one instance, no orphan.
    let mut acknowledged = ids_of(&s.json(&["machine", "add", "-n", "20", "--json"]));
    // Crash while starts are in flight (each takes 1 s), right after acknowledging more.
    eventually(Duration::from_secs(10), "starts to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    acknowledged.extend(ids_of(&s.json(&["machine", "add", "-n", "10", "--json"])));
    assert_eq!(acknowledged.len(), 30);
    s.crash();

    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    eventually(Duration::from_secs(40), "every acknowledged machine to be provisioned", || {
        let m = s.machines();
        acknowledged.iter().all(|id| {
            m.iter()
                .any(|m| field(m, "id") == id && field(m, "status") == "started" && !field(m, "instance").is_empty())
        })
    });
    assert_provisioned_once(&s, &acknowledged);
    let live = s.instances();
    assert_eq!(live.len(), acknowledged.len(), "one live instance per machine: {live:?}");

    // A second crash, right after adding more, then a clean stop and start: still exact.
    acknowledged.extend(ids_of(&s.json(&["machine", "add", "-n", "3", "--json"])));
    s.crash();
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    eventually(Duration::from_secs(20), "the machines added before the second crash", || {
        s.machines().iter().filter(|m| field(m, "status") == "started").count() == acknowledged.len()
    });
    assert_provisioned_once(&s, &acknowledged);
    assert_eq!(s.terminate().code(), Some(0));
    let s = Server::start(&dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    assert_provisioned_once(&s, &acknowledged);
    assert_eq!(s.instances().len(), acknowledged.len());
}

/// SIGTERM with starts in flight waits for them: after the restart the machines are already
/// provisioned with running instances (an instance adopted after a crash would show the
/// `pending` state it was listed in until the next resync, 60 s away).
#[test]
fn sigterm_waits_for_starts_in_flight() {
    let dir = temp_dir("drain");
    let mut s = Server::start(&dir, &["--sim-start-latency", "1s"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "4", "--json"]));
    eventually(Duration::from_secs(5), "starts to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    let began = Instant::now();
    assert_eq!(s.terminate().code(), Some(0), "{}", s.log_text());
    assert!(began.elapsed() >= Duration::from_millis(300), "SIGTERM did not wait for the starts");
    let s = Server::start(&dir, &["--sim-start-latency", "30s"]);
    let machines = s.machines();
    for id in &ids {
        let m = machines.iter().find(|m| field(m, "id") == id).unwrap();
        assert_eq!(field(m, "status"), "started", "{m}");
        assert_eq!(field(m, "instance_status"), "running", "{m}");
    }
    assert_provisioned_once(&s, &ids);
}

/// `kill -9` while the instances of removed machines are being stopped: after a restart the
/// removal is finished (instances terminated, machines gone) and nothing else is touched.
#[test]
fn a_crash_with_stops_in_flight_finishes_the_removal() {
    let dir = temp_dir("crash-stop");
    let cfg = config_file(&dir, "serve.toml", "[sim]\nstop_latency = \"1s\"\n");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "3", "--wait", "--json"]));
    assert!(s.cli(&["machine", "remove", "0", "1"]).status.success());
    eventually(Duration::from_secs(10), "the stop to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    s.crash();
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    eventually(Duration::from_secs(15), "the removal to finish", || {
        s.machines().iter().map(|m| field(m, "id").to_owned()).collect::<Vec<_>>() == ["2"]
    });
    assert_provisioned_once(&s, &ids[2..]);
    assert_eq!(s.instances().len(), 1);
    let m = s.metrics();
    assert!(m.contains("provisioner_instances{state=\"terminated\"} 2"), "{m}");
    assert!(m.contains("provisioner_instances{state=\"running\"} 1"), "{m}");
}

/// A start whose call made the instance and lost its answer (the service's part). The data
/// directory's disk fills while starts are in flight: the simulated cloud has written each
/// instance, then cannot record its landing, and answers a transient error. When the disk frees up,
/// every machine must end with exactly one instance ever created for it: the retried start must
/// reuse the client token (and the cloud return the instance already made for it) instead of making
/// a second one.
///
/// Before the start procedure repeated an ambiguous failure with the same client token, every
/// machine here ended with two instances.
///
/// The data directory is a 8 MiB tmpfs (needs root and `mount`; without them the test says so
/// and passes without checking anything).
#[test]
fn a_full_disk_during_starts_gives_no_machine_a_second_instance() {
    let dir = temp_dir("disk-full");
    let mnt = dir.join("mnt");
    let Some(_unmount) = mount_tmpfs(&mnt, "8m") else { return };
    let cfg = config_file(&dir, "serve.toml", "resync = \"1s\"\n[retry]\ncount = 30\ndelay = \"500ms\"\n");
    let s = Server::start_on(&mnt.join("data"), &dir, &["--sim-start-latency", "1s", "--config", &cfg]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "12", "--json"]));
    eventually(Duration::from_secs(10), "starts to be in flight", || {
        sample(&s.metrics(), "provisioner_broker_calls_in_flight").unwrap_or(0.0) >= 1.0
    });
    // Fill the disk while the starts wait for their instances to come up.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 << 10];
        while f.write_all(&chunk).and_then(|()| f.flush()).is_ok() {}
    }
    std::thread::sleep(Duration::from_secs(3));
    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(60), "every machine to be provisioned after the disk freed up", || {
        let m = s.machines();
        m.len() == ids.len() && m.iter().all(|m| field(m, "status") == "started")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_provisioned_once(&s, &ids);
    // Every instance the cloud ever made, whatever its state: one per machine.
    let m = s.metrics();
    let made: f64 = m
        .lines()
        .filter(|l| l.starts_with("provisioner_instances{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(made, ids.len() as f64, "instances ever created for {} machines:\n{m}\n{}", ids.len(), s.log_text());
    assert!(s.log_text().contains("full") || s.log_text().contains("disk"), "the disk never filled: {}", s.log_text());
}
