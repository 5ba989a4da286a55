//! `provisioner serve` (runs [`provisioner::service::serve`] on an actix system) and
//! `provisioner bench serve` (starts a service on loopback and measures its HTTP API).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use clap::ArgMatches;
use provisioner::service::wire::{AddMachines, StatusView};
use provisioner::service::ServeSettings;
use serde::Serialize;

use super::client::{Client, Failure};
use super::{BenchServeArgs, Conn};

/// Runs the service until SIGTERM.
pub fn run(matches: &ArgMatches, logging: impl FnOnce(Option<super::TraceLayer>)) -> ExitCode {
    let opts = match ServeSettings::load(matches) {
        Ok(o) => o,
        Err(e) => {
            logging(None);
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let traces = match super::traces::start(opts.otlp_endpoint.as_deref(), opts.lease.replica_id.as_deref()) {
        Ok(traces) => traces,
        Err(e) => {
            logging(None);
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (layer, traces) = traces.unzip();
    logging(layer);
    if let Some(t) = &traces {
        tracing::info!(url = t.url(), "exporting traces (OTLP over HTTP)");
    }
    let served = actix_rt::System::new().block_on(provisioner::service::serve(opts));
    if let Some(t) = traces {
        t.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// What `bench serve` measured.
#[derive(Debug, Serialize)]
struct BenchReport {
    target_rate: f64,
    requests: usize,
    clients: usize,
    batch: usize,
    add_requests: usize,
    list_requests: usize,
    errors: usize,
    wall_s: f64,
    requests_per_s: f64,
    add_p50_ms: f64,
    add_p90_ms: f64,
    add_p99_ms: f64,
    add_max_ms: f64,
    list_p50_ms: f64,
    list_p99_ms: f64,
    machines: usize,
    machines_in_error: usize,
    all_provisioned_s: f64,
    /// The service's own peak resident set (`VmHWM` of its process, read before it is stopped;
    /// `None` where there is no `/proc`).
    service_peak_rss_mib: Option<f64>,
}

/// A process's peak resident set in MiB (`VmHWM` in `/proc/PID/status`, Linux).
pub(super) fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A child service that is sent SIGTERM (and reaped) when dropped.
pub(super) struct Service(pub(super) Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

/// Starts a service on a free loopback port with a fresh data dir, runs the load, reports.
// A benchmark measures wall-clock time and polls: both are what it is for.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub fn bench(args: BenchServeArgs) -> ExitCode {
    report(bench_inner(&args), args.json, |r| {
        let rss = r.service_peak_rss_mib.map_or_else(|| "unknown".to_owned(), |m| format!("{m:.0} MiB"));
        println!(
            "{} requests ({} adds of {} machine(s), {} lists) from {} clients in {:.2}s: {:.0} requests/s; add p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; list p50 {:.2} ms, p99 {:.2} ms; {} errors; {} machines all provisioned after {:.2}s; service peak RSS {rss}",
            r.requests, r.add_requests, r.batch, r.list_requests, r.clients, r.wall_s, r.requests_per_s,
            r.add_p50_ms, r.add_p90_ms, r.add_p99_ms, r.add_max_ms, r.list_p50_ms, r.list_p99_ms, r.errors,
            r.machines, r.all_provisioned_s
        );
    })
}

/// A benchmark's end: its report printed (JSON with `json`, else by `human`), or its failure
/// with the failure's exit code.
pub(super) fn report<R: Serialize>(outcome: Result<R, Failure>, json: bool, human: impl FnOnce(&R)) -> ExitCode {
    match outcome {
        Ok(r) if json => {
            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            human(&r);
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// A bench's service: `provisioner serve` on a free loopback port over the data directory
/// `dir`, with `flags` besides `--listen` and `--data-dir`; its URL once it answers and
/// accepts the token it wrote there.
///
/// The port is free when chosen, not necessarily when the service binds it (another process
/// may take it between): a service that exits, or a port answered by another service (our
/// token refused), is started again on another port, three times at most; then the failure
/// says so, with `hint` (what to check) in parentheses.
pub(super) fn start_service(dir: &Path, flags: &[OsString], hint: &str) -> Result<(Service, String), Failure> {
    for _ in 0..3 {
        if let Some(started) = start_once(dir, flags)? {
            return Ok(started);
        }
    }
    Err(Failure {
        code: 2,
        message: format!("the service exited or another answered on its port, three times ({hint})"),
    })
}

/// One try of [`start_service`]: `None` when the service exited first or another service
/// answered on its port.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn start_once(dir: &Path, flags: &[OsString]) -> Result<Option<(Service, String)>, Failure> {
    let runtime = |m: String| Failure { code: 1, message: m };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| runtime(format!("cannot find a free port: {e}")))?
        .port();
    let exe = std::env::current_exe().map_err(|e| runtime(format!("cannot find this program: {e}")))?;
    let child = Command::new(exe)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir)
        .args(flags)
        .env("PROVISIONER_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| runtime(format!("cannot start the service: {e}")))?;
    let mut service = Service(child);
    let url = format!("http://127.0.0.1:{port}");
    let began = std::time::Instant::now();
    let mut healthy_since = None;
    loop {
        let healthy = ureq::get(&format!("{url}/healthz")).call().is_ok();
        if healthy && dir.join("token").exists() {
            // Ours answers with the token it wrote (once it is ready: 503 before); another
            // service on the port refuses it.
            let token = std::fs::read_to_string(dir.join("token")).unwrap_or_default();
            let status =
                ureq::get(&format!("{url}/v1/status")).set("Authorization", &format!("Bearer {}", token.trim())).call();
            match status {
                Ok(_) if matches!(service.0.try_wait(), Ok(None)) => return Ok(Some((service, url))),
                Ok(_) | Err(ureq::Error::Status(401 | 403, _)) => return Ok(None),
                Err(_) => {}
            }
        }
        if let Ok(Some(_)) = service.0.try_wait() {
            return Ok(None);
        }
        let since = healthy.then(|| *healthy_since.get_or_insert_with(std::time::Instant::now));
        if since.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) && !dir.join("token").exists() {
            // The service runs but wrote no token: it found a model (and its token) in the
            // database (a fresh data directory's never holds one: only `--store`'s can).
            return Err(Failure {
                code: 2,
                message: "the database --store names holds a model already: give the benchmark an empty one".into(),
            });
        }
        if began.elapsed() > Duration::from_secs(30) {
            return Err(runtime("the service did not become ready within 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn bench_inner(args: &BenchServeArgs) -> Result<BenchReport, Failure> {
    if args.clients == 0 || args.requests == 0 || args.batch == 0 {
        return Err(Failure { code: 2, message: "--requests, --clients and --batch must be positive".into() });
    }
    if !(args.rate.is_finite() && args.rate >= 0.0) {
        return Err(Failure { code: 2, message: "--rate must be a non-negative number of requests per second".into() });
    }
    let total = match (args.rate > 0.0, args.duration) {
        (true, Some(d)) => ((args.rate * d.as_secs_f64()).round() as usize).max(1),
        (false, Some(_)) => return Err(Failure { code: 2, message: "--duration needs --rate".into() }),
        _ => args.requests,
    };
    let dir = std::env::temp_dir().join(format!("provisioner-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flags =
        ["--sim-start-latency", &humantime::format_duration(args.start_latency).to_string(), "--store", &args.store];
    let flags: Vec<OsString> = flags.into_iter().map(OsString::from).collect();
    let (service, url) = start_service(&dir, &flags, "is --store right?")?;
    let conn = Conn { server: Some(url), token: None, data_dir: Some(dir.clone()), ca_cert: None, model: None };

    let clients = args.clients;
    let per_client = total.div_ceil(clients);
    let began = std::time::Instant::now();
    let results: Vec<(Vec<f64>, Vec<f64>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.clients)
            .map(|k| {
                let conn = conn.clone();
                s.spawn(move || {
                    let (mut adds, mut lists, mut errors) = (Vec::new(), Vec::new(), 0);
                    let Ok(client) = Client::from_conn(&conn) else { return (adds, lists, per_client) };
                    for i in 0..per_client {
                        // Requests are dealt round-robin: client k sends k, k + clients, ...
                        let n = i * clients + k;
                        if n >= total {
                            break;
                        }
                        let t = if args.rate > 0.0 {
                            let due = began + Duration::from_secs_f64(n as f64 / args.rate);
                            let now = std::time::Instant::now();
                            if due > now {
                                std::thread::sleep(due - now);
                            }
                            due
                        } else {
                            std::time::Instant::now()
                        };
                        let list = args.list_every > 0 && n % args.list_every == args.list_every - 1;
                        let ok = if list {
                            client.get::<serde_json::Value>("/v1/machines").is_ok()
                        } else {
                            let body = AddMachines::plain(args.batch, None);
                            client.send::<_, serde_json::Value>("POST", "/v1/machines", &body).is_ok()
                        };
                        let ms = t.elapsed().as_secs_f64() * 1000.0;
                        match (ok, list) {
                            (false, _) => errors += 1,
                            (true, true) => lists.push(ms),
                            (true, false) => adds.push(ms),
                        }
                    }
                    (adds, lists, errors)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let wall = began.elapsed().as_secs_f64();
    let mut adds: Vec<f64> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
    let mut lists: Vec<f64> = results.iter().flat_map(|r| r.1.iter().copied()).collect();
    let errors: usize = results.iter().map(|r| r.2).sum();
    adds.sort_by(f64::total_cmp);
    lists.sort_by(f64::total_cmp);

    // Then the end-to-end figure: how long until the provisioner has started every machine.
    let client = Client::from_conn(&conn)?;
    let status = loop {
        let s: StatusView = client.get("/v1/status")?;
        let started = s.machines_by_status.get("started").copied().unwrap_or(0);
        if started + s.machines_in_error >= s.machines || began.elapsed() > Duration::from_secs(300) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let all_provisioned_s = began.elapsed().as_secs_f64();
    let service_peak_rss_mib = peak_rss_mib(service.0.id());
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
    let done = adds.len() + lists.len();
    Ok(BenchReport {
        target_rate: args.rate,
        requests: done + errors,
        clients: args.clients,
        batch: args.batch,
        add_requests: adds.len(),
        list_requests: lists.len(),
        errors,
        wall_s: wall,
        requests_per_s: done as f64 / wall,
        add_p50_ms: percentile(&adds, 0.50),
        add_p90_ms: percentile(&adds, 0.90),
        add_p99_ms: percentile(&adds, 0.99),
        add_max_ms: adds.last().copied().unwrap_or(0.0),
        list_p50_ms: percentile(&lists, 0.50),
        list_p99_ms: percentile(&lists, 0.99),
        machines: status.machines,
        machines_in_error: status.machines_in_error,
        all_provisioned_s,
        service_peak_rss_mib,
    })
}
