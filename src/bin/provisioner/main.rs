//! The `provisioner` binary: the offline commands (`simulate`, `plan`, `bench`,
//! `generate-scenario`) and, in `cli`, the service and its client commands. Every command has
//! `--help`; errors are one sentence on stderr.
//!
//! Exit codes: 0 success, 1 a failure at run time (including a simulation that broke an
//! invariant), 2 bad usage or input.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use provisioner::service::settings::parse_duration;

mod cli;
mod oneline;

// The actors allocate many small, short-lived messages: mimalloc halves the cost of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long mimalloc keeps memory freed before giving it back to the system, in milliseconds.
/// Its default (1,000 ms) outlasts a whole 100,000-machine run, whose peak RSS then holds every
/// page it ever freed. With the engine's fourth pass (a smaller heap, so fewer pages to purge and
/// fault in again) 10 ms takes the engine's 100,000-machine peak from 163–175 to 143 MiB at no
/// measurable cost in wall time (docs/performance.md, "Issue 17, the fourth pass merged"), and
/// the service's from about 200 to 175 MiB ("Third pass"): every command uses it.
/// `MIMALLOC_PURGE_DELAY` overrides it.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// `mi_option_purge_delay` in mimalloc.h (v3, the one `libmimalloc-sys` builds), which the
/// crate's list of options leaves out.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's purge delay, unless the environment sets it. Called first thing: mimalloc
/// takes the delay in at its first purges, so setting it later is too late.
fn tune_allocator() {
    #[cfg(feature = "serve")]
    sqlite_memory::install();
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one integer option, which mimalloc reads atomically; no pointer is passed.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}
use provisioner::sim::{self, Scenario};

/// SQLite's memory from mimalloc, as the rest of the program's, and no lookaside buffer per
/// connection (issue 36: every model's store holds a connection). What a store frees (the
/// statements and page cache an idle model sheds, `store::lanes`) goes back to the system
/// after mimalloc's purge delay, where the C library's allocator kept it in its arenas; and
/// the lookaside buffer, which speeds up small allocations the C library makes slowly, costs
/// each connection its pages. Measured with `bench models` (300 models of 2 machines, debug
/// build): 349 KiB a model with SQLite's defaults, 248 KiB with both.
#[cfg(feature = "serve")]
mod sqlite_memory {
    use std::ffi::{c_int, c_void};

    use rusqlite::ffi;

    unsafe extern "C" fn malloc(n: c_int) -> *mut c_void {
        // SAFETY: mimalloc's malloc, for any size SQLite asks (positive).
        unsafe { libmimalloc_sys::mi_malloc(usize::try_from(n).unwrap_or(0)) }
    }
    unsafe extern "C" fn free(p: *mut c_void) {
        // SAFETY: `p` came from `malloc` or `realloc` above (or is null).
        unsafe { libmimalloc_sys::mi_free(p) }
    }
    unsafe extern "C" fn realloc(p: *mut c_void, n: c_int) -> *mut c_void {
        // SAFETY: as `free`.
        unsafe { libmimalloc_sys::mi_realloc(p, usize::try_from(n).unwrap_or(0)) }
    }
    unsafe extern "C" fn size(p: *mut c_void) -> c_int {
        // SAFETY: as `free`.
        c_int::try_from(unsafe { libmimalloc_sys::mi_usable_size(p) }).unwrap_or(c_int::MAX)
    }
    unsafe extern "C" fn roundup(n: c_int) -> c_int {
        // SAFETY: a pure function of its argument.
        c_int::try_from(unsafe { libmimalloc_sys::mi_good_size(usize::try_from(n).unwrap_or(0)) }).unwrap_or(n)
    }
    unsafe extern "C" fn init(_: *mut c_void) -> c_int {
        ffi::SQLITE_OK
    }
    unsafe extern "C" fn shutdown(_: *mut c_void) {}

    /// Installs it: first thing, before SQLite is initialised (SQLite copies the methods).
    pub fn install() {
        // SAFETY: before any other SQLite call; plain integer arguments.
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_LOOKASIDE, 0 as c_int, 0 as c_int) };
        if rc != ffi::SQLITE_OK {
            eprintln!("warning: SQLite keeps its lookaside buffers (sqlite3_config answered {rc})");
        }
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(malloc),
            xFree: Some(free),
            xRealloc: Some(realloc),
            xSize: Some(size),
            xRoundup: Some(roundup),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: before any other SQLite call; SQLite copies the structure before returning.
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &methods as *const ffi::sqlite3_mem_methods) };
        if rc != ffi::SQLITE_OK {
            eprintln!("warning: SQLite keeps its own allocator (sqlite3_config answered {rc})");
        }
    }
}

/// The command line: [`Cli`]'s, with `model add`'s `--lxd-...` flags reading no environment
/// variable (`PROVISIONER_LXD_*` are the service's: a shell that sets them for `serve` must not
/// send them with every `model add`).
fn command() -> clap::Command {
    let lxd = ["lxd_endpoint", "lxd_image", "lxd_project", "lxd_client_cert", "lxd_client_key", "lxd_server_cert"];
    Cli::command().mut_subcommand("model", |model| {
        model.mut_subcommand("add", |add| lxd.into_iter().fold(add, |add, id| add.mut_arg(id, |arg| arg.env(None))))
    })
}

#[derive(Parser)]
#[command(name = "provisioner", version, about = "A machine provisioner built from actix actors")]
struct Cli {
    /// How log lines are written to stderr: `text`, or `json` (one object per line, for log
    /// collectors). Levels: `PROVISIONER_LOG` (e.g. `debug`, `provisioner=debug,actix_web=warn`).
    #[arg(long, global = true, value_name = "text|json", value_enum, default_value_t = LogFormat::Text, env = "PROVISIONER_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written (`--log-format`'s help says it; the values have none of their own).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file against the simulated cloud and model on virtual time.
    Simulate {
        /// The scenario (`.toml` or `.json`).
        file: PathBuf,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Print the JSON report instead of the summary.
        #[arg(long)]
        json: bool,
        /// Also write the run's spans (each machine's start, its zone decision, cloud calls,
        /// retries and record) to FILE as OTLP JSON, timed by the virtual clock, for a trace
        /// viewer.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
    },
    /// Print what the provisioner would do next from a scenario's initial state, without
    /// doing it (events are not applied).
    Plan {
        /// The scenario (`.toml` or `.json`).
        file: PathBuf,
        /// Override the scenario's seed (zone tie-breaks).
        #[arg(long)]
        seed: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks on the simulated cloud.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
    /// Print a random scenario (what the property test runs), to reproduce a failing seed.
    GenerateScenario {
        /// The seed that picks the scenario.
        #[arg(long)]
        seed: u64,
    },
    /// Run the provisioner as a service: embedded store, HTTP API, metrics (feature `serve`).
    Serve(Box<provisioner::service::ServeSettings>),
    /// Add, list, remove or retry machines of a running service, or change one's constraints.
    Machine {
        #[command(subcommand)]
        cmd: cli::MachineCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Add, list or remove applications of a running service (their units' machines spread
    /// over zones).
    Application {
        #[command(subcommand)]
        cmd: cli::ApplicationCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// List the cloud's instances, as a running service's broker sees them.
    Instance {
        #[command(subcommand)]
        cmd: cli::InstanceCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Read or change a running service's settings (harvest-mode, workers).
    Config {
        #[command(subcommand)]
        cmd: cli::ConfigCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Create, list or revoke a running service's API tokens (admin or read-only).
    Token {
        #[command(subcommand)]
        cmd: cli::TokenCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Add, list, show or destroy the models of a running service (each with its own
    /// machines, settings and provisioners; `-m MODEL` picks one for the other commands).
    Model {
        #[command(subcommand)]
        cmd: cli::ModelCmd,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Summarise a running service: model, machines, instances, pool.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// The machines whose instance no longer matches what a start would make for them today
    /// (issue 34): an instance type the constraints now forbid, another image than a start
    /// uses today, a zone outside the ones the machine allows, a machine tag changed outside
    /// the provisioner. Report-only unless `config set replace-drifted true`.
    Drift {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Destroy the model of a running service: every instance is stopped, no machine is added.
    DestroyModel {
        /// Do not fail on machines that cannot be destroyed.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: cli::Conn,
    },
    /// Print a completion script for a shell (e.g. `provisioner completions bash >
    /// /usr/share/bash-completion/completions/provisioner`).
    Completions {
        /// The shell.
        #[arg(value_enum, value_name = "bash|zsh|fish")]
        shell: cli::shell::Shell,
    },
    /// Print the man page (roff; e.g. `provisioner man | man -l -`).
    Man,
}

#[derive(Subcommand)]
enum Bench {
    /// Provision N pending machines with W workers over Z zones.
    Throughput {
        /// Machines.
        #[arg(long)]
        machines: usize,
        /// Broker workers (1..=100).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=100))]
        workers: u16,
        /// Availability zones (0 = a zoneless cloud).
        #[arg(long)]
        zones: usize,
        /// Virtual time one StartInstance takes, e.g. 30s.
        #[arg(long, value_parser = parse_duration)]
        start_latency: std::time::Duration,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Provision N machines, then time E single-machine changes.
    Churn {
        /// Machines.
        #[arg(long)]
        machines: usize,
        /// Single-machine changes.
        #[arg(long)]
        events: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Provision N machines against a cloud that throttles starts, batched or one call per
    /// machine, and count the start calls and the throttled ones.
    Starts {
        /// Machines.
        #[arg(long)]
        machines: usize,
        /// The cloud's StartInstance bucket: calls at once.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        start_burst: u32,
        /// The cloud's StartInstance bucket: calls per second after the burst.
        #[arg(long, value_parser = parse_rate)]
        start_per_second: f64,
        /// Broker workers (1..=100).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=100))]
        workers: u16,
        /// Availability zones (0 = a zoneless cloud).
        #[arg(long, default_value_t = 3)]
        zones: usize,
        /// Virtual time one StartInstance takes.
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        start_latency: std::time::Duration,
        /// Most machines per batched call (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        batch_size: u16,
        /// One call per machine (no batching), for comparison.
        #[arg(long)]
        unbatched: bool,
        /// Give the client-side limiter the cloud's own start bucket (default: EC2's published
        /// one, 50 at once then 5/s, as a provisioner that does not know this cloud runs).
        #[arg(long)]
        client_knows_bucket: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a service on loopback and measure HTTP request throughput and latency.
    Serve(cli::BenchServeArgs),
    /// N machines through the service (`serve --broker lxd`) beside the same N containers
    /// created and started directly through LXD's API at the same concurrency: both times and
    /// their ratio (feature `serve`; without --lxd-endpoint, a daemon of its own).
    Lxd(cli::BenchLxdArgs),
    /// What a model costs a service: N models of M machines each through the API, the
    /// service's memory and threads before and after, adding a model's latency, and the CPU
    /// and wake-ups of an idle service (feature `serve`).
    Models(cli::BenchModelsArgs),
}

/// A positive, finite rate.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("expected a positive number, got {s:?}")),
    }
}

/// Logs to stderr, as text or JSON lines, one line per event whatever its values carry
/// (`oneline`); `PROVISIONER_LOG` overrides `default` (`off`, or `info` for `serve`). The spans
/// meant for traces (target `provisioner::TRACE_TARGET`) are never logged: they go to `traces`,
/// the trace export `serve` installs when asked (feature `otel`, `cli::traces`).
fn init_logging(default: &str, json: bool, traces: Option<cli::TraceLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROVISIONER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        .add_directive(format!("{}=off", provisioner::TRACE_TARGET).parse().expect("a directive"));
    let fmt = tracing_subscriber::fmt::layer();
    let fmt = if json {
        // JSON escapes every value: one line per event as it is.
        fmt.with_writer(std::io::stderr).json().with_current_span(true).with_filter(filter).boxed()
    } else {
        // Text: one line per event whatever a value carries (no log line forged by a request).
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        fmt.with_writer(oneline::OneLine { ansi }).with_ansi(ansi).with_filter(filter).boxed()
    };
    let _ = tracing_subscriber::registry().with(traces).with(fmt).try_init();
}

/// Loads a scenario and runs `command` on it; bad input is one line on stderr and exit code 2.
fn on_scenario(file: &std::path::Path, command: impl FnOnce(Scenario) -> ExitCode) -> ExitCode {
    match Scenario::load(file) {
        Ok(scenario) => command(scenario),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints a run's or a plan's JSON (a line) or its human text.
fn print_json_or_human(json: bool, as_json: impl FnOnce() -> String, as_human: impl FnOnce() -> String) {
    if json {
        println!("{}", as_json());
    } else {
        print!("{}", as_human());
    }
}

fn main() -> ExitCode {
    tune_allocator();
    // The matches are kept: `serve` layers its config file under the flags given in them.
    let matches = command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command()).exit());
    let json_logs = cli.log_format == LogFormat::Json;
    // `serve` starts its logging once its settings are read (they may ask for a trace export);
    // `simulate --trace` records the trace target's spans to a file.
    let mut trace_file = None;
    match &cli.command {
        Command::Serve(_) => {}
        Command::Simulate { trace: Some(_), .. } => {
            use tracing_subscriber::Layer;
            let (layer, file) = cli::trace_file::layer();
            let only = tracing_subscriber::filter::Targets::new()
                .with_target(provisioner::TRACE_TARGET, tracing::Level::TRACE);
            init_logging("off", json_logs, Some(layer.with_filter(only).boxed()));
            trace_file = Some(file);
        }
        _ => init_logging("off", json_logs, None),
    }
    match cli.command {
        Command::Serve(_) => cli::run_serve(matches.subcommand_matches("serve").unwrap_or(&matches), |traces| {
            init_logging("info", json_logs, traces)
        }),
        Command::Machine { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Machine(cmd)),
        Command::Instance { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Instance(cmd)),
        Command::Application { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Application(cmd)),
        Command::Config { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Config(cmd)),
        Command::Token { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Token(cmd)),
        Command::Model { cmd, conn } => cli::run_client(conn, cli::ClientCmd::Model(cmd)),
        Command::Status { json, conn } => cli::run_client(conn, cli::ClientCmd::Status { json }),
        Command::Drift { json, conn } => cli::run_client(conn, cli::ClientCmd::Drift { json }),
        Command::DestroyModel { force, json, conn } => {
            cli::run_client(conn, cli::ClientCmd::DestroyModel { force, json })
        }
        Command::Bench { which: Bench::Serve(args) } => cli::run_bench(args),
        Command::Bench { which: Bench::Lxd(args) } => cli::run_bench_lxd(args),
        Command::Bench { which: Bench::Models(args) } => cli::run_bench_models(args),
        Command::Completions { shell } => cli::shell::run_completions(command(), shell),
        Command::Man => cli::shell::run_man(command()),
        Command::Simulate { file, seed, json, trace } => on_scenario(&file, |scenario| {
            // The trace file is made before the run: a path that cannot be written is refused
            // before any work.
            let out = match trace.as_deref().map(|path| std::fs::File::create(path).map(|f| (path, f))).transpose() {
                Ok(out) => out,
                Err(e) => {
                    eprintln!("error: cannot write the trace file {}: {e}", trace.unwrap_or_default().display());
                    return ExitCode::from(2);
                }
            };
            let report = sim::run(&scenario, seed);
            if let (Some((path, f)), Some(spans)) = (out, &trace_file) {
                let doc = spans.document(scenario.name.as_deref().unwrap_or_default(), seed.unwrap_or(scenario.seed));
                if let Err(e) = serde_json::to_writer(std::io::BufWriter::new(f), &doc) {
                    eprintln!("error: cannot write the trace file {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            print_json_or_human(json, || report.to_json(), || report.to_human());
            if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the run broke {} invariant(s); see violations", report.violations.len());
                ExitCode::from(1)
            }
        }),
        Command::Bench { which: Bench::Throughput { machines, workers, zones, start_latency, json } } => {
            // The process exits next: what the run built is left to the operating system, not
            // freed entry by entry.
            let (r, standing) = sim::bench::throughput_kept(machines, usize::from(workers), zones, start_latency);
            std::mem::forget(standing);
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                println!(
                    "{} machines, {} workers, {} zones: virtual makespan {:.1}s (ideal {:.1}s, efficiency {:.3}); wall {:.3}s ({:.0} machines/s); peak RSS {:.0} MiB",
                    r.machines, r.workers, r.zones, r.virtual_makespan_s, r.ideal_makespan_s, r.efficiency, r.wall_s, r.machines_per_wall_s, r.peak_rss_mib
                );
            }
            ExitCode::SUCCESS
        }
        Command::Bench {
            which:
                Bench::Starts {
                    machines,
                    start_burst,
                    start_per_second,
                    workers,
                    zones,
                    start_latency,
                    batch_size,
                    unbatched,
                    client_knows_bucket,
                    json,
                },
        } => {
            let r = sim::bench::starts(sim::bench::StartsBench {
                machines,
                workers: usize::from(workers),
                zones,
                start_latency,
                start_burst,
                start_per_second,
                batch_size: (!unbatched).then_some(usize::from(batch_size)),
                client_limit: client_knows_bucket
                    .then(|| provisioner::config::rate_limits::BucketLimit::new(start_burst, start_per_second)),
            });
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                println!(
                    "{} machines, {} workers, {} zones, {}: virtual makespan {:.1}s (one call per machine at the cloud's rate: {:.1}s); {} start calls ({:.1} machines per call), {} throttled; wall {:.3}s",
                    r.machines,
                    r.workers,
                    r.zones,
                    if r.batched { format!("batches of up to {}", r.batch_size) } else { "one call per machine".into() },
                    r.virtual_makespan_s,
                    r.unbatched_ideal_s,
                    r.start_calls,
                    r.machines_per_call,
                    r.throttled_calls,
                    r.wall_s
                );
            }
            ExitCode::SUCCESS
        }
        Command::Bench { which: Bench::Churn { machines, events, json } } => {
            let r = sim::bench::churn(machines, events);
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                println!(
                    "{} machines, {} changes: wall {:.3}s, {:.1} µs per change, {} cloud listings over {:.0}s of virtual time; peak RSS {:.0} MiB",
                    r.machines, r.events, r.wall_s, r.per_event_us, r.all_instances_calls, r.virtual_s, r.peak_rss_mib
                );
            }
            ExitCode::SUCCESS
        }
        Command::Plan { file, seed, json } => on_scenario(&file, |scenario| {
            let p = sim::plan(&scenario, seed);
            print_json_or_human(json, || p.to_json(), || p.to_human());
            ExitCode::SUCCESS
        }),
        Command::GenerateScenario { seed } => {
            print!("{}", sim::generate(seed).to_toml());
            ExitCode::SUCCESS
        }
    }
}
