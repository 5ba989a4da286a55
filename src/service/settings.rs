//! The options of `provisioner serve`: command-line flags over a TOML config file over the
//! defaults (`shared/spec/cli.md`). Model settings changed at run time with
//! `provisioner config set` are kept in the database and win over the file at the next start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::{RetryStrategy, DEFAULT_RESYNC_INTERVAL, DEFAULT_WORKERS};
use crate::service::run::ServeError;
use crate::service::simcloud::SimSettings;
use crate::types::HarvestMode;

/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./provisioner-data";
/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// How long a graceful shutdown waits for in-flight cloud calls by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Which cloud the service drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// The simulated cloud, in real time, persisted in the data directory.
    Sim,
    /// EC2 (not in this build).
    Ec2,
}

impl std::str::FromStr for BrokerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(BrokerKind::Sim),
            "ec2" => Ok(BrokerKind::Ec2),
            other => Err(format!("invalid broker {other:?}: expected sim or ec2")),
        }
    }
}

/// What was given on the command line (`None`: not given).
#[derive(Debug, Clone, Default)]
pub struct ServeFlags {
    /// `--config FILE`.
    pub config: Option<PathBuf>,
    /// `--data-dir DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--listen ADDR`.
    pub listen: Option<String>,
    /// `--broker sim|ec2`.
    pub broker: Option<BrokerKind>,
    /// `--sim-zones a,b,c` (empty: a zoneless cloud).
    pub sim_zones: Option<Vec<String>>,
    /// `--sim-start-latency DUR`.
    pub sim_start_latency: Option<Duration>,
    /// `--ec2-endpoint URL`.
    pub ec2_endpoint: Option<String>,
    /// `--region REGION`.
    pub region: Option<String>,
    /// `--ec2-image AMI`.
    pub ec2_image: Option<String>,
    /// `--ec2-instance-type TYPE`.
    pub ec2_instance_type: Option<String>,
    /// `--init`: create a new model even where an old one's leftovers are.
    pub init: bool,
}

/// The EC2 broker's settings (used with `--broker ec2`; credentials come from the standard AWS
/// chain, never from here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ec2Settings {
    /// An EC2-compatible endpoint instead of AWS's.
    pub endpoint: Option<String>,
    /// The region (`None`: from `AWS_REGION` or the profile).
    pub region: Option<String>,
    /// The image every instance starts from.
    pub image: Option<String>,
    /// The instance type.
    pub instance_type: Option<String>,
    /// A subnet for new instances.
    pub subnet: Option<String>,
    /// Security groups for new instances.
    pub security_groups: Vec<String>,
}

/// The config file (every key optional; unknown keys are an error).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    data_dir: Option<PathBuf>,
    listen: Option<String>,
    broker: Option<String>,
    harvest_mode: Option<String>,
    workers: Option<usize>,
    resync: Option<String>,
    shutdown_grace: Option<String>,
    retry: Option<RetryFile>,
    sim: Option<SimFile>,
    ec2: Option<Ec2File>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ec2File {
    endpoint: Option<String>,
    region: Option<String>,
    image: Option<String>,
    instance_type: Option<String>,
    subnet: Option<String>,
    security_groups: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryFile {
    count: Option<u32>,
    delay: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    zones: Option<Vec<String>>,
    unavailable_zones: Option<Vec<String>>,
    start_latency: Option<String>,
    stop_latency: Option<String>,
}

/// Everything `serve` runs with, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// The data directory (database, token).
    pub data_dir: PathBuf,
    /// The HTTP listen address.
    pub listen: String,
    /// The cloud.
    pub broker: BrokerKind,
    /// Initial harvest mode (a value set with `config set` wins).
    pub harvest_mode: HarvestMode,
    /// Initial worker pool size (a value set with `config set` wins).
    pub workers: usize,
    /// StartInstance retries.
    pub retry: RetryStrategy,
    /// Interval between full cloud listings.
    pub resync: Duration,
    /// How long SIGTERM waits for in-flight cloud calls.
    pub shutdown_grace: Duration,
    /// The simulated cloud.
    pub sim: SimSettings,
    /// The EC2 broker.
    pub ec2: Ec2Settings,
    /// Create a new model where the data directory has no usable database (`--init`).
    pub init: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            listen: DEFAULT_LISTEN.into(),
            broker: BrokerKind::Sim,
            harvest_mode: HarvestMode::default(),
            workers: DEFAULT_WORKERS,
            retry: RetryStrategy::default(),
            resync: DEFAULT_RESYNC_INTERVAL,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            sim: SimSettings::default(),
            ec2: Ec2Settings::default(),
            init: false,
        }
    }
}

fn duration(file: &Path, key: &str, v: &str) -> Result<Duration, ServeError> {
    humantime::parse_duration(v)
        .map_err(|e| ServeError::Config(format!("{}: {key}: invalid duration {v:?}: {e}", file.display())))
}

impl ServeOptions {
    /// Resolves the flags over the config file (if any) over the defaults.
    pub fn resolve(flags: ServeFlags) -> Result<Self, ServeError> {
        let mut o = ServeOptions::default();
        if let Some(path) = &flags.config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ServeError::Config(format!("cannot read config file {}: {e}", path.display())))?;
            o.apply_file(path, &text)?;
        }
        if let Some(d) = flags.data_dir {
            o.data_dir = d;
        }
        if let Some(l) = flags.listen {
            o.listen = l;
        }
        if let Some(b) = flags.broker {
            o.broker = b;
        }
        if let Some(z) = flags.sim_zones {
            o.sim.zones = z;
        }
        if let Some(l) = flags.sim_start_latency {
            o.sim.start_latency = l;
        }
        if let Some(e) = flags.ec2_endpoint {
            o.ec2.endpoint = Some(e);
        }
        if let Some(r) = flags.region {
            o.ec2.region = Some(r);
        }
        if let Some(i) = flags.ec2_image {
            o.ec2.image = Some(i);
        }
        if let Some(t) = flags.ec2_instance_type {
            o.ec2.instance_type = Some(t);
        }
        o.init = flags.init;
        crate::config::validate_workers(o.workers, crate::config::MAX_WORKERS)
            .map_err(|e| ServeError::Config(format!("config: {e}")))?;
        if o.resync.is_zero() {
            return Err(ServeError::Config("config: resync must be positive".into()));
        }
        Ok(o)
    }

    fn apply_file(&mut self, path: &Path, text: &str) -> Result<(), ServeError> {
        let f: ConfigFile = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_owned();
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            ServeError::Config(match line {
                Some(l) => format!("{}:{l}: {msg}", path.display()),
                None => format!("{}: {msg}", path.display()),
            })
        })?;
        if let Some(d) = f.data_dir {
            self.data_dir = d;
        }
        if let Some(l) = f.listen {
            self.listen = l;
        }
        if let Some(b) = f.broker {
            self.broker = b.parse().map_err(|e| ServeError::Config(format!("{}: broker: {e}", path.display())))?;
        }
        if let Some(m) = f.harvest_mode {
            self.harvest_mode =
                m.parse().map_err(|e| ServeError::Config(format!("{}: harvest_mode: {e}", path.display())))?;
        }
        if let Some(w) = f.workers {
            self.workers = w;
        }
        if let Some(r) = f.resync {
            self.resync = duration(path, "resync", &r)?;
        }
        if let Some(g) = f.shutdown_grace {
            self.shutdown_grace = duration(path, "shutdown_grace", &g)?;
        }
        if let Some(r) = f.retry {
            if let Some(c) = r.count {
                self.retry.count = c;
            }
            if let Some(d) = r.delay {
                self.retry.delay = duration(path, "retry.delay", &d)?;
            }
        }
        if let Some(s) = f.sim {
            if let Some(z) = s.zones {
                self.sim.zones = z;
            }
            if let Some(z) = s.unavailable_zones {
                self.sim.unavailable_zones = z;
            }
            if let Some(l) = s.start_latency {
                self.sim.start_latency = duration(path, "sim.start_latency", &l)?;
            }
            if let Some(l) = s.stop_latency {
                self.sim.stop_latency = duration(path, "sim.stop_latency", &l)?;
            }
        }
        if let Some(e) = f.ec2 {
            let ec2 = &mut self.ec2;
            ec2.endpoint = e.endpoint.or(ec2.endpoint.take());
            ec2.region = e.region.or(ec2.region.take());
            ec2.image = e.image.or(ec2.image.take());
            ec2.instance_type = e.instance_type.or(ec2.instance_type.take());
            ec2.subnet = e.subnet.or(ec2.subnet.take());
            if let Some(g) = e.security_groups {
                ec2.security_groups = g;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("provisioner-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn defaults_are_the_contracts() {
        let o = ServeOptions::resolve(ServeFlags::default()).unwrap();
        assert_eq!(o.data_dir, PathBuf::from("./provisioner-data"));
        assert_eq!(o.listen, "127.0.0.1:7878");
        assert_eq!(o.broker, BrokerKind::Sim);
        assert_eq!(o.sim.zones, ["az1", "az2", "az3"]);
        assert_eq!(o.sim.start_latency, Duration::from_secs(2));
    }

    #[test]
    fn ec2_settings_come_from_the_file_and_the_flags() {
        let p = file(
            "ec2.toml",
            "broker = \"ec2\"\n[ec2]\nregion = \"eu-west-1\"\nimage = \"ami-1\"\ninstance_type = \"t3.micro\"\nsubnet = \"subnet-9\"\nsecurity_groups = [\"sg-1\"]\n",
        );
        let o = ServeOptions::resolve(ServeFlags {
            config: Some(p),
            ec2_image: Some("ami-2".into()),
            ec2_endpoint: Some("http://127.0.0.1:5000".into()),
            ..ServeFlags::default()
        })
        .unwrap();
        assert_eq!(o.broker, BrokerKind::Ec2);
        assert_eq!(o.ec2.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.ec2.image.as_deref(), Some("ami-2"), "the flag wins");
        assert_eq!(o.ec2.instance_type.as_deref(), Some("t3.micro"));
        assert_eq!(o.ec2.subnet.as_deref(), Some("subnet-9"));
        assert_eq!(o.ec2.security_groups, ["sg-1"]);
        assert_eq!(o.ec2.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let p = file(
            "ok.toml",
            "listen = \"127.0.0.1:9999\"\nworkers = 4\nharvest_mode = \"all\"\nresync = \"5s\"\n[retry]\ncount = 2\ndelay = \"1s\"\n[sim]\nzones = [\"a\"]\nstart_latency = \"100ms\"\n",
        );
        let o = ServeOptions::resolve(ServeFlags {
            config: Some(p),
            listen: Some("127.0.0.1:1".into()),
            ..ServeFlags::default()
        })
        .unwrap();
        assert_eq!(o.listen, "127.0.0.1:1");
        assert_eq!(o.workers, 4);
        assert_eq!(o.harvest_mode, HarvestMode::All);
        assert_eq!(o.resync, Duration::from_secs(5));
        assert_eq!((o.retry.count, o.retry.delay), (2, Duration::from_secs(1)));
        assert_eq!(o.sim.zones, ["a"]);
        assert_eq!(o.sim.start_latency, Duration::from_millis(100));
    }

    #[test]
    fn bad_files_name_the_file_line_and_key() {
        let p = file("bad.toml", "workers = 4\nwrokers = 5\n");
        let e = ServeOptions::resolve(ServeFlags { config: Some(p), ..ServeFlags::default() }).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("bad.toml:2") && msg.contains("wrokers"), "{msg}");
        assert_eq!(e.exit_code(), 2);
        let p = file("w.toml", "workers = 0\n");
        let e = ServeOptions::resolve(ServeFlags { config: Some(p), ..ServeFlags::default() }).unwrap_err();
        assert!(e.to_string().contains("workers must be between 1 and 100, got 0"), "{e}");
        let p = file("d.toml", "[sim]\nstart_latency = \"soon\"\n");
        let e = ServeOptions::resolve(ServeFlags { config: Some(p), ..ServeFlags::default() }).unwrap_err();
        assert!(e.to_string().contains("sim.start_latency"), "{e}");
    }
}
