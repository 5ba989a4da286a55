//! `provisioner bench lxd` (issue 32): N machines through the service (`serve --broker lxd`)
//! against one LXD daemon, beside the same N containers created and started directly through
//! LXD's API at the same concurrency, in one run: direct, the service, direct again (per
//! round). The figure is the service's time over the mean of the direct runs' (the aim: within
//! 1.25×).
//!
//! - Direct: N containers created (`POST /1.0/instances` from the image alias, waited on by
//!   operation id) then started (`PUT .../state`, waited), `--concurrency` at a time, with the
//!   crate's [`LxdClient`] (one connection a call, as the broker makes them); timed from the
//!   first call to the last container running. They are deleted afterwards (force stop, then
//!   delete), untimed.
//! - The service: `provisioner serve --broker lxd` on a fresh data directory and a free
//!   loopback port, its worker pool `--concurrency` (a config file's `workers`); one
//!   `POST /v1/machines` of N machines, timed from sending it to every machine `started` (the
//!   machine list, read every 50 ms: the store's, no cloud call); then the machines are
//!   removed and their containers checked gone.
//!
//! Without `--lxd-endpoint` the bench starts a standalone daemon of its own
//! ([`provisioner::testing::lxd`]) with the busybox image, and removes it at the end.

// A benchmark measures wall-clock time and polls: both are what it is for.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use hyper::Method;
use provisioner::adapters::lxd::{Answer, CallError, LxdClient, LxdEndpoint, LxdTlsFiles, KEY_MODEL};
use provisioner::service::wire::{AddMachines, AddedMachines, MachineView, RemoveMachines, StatusView};
use provisioner::testing::lxd::{ensure_lxd, LxdDaemon};
use serde::Serialize;
use serde_json::{json, Value};

use super::client::{Client, Failure};
use super::serve::{peak_rss_mib, percentile, start_service};
use super::{BenchLxdArgs, Conn};

/// The image alias the bench imports into a daemon of its own.
const OWN_IMAGE: &str = "busybox";

/// The aim: the service's time within this factor of LXD's own.
const TARGET_RATIO: f64 = 1.25;

/// How long one LXD call, and one operation, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

/// How often the service's machine list is read while it provisions.
const POLL: Duration = Duration::from_millis(50);

/// One direct run.
#[derive(Debug, Serialize)]
struct DirectRun {
    /// First call to last container running.
    wall_s: f64,
    /// Per container: its create (call and operation), its start (call and operation).
    create_p50_ms: f64,
    start_p50_ms: f64,
    /// Per container: from the run's first call to it running (the median).
    running_p50_s: f64,
    /// LXD's own record: from the run's first call to the first container's `created_at`,
    /// and to the last one's `last_used_at` (its start).
    lxd_first_created_s: Option<f64>,
    lxd_last_started_s: Option<f64>,
}

/// One round: direct, the service, direct.
#[derive(Debug, Serialize)]
struct Round {
    direct_before: DirectRun,
    direct_after: DirectRun,
    /// From sending the add to every machine `started`.
    service_s: f64,
    /// Per machine: from the add to it seen `started` (the median; read every 50 ms).
    service_started_p50_s: f64,
    /// Machines started by the service.
    service_machines_started: usize,
    /// LXD's own record of the service's containers: from the add to the first one's
    /// `created_at`, and to the last one's `last_used_at` (its start).
    service_lxd_first_created_s: Option<f64>,
    service_lxd_last_started_s: Option<f64>,
    /// The service's time over the mean of the two direct runs'.
    ratio: f64,
    /// From the removal request to the model's containers all gone (untimed by the ratio).
    service_removal_s: f64,
    /// The service's peak resident set (`VmHWM`, read before it is stopped).
    service_peak_rss_mib: Option<f64>,
    /// The service's broker calls until every machine started, by operation (its
    /// `/metrics`): how many, and their mean duration.
    service_broker_calls: BTreeMap<String, BrokerCalls>,
}

/// Calls of one broker operation.
#[derive(Debug, Default, Serialize)]
struct BrokerCalls {
    count: u64,
    mean_ms: f64,
}

/// `provisioner_broker_call_duration_seconds`'s counts and means by `op`, from `/metrics`.
fn broker_calls(metrics: &str) -> BTreeMap<String, BrokerCalls> {
    let mut sums: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("provisioner_broker_call_duration_seconds_") else { continue };
        let (kind, rest) = rest.split_once('{').unwrap_or_default();
        let Some((labels, value)) = rest.split_once("} ") else { continue };
        let Some(op) = labels.split(',').find_map(|l| l.strip_prefix("op=\"")).map(|o| o.trim_end_matches('"')) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let entry = sums.entry(op.to_owned()).or_default();
        match kind {
            "sum" => entry.0 = value,
            "count" => entry.1 = value as u64,
            _ => {}
        }
    }
    sums.into_iter()
        .filter(|(_, (_, n))| *n > 0)
        .map(|(op, (sum, n))| (op, BrokerCalls { count: n, mean_ms: sum / n as f64 * 1000.0 }))
        .collect()
}

/// What `bench lxd` measured.
#[derive(Debug, Serialize)]
struct BenchLxdReport {
    machines: usize,
    concurrency: usize,
    endpoint: String,
    image: String,
    /// The LXD server's version.
    lxd_version: String,
    /// Whether the bench started (and removed) a daemon of its own.
    own_daemon: bool,
    /// That daemon's directory and process (both gone when the report is printed).
    own_daemon_dir: Option<PathBuf>,
    own_daemon_pid: Option<u32>,
    rounds: Vec<Round>,
    /// Means over the rounds.
    direct_mean_s: f64,
    service_mean_s: f64,
    /// `service_mean_s / direct_mean_s`.
    ratio: f64,
    ratio_min: f64,
    ratio_max: f64,
    target_ratio: f64,
    within_target: bool,
    /// The largest of the rounds' service peaks.
    service_peak_rss_mib: Option<f64>,
    /// Instances the bench made that are still on the daemon at the end (0 in a clean run).
    containers_left: usize,
}

fn runtime(message: impl Into<String>) -> Failure {
    Failure { code: 1, message: message.into() }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure { code: 2, message: message.into() }
}

/// Runs the bench and prints its report.
pub fn bench(args: BenchLxdArgs) -> ExitCode {
    super::serve::report(bench_inner(&args), args.json, print_human)
}

fn secs(s: Option<f64>) -> String {
    s.map_or_else(|| "?".to_owned(), |s| format!("{s:.2}s"))
}

fn print_human(r: &BenchLxdReport) {
    let daemon = if r.own_daemon { "a standalone daemon of its own" } else { "the daemon at" };
    let at = if r.own_daemon { String::new() } else { format!(" {}", r.endpoint) };
    println!(
        "{} containers ({}), {} at a time, on {daemon}{at} (LXD {}):",
        r.machines, r.image, r.concurrency, r.lxd_version
    );
    for (i, round) in r.rounds.iter().enumerate() {
        let rss = round.service_peak_rss_mib.map_or_else(|| "unknown".to_owned(), |m| format!("{m:.0} MiB"));
        println!(
            "  round {}: direct {:.2}s, service {:.2}s, direct {:.2}s: ratio {:.2} (direct per container: create p50 {:.0} ms, start p50 {:.0} ms; the service's first create after {}, last start after {}; service peak RSS {rss}; removal {:.2}s)",
            i + 1,
            round.direct_before.wall_s,
            round.service_s,
            round.direct_after.wall_s,
            round.ratio,
            round.direct_before.create_p50_ms,
            round.direct_before.start_p50_ms,
            secs(round.service_lxd_first_created_s),
            secs(round.service_lxd_last_started_s),
            round.service_removal_s,
        );
        let calls: Vec<String> = round
            .service_broker_calls
            .iter()
            .map(|(op, c)| format!("{op} ×{} (mean {:.0} ms)", c.count, c.mean_ms))
            .collect();
        println!("    the service's broker calls: {}", calls.join(", "));
    }
    println!(
        "provisioner {:.2}s / LXD directly {:.2}s = {:.2} (min {:.2}, max {:.2}; aim ≤ {:.2}: {})",
        r.service_mean_s,
        r.direct_mean_s,
        r.ratio,
        r.ratio_min,
        r.ratio_max,
        r.target_ratio,
        if r.within_target { "met" } else { "not met" }
    );
}

/// Where LXD is and what to start from.
struct Target {
    endpoint: LxdEndpoint,
    tls: LxdTlsFiles,
    image: String,
    /// The daemon the bench started, if it did.
    own: Option<LxdDaemon>,
}

fn bench_inner(args: &BenchLxdArgs) -> Result<BenchLxdReport, Failure> {
    if args.machines == 0 || args.machines > 10_000 {
        return Err(usage("--machines must be between 1 and 10000"));
    }
    if args.concurrency == 0 || args.concurrency > 100 {
        return Err(usage("--concurrency must be between 1 and 100 (the service's worker pool)"));
    }
    if args.rounds == 0 {
        return Err(usage("--rounds must be positive"));
    }
    let lxd = &args.lxd;
    if lxd.project.is_some() {
        return Err(usage("--lxd-project: the bench measures in the default project"));
    }
    let tls = LxdTlsFiles {
        client_cert: lxd.client_cert.clone(),
        client_key: lxd.client_key.clone(),
        server_cert: lxd.server_cert.clone(),
    };
    let target = match (&lxd.endpoint, &lxd.image) {
        (Some(e), Some(image)) => {
            let endpoint = LxdEndpoint::parse(e).map_err(|e| usage(e.to_string()))?;
            Target { endpoint, tls, image: image.clone(), own: None }
        }
        (None, None) => {
            if tls != LxdTlsFiles::default() {
                return Err(usage("--lxd-client-cert, --lxd-client-key and --lxd-server-cert need --lxd-endpoint"));
            }
            ensure_lxd().map_err(|why| runtime(format!("cannot start an LXD daemon for the bench: {why}")))?;
            let own = LxdDaemon::standalone(&format!("bench{}", std::process::id()))
                .map_err(|e| runtime(format!("cannot start an LXD daemon for the bench: {e}")))?;
            own.import_busybox_image(OWN_IMAGE)
                .map_err(|e| runtime(format!("cannot import the busybox image into the bench's daemon: {e}")))?;
            Target { endpoint: LxdEndpoint::Unix(own.socket()), tls, image: OWN_IMAGE.to_owned(), own: Some(own) }
        }
        _ => return Err(usage("--lxd-endpoint and --lxd-image go together (or neither: a daemon of the bench's own)")),
    };
    let client = LxdClient::new(&target.endpoint, &target.tls, CALL_TIMEOUT)
        .map_err(|e| usage(format!("cannot use --lxd-endpoint {}: {e}", target.endpoint)))?;
    let system = actix_rt::System::new();
    let server = system
        .block_on(client.get("/1.0"))
        // As `serve` does: an endpoint that does not answer is a setting to fix.
        .map_err(|e| usage(format!("cannot reach LXD at --lxd-endpoint {}: {e}", target.endpoint)))?;
    if server.get("auth").and_then(Value::as_str) != Some("trusted") {
        return Err(usage(format!("LXD at {} does not trust this client", target.endpoint)));
    }
    let lxd_version = server.pointer("/environment/server_version").and_then(Value::as_str).unwrap_or("?").to_owned();

    let mut rounds = Vec::new();
    let mut model_uuids = Vec::new();
    let mut outcome = Ok(());
    for round in 0..args.rounds {
        let run = Run { system: &system, client: &client, target: &target, args };
        match one_round(run, round, &mut model_uuids) {
            Ok(r) => rounds.push(r),
            Err(f) => {
                outcome = Err(f);
                break;
            }
        }
    }
    // What is left of ours: direct containers (named `bench-PID-...`) and the services'.
    let prefix = format!("bench-{}-", std::process::id());
    let left = system.block_on(ours(&client, &prefix, &model_uuids)).unwrap_or_default();
    if !left.is_empty() {
        let _ = system.block_on(remove_all(&client, &left, args.concurrency));
    }
    let containers_left = system.block_on(ours(&client, &prefix, &model_uuids)).map(|l| l.len()).unwrap_or(0);
    let (own_daemon_dir, own_daemon_pid) = match &target.own {
        Some(d) => (Some(d.dir().parent().unwrap_or(d.dir()).to_owned()), Some(d.pid())),
        None => (None, None),
    };
    let own_daemon = target.own.is_some();
    let endpoint = target.endpoint.to_string();
    drop(target); // the bench's own daemon stops, its directory goes
    outcome?;

    let direct: Vec<f64> = rounds.iter().flat_map(|r| [r.direct_before.wall_s, r.direct_after.wall_s]).collect();
    let service: Vec<f64> = rounds.iter().map(|r| r.service_s).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (direct_mean_s, service_mean_s) = (mean(&direct), mean(&service));
    let ratio = service_mean_s / direct_mean_s;
    let ratios = rounds.iter().map(|r| r.ratio);
    Ok(BenchLxdReport {
        machines: args.machines,
        concurrency: args.concurrency,
        endpoint,
        image: args.lxd.image.clone().unwrap_or_else(|| OWN_IMAGE.to_owned()),
        lxd_version,
        own_daemon,
        own_daemon_dir,
        own_daemon_pid,
        direct_mean_s,
        service_mean_s,
        ratio,
        ratio_min: ratios.clone().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.fold(0.0, f64::max),
        target_ratio: TARGET_RATIO,
        within_target: ratio <= TARGET_RATIO,
        service_peak_rss_mib: rounds.iter().filter_map(|r| r.service_peak_rss_mib).reduce(f64::max),
        containers_left,
        rounds,
    })
}

/// Direct, the service, direct.
/// What every part of a run works with.
#[derive(Clone, Copy)]
struct Run<'a> {
    system: &'a actix_rt::SystemRunner,
    client: &'a LxdClient,
    target: &'a Target,
    args: &'a BenchLxdArgs,
}

fn one_round(run: Run<'_>, round: usize, model_uuids: &mut Vec<String>) -> Result<Round, Failure> {
    let direct_before = direct_run(run, &format!("{round}a"))?;
    let service = service_run(run, round, model_uuids)?;
    let direct_after = direct_run(run, &format!("{round}b"))?;
    let ratio = service.wall_s / ((direct_before.wall_s + direct_after.wall_s) / 2.0);
    Ok(Round {
        direct_before,
        direct_after,
        service_s: service.wall_s,
        service_started_p50_s: service.started_p50_s,
        service_machines_started: service.started,
        service_lxd_first_created_s: service.lxd_span.map(|s| s.0),
        service_lxd_last_started_s: service.lxd_span.map(|s| s.1),
        ratio,
        service_removal_s: service.removal_s,
        service_peak_rss_mib: service.peak_rss_mib,
        service_broker_calls: service.broker_calls,
    })
}

/// A call waited on: the operation's metadata (or the call's, when it was synchronous).
async fn operate(client: &LxdClient, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
    match client.call(method, path, body).await? {
        Answer::Sync(v) => Ok(v),
        Answer::Async(id) => client.wait(&id, "default", OPERATION_TIMEOUT).await,
    }
}

/// Creates and starts `name` as the broker does (a start refused because the create still
/// holds the instance is tried again 200 ms later): the create's and the start's durations.
async fn create_and_start(client: &LxdClient, name: &str, image: &str) -> Result<(Duration, Duration), String> {
    let began = Instant::now();
    let body = json!({
        "name": name,
        "type": "container",
        "source": {"type": "image", "alias": image},
        "config": {"user.provisioner-bench": "direct"},
    });
    operate(client, Method::POST, "/1.0/instances?project=default", Some(&body))
        .await
        .map_err(|e| format!("create {name}: {e}"))?;
    let created = Instant::now();
    let state = json!({"action": "start", "force": false, "timeout": -1});
    let path = format!("/1.0/instances/{name}/state?project=default");
    loop {
        match operate(client, Method::PUT, &path, Some(&state)).await {
            Ok(_) => break,
            Err(e) if e.lxd_message().is_some_and(|m| m.to_ascii_lowercase().contains("busy")) => {
                actix_rt::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("start {name}: {e}")),
        }
    }
    Ok((created - began, created.elapsed()))
}

/// Force-stops and deletes each of `names`, `concurrency` at a time (gone already is fine).
async fn remove_all(client: &LxdClient, names: &[String], concurrency: usize) -> Result<(), String> {
    let results: Vec<Result<(), String>> = futures::stream::iter(names.iter())
        .map(|name| async move {
            let gone = |e: &CallError| {
                e.status() == Some(404) || e.lxd_message().is_some_and(|m| m.to_ascii_lowercase().contains("not found"))
            };
            let state = json!({"action": "stop", "force": true, "timeout": -1});
            let path = format!("/1.0/instances/{name}/state?project=default");
            match operate(client, Method::PUT, &path, Some(&state)).await {
                Ok(_) => {}
                Err(e) if gone(&e) => return Ok(()),
                Err(e)
                    if e.lxd_message().is_some_and(|m| m.contains("already stopped") || m.contains("not running")) => {}
                Err(e) => return Err(format!("stop {name}: {e}")),
            }
            match operate(client, Method::DELETE, &format!("/1.0/instances/{name}?project=default"), None).await {
                Err(e) if !gone(&e) => Err(format!("delete {name}: {e}")),
                _ => Ok(()),
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The instances of the bench on the daemon: direct ones (named `prefix...`) and those that
/// carry one of `models`' key.
async fn ours(client: &LxdClient, prefix: &str, models: &[String]) -> Result<Vec<String>, CallError> {
    let all = client.get("/1.0/instances?recursion=1&project=default").await?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| {
            let name = i.get("name").and_then(Value::as_str).unwrap_or_default();
            let model = i.pointer(&format!("/config/{KEY_MODEL}")).and_then(Value::as_str).unwrap_or_default();
            name.starts_with(prefix) || models.iter().any(|m| m == model)
        })
        .filter_map(|i| i.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect())
}

/// LXD's record of `names` (or, empty, the instances of `model`): from `t0` to the first
/// `created_at` and to the last `last_used_at` (when each was started), in seconds.
async fn lxd_span(client: &LxdClient, names: &[String], model: &str, t0: SystemTime) -> Option<(f64, f64)> {
    let all = client.get("/1.0/instances?recursion=1&project=default").await.ok()?;
    let offset = |i: &Value, key: &str| -> Option<f64> {
        let at = humantime::parse_rfc3339_weak(i.get(key)?.as_str()?).ok()?;
        Some(match at.duration_since(t0) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        })
    };
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    for i in all.as_array().into_iter().flatten() {
        let name = i.get("name").and_then(Value::as_str).unwrap_or_default();
        let theirs = i.pointer(&format!("/config/{KEY_MODEL}")).and_then(Value::as_str) == Some(model);
        if !(names.iter().any(|n| n == name) || names.is_empty() && theirs) {
            continue;
        }
        first = first.min(offset(i, "created_at")?);
        last = last.max(offset(i, "last_used_at")?);
    }
    first.is_finite().then_some((first, last))
}

/// N containers created and started directly, timed; then deleted, untimed.
fn direct_run(run: Run<'_>, tag: &str) -> Result<DirectRun, Failure> {
    let Run { system, client, target, args } = run;
    let names: Vec<String> = (0..args.machines).map(|i| format!("bench-{}-{tag}-{i}", std::process::id())).collect();
    let image = target.image.as_str();
    let wall = SystemTime::now();
    let began = Instant::now();
    let results: Vec<Result<(Duration, Duration, Duration), String>> = system.block_on(
        futures::stream::iter(names.iter())
            .map(|name| async move {
                let (create, start) = create_and_start(client, name, image).await?;
                Ok((create, start, began.elapsed()))
            })
            .buffer_unordered(args.concurrency)
            .collect(),
    );
    let wall_s = began.elapsed().as_secs_f64();
    let span = system.block_on(lxd_span(client, &names, "", wall));
    let removed = system.block_on(remove_all(client, &names, args.concurrency));
    let mut times = Vec::with_capacity(results.len());
    for r in results {
        times.push(r.map_err(|e| runtime(format!("LXD directly: {e}")))?);
    }
    removed.map_err(|e| runtime(format!("LXD directly, removing the bench's containers: {e}")))?;
    let sorted = |f: &dyn Fn(&(Duration, Duration, Duration)) -> f64| {
        let mut v: Vec<f64> = times.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.5)
    };
    Ok(DirectRun {
        wall_s,
        create_p50_ms: sorted(&|t| t.0.as_secs_f64() * 1000.0),
        start_p50_ms: sorted(&|t| t.1.as_secs_f64() * 1000.0),
        running_p50_s: sorted(&|t| t.2.as_secs_f64()),
        lxd_first_created_s: span.map(|s| s.0),
        lxd_last_started_s: span.map(|s| s.1),
    })
}

/// What one service run measured.
struct ServiceRun {
    wall_s: f64,
    started_p50_s: f64,
    started: usize,
    removal_s: f64,
    peak_rss_mib: Option<f64>,
    lxd_span: Option<(f64, f64)>,
    broker_calls: BTreeMap<String, BrokerCalls>,
}

/// A service on the daemon, N machines added at once, timed to all started; then removed.
fn service_run(run: Run<'_>, round: usize, model_uuids: &mut Vec<String>) -> Result<ServiceRun, Failure> {
    let args = run.args;
    let base = std::env::temp_dir().join(format!("provisioner-bench-lxd-{}-{round}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| runtime(format!("cannot create {}: {e}", base.display())))?;
    let dir = base.join("data");
    let config = base.join("bench.toml");
    std::fs::write(&config, format!("workers = {}\n", args.concurrency))
        .map_err(|e| runtime(format!("cannot write {}: {e}", config.display())))?;
    let result = service_run_in(run, &dir, &config, model_uuids);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn service_run_in(
    run: Run<'_>,
    dir: &std::path::Path,
    config: &std::path::Path,
    model_uuids: &mut Vec<String>,
) -> Result<ServiceRun, Failure> {
    let Run { system, client, target, args } = run;
    let mut flags: Vec<OsString> = vec!["--config".into(), config.into()];
    let endpoint = target.endpoint.to_string();
    flags.extend(["--broker", "lxd", "--lxd-endpoint", &endpoint, "--lxd-image", &target.image].map(OsString::from));
    for (flag, file) in [
        ("--lxd-client-cert", &target.tls.client_cert),
        ("--lxd-client-key", &target.tls.client_key),
        ("--lxd-server-cert", &target.tls.server_cert),
    ] {
        if let Some(f) = file {
            flags.extend([flag.into(), f.into()]);
        }
    }
    let (service, url) = start_service(dir, &flags, "its error is above")?;
    let conn =
        Conn { server: Some(url.clone()), token: None, data_dir: Some(dir.to_owned()), ca_cert: None, model: None };
    let api = Client::from_conn(&conn)?;
    let status: StatusView = api.get("/v1/status")?;
    model_uuids.push(status.model_uuid.clone());
    if status.workers != args.concurrency {
        return Err(runtime(format!("the service runs {} workers, not {}", status.workers, args.concurrency)));
    }

    // Timed: the add, to every machine started.
    let wall = SystemTime::now();
    let began = Instant::now();
    let added: AddedMachines = api.send("POST", "/v1/machines", &AddMachines::plain(args.machines, None))?;
    let limit = Duration::from_secs(120) + Duration::from_secs(5) * args.machines as u32;
    let mut started_at: BTreeMap<String, f64> = BTreeMap::new();
    loop {
        let list: Vec<MachineView> = api.get("/v1/machines")?;
        let now = began.elapsed().as_secs_f64();
        for m in &list {
            if m.status == "started" && m.instance.is_some() {
                started_at.entry(m.id.clone()).or_insert(now);
            } else if m.status == "error" {
                return Err(runtime(format!("the service could not start machine {}: {}", m.id, m.message)));
            }
        }
        if added.ids.iter().all(|id| started_at.contains_key(id)) {
            break;
        }
        if began.elapsed() > limit {
            return Err(runtime(format!(
                "the service started {} of {} machines in {} s",
                started_at.len(),
                args.machines,
                limit.as_secs()
            )));
        }
        std::thread::sleep(POLL);
    }
    let wall_s = began.elapsed().as_secs_f64();
    let mut each: Vec<f64> = started_at.values().copied().collect();
    each.sort_by(f64::total_cmp);
    let lxd_span = system.block_on(lxd_span(client, &[], &status.model_uuid, wall));
    let metrics = ureq::get(&format!("{url}/metrics")).call().ok().and_then(|r| r.into_string().ok());
    let broker_calls = metrics.as_deref().map(broker_calls).unwrap_or_default();

    // Untimed: the machines removed, their containers gone.
    let removing = Instant::now();
    api.send_only(
        "POST",
        "/v1/machines/remove",
        &RemoveMachines { ids: added.ids.clone(), keep_instance: false, force: false },
    )?;
    let prefix = "\u{0}"; // no direct container: only the model's
    loop {
        let left = system
            .block_on(ours(client, prefix, std::slice::from_ref(&status.model_uuid)))
            .map_err(|e| runtime(format!("cannot list LXD's instances: {e}")))?;
        if left.is_empty() {
            break;
        }
        if removing.elapsed() > limit {
            return Err(runtime(format!(
                "{} of the service's containers are still there {} s after the machines were removed",
                left.len(),
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let removal_s = removing.elapsed().as_secs_f64();
    // `VmHWM` is the high-water mark: read once, last.
    let peak_rss_mib = peak_rss_mib(service.0.id());
    drop(service);
    Ok(ServiceRun {
        wall_s,
        started_p50_s: percentile(&each, 0.5),
        started: started_at.len(),
        removal_s,
        peak_rss_mib,
        lxd_span,
        broker_calls,
    })
}
