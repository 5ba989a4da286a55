//! `[sim]`: the simulated cloud's settings (zones, latencies, subnets, faults, containers).

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::errors::SettingsError;
use super::parse::{duration, optional_duration, parse_duration, parse_zone_list, ZoneList};

/// The simulated cloud's zones by default.
pub const DEFAULT_SIM_ZONES: [&str; 3] = ["az1", "az2", "az3"];
/// How long a simulated start takes by default.
pub const DEFAULT_SIM_START_LATENCY: Duration = Duration::from_secs(2);
/// How long the simulated preparation of a host for containers takes by default.
pub const DEFAULT_SIM_CONTAINER_INIT_DELAY: Duration = Duration::from_secs(1);

/// The simulated cloud (`[sim]`, `--sim-zones`, `--sim-start-latency`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// The simulated cloud's zones, comma-separated (empty: no zones) [default: az1,az2,az3].
    #[arg(id = "sim_zones", long = "sim-zones", env = "PROVISIONER_SIM_ZONES", value_name = "a,b,c",
          value_parser = parse_zone_list)]
    pub zones: Option<ZoneList>,
    /// Zones listed but refusing starts.
    #[arg(skip)]
    pub unavailable_zones: Vec<String>,
    /// How long a simulated start takes, e.g. 2s or 500ms [default: 2s].
    #[arg(id = "sim_start_latency", long = "sim-start-latency", env = "PROVISIONER_SIM_START_LATENCY",
          value_name = "DUR", value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub start_latency: Option<Duration>,
    /// How long a simulated stop takes.
    #[arg(skip)]
    #[serde(deserialize_with = "duration")]
    pub stop_latency: Duration,
    /// The simulated cloud's subnets and the zones each is in (`--to subnet=ID`); by default
    /// one per zone, `subnet-ZONE` in `ZONE`.
    #[arg(skip)]
    #[serde(default)]
    pub subnets: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// How long preparing a host for containers of a type takes (the simulated initialiser
    /// run before a host's first container of that type starts), e.g. 2s [default: 1s].
    #[arg(id = "sim_container_init_delay", long = "sim-container-init-delay",
          env = "PROVISIONER_SIM_CONTAINER_INIT_DELAY", value_name = "DUR", value_parser = parse_duration)]
    #[serde(deserialize_with = "optional_duration")]
    pub container_init_delay: Option<Duration>,
    /// Fault injection: the first N preparations of each host for each container type fail
    /// (retried with backoff, shown on the containers' status; 6 failures in a row give up)
    /// [default: 0].
    #[arg(
        id = "sim_container_init_failures",
        long = "sim-container-init-failures",
        env = "PROVISIONER_SIM_CONTAINER_INIT_FAILURES",
        value_name = "N"
    )]
    pub container_init_failures: Option<u32>,
    /// Fault injection: the first N start calls the simulated cloud gets after the service
    /// starts are refused with a zone-independent error (each uses a retry round; with
    /// `[retry] count = 0` its machine ends in provisioning error, which `machine retry` then
    /// provisions) [default: 0].
    #[arg(
        id = "sim_start_failures",
        long = "sim-start-failures",
        env = "PROVISIONER_SIM_START_FAILURES",
        value_name = "N"
    )]
    pub start_failures: Option<u32>,
    /// Each simulated account's start rate: the starts per second (and at once) it takes from
    /// all the models on it together, refusing more as throttled; the models on one account
    /// share one client-side limiter of that size [default: no limit, no client-side limiter].
    #[arg(id = "sim_account_start_rate", long = "sim-account-start-rate",
          env = "PROVISIONER_SIM_ACCOUNT_START_RATE", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub account_start_rate: Option<u32>,
    /// The instance type of machines without hardware constraints (file only; unset: no type).
    #[arg(skip)]
    pub instance_type: Option<String>,
    /// `TYPE:ZONE` pairs out of capacity (file only): starts try the next fitting type there.
    #[arg(skip)]
    pub out_of_capacity: Vec<String>,
}

impl SimSection {
    /// The zones the simulated cloud has available.
    pub fn zones(&self) -> ZoneList {
        self.zones.clone().unwrap_or_else(|| DEFAULT_SIM_ZONES.map(String::from).to_vec())
    }

    /// How long a simulated start takes.
    pub fn start_latency(&self) -> Duration {
        self.start_latency.unwrap_or(DEFAULT_SIM_START_LATENCY)
    }

    /// Every zone the simulated cloud lists, available or not.
    pub fn known_zones(&self) -> ZoneList {
        let mut all = self.zones();
        all.extend(self.unavailable_zones.iter().filter(|z| !all.contains(z)).cloned().collect::<Vec<_>>());
        all
    }

    /// The simulated cloud's subnets: as configured, else `subnet-ZONE` for each zone it lists.
    pub fn subnets(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        self.subnets
            .clone()
            .unwrap_or_else(|| self.known_zones().into_iter().map(|z| (format!("subnet-{z}"), vec![z])).collect())
    }

    pub(super) fn check_subnets(&self) -> Result<(), SettingsError> {
        let known = self.known_zones();
        for (subnet, zones) in self.subnets.iter().flatten() {
            if zones.is_empty() || zones.iter().any(|z| !known.contains(z)) {
                return Err(SettingsError::SimSubnet {
                    subnet: subnet.clone(),
                    got: zones.clone(),
                    zones: known.join(", "),
                });
            }
        }
        Ok(())
    }

    /// How long the simulated preparation of a host for containers takes.
    pub fn container_init_delay(&self) -> Duration {
        self.container_init_delay.unwrap_or(DEFAULT_SIM_CONTAINER_INIT_DELAY)
    }

    /// How many preparations of each host and container type fail first.
    pub fn container_init_failures(&self) -> u32 {
        self.container_init_failures.unwrap_or(0)
    }

    /// How many start calls the simulated cloud refuses first.
    pub fn start_failures(&self) -> u32 {
        self.start_failures.unwrap_or(0)
    }
}
