//! `provisioner bench models` (issue 36): what a model costs a service. One service on
//! loopback (the simulated cloud), `--models` models of `--machines` machines each, added
//! through the API; measured from outside, in the service's `/proc` entries: its resident
//! memory and threads before the models and after them (the cost of one model is the
//! difference over their number), how long adding a model takes, how long until every
//! machine is started, and, once every model is idle, how much CPU and how many wake-ups of
//! its threads the service spends in `--idle` seconds of nothing to do. With `--compare`: the
//! same machines as one model and as `--models` models, side by side ([`compare`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provisioner::service::wire::{AddMachines, StatusView};
use serde::Serialize;

use super::client::{Client, Failure};
use super::serve::{percentile, start_service, Service};
use super::{BenchModelsArgs, Conn};

/// What `bench models` measured.
#[derive(Debug, Serialize)]
struct ModelsReport {
    store: String,
    models: usize,
    machines_per_model: usize,
    /// Adding a model through the API (`POST /v1/models`), each.
    add_model_p50_ms: f64,
    add_model_p99_ms: f64,
    add_model_max_ms: f64,
    /// From the first machine add to every machine of every model started.
    all_started_s: f64,
    /// The service alone (its `default` model), then with every model just started, then
    /// after the idle window.
    rss_before_mib: f64,
    rss_after_mib: f64,
    rss_idle_mib: f64,
    peak_rss_mib: f64,
    threads_before: usize,
    threads_after: usize,
    /// The service's sessions on the database once idle (PostgreSQL only).
    #[serde(skip_serializing_if = "Option::is_none")]
    db_sessions: Option<usize>,
    /// The difference (idle), over the models added.
    rss_per_model_kib: f64,
    threads_per_model: f64,
    /// In `--idle` seconds with nothing to do: the service's CPU time and its threads'
    /// context switches (each a wake-up), per second.
    idle_s: f64,
    idle_cpu_ms_per_s: f64,
    idle_wakeups_per_s: f64,
}

/// One `/proc/PID/status` field, as a number (`VmRSS:  1234 kB` gives 1234).
fn status_field(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// The process's CPU time (user and system), in clock ticks (`/proc/PID/stat`, fields 14
/// and 15).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces: the fields counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Every thread's context switches so far (voluntary and not): each is a wake-up.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Runs the benchmark and prints its report.
pub fn bench(args: BenchModelsArgs) -> std::process::ExitCode {
    if args.compare || args.fairness {
        let run = if args.fairness { fairness(&args) } else { compare(&args) };
        return match run {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(f) => {
                eprintln!("error: {}", f.message);
                std::process::ExitCode::from(f.code)
            }
        };
    }
    match bench_inner(&args) {
        Ok(r) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                println!(
                    "{} models × {} machines on {}: adding a model p50 {:.1} ms, p99 {:.1} ms; all started in {:.1} s",
                    r.models, r.machines_per_model, r.store, r.add_model_p50_ms, r.add_model_p99_ms, r.all_started_s
                );
                println!(
                    "service: {:.0} MiB and {} threads alone, {:.0} MiB (peak {:.0}, {:.0} once idle) and {} threads \
                     with the models: {:.0} KiB and {:.3} threads a model",
                    r.rss_before_mib,
                    r.threads_before,
                    r.rss_after_mib,
                    r.peak_rss_mib,
                    r.rss_idle_mib,
                    r.threads_after,
                    r.rss_per_model_kib,
                    r.threads_per_model
                );
                println!(
                    "idle for {:.0} s: {:.1} ms of CPU and {:.0} wake-ups a second",
                    r.idle_s, r.idle_cpu_ms_per_s, r.idle_wakeups_per_s
                );
                if let Some(n) = r.db_sessions {
                    println!("database sessions of the service: {n}");
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("error: {}", f.message);
            std::process::ExitCode::from(f.code)
        }
    }
}

#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn bench_inner(args: &BenchModelsArgs) -> Result<ModelsReport, Failure> {
    let usage = |m: &str| Failure { code: 2, message: m.into() };
    if args.models == 0 || args.clients == 0 {
        return Err(usage("--models and --clients must be positive"));
    }
    let store = Scratch::new(&args.store, "models")?;
    let (service, url, dir) = fresh_service(&store.url, "models")?;
    let pid = service.0.id();
    let conn = |model: &str| conn_to(&url, &dir, model);
    let settle = || std::thread::sleep(Duration::from_secs(2));
    settle();
    let rss = || status_field(pid, "VmRSS:").unwrap_or(0.0) / 1024.0;
    let threads = || status_field(pid, "Threads:").unwrap_or(0.0) as usize;
    let (rss_before_mib, threads_before) = (rss(), threads());

    // The models, one after another (each timed), `default` among them.
    let names = model_names(args.models);
    let admin = Client::from_conn(&conn("default"))?;
    let mut adds = Vec::with_capacity(names.len());
    for name in &names[1..] {
        let t = std::time::Instant::now();
        admin.send_only("POST", "/v1/models", &serde_json::json!({ "name": name }))?;
        adds.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    adds.sort_by(f64::total_cmp);
    wait_led(&admin, &args.store, names.len(), args.timeout)?;

    // Their machines, by `--clients` clients, then every model polled until all are started.
    let all_started_s = add_and_wait(args, &names, args.machines, &conn)?;

    // Idle: nothing asked of it for a while, then a window measured.
    settle();
    let (rss_after_mib, threads_after) = (rss(), threads());
    let db_sessions = store.sessions();
    let (cpu0, switches0) = (cpu_ticks(pid).unwrap_or(0), context_switches(pid));
    let window = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(args.idle));
    let idle_s = window.elapsed().as_secs_f64();
    let (cpu1, switches1) = (cpu_ticks(pid).unwrap_or(0), context_switches(pid));
    let peak_rss_mib = status_field(pid, "VmHWM:").unwrap_or(0.0) / 1024.0;
    let rss_idle_mib = rss();
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
    // Clock ticks are 1/100 s on Linux (`USER_HZ`).
    let idle_cpu_ms_per_s = (cpu1.saturating_sub(cpu0)) as f64 * 10.0 / idle_s;
    let added = (names.len() - 1).max(1) as f64;
    Ok(ModelsReport {
        store: store_name(&args.store),
        models: names.len(),
        machines_per_model: args.machines,
        add_model_p50_ms: percentile(&adds, 0.50),
        add_model_p99_ms: percentile(&adds, 0.99),
        add_model_max_ms: adds.last().copied().unwrap_or(0.0),
        all_started_s,
        rss_before_mib,
        rss_after_mib,
        rss_idle_mib,
        peak_rss_mib,
        threads_before,
        threads_after,
        db_sessions,
        rss_per_model_kib: (rss_idle_mib - rss_before_mib) * 1024.0 / added,
        threads_per_model: (threads_after as f64 - threads_before as f64) / added,
        idle_s,
        idle_cpu_ms_per_s,
        idle_wakeups_per_s: switches1.saturating_sub(switches0) as f64 / idle_s,
    })
}

/// What `bench models --compare` measured: the same machines as one model and as many.
#[derive(Debug, Serialize)]
struct CompareReport {
    store: String,
    models: usize,
    machines_per_model: usize,
    clients: usize,
    /// One model of `models × machines` machines: from the first add to all started.
    one_model_s: f64,
    one_model_peak_rss_mib: f64,
    /// `models` models of `machines` machines each: the same.
    many_models_s: f64,
    many_models_peak_rss_mib: f64,
    /// `many_models_s / one_model_s`.
    ratio: f64,
}

/// `--compare`: the same machines (`--models × --machines`) added through the API as one
/// model, then as `--models` models, each on a fresh service, by the same `--clients` clients
/// in requests of at most 1,000 machines; the seconds from the first add to every machine
/// started, and their ratio.
pub(super) fn compare(args: &BenchModelsArgs) -> Result<(), Failure> {
    if args.models == 0 || args.clients == 0 || args.machines == 0 {
        return Err(Failure { code: 2, message: "--models, --machines and --clients must be positive".into() });
    }
    let total = args.models * args.machines;
    let (one_model_s, one_model_peak_rss_mib) = spread(args, 1, total)?;
    let (many_models_s, many_models_peak_rss_mib) = spread(args, args.models, args.machines)?;
    let r = CompareReport {
        store: store_name(&args.store),
        models: args.models,
        machines_per_model: args.machines,
        clients: args.clients,
        one_model_s,
        one_model_peak_rss_mib,
        many_models_s,
        many_models_peak_rss_mib,
        ratio: many_models_s / one_model_s,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        println!(
            "{total} machines on {}, {} clients: 1 model {:.1} s (peak {:.0} MiB), {} models of {} {:.1} s (peak {:.0} MiB): {:.2}×",
            r.store,
            r.clients,
            r.one_model_s,
            r.one_model_peak_rss_mib,
            r.models,
            r.machines_per_model,
            r.many_models_s,
            r.many_models_peak_rss_mib,
            r.ratio
        );
    }
    Ok(())
}

/// One run of [`compare`]: a fresh service with `models` models, `per_model` machines added to
/// each; the seconds from the first add to all started, and the service's peak memory.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn spread(args: &BenchModelsArgs, models: usize, per_model: usize) -> Result<(f64, f64), Failure> {
    let store = Scratch::new(&args.store, &format!("spread{models}"))?;
    let (service, url, dir) = fresh_service(&store.url, &format!("spread-{models}"))?;
    let conn = |model: &str| conn_to(&url, &dir, model);
    let names = model_names(models);
    let admin = Client::from_conn(&conn("default"))?;
    for name in &names[1..] {
        admin.send_only("POST", "/v1/models", &serde_json::json!({ "name": name }))?;
    }
    wait_led(&admin, &args.store, names.len(), args.timeout)?;
    let seconds = add_and_wait(args, &names, per_model, &conn)?;
    let peak = status_field(service.0.id(), "VmHWM:").unwrap_or(0.0) / 1024.0;
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
    Ok((seconds, peak))
}

/// Waits until the model `name` (its `client`) has `machines` machines, all started (or in
/// error), for at most `timeout` seconds from `began`.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn wait_started(
    client: &Client,
    name: &str,
    machines: usize,
    began: std::time::Instant,
    timeout: u64,
) -> Result<(), Failure> {
    loop {
        let s: StatusView = client.get("/v1/status")?;
        let started = s.machines_by_status.get("started").copied().unwrap_or(0);
        if s.machines >= machines && started + s.machines_in_error >= s.machines {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(timeout) {
            return Err(Failure { code: 1, message: format!("model {name} not started in time") });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Adds `per_model` machines to each model of `names` through the API, in requests of at most
/// 1,000 dealt round-robin to `--clients` clients (`conn` names each model's connection), then
/// waits until every model's machines are started: the seconds from the first add.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn add_and_wait(
    args: &BenchModelsArgs,
    names: &[String],
    per_model: usize,
    conn: &(dyn Fn(&str) -> Conn + Sync),
) -> Result<f64, Failure> {
    let requests: Vec<(&str, usize)> = names
        .iter()
        .flat_map(|n| {
            let (full, rest) = (per_model / 1000, per_model % 1000);
            std::iter::repeat_n((n.as_str(), 1000), full).chain((rest > 0).then_some((n.as_str(), rest)))
        })
        .collect();
    let clients = args.clients.min(names.len()).max(1);
    let began = std::time::Instant::now();
    let failures: Vec<Failure> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|k| {
                let requests = &requests;
                s.spawn(move || -> Result<(), Failure> {
                    for (name, count) in requests.iter().skip(k).step_by(clients) {
                        let client = Client::from_conn(&conn(name))?;
                        client.send_only("POST", "/v1/machines", &AddMachines::plain(*count, None))?;
                    }
                    for name in names.iter().skip(k).step_by(clients) {
                        wait_started(&Client::from_conn(&conn(name))?, name, per_model, began, args.timeout)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok().and_then(Result::err)).collect()
    });
    match failures.into_iter().next() {
        Some(f) => Err(f),
        None => Ok(began.elapsed().as_secs_f64()),
    }
}

/// A service on a fresh data directory (`tag` names it), the simulated cloud at zero latency,
/// on `store`: the service, its URL and its directory.
fn fresh_service(store: &str, tag: &str) -> Result<(Service, String, PathBuf), Failure> {
    let dir = std::env::temp_dir().join(format!("provisioner-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flags = ["--sim-start-latency", "0s", "--store", store];
    let flags: Vec<OsString> = flags.into_iter().map(OsString::from).collect();
    let (service, url) = start_service(&dir, &flags, "is --store right?")?;
    Ok((service, url, dir))
}

/// The connection to `model` of the service at `url` (its token in `dir`).
fn conn_to(url: &str, dir: &Path, model: &str) -> Conn {
    Conn {
        server: Some(url.to_owned()),
        token: None,
        data_dir: Some(dir.to_owned()),
        ca_cert: None,
        model: Some(model.to_owned()),
    }
}

/// `default`, then `m0001` ... for `models` models in all.
fn model_names(models: usize) -> Vec<String> {
    std::iter::once("default".to_owned()).chain((1..models).map(|i| format!("m{i:04}"))).collect()
}

/// The store of one run: SQLite's fresh data directory, or on PostgreSQL a database of its own
/// beside the one `--store` names (created on its server, dropped when the run is over), so
/// that every run starts empty and `--store`'s database is left as it was.
struct Scratch {
    url: String,
    #[cfg(feature = "postgres")]
    created: Option<(String, String)>,
}

impl Scratch {
    /// The service's sessions on the run's database now (PostgreSQL; `None` on SQLite, or if
    /// they cannot be counted).
    fn sessions(&self) -> Option<usize> {
        #[cfg(feature = "postgres")]
        if self.created.is_some() {
            let mut c = ::postgres::Client::connect(&self.url, ::postgres::NoTls).ok()?;
            let row = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND application_name LIKE 'provisioner%'",
                    &[],
                )
                .ok()?;
            return usize::try_from(row.get::<_, i64>(0)).ok();
        }
        None
    }

    fn new(store: &str, tag: &str) -> Result<Self, Failure> {
        if store == "sqlite" {
            return Ok(Self {
                url: store.to_owned(),
                #[cfg(feature = "postgres")]
                created: None,
            });
        }
        #[cfg(feature = "postgres")]
        {
            let (base, query) = store.split_once('?').map_or((store, ""), |(b, q)| (b, q));
            let (server, db) =
                base.rsplit_once('/').ok_or_else(|| Failure::usage("--store: no database in the URL"))?;
            let name = format!("{db}_{tag}_{}", std::process::id());
            let mut admin = ::postgres::Client::connect(store, ::postgres::NoTls)
                .map_err(|e| Failure::runtime(format!("cannot connect to --store: {e}")))?;
            // One statement each: neither runs inside a transaction.
            for sql in [format!("DROP DATABASE IF EXISTS \"{name}\""), format!("CREATE DATABASE \"{name}\"")] {
                admin.batch_execute(&sql).map_err(|e| {
                    let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned());
                    Failure::runtime(format!("cannot create the run's database {name}: {why}"))
                })?;
            }
            let url = if query.is_empty() { format!("{server}/{name}") } else { format!("{server}/{name}?{query}") };
            Ok(Self { url, created: Some((store.to_owned(), name)) })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = tag;
            Err(Failure::usage("--store: this build has no PostgreSQL store: build with `--features postgres`"))
        }
    }
}

#[cfg(feature = "postgres")]
impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some((store, name)) = &self.created {
            if let Ok(mut admin) = ::postgres::Client::connect(store, ::postgres::NoTls) {
                let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"));
            }
        }
    }
}

/// On PostgreSQL, waits until the service lists `models` models, each with a leader (a new
/// model's lease is taken after its add answers, and its API answers 503 until then). On
/// SQLite the service runs every model at once, and has no leader to show.
#[allow(clippy::disallowed_methods)]
fn wait_led(admin: &Client, store: &str, models: usize, timeout: u64) -> Result<(), Failure> {
    if store == "sqlite" {
        return Ok(());
    }
    for _ in 0..timeout * 10 {
        let listed: Vec<serde_json::Value> = admin.get("/v1/models")?;
        if listed.len() >= models && listed.iter().all(|m| !m["leader"].is_null()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Failure::runtime(format!("the {models} models were not all led within {timeout} s")))
}

/// What `bench models --fairness` measured: a quiet model's single adds while a busy model
/// provisions many machines.
#[derive(Debug, Serialize)]
struct FairnessReport {
    store: String,
    busy_machines: usize,
    /// How many clients added to the quiet model at once.
    quiet_clients: usize,
    /// The busy model's machines, all started, after this long.
    busy_s: f64,
    /// The quiet model's adds (one machine each, one every 100 ms by each of its clients while
    /// the busy model provisions): from each add's request to its machine started.
    quiet_adds: usize,
    quiet_p50_ms: f64,
    quiet_p99_ms: f64,
    quiet_max_ms: f64,
}

/// `--fairness`: model `default` adds `--machines` machines (requests of 1,000 by `--clients`
/// clients) while each of model `quiet`'s `--quiet-clients` clients adds one machine every
/// 100 ms, each waited for until it is started; the quiet adds' latency from request to
/// started (p50, p99, max).
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub(super) fn fairness(args: &BenchModelsArgs) -> Result<(), Failure> {
    if args.machines == 0 || args.clients == 0 || args.quiet_clients == 0 {
        return Err(Failure::usage("--machines, --clients and --quiet-clients must be positive"));
    }
    let store = Scratch::new(&args.store, "fairness")?;
    let (service, url, dir) = fresh_service(&store.url, "fairness")?;
    let conn = |model: &str| conn_to(&url, &dir, model);
    let admin = Client::from_conn(&conn("default"))?;
    admin.send_only("POST", "/v1/models", &serde_json::json!({ "name": "quiet" }))?;
    wait_led(&admin, &args.store, 2, args.timeout)?;
    let busy_done = std::sync::atomic::AtomicBool::new(false);
    let (busy, quiet) = std::thread::scope(|s| {
        let busy = s.spawn(|| {
            let r = add_and_wait(args, &["default".to_owned()], args.machines, &conn);
            busy_done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        let quiet: Vec<_> = (0..args.quiet_clients)
            .map(|_| {
                s.spawn(|| -> Result<Vec<f64>, Failure> {
                    let client = Client::from_conn(&conn("quiet"))?;
                    let mut took = Vec::new();
                    while !busy_done.load(std::sync::atomic::Ordering::SeqCst) {
                        let t = std::time::Instant::now();
                        let added: serde_json::Value =
                            client.send("POST", "/v1/machines", &AddMachines::plain(1, None))?;
                        let id = added["ids"][0].as_str().unwrap_or_default().to_owned();
                        loop {
                            let m: serde_json::Value = client.get(&format!("/v1/machines/{id}"))?;
                            if m["status"] == "started" || m["status"] == "error" {
                                break;
                            }
                            if t.elapsed() > Duration::from_secs(args.timeout) {
                                return Err(Failure::runtime(format!(
                                    "the quiet model's machine {id} not started in time"
                                )));
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        took.push(t.elapsed().as_secs_f64() * 1000.0);
                        std::thread::sleep(Duration::from_millis(100).saturating_sub(t.elapsed()));
                    }
                    Ok(took)
                })
            })
            .collect();
        let quiet: Vec<_> = quiet.into_iter().map(|q| q.join()).collect();
        (busy.join(), quiet)
    });
    let busy_s = busy.map_err(|_| Failure::runtime("the busy model's clients panicked"))??;
    let mut took: Vec<f64> = Vec::new();
    for q in quiet {
        took.extend(q.map_err(|_| Failure::runtime("a quiet model's client panicked"))??);
    }
    let mut quiet = took;
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
    quiet.sort_by(f64::total_cmp);
    let r = FairnessReport {
        store: store_name(&args.store),
        busy_machines: args.machines,
        quiet_clients: args.quiet_clients,
        busy_s,
        quiet_adds: quiet.len(),
        quiet_p50_ms: percentile(&quiet, 0.50),
        quiet_p99_ms: percentile(&quiet, 0.99),
        quiet_max_ms: quiet.last().copied().unwrap_or(0.0),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        println!(
            "while one model provisioned {} machines on {} ({:.1} s), another's {} single adds ({} clients) were \
             started in p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            r.busy_machines,
            r.store,
            r.busy_s,
            r.quiet_adds,
            r.quiet_clients,
            r.quiet_p50_ms,
            r.quiet_p99_ms,
            r.quiet_max_ms
        );
    }
    Ok(())
}

/// The store a report names: `sqlite`, or `postgres` (never the URL, which may hold a password).
fn store_name(store: &str) -> String {
    if store == "sqlite" { "sqlite" } else { "postgres" }.to_owned()
}
