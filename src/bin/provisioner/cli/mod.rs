//! The binary's service commands: `serve` (its arguments are the library's
//! [`ServeSettings`](provisioner::service::ServeSettings)), the client commands that talk to a
//! running service over HTTP (server from `--server`, else `$PROVISIONER_URL`, else
//! `http://127.0.0.1:7878`; token from `--token`, else `$PROVISIONER_TOKEN`, else the data
//! directory's `token` file), and `bench serve`. The arguments are always defined (so `--help`
//! works in every build); running them needs the `serve` feature, and a build without it says
//! so and exits 2.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Args, Subcommand};
use provisioner::service::settings::parse_duration;

#[cfg(feature = "serve")]
mod bench_lxd;
#[cfg(feature = "serve")]
mod bench_models;
#[cfg(feature = "serve")]
mod client;
#[cfg(feature = "serve")]
mod serve;
pub mod shell;
pub mod trace_file;
#[cfg(feature = "serve")]
mod traces;

/// Where the service is and how to authenticate.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// The service's URL [default: $PROVISIONER_URL, else http://127.0.0.1:7878].
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// The API token [default: $PROVISIONER_TOKEN, else read from DIR/token].
    #[arg(long, global = true, value_name = "T")]
    pub token: Option<String>,
    /// The service's data directory, to read the token from [default: ./provisioner-data].
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Trust this PEM certificate (a CA, or the service's own) for an https:// server
    /// [default: $PROVISIONER_CA_CERT, else the usual public roots].
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// The model the command is about [default: $PROVISIONER_MODEL, else default].
    #[arg(short = 'm', long = "model", global = true, value_name = "MODEL")]
    pub model: Option<String>,
}

/// `provisioner model ...`: the models a service hosts.
#[derive(Subcommand, Debug)]
// Parsed once per process: `add`'s LXD settings make it large, which costs nothing here.
#[allow(clippy::large_enum_variant)]
pub enum ModelCmd {
    /// Add a model: its own machines, settings and provisioners, on its own cloud (a setting
    /// left out is the service's).
    Add {
        /// Its name: 1 to 63 lowercase letters, digits and hyphens.
        name: String,
        /// Its cloud [default: the service's --broker].
        #[arg(long, value_name = "sim|ec2|lxd", value_parser = ["sim", "ec2", "lxd"])]
        broker: Option<String>,
        /// The simulated cloud's zones, comma-separated (sim) [default: the service's].
        #[arg(long, value_name = "a,b")]
        zones: Option<String>,
        /// The simulated account whose request limits it shares with the other models on it
        /// (sim) [default: default].
        #[arg(long, value_name = "NAME")]
        account: Option<String>,
        /// EC2's region (ec2) [default: the service's].
        #[arg(long, value_name = "REGION")]
        region: Option<String>,
        /// EC2's endpoint (ec2) [default: the service's].
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// EC2's image id (ec2) [default: the service's].
        #[arg(long, value_name = "AMI")]
        image: Option<String>,
        /// LXD's settings (lxd; each one left out is the service's; the files are on the
        /// service's host). Their environment variables are the service's: not read here.
        #[command(flatten)]
        lxd: provisioner::service::settings::LxdSettings,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the models.
    List {
        /// Print JSON (`name`, `life`, `machines`, `leader`, `epoch`).
        #[arg(long)]
        json: bool,
    },
    /// Show one model and its cloud.
    Show {
        /// The model.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Destroy a model: its instances are stopped, then the model is removed.
    Destroy {
        /// The model.
        name: String,
        /// Needed for `default`; leaves live manual machines as they are.
        #[arg(long)]
        force: bool,
    },
}

/// `provisioner machine ...`.
#[derive(Subcommand, Debug)]
pub enum MachineCmd {
    /// Add machines; prints the new ids.
    Add {
        /// How many.
        #[arg(short = 'n', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        n: u64,
        /// Restrict them to these zones (comma-separated).
        #[arg(long, value_name = "a,b")]
        zones: Option<String>,
        /// Constraints in Juju's syntax, e.g. "cores=4 mem=16G zones=az1,az2" (keys: arch,
        /// cores, mem, root-disk, instance-type, zones, spaces, tags; sizes in MiB, or with M,
        /// G, T, P).
        #[arg(long, value_name = "\"key=value ...\"")]
        constraints: Option<String>,
        /// Placement: zone=ZONE or subnet=SUBNET.
        #[arg(long = "to", value_name = "zone=Z|subnet=S")]
        to: Option<String>,
        /// Add containers of this type (lxd or kvm) on --host instead: HOST/TYPE/N.
        #[arg(long, value_name = "TYPE")]
        container: Option<String>,
        /// The machine the containers go on (with --container); it must exist and be alive.
        #[arg(long, value_name = "ID")]
        host: Option<String>,
        /// Register a manually provisioned machine at --address: the provisioner never starts
        /// or stops it.
        #[arg(long)]
        manual: bool,
        /// The manual machine's address, an IP address or a hostname (with --manual).
        #[arg(long, value_name = "HOST")]
        address: Option<String>,
        /// Capacity: on-demand (the default), spot (spot only: without spot capacity in any
        /// allowed zone the machine ends in provisioning error) or prefer-spot (spot while it can
        /// be had, else on-demand).
        #[arg(long, value_name = "C", value_parser = ["on-demand", "spot", "prefer-spot"])]
        capacity: Option<String>,
        /// Wait until every new machine is provisioned or in error.
        #[arg(long)]
        wait: bool,
        /// With --wait, give up after this long (e.g. 5m); exit 1.
        #[arg(long, value_name = "DUR", value_parser = parse_duration, requires = "wait")]
        timeout: Option<std::time::Duration>,
        /// Print JSON (a list of ids).
        #[arg(long)]
        json: bool,
    },
    /// List the machines.
    List {
        /// Only the machines of this application.
        #[arg(long, value_name = "A")]
        application: Option<String>,
        /// Only machines with this machine status (pending, started, error, stopped) or
        /// instance status (provisioning, "provisioning error", running, ...), or unhealthy (issue 34).
        #[arg(long, value_name = "S")]
        status: Option<String>,
        /// Only machines whose instance is in this zone.
        #[arg(long, value_name = "Z")]
        zone: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show everything the service holds for one machine.
    Show {
        /// The machine (a container's id is HOST/TYPE/N).
        #[arg(value_name = "ID")]
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove machines: they become dead; their instances are stopped (or released).
    Remove {
        /// The machines.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
        /// Leave the instances running, released from the model.
        #[arg(long)]
        keep_instance: bool,
        /// Ask again for machines already being removed; remove a host together with its
        /// live containers (without it, a host with containers is refused).
        #[arg(long)]
        force: bool,
    },
    /// Start machines in provisioning error again.
    Retry {
        /// The machines.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Replace an alive machine's constraints (its next start uses them); prints the machine
    /// as `machine show` does.
    SetConstraints {
        /// The machine (a container's id is HOST/TYPE/N); not a manual one.
        #[arg(value_name = "ID")]
        id: String,
        /// The new constraints in Juju's syntax, e.g. "cores=4 mem=8G" (the keys of `machine
        /// add --constraints`); "" clears them.
        #[arg(value_name = "CONSTRAINTS")]
        constraints: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `provisioner application ...`.
#[derive(Subcommand, Debug)]
pub enum ApplicationCmd {
    /// Add an application with N units, each on a new machine; prints the new machines' ids.
    /// The machines of one application form its distribution group: they spread over zones.
    Add {
        /// Its name: lowercase letters, digits and hyphens, starting with a letter.
        name: String,
        /// How many units (machines).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        units: u64,
        /// Constraints for its machines, in Juju's syntax (as `machine add --constraints`).
        #[arg(long, value_name = "\"key=value ...\"")]
        constraints: Option<String>,
        /// Capacity of its machines: on-demand (the default), spot or prefer-spot (as `machine
        /// add --capacity`).
        #[arg(long, value_name = "C", value_parser = ["on-demand", "spot", "prefer-spot"])]
        capacity: Option<String>,
        /// Print JSON (a list of the new machines' ids).
        #[arg(long)]
        json: bool,
    },
    /// List the applications.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an application: its machines are removed (their instances stopped).
    Remove {
        /// The application.
        name: String,
    },
}

/// `provisioner instance ...`.
#[derive(Subcommand, Debug)]
pub enum InstanceCmd {
    /// The cloud's instances as the broker sees them.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `provisioner token ...`.
#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create an API token; prints it alone on the last line (it is shown once: the service
    /// keeps only its hash).
    Create {
        /// A read-only token: it may read, every change is refused (403). Without it, an admin
        /// token.
        #[arg(long)]
        read_only: bool,
        /// Scope it to this one model: every other model's routes, and the service's own
        /// (models, tokens), refuse it with 403 [default: the model of -m or $PROVISIONER_MODEL
        /// if given, else every model].
        #[arg(long, value_name = "MODEL")]
        for_model: Option<String>,
        /// Print JSON (`id`, `scope`, `token`, `model`).
        #[arg(long)]
        json: bool,
    },
    /// List the created tokens: ids, scopes, created and revoked times (never the tokens).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: its next request gets 401, on every replica.
    Revoke {
        /// The token's id (tok-N, from `token list`).
        #[arg(value_name = "ID")]
        id: String,
    },
}

/// The model settings `config` reads and writes.
pub const CONFIG_KEYS: [&str; 6] =
    ["harvest-mode", "workers", "repair-after", "repair-max-unhealthy", "replace-drifted", "drift-budget"];

/// `provisioner config ...`.
#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Print a setting.
    Get {
        /// harvest-mode, workers, repair-after, repair-max-unhealthy, replace-drifted or
        /// drift-budget.
        #[arg(value_parser = CONFIG_KEYS)]
        key: String,
    },
    /// Change a setting (applied at once, kept across restarts).
    Set {
        /// harvest-mode, workers, repair-after, repair-max-unhealthy, replace-drifted or
        /// drift-budget.
        #[arg(value_parser = CONFIG_KEYS)]
        key: String,
        /// The new value (harvest-mode: none, unknown, destroyed, all; workers: 1..=100;
        /// repair-after: a duration such as 10m, or off; repair-max-unhealthy: a count such as
        /// 3 or a percentage such as 20%; replace-drifted: true or false; drift-budget: 1 or
        /// more).
        value: String,
    },
}

/// A client command.
#[derive(Debug)]
// Without the `serve` feature the commands are parsed (for `--help`) but never run.
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub enum ClientCmd {
    /// `machine ...`.
    Machine(MachineCmd),
    /// `instance ...`.
    Instance(InstanceCmd),
    /// `application ...`.
    Application(ApplicationCmd),
    /// `config ...`.
    Config(ConfigCmd),
    /// `token ...`.
    Token(TokenCmd),
    /// `model ...`.
    Model(ModelCmd),
    /// `status`.
    Status {
        /// Print JSON.
        json: bool,
    },
    /// `drift`.
    Drift {
        /// Print JSON.
        json: bool,
    },
    /// `destroy-model`.
    DestroyModel {
        /// Do not fail on machines that cannot be destroyed.
        force: bool,
        /// Print JSON.
        json: bool,
    },
}

/// `provisioner bench serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Requests in all (machine adds, with a list every `--list-every`).
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Machines per add request.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// One request in this many is a `machine list` (0: none).
    #[arg(long, default_value_t = 10)]
    pub list_every: usize,
    /// Open loop: send at this many requests per second in all (0: each client as fast as it
    /// can). Request i is due at i/rate; its latency counts from then, so a service that falls
    /// behind shows it (no coordinated omission).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// With `--rate`: send for this long (the number of requests is rate × duration).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,
    /// The simulated cloud's start latency.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub start_latency: std::time::Duration,
    /// The store the measured service runs on: `sqlite` (a fresh data directory) or the URL of
    /// an empty PostgreSQL database (a build with the `postgres` feature).
    #[arg(long, default_value = "sqlite", value_name = "sqlite|postgres://...")]
    pub store: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `provisioner bench models`.
#[derive(Args, Debug)]
pub struct BenchModelsArgs {
    /// Models in all (`default` and the ones added).
    #[arg(long, default_value_t = 1000)]
    pub models: usize,
    /// Machines added to each model.
    #[arg(long, default_value_t = 2)]
    pub machines: usize,
    /// Concurrent clients adding the machines.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Seconds of nothing to do measured at the end (idle stores shed their caches after
    /// 10 to 20 s).
    #[arg(long, default_value_t = 25)]
    pub idle: u64,
    /// Seconds every machine has to start in.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Instead: the same `--models × --machines` machines added through the API as one model,
    /// then as `--models` models (each on a fresh service, by the same `--clients` clients in
    /// requests of at most 1,000), the seconds until all are started and their ratio.
    #[arg(long)]
    pub compare: bool,
    /// Instead: model `default` adds `--machines` machines while another model's
    /// `--quiet-clients` clients each add one machine every 100 ms; how long each of those
    /// takes from its request to started (p50, p99, max): what a busy model costs an idle one.
    #[arg(long, conflicts_with = "compare")]
    pub fairness: bool,
    /// With `--fairness`: how many clients add to the quiet model at once, each one machine at
    /// a time every 100 ms (more clients, more samples for the p99).
    #[arg(long, default_value_t = 4, requires = "fairness")]
    pub quiet_clients: usize,
    /// The store the measured service runs on: `sqlite` (a fresh data directory) or the URL of
    /// a PostgreSQL database (a build with the `postgres` feature), beside which each run makes
    /// a database of its own, dropped after it (the URL's user must be allowed to).
    #[arg(long, default_value = "sqlite", value_name = "sqlite|postgres://...")]
    pub store: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `provisioner bench lxd`.
#[derive(Args, Debug)]
pub struct BenchLxdArgs {
    /// Machines through the service, and containers created directly, per run.
    #[arg(long, default_value_t = 60)]
    pub machines: usize,
    /// Containers created and started at once directly, and the service's worker pool
    /// (`workers`; 16 is the service's default pool).
    #[arg(long, default_value_t = provisioner::config::DEFAULT_WORKERS)]
    pub concurrency: usize,
    /// Rounds of direct, the service, direct.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// The LXD to measure on (`--lxd-endpoint` with `--lxd-image`, and the three files over
    /// HTTPS) [default: a standalone daemon the bench starts, with a busybox image, and removes
    /// at the end].
    #[command(flatten)]
    pub lxd: provisioner::service::settings::LxdSettings,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(not(feature = "serve"))]
fn no_service(what: &str) -> ExitCode {
    eprintln!(
        "error: `provisioner {what}` needs the service, which this build leaves out; rebuild with the serve feature: cargo run --features serve -- {what}"
    );
    ExitCode::from(2)
}

/// The layer of the trace export, if `serve` installs one (feature `otel`).
pub type TraceLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Runs `serve` with the settings its arguments (`matches`, the `serve` subcommand's) and
/// config file give; `logging` starts the logging once they are read, with the trace export
/// they ask for.
pub fn run_serve(matches: &ArgMatches, logging: impl FnOnce(Option<TraceLayer>)) -> ExitCode {
    #[cfg(feature = "serve")]
    {
        serve::run(matches, logging)
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = matches;
        logging(None);
        no_service("serve")
    }
}

/// Runs a client command.
pub fn run_client(conn: Conn, cmd: ClientCmd) -> ExitCode {
    #[cfg(feature = "serve")]
    {
        client::run(conn, cmd)
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = conn;
        no_service(match cmd {
            ClientCmd::Machine(_) => "machine",
            ClientCmd::Instance(_) => "instance",
            ClientCmd::Application(_) => "application",
            ClientCmd::Config(_) => "config",
            ClientCmd::Token(_) => "token",
            ClientCmd::Model(_) => "model",
            ClientCmd::Status { .. } => "status",
            ClientCmd::Drift { .. } => "drift",
            ClientCmd::DestroyModel { .. } => "destroy-model",
        })
    }
}

/// Runs `bench serve`.
pub fn run_bench(args: BenchServeArgs) -> ExitCode {
    #[cfg(feature = "serve")]
    {
        serve::bench(args)
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = args;
        no_service("bench serve")
    }
}

/// Runs `bench models`.
pub fn run_bench_models(args: BenchModelsArgs) -> ExitCode {
    #[cfg(feature = "serve")]
    {
        bench_models::bench(args)
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = args;
        no_service("bench models")
    }
}

/// Runs `bench lxd`.
pub fn run_bench_lxd(args: BenchLxdArgs) -> ExitCode {
    #[cfg(feature = "serve")]
    {
        bench_lxd::bench(args)
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = args;
        no_service("bench lxd")
    }
}
