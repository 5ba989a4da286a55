//! Replicas of `serve` on one PostgreSQL with one fenced leader (issue 15), on the real
//! binary: three replicas with the simulated cloud; while machines are added and removed
//! through random replicas, the leader is killed (`kill -9`) with starts in flight, paused (SIGSTOP) for
//! longer than its lease and resumed, and stopped cleanly (SIGTERM); and PostgreSQL itself is
//! restarted under them; and the leader is cut off from the database (a TCP proxy in front of
//! PostgreSQL that the test controls goes silent) and healed. Each time another replica takes
//! over; at the end every acknowledged add is there and each machine has exactly one live
//! instance, the one recorded (no duplicate create across the faults); the epochs' record in
//! the database shows no write committed under a stale epoch and exactly as many leader
//! transitions as the faults caused. Once more with the EC2 broker on moto (feature `ec2`).
//!
//! The lease is shortened for CI (`--lease 3s --lease-renew-deadline 2s --lease-retry 500ms`);
//! `PROVISIONER_HA_RUNS` sets how many times each fault is repeated (default 10, as the issue
//! asks; about two minutes for the five tests on two cores). The fail-over times are printed
//! (p50 and max), not asserted beyond a generous bound.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use provisioner::service::{audit_epochs, EpochAudit};
use provisioner::testing::TempPostgres;
use serde_json::Value;

use crate::support::*;

const LEASE: &[&str] = &["--lease", "3s", "--lease-renew-deadline", "2s", "--lease-retry", "500ms"];
const LEASE_S: f64 = 3.0;
const RETRY_S: f64 = 0.5;

fn runs() -> usize {
    std::env::var("PROVISIONER_HA_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(10)
}

/// A TCP proxy in front of PostgreSQL that the test controls, one per replica. [`Proxy::cut`]
/// is a partition: bytes through the open connections are swallowed (acknowledged by the
/// proxy's kernel, never delivered, so no timeout on the replica's side fires), and new
/// connections are accepted and held silent. [`Proxy::heal`] closes every connection that
/// lived through the partition (as TCP sessions that timed out) and lets new ones through.
struct Proxy {
    port: u16,
    shared: Arc<ProxyShared>,
}

#[derive(Default)]
struct ProxyShared {
    cut: AtomicBool,
    stop: AtomicBool,
    /// Every socket of the connections made so far (both ends), and those held while cut.
    sockets: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(ProxyShared::default());
        let sh = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                // The cut is read and the sockets kept under one lock, so a heal (which closes
                // them and ends the cut under the same lock) never misses one.
                let mut socks = sh.sockets.lock().unwrap();
                if sh.cut.load(Ordering::SeqCst) {
                    socks.push(client);
                    continue;
                }
                socks.push(client.try_clone().unwrap());
                socks.push(server.try_clone().unwrap());
                drop(socks);
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let sh = sh.clone();
                    std::thread::spawn(move || pump(from, to, &sh));
                }
            }
        });
        Proxy { port, shared }
    }

    /// The partition begins.
    fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
    }

    /// The partition ends: the connections that lived through it are closed.
    fn heal(&self) {
        let mut socks = self.shared.sockets.lock().unwrap();
        for s in socks.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; while cut, what is read is dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, sh: &ProxyShared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) if !sh.cut.load(Ordering::SeqCst) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Ok(_) => {}
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for s in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

pub(crate) struct Cluster {
    pg: TempPostgres,
    url: String,
    base: PathBuf,
    replicas: Vec<Option<Server>>,
    /// Each replica's proxy to the database, when the cluster is proxied.
    proxies: Vec<Option<Proxy>>,
    proxied: bool,
    /// Arguments every replica gets besides the store, its id and the lease.
    extra: Vec<String>,
    /// The data directory holding the API token (the replica that initialised the database).
    token_dir: PathBuf,
    started: usize,
}

impl Cluster {
    fn start(name: &str, n: usize) -> Cluster {
        Cluster::start_with(name, n, false, &["--sim-start-latency", "1s"])
    }

    /// `n` replicas with `extra` arguments each; `proxied`: each reaches the database through a
    /// [`Proxy`] of its own.
    pub(crate) fn start_with(name: &str, n: usize, proxied: bool, extra: &[&str]) -> Cluster {
        let pg = TempPostgres::start(name).expect("a PostgreSQL cluster");
        let url = pg.url().to_owned();
        let base = temp_dir(name);
        let extra = extra.iter().map(|a| a.to_string()).collect();
        let mut c = Cluster {
            pg,
            url,
            base: base.clone(),
            replicas: Vec::new(),
            proxies: Vec::new(),
            proxied,
            extra,
            token_dir: base.join("r0"),
            started: 0,
        };
        for _ in 0..n {
            c.spawn();
        }
        c
    }

    /// Starts one more replica (its own data directory and port, and its own proxy).
    fn spawn(&mut self) -> usize {
        let i = self.started;
        self.started += 1;
        let id = format!("replica-{i}");
        let url = if self.proxied {
            let upstream = self.url.rsplit(':').next().unwrap().split('/').next().unwrap().parse().unwrap();
            let proxy = Proxy::start(upstream);
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);
            self.proxies.push(Some(proxy));
            url
        } else {
            self.proxies.push(None);
            self.url.clone()
        };
        let mut args = vec!["--store", url.as_str(), "--replica-id", id.as_str()];
        args.extend(self.extra.iter().map(String::as_str));
        args.extend_from_slice(LEASE);
        let data = self.base.join(format!("r{i}"));
        let s = Server::start_on(&data, &self.base, &args);
        self.replicas.push(Some(s));
        self.replicas.len() - 1
    }

    /// The epochs' record: every acquisition, and no write under a stale epoch.
    fn audit(&self) -> EpochAudit {
        let mut client = ::postgres::Client::connect(&self.url, ::postgres::NoTls).unwrap();
        let uuid: String = client.query_one("SELECT value FROM meta WHERE key = 'model_uuid'", &[]).unwrap().get(0);
        audit_epochs(&mut client, &uuid).unwrap()
    }

    /// No write committed under a stale epoch, some were made, and the leader changed exactly
    /// `transitions` times (within `transitions` when a range is given).
    fn assert_fenced(&self, transitions: std::ops::RangeInclusive<usize>) {
        let a = self.audit();
        assert!(a.stale.is_empty(), "writes committed under a stale epoch: {:?}", a.stale);
        assert!(a.writes > 0, "the leaders' writes are recorded: {a:?}");
        let changes = a.acquisitions.len() - 1;
        assert!(transitions.contains(&changes), "{changes} leader transitions, expected {transitions:?}: {a:?}");
        eprintln!("HA epochs: {} acquisitions, {} fenced writes, none stale", a.acquisitions.len(), a.writes);
    }

    fn alive(&self) -> impl Iterator<Item = (usize, &Server)> {
        self.replicas.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    /// A client command through replica `i`, with the API token.
    pub(crate) fn cli(&self, i: usize, args: &[&str]) -> Output {
        let s = self.replicas[i].as_ref().unwrap();
        bin().args(args).arg("--server").arg(&s.url).arg("--data-dir").arg(&self.token_dir).output().unwrap()
    }

    /// `GET /v1/status` of replica `i`, within a second (a paused replica does not answer).
    fn status(&self, i: usize) -> Option<Value> {
        let s = self.replicas[i].as_ref()?;
        let token = std::fs::read_to_string(self.token_dir.join("token")).ok()?;
        let r = ureq::get(&format!("{}/v1/status", s.url))
            .set("Authorization", &format!("Bearer {}", token.trim()))
            .timeout(Duration::from_secs(1))
            .call()
            .ok()?;
        r.into_json().ok()
    }

    /// The replica that says it leads, at an epoch above `after`, within `limit`.
    pub(crate) fn leader(&self, after: i64, limit: Duration) -> (usize, i64) {
        let found = poll(limit, Duration::from_millis(50), || {
            self.alive().find_map(|(i, _)| {
                let s = self.status(i)?;
                let epoch = s["epoch"].as_i64().unwrap_or(0);
                (s["role"] == "leader" && epoch > after).then_some((i, epoch))
            })
        });
        found.unwrap_or_else(|| panic!("no leader above epoch {after} within {limit:?}"))
    }

    pub(crate) fn follower(&self, leader: usize, k: usize) -> usize {
        let others: Vec<usize> = self.alive().map(|(i, _)| i).filter(|i| *i != leader).collect();
        others[k % others.len()]
    }

    /// Adds `n` machines through replica `i` (no wait): the acknowledged ids.
    pub(crate) fn add(&self, i: usize, n: usize) -> Vec<String> {
        let out = self.cli(i, &["machine", "add", "-n", &n.to_string(), "--json"]);
        assert!(out.status.success(), "add through replica {i}: {}", String::from_utf8_lossy(&out.stderr));
        ids_of(&serde_json::from_slice(&out.stdout).unwrap())
    }

    /// Removes machine `id` through replica `i` (acknowledged once committed).
    fn remove(&self, i: usize, id: &str) {
        let out = self.cli(i, &["machine", "remove", id]);
        assert!(out.status.success(), "remove {id} through replica {i}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Removes the oldest machine still kept through replica `i`: what a client does while the
    /// faults happen. `kept` loses it.
    fn remove_one(&self, i: usize, kept: &mut Vec<String>) {
        if !kept.is_empty() {
            let id = kept.remove(0);
            self.remove(i, &id);
        }
    }

    fn signal(&self, i: usize, sig: &str) {
        let pid = self.replicas[i].as_ref().unwrap().child.as_ref().unwrap().id();
        assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
    }

    fn any(&self) -> &Server {
        self.alive().next().unwrap().1
    }
}

fn report(what: &str, mut times: Vec<f64>) {
    times.sort_by(f64::total_cmp);
    let p50 = times[times.len() / 2];
    let max = times[times.len() - 1];
    eprintln!("HA fail-over after {what}: p50 {p50:.2} s, max {max:.2} s over {} runs ({times:?})", times.len());
}

/// Every acknowledged machine still kept is there, started, with exactly one live instance,
/// the one recorded; every removed one is gone with its instance; and no live instance of ours
/// belongs to no machine.
fn assert_all_provisioned_once(c: &Cluster, acked: &[String]) {
    let i = c.alive().next().unwrap().0;
    let mut ms: Vec<Value> = Vec::new();
    let all_started = poll(Duration::from_secs(60), Duration::from_millis(50), || {
        let out = c.cli(i, &["machine", "list", "--json"]);
        ms = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let started = |id: &String| ms.iter().any(|m| field(m, "id") == id && field(m, "status") == "started");
        (ms.len() == acked.len() && acked.iter().all(started)).then_some(())
    });
    if all_started.is_none() {
        // What is not there yet, and what the replicas said (their last lines).
        let behind: Vec<String> = ms
            .iter()
            .filter(|m| !acked.iter().any(|id| field(m, "id") == id) || field(m, "status") != "started")
            .map(|m| m.to_string())
            .collect();
        let logs: Vec<String> = c
            .alive()
            .map(|(n, s)| {
                let text = s.log_text();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                format!("replica {n}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect();
        panic!(
            "timed out waiting for every kept machine to be started and every removed one gone: \
             {} machines listed, {} acknowledged; not started or not acknowledged: {behind:#?}\n{}",
            ms.len(),
            acked.len(),
            logs.join("\n")
        );
    }
    let out = c.cli(i, &["machine", "list", "--json"]);
    let machines: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    // A real cloud's instances are read from a listing up to 5 s old (`Age`): read until the
    // listing has every recorded instance and no removed machine's (or its last is asserted
    // on, after 15 s).
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    poll(Duration::from_secs(15), Duration::from_millis(250), || {
        let out = c.cli(i, &["instance", "list", "--json"]);
        let instances: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        live = BTreeMap::new();
        for inst in &instances {
            live.entry(field(inst, "machine").to_owned()).or_default().push(field(inst, "id").to_owned());
        }
        let recorded = |m: &Value| live.get(field(m, "id")) == Some(&vec![field(m, "instance").to_owned()]);
        // ... and no longer shows the instances of machines removed since.
        (machines.iter().all(recorded) && live.keys().all(|m| acked.contains(m))).then_some(())
    });
    for id in acked {
        let m = machines.iter().find(|m| field(m, "id") == id).unwrap_or_else(|| panic!("acknowledged {id} lost"));
        assert_eq!(live.get(id.as_str()), Some(&vec![field(m, "instance").to_owned()]), "machine {id}: {live:?}");
    }
    assert_eq!(machines.len(), acked.len(), "no machine beyond those acknowledged");
    assert!(live.keys().all(|m| acked.contains(m)), "no live instance without a machine: {live:?}");
}

#[test]
fn replicas_fail_over_on_kill_9_and_sigterm_without_a_duplicate_instance() {
    let mut c = Cluster::start("ha-kill", 3);
    let (mut leader, mut epoch) = c.leader(0, Duration::from_secs(20));
    let mut acked = Vec::new();
    let mut kill_times = Vec::new();
    for run in 0..runs() {
        // Starts in flight (each takes 1 s in the simulated cloud), added through a follower;
        // an older machine removed through another.
        acked.extend(c.add(c.follower(leader, run), 3));
        c.remove_one(c.follower(leader, run + 1), &mut acked);
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        c.replicas[leader].as_mut().unwrap().crash();
        c.replicas[leader] = None;
        acked.extend(c.add(c.follower(leader, run + 1), 1));
        let (next, e) = c.leader(epoch, Duration::from_secs(30));
        kill_times.push(t0.elapsed().as_secs_f64());
        assert!(e > epoch && next != leader);
        (leader, epoch) = (next, e);
        c.spawn();
    }
    let mut term_times = Vec::new();
    for run in 0..runs() {
        acked.extend(c.add(c.follower(leader, run), 2));
        c.remove_one(c.follower(leader, run + 1), &mut acked);
        let t0 = Instant::now();
        c.signal(leader, "-TERM");
        let (next, e) = c.leader(epoch, Duration::from_secs(30));
        term_times.push(t0.elapsed().as_secs_f64());
        let status = c.replicas[leader].as_mut().unwrap().child.take().unwrap().wait().unwrap();
        assert_eq!(status.code(), Some(0), "a clean shutdown exits 0");
        c.replicas[leader] = None;
        (leader, epoch) = (next, e);
        c.spawn();
    }
    assert_all_provisioned_once(&c, &acked);
    // One transition per kill and per SIGTERM, none besides.
    c.assert_fenced(2 * runs()..=2 * runs());
    report("kill -9", kill_times.clone());
    report("SIGTERM", term_times.clone());
    // Generous bounds (the figures are reported, not timed assertions): the lease and one
    // retry after a kill, a few retries after a clean release.
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    assert!(max(&kill_times) < LEASE_S + RETRY_S + 5.0, "{kill_times:?}");
    assert!(max(&term_times) < RETRY_S + 3.0, "{term_times:?}");
    let metrics = c.any().metrics();
    assert!(metrics.contains("# TYPE provisioner_leader gauge"), "{metrics}");
    assert!(metrics.contains("provisioner_leader_transitions_total"), "{metrics}");
}

#[test]
fn a_paused_leader_is_fenced_out_and_steps_down() {
    let c = Cluster::start("ha-stop", 3);
    let (mut leader, mut epoch) = c.leader(0, Duration::from_secs(20));
    let mut acked = Vec::new();
    for run in 0..runs() {
        acked.extend(c.add(c.follower(leader, run), 3));
        c.remove_one(c.follower(leader, run + 1), &mut acked);
        std::thread::sleep(Duration::from_millis(300));
        // Paused with starts in flight, for longer than its lease.
        c.signal(leader, "-STOP");
        let (next, e) = c.leader(epoch, Duration::from_secs(30));
        assert!(next != leader && e > epoch);
        std::thread::sleep(Duration::from_secs_f64(LEASE_S));
        c.signal(leader, "-CONT");
        // Resumed, it finds its lease gone: it steps down (its writes meanwhile are refused
        // by the fence), and stays a follower of the new epoch.
        let old = leader;
        eventually(Duration::from_secs(10), "the resumed ex-leader to step down", || {
            c.status(old).is_some_and(|s| s["role"] == "follower" && s["epoch"].as_i64() >= Some(e))
        });
        (leader, epoch) = (next, e);
    }
    assert_all_provisioned_once(&c, &acked);
    // One transition per pause; the resumed ex-leaders' writes were all refused.
    c.assert_fenced(runs()..=runs());
    // The ex-leaders' logs say they stopped acting.
    let logs: String = c.alive().map(|(_, s)| s.log_text()).collect();
    assert!(logs.contains("no longer the leader") || logs.contains("role changed"), "{logs}");
}

#[test]
fn a_database_restart_under_the_replicas_keeps_one_leader_and_duplicates_nothing() {
    let mut c = Cluster::start("ha-pgrestart", 3);
    let (leader, epoch) = c.leader(0, Duration::from_secs(20));
    let mut acked = Vec::new();
    for run in 0..runs() {
        acked.extend(c.add(c.follower(leader, run), 3));
        std::thread::sleep(Duration::from_millis(300));
        c.pg.restart().expect("restart PostgreSQL");
        // Some replica leads again (the same one if it renewed in time, else another at a
        // higher epoch), and exactly one says so.
        let led = poll(Duration::from_secs(30), Duration::from_millis(100), || {
            let leaders: Vec<i64> = c
                .alive()
                .filter_map(|(i, _)| c.status(i))
                .filter(|s| s["role"] == "leader")
                .filter_map(|s| s["epoch"].as_i64())
                .collect();
            assert!(leaders.len() <= 1, "at most one replica says it leads: {leaders:?}");
            leaders.first().is_some_and(|e| *e >= epoch).then_some(())
        });
        assert!(led.is_some(), "no leader after the restart");
    }
    assert_all_provisioned_once(&c, &acked);
    // A restart shorter than the renew deadline keeps the leader; a longer one hands over once.
    c.assert_fenced(0..=runs());
}

#[test]
fn a_leader_cut_off_from_the_database_is_replaced_and_rejoins_as_a_follower() {
    let c = Cluster::start_with("ha-cut", 3, true, &["--sim-start-latency", "1s"]);
    let (mut leader, mut epoch) = c.leader(0, Duration::from_secs(20));
    let mut acked = Vec::new();
    let mut times = Vec::new();
    for run in 0..runs() {
        acked.extend(c.add(c.follower(leader, run), 3));
        c.remove_one(c.follower(leader, run + 1), &mut acked);
        std::thread::sleep(Duration::from_millis(300));
        // The partition: the leader's lease renewals, writes and listening all go unanswered.
        let t0 = Instant::now();
        c.proxies[leader].as_ref().unwrap().cut();
        let (next, e) = c.leader(epoch, Duration::from_secs(30));
        times.push(t0.elapsed().as_secs_f64());
        assert!(next != leader && e > epoch);
        acked.extend(c.add(next, 1));
        c.proxies[leader].as_ref().unwrap().heal();
        let old = leader;
        eventually(Duration::from_secs(20), "the healed ex-leader to serve as a follower", || {
            c.status(old).is_some_and(|s| s["role"] == "follower" && s["epoch"].as_i64() >= Some(e))
        });
        (leader, epoch) = (next, e);
    }
    assert_all_provisioned_once(&c, &acked);
    c.assert_fenced(runs()..=runs());
    report("a partition from the database", times);
}

/// The same fail-over with the EC2 broker on moto: the leader is killed with starts in flight;
/// the new leader repeats each start with its client token (moto answers the instance the
/// first call made) or adopts it by its tags, so each machine has one instance in the cloud.
#[cfg(all(feature = "ec2", feature = "test-util"))]
#[test]
fn replicas_on_ec2_fail_over_without_a_duplicate_instance() {
    let mut c = Cluster::start_with("ha-ec2", 3, false, &moto_serve_args(provisioner::testing::moto::Moto::shared()));
    kill_leaders_with_starts_in_flight(&mut c, runs(), Duration::from_millis(150));
}

/// `runs` times: machines added through a follower and one removed through another, then,
/// `settle` later (starts in flight), the leader killed (`kill -9`), another leading, a replica
/// started in its place. Every acknowledged machine ends provisioned once, fenced: the
/// machines.
fn kill_leaders_with_starts_in_flight(c: &mut Cluster, runs: usize, settle: Duration) -> Vec<String> {
    let (mut leader, mut epoch) = c.leader(0, Duration::from_secs(30));
    let mut acked = Vec::new();
    for run in 0..runs {
        acked.extend(c.add(c.follower(leader, run), 4));
        c.remove_one(c.follower(leader, run + 1), &mut acked);
        std::thread::sleep(settle);
        c.replicas[leader].as_mut().unwrap().crash();
        c.replicas[leader] = None;
        (leader, epoch) = c.leader(epoch, Duration::from_secs(30));
        c.spawn();
    }
    assert_all_provisioned_once(c, &acked);
    c.assert_fenced(runs..=runs);
    acked
}

/// The fail-over on LXD (issue 32): the leader is killed with starts in flight, three times;
/// the new leader repeats each start under its instance name (LXD answers that it exists: the
/// container is adopted and started) or adopts it by its keys. Each machine ends with exactly
/// one container on the daemon, the one recorded, and the daemon holds no other.
#[cfg(all(feature = "lxd", feature = "test-util"))]
#[test]
fn replicas_on_lxd_fail_over_without_a_duplicate_container() {
    let Some(daemon) = provisioner::testing::lxd::daemon_for_test("ha", "busybox") else { return };
    let socket = format!("unix:{}", daemon.socket().display());
    let args = ["--broker", "lxd", "--lxd-endpoint", &socket, "--lxd-image", "busybox"];
    let mut c = Cluster::start_with("ha-lxd", 3, false, &args);
    let acked = kill_leaders_with_starts_in_flight(&mut c, 3, Duration::from_millis(300));
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    poll(Duration::from_secs(30), Duration::from_millis(250), || {
        held = BTreeMap::new();
        for i in daemon.instances().unwrap() {
            *held.entry(i.user.get("user.provisioner-machine").cloned().unwrap_or_default()).or_default() += 1;
        }
        (held.len() == acked.len()).then_some(())
    });
    for id in &acked {
        assert_eq!(held.get(id), Some(&1), "machine {id}: {held:?}");
    }
    assert_eq!(held.len(), acked.len(), "no container besides the machines': {held:?}");
}

/// Issue 30, item 0: PostgreSQL restarted under load (`pg_ctl stop -m fast`, then start) every
/// 10–20 s while machines are added through random replicas every 0.2 s, until it has been
/// restarted `PROVISIONER_HA_PG_RESTARTS` times (default 20). Seen before the fix: a leader's
/// store parked for ever inside one database call while its lease kept renewing — no
/// provisioning, an API that did not answer, and no fail-over. After each restart: within a
/// bound some replica leads and its store commits (a machine added after the restart is
/// started), and every replica answers `/v1/status` within a second. At the end every
/// acknowledged machine has exactly one live instance, the one recorded, and no write committed
/// under a stale epoch.
#[test]
fn postgres_restarts_under_load_never_wedge_the_leader() {
    use rand::{Rng, SeedableRng};
    let restarts: usize = std::env::var("PROVISIONER_HA_PG_RESTARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let mut c = Cluster::start("ha-wedge", 3);
    c.leader(0, Duration::from_secs(30));
    let token = std::fs::read_to_string(c.token_dir.join("token")).unwrap().trim().to_owned();
    let urls: Vec<String> = c.alive().map(|(_, s)| s.url.clone()).collect();
    // The load: one machine every 0.2 s through a random replica. An add that failed may still
    // have been made (its answer lost with the connection): counted, not acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, urls, token) = (stop.clone(), urls.clone(), token.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(30);
            let (mut acked, mut unsure) = (Vec::new(), 0usize);
            while !stop.load(Ordering::Relaxed) {
                let url = &urls[rng.random_range(0..urls.len())];
                let r = ureq::post(&format!("{url}/v1/machines"))
                    .set("Authorization", &format!("Bearer {token}"))
                    .timeout(Duration::from_secs(15))
                    .send_json(serde_json::json!({"count": 1}));
                match r {
                    Ok(r) => acked.extend(ids_of(&r.into_json::<Value>().unwrap()["ids"])),
                    Err(_) => unsure += 1,
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (acked, unsure)
        })
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(20);
    let mut recoveries = Vec::new();
    // The probes' own adds: acknowledged, and failed (perhaps made, their answer lost).
    let (mut probes, mut probes_unsure) = (Vec::new(), 0usize);
    for run in 0..restarts {
        let period = Duration::from_millis(rng.random_range(10_000..=20_000));
        let t0 = Instant::now();
        c.pg.restart().expect("restart PostgreSQL");
        let probe = recovered(&c, run);
        recoveries.push(probe.took.as_secs_f64());
        probes.push(probe.id);
        probes_unsure += probe.failed_adds;
        // Every replica answers its status within a second.
        for (i, _) in c.alive() {
            assert!(c.status(i).is_some(), "restart {run}: replica {i} did not answer /v1/status within a second");
        }
        std::thread::sleep(period.saturating_sub(t0.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let (acked, unsure) = load.join().unwrap();
    eprintln!("HA PostgreSQL restarts: {restarts}, {} adds acknowledged, {unsure} failed", acked.len());
    report("a PostgreSQL restart (until a new machine is started)", recoveries);
    // Every acknowledged machine started once; the failed adds that were made anyway too.
    let i = c.alive().next().unwrap().0;
    eventually(Duration::from_secs(60), "every machine started", || {
        let out = c.cli(i, &["machine", "list", "--json"]);
        let ms: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        !ms.is_empty() && ms.iter().all(|m| field(m, "status") == "started")
    });
    let machines: Vec<Value> = serde_json::from_slice(&c.cli(i, &["machine", "list", "--json"]).stdout).unwrap();
    let instances: Vec<Value> = serde_json::from_slice(&c.cli(i, &["instance", "list", "--json"]).stdout).unwrap();
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for inst in &instances {
        live.entry(field(inst, "machine").to_owned()).or_default().push(field(inst, "id").to_owned());
    }
    for id in acked.iter().chain(&probes) {
        assert!(machines.iter().any(|m| field(m, "id") == id), "acknowledged {id} lost");
    }
    let adds = acked.len() + unsure + probes.len() + probes_unsure;
    assert!(machines.len() <= adds, "{} machines for {adds} adds", machines.len());
    for m in &machines {
        let id = field(m, "id");
        assert_eq!(live.get(id), Some(&vec![field(m, "instance").to_owned()]), "machine {id}: {live:?}");
    }
    assert!(live.keys().all(|id| machines.iter().any(|m| field(m, "id") == id)), "no live instance without a machine");
    let a = c.audit();
    assert!(a.stale.is_empty(), "writes committed under a stale epoch: {:?}", a.stale);
}

/// What [`recovered`] saw: how long the recovery took, the machine it added (acknowledged), and
/// how many of its adds failed (each may have been made, its answer lost with the database).
struct Recovery {
    took: Duration,
    id: String,
    failed_adds: usize,
}

/// After a restart of the database: how long until some replica leads and its store commits, as
/// seen by a machine added now (through any replica, retried while the database comes back)
/// being started. Panics past a minute, with the replicas' last log lines.
fn recovered(c: &Cluster, run: usize) -> Recovery {
    let t0 = Instant::now();
    let limit = Duration::from_secs(60);
    let replicas: Vec<usize> = c.alive().map(|(i, _)| i).collect();
    let mut k = run;
    let every = Duration::from_millis(200);
    let mut failed_adds = 0;
    let id = poll(limit, every, || {
        let out = c.cli(replicas[k % replicas.len()], &["machine", "add", "--json"]);
        if out.status.success() {
            return Some(ids_of(&serde_json::from_slice(&out.stdout).unwrap()).remove(0));
        }
        failed_adds += 1;
        k += 1;
        None
    });
    let id = id.unwrap_or_else(|| panic!("restart {run}: no replica took an add for a minute\n{}", tails(c)));
    let took = poll(limit.saturating_sub(t0.elapsed()), every, || {
        let out = c.cli(replicas[k % replicas.len()], &["machine", "list", "--json"]);
        let ms: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if ms.iter().any(|m| field(m, "id") == id && field(m, "status") == "started") {
            return Some(t0.elapsed());
        }
        k += 1;
        None
    });
    let took = took.unwrap_or_else(|| panic!("restart {run}: machine {id} not started within a minute\n{}", tails(c)));
    Recovery { took, id, failed_adds }
}

/// Each live replica's last log lines.
fn tails(c: &Cluster) -> String {
    c.alive()
        .map(|(n, s)| {
            let text = s.log_text();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            format!("replica {n}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 30, item 0: the lease is tied to the leader's progress. A table the leader's store
/// needs (`meta`, which an add and a read of the model take) is locked by another session, and
/// the leader's store fails on it (an add through the leader waits out the lock and fails):
/// the leader's lease renews as ever (its own table is free), but its store answers nothing
/// well (a troubled store's probe reads the model: issue 36 made an untroubled one's probe ask
/// only its lane's connection), so it steps down as `stalled` within about its renew deadline
/// and releases the lease, rather than keep a healthy lease over work that cannot move. Once
/// the lock goes, one replica leads and provisions again, and nothing was written under a
/// stale epoch.
#[test]
fn a_leader_whose_store_makes_no_progress_steps_down_though_its_lease_renews() {
    let c = Cluster::start("ha-stall", 3);
    let (leader, epoch) = c.leader(0, Duration::from_secs(20));
    let mut acked = c.add(c.follower(leader, 0), 2);
    assert_all_provisioned_once(&c, &acked);
    let mut holder = ::postgres::Client::connect(&c.url, ::postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("LOCK TABLE meta IN ACCESS EXCLUSIVE MODE").unwrap();
    let t0 = Instant::now();
    let out = c.cli(leader, &["machine", "add", "-n", "1", "--json"]);
    assert!(!out.status.success(), "an add through the leader behind the lock was acknowledged");
    eventually(Duration::from_secs(20), "the leader to step down as stalled", || {
        c.replicas[leader].as_ref().unwrap().log_text().contains("why=\"stalled\"")
    });
    eprintln!("HA stalled leader stepped down after {:.2} s", t0.elapsed().as_secs_f64());
    tx.rollback().unwrap();
    let (_, e) = c.leader(epoch, Duration::from_secs(60));
    assert!(e > epoch);
    acked.extend(c.add(c.follower(leader, 1), 2));
    assert_all_provisioned_once(&c, &acked);
    let a = c.audit();
    assert!(a.stale.is_empty(), "writes committed under a stale epoch: {:?}", a.stale);
}
