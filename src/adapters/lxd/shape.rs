//! What an instance is made of, decided without the daemon: its name (derived from the model,
//! the machine and the start's token, so a repeated start finds what the first one made), its
//! config (limits and our `user.*` keys) and root disk from the machine's constraints, and how
//! LXD's answers read back (status, location, keys).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::model::instance_types;
use crate::model::{Constraints, InstanceState, InstanceTags, MachineId};

/// Config key carrying the model's uuid: the provisioner's identity on an instance.
pub const KEY_MODEL: &str = "user.provisioner-model";
/// Config key carrying the machine the instance was started for.
pub const KEY_MACHINE: &str = "user.provisioner-machine";
/// Config key carrying the start's nonce.
pub const KEY_START: &str = "user.provisioner-start";
/// Config key carrying a container's host machine (`H` of `H/lxd/N`).
pub const KEY_HOST: &str = "user.provisioner-host";
/// Config key carrying the instance type an `instance-type=` constraint chose.
pub const KEY_INSTANCE_TYPE: &str = "user.provisioner-instance-type";
/// Prefix of the keys carrying the model's own tags (`user.tag.KEY`).
pub const KEY_TAG_PREFIX: &str = "user.tag.";

/// The storage pool drivers that can size a root disk (`size` on the disk device); `dir`
/// cannot (it would need project quotas on the host's file system, which LXD does not set up).
pub const SIZED_POOL_DRIVERS: [&str; 5] = ["btrfs", "zfs", "lvm", "ceph", "cephfs"];

/// The instance name of model `model`'s start with client token `token` for `machine`:
/// `prov-<model>-<machine>-<token>`, within LXD's rules (at most 63 characters: letters,
/// digits and hyphens, starting with a letter). The model and the token are hashed (8 and 12
/// hex digits), the machine id kept readable (its `/` as `-`, cut to 36 characters). The same
/// three always give the same name, so a retried create meets the instance the first one made;
/// two models never share a name.
pub fn instance_name(model: &str, machine: &MachineId, token: &str) -> String {
    let hash = |s: &str| uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, s.as_bytes()).simple().to_string();
    let model_part = &hash(model)[..8];
    let token_part = &hash(&format!("{model}\n{token}"))[..12];
    let mut machine_part: String = machine
        .as_str()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(36)
        .collect();
    machine_part = machine_part.trim_matches('-').to_owned();
    if machine_part.is_empty() {
        machine_part.push('m');
    }
    format!("prov-{model_part}-{machine_part}-{token_part}")
}

/// LXD's name of a Juju architecture (`amd64` → `x86_64`); `None` for one LXD does not run.
pub fn lxd_arch(juju: &str) -> Option<&'static str> {
    Some(match juju {
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        "i386" => "i686",
        "armhf" => "armv7l",
        "ppc64el" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        _ => return None,
    })
}

/// The storage pool instances' root disks come from (the default profile's `root` device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPool {
    /// The pool's name.
    pub name: String,
    /// Its driver (`dir`, `zfs`, ...).
    pub driver: String,
}

/// What a machine's constraints make of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shape {
    /// `limits.*` keys (and the instance type's key).
    pub config: BTreeMap<String, String>,
    /// The root disk device, when `root-disk=` sizes it.
    pub root_disk: Option<Value>,
    /// The architecture the member must have (LXD's name), when `arch=` is given.
    pub arch: Option<&'static str>,
    /// The instance type `instance-type=` chose.
    pub instance_type: Option<String>,
}

/// The shape of an instance for constraints `c` with its root disk from `pool`; an error
/// (the machine's provisioning error: no zone can meet it) says which constraint and why.
///
/// - `cores` → `limits.cpu`, `mem` → `limits.memory` (MiB);
/// - `instance-type` → the cores and memory of that type in the shipped table
///   ([`instance_types::shipped`], EC2's names: LXD's own table needs an internet download),
///   raised to `cores`/`mem` where those ask for more; a name the table does not know is
///   refused;
/// - `root-disk` → the root disk's `size`, on a pool whose driver can enforce it
///   ([`SIZED_POOL_DRIVERS`]); refused on a `dir` pool;
/// - `arch` → checked against the member's architecture by the broker;
/// - `spaces`, `tags` and `zones` do not shape an instance here.
pub fn shape(c: &Constraints, pool: &RootPool) -> Result<Shape, String> {
    let mut shape = Shape::default();
    let mut cores = c.cores;
    let mut mem = c.mem_mb;
    if let Some(name) = &c.instance_type {
        let catalogue = instance_types::shipped();
        let Some(t) = catalogue.iter().find(|t| &t.name == name) else {
            return Err(format!(
                "instance-type={name} is not in the instance-type table this provisioner ships for LXD \
                 (EC2's names, e.g. t3.micro, m5.large): give cores= and mem= instead"
            ));
        };
        if c.arch.as_deref().is_some_and(|a| !t.arch.is_empty() && a != t.arch) {
            return Err(format!("instance-type={name} is {}, not arch={}", t.arch, c.arch.as_deref().unwrap_or("")));
        }
        cores = Some(cores.map_or(t.cores, |n| n.max(t.cores)));
        mem = Some(mem.map_or(t.mem_mb, |m| m.max(t.mem_mb)));
        shape.instance_type = Some(name.clone());
        shape.config.insert(KEY_INSTANCE_TYPE.to_owned(), name.clone());
    }
    if let Some(n) = cores {
        if n == 0 {
            return Err("cores=0 cannot be met: an instance needs at least one core".into());
        }
        shape.config.insert("limits.cpu".into(), n.to_string());
    }
    if let Some(m) = mem {
        if m == 0 {
            return Err("mem=0 cannot be met".into());
        }
        shape.config.insert("limits.memory".into(), format!("{m}MiB"));
    }
    if let Some(size) = c.root_disk_mb {
        if !SIZED_POOL_DRIVERS.contains(&pool.driver.as_str()) {
            return Err(format!(
                "root-disk={size}M cannot be met: the storage pool {:?} (driver {}) cannot limit a disk's size; \
                 pools of driver {} can",
                pool.name,
                pool.driver,
                SIZED_POOL_DRIVERS.join(", ")
            ));
        }
        shape.root_disk = Some(json!({"type": "disk", "path": "/", "pool": pool.name, "size": format!("{size}MiB")}));
    }
    if let Some(a) = &c.arch {
        shape.arch = Some(lxd_arch(a).ok_or_else(|| format!("arch={a} is not an architecture LXD runs"))?);
    }
    Ok(shape)
}

/// The config of a new instance: the shape's keys, our identity keys and the model's tags
/// (`user.tag.KEY`; keys LXD would refuse are left out).
pub fn instance_config(shape: &Shape, tags: &InstanceTags, extra: &BTreeMap<String, String>) -> Map<String, Value> {
    let mut config: Map<String, Value> = shape.config.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    for (key, value) in extra {
        if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            config.insert(format!("{KEY_TAG_PREFIX}{key}"), json!(value));
        }
    }
    for (key, value) in [
        (KEY_MODEL, tags.model.clone()),
        (KEY_MACHINE, tags.machine.as_ref().map(|m| m.as_str().to_owned())),
        (KEY_START, tags.start.clone()),
    ] {
        if let Some(v) = value {
            config.insert(key.to_owned(), json!(v));
        }
    }
    config
}

/// The identity an instance's config carries.
pub fn tags_of(config: &Value) -> InstanceTags {
    let key = |k: &str| config.get(k).and_then(Value::as_str).filter(|v| !v.is_empty()).map(str::to_owned);
    InstanceTags { model: key(KEY_MODEL), machine: key(KEY_MACHINE).map(MachineId::new), start: key(KEY_START) }
}

/// Our state of an instance from LXD's `status` and config: a container created and never
/// started (no `volatile.last_state.power`) is still `pending` (its start comes next); one
/// `Stopped` or `Frozen` after it ran is `stopped`; `Error` (its member unreachable) is
/// `stopped` too: it is not running as far as anyone can tell; any other status (an
/// operation under way) is `pending`.
pub fn state_of(status: &str, config: &Value) -> InstanceState {
    let ran = config.get("volatile.last_state.power").is_some();
    match status {
        "Running" => InstanceState::Running,
        "Stopped" if !ran => InstanceState::Pending,
        "Stopped" | "Frozen" | "Error" => InstanceState::Stopped,
        _ => InstanceState::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(driver: &str) -> RootPool {
        RootPool { name: "default".into(), driver: driver.into() }
    }

    #[test]
    fn names_are_valid_deterministic_and_the_models_own() {
        let m = MachineId::new("3/lxd/0");
        let a = instance_name("model-a", &m, "3/abc/0");
        assert_eq!(a, instance_name("model-a", &m, "3/abc/0"), "the same start, the same name");
        assert_ne!(a, instance_name("model-a", &m, "3/abc/1"), "another call, another name");
        assert_ne!(a, instance_name("model-b", &m, "3/abc/0"), "another model, another name");
        assert!(a.starts_with("prov-") && a.contains("-3-lxd-0-"), "{a}");
        let long = instance_name(&"u".repeat(80), &MachineId::new("9/lxd/".repeat(20)), &"t".repeat(300));
        for n in [&a, &long] {
            assert!(n.len() <= 63, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
            assert!(n.starts_with(|c: char| c.is_ascii_alphabetic()) && !n.ends_with('-'), "{n}");
        }
    }

    #[test]
    fn constraints_become_limits_and_what_cannot_be_met_is_refused_with_the_reason() {
        let c = Constraints { cores: Some(2), mem_mb: Some(1536), ..Constraints::default() };
        let s = shape(&c, &pool("dir")).unwrap();
        assert_eq!(s.config["limits.cpu"], "2");
        assert_eq!(s.config["limits.memory"], "1536MiB");
        assert_eq!(s.root_disk, None);

        let t = Constraints { instance_type: Some("m5.large".into()), cores: Some(4), ..Constraints::default() };
        let s = shape(&t, &pool("dir")).unwrap();
        assert_eq!(s.config["limits.cpu"], "4", "cores= asks for more than the type");
        assert_eq!(s.config["limits.memory"], "8192MiB", "the type's memory");
        assert_eq!(s.config[KEY_INSTANCE_TYPE], "m5.large");

        let unknown = Constraints { instance_type: Some("huge".into()), ..Constraints::default() };
        assert!(shape(&unknown, &pool("dir")).unwrap_err().contains("instance-type=huge"));

        let disk = Constraints { root_disk_mb: Some(2048), ..Constraints::default() };
        let e = shape(&disk, &pool("dir")).unwrap_err();
        assert!(e.contains("root-disk=2048M") && e.contains("driver dir") && e.contains("zfs"), "{e}");
        let s = shape(&disk, &pool("zfs")).unwrap();
        assert_eq!(s.root_disk.unwrap()["size"], "2048MiB");

        let arch = Constraints { arch: Some("arm64".into()), ..Constraints::default() };
        assert_eq!(shape(&arch, &pool("dir")).unwrap().arch, Some("aarch64"));
        let bad = Constraints { arch: Some("vax".into()), ..Constraints::default() };
        assert!(shape(&bad, &pool("dir")).unwrap_err().contains("arch=vax"));
        assert!(shape(&Constraints { cores: Some(0), ..Constraints::default() }, &pool("dir")).is_err());
    }

    #[test]
    fn identity_keys_round_trip_and_states_read_back() {
        let tags = InstanceTags {
            model: Some("m".into()),
            machine: Some(MachineId::new("4")),
            start: Some("machine-4:n".into()),
        };
        let extra = BTreeMap::from([("owner".to_owned(), "ops".to_owned()), ("bad key".to_owned(), "x".to_owned())]);
        let config = Value::Object(instance_config(&Shape::default(), &tags, &extra));
        assert_eq!(tags_of(&config), tags);
        assert_eq!(config["user.tag.owner"], "ops");
        assert!(config.get("user.tag.bad key").is_none());

        let never = json!({"volatile.base_image": "x"});
        let ran = json!({"volatile.last_state.power": "STOPPED"});
        assert_eq!(state_of("Stopped", &never), InstanceState::Pending);
        assert_eq!(state_of("Stopped", &ran), InstanceState::Stopped);
        assert_eq!(state_of("Running", &ran), InstanceState::Running);
        assert_eq!(state_of("Error", &ran), InstanceState::Stopped);
        assert_eq!(state_of("Starting", &never), InstanceState::Pending);
    }
}
