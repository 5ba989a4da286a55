//! What a `POST /v1/machines` asking for containers or a manual machine means, checked field by
//! field before anything is written. Plain logic (no actix): the handler asks the store to do
//! what [`container_or_manual`] returns; the store then checks what only it knows (the host
//! exists and is alive, the address is not already a machine's).

use std::net::IpAddr;

use super::types::AddMachines;
use crate::model::MachineId;

/// A request for containers or for a manual machine, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecialAdd {
    /// `count` containers of `kind` on `host` (`HOST/KIND/N`, numbered per host and type).
    Containers {
        /// `lxd` or `kvm`.
        kind: String,
        /// The host (a top-level machine).
        host: MachineId,
        /// How many.
        count: usize,
    },
    /// One manually provisioned machine at `address` (an IP address or a lower-case hostname).
    Manual {
        /// Where it is.
        address: String,
    },
}

/// A refused field: its name (as in the JSON body) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field:?}: {message}")]
pub struct FieldError {
    /// The body's field.
    pub field: &'static str,
    /// Why it is refused.
    pub message: String,
}

fn refuse<T>(field: &'static str, message: impl Into<String>) -> Result<T, FieldError> {
    Err(FieldError { field, message: message.into() })
}

/// Checks a request that names `container`, `host`, `manual` or `address` (see
/// [`AddMachines::is_container_or_manual`]); `kinds` are the container types the service runs.
/// `count` is checked for its range by the caller.
pub fn container_or_manual(body: &AddMachines, kinds: &[&str]) -> Result<SpecialAdd, FieldError> {
    let container = body.container.as_deref().map(str::trim);
    let host = body.host.as_deref().map(str::trim);
    if body.manual {
        if container.is_some() || host.is_some() {
            let field = if container.is_some() { "container" } else { "host" };
            return refuse(
                field,
                "a manual machine is not a container: give manual and address, or container and host",
            );
        }
        let Some(address) = body.address.as_deref() else {
            return refuse("address", "a manual machine needs an address (an IP address or a hostname)");
        };
        let address = parse_address(address).map_err(|message| FieldError { field: "address", message })?;
        if body.count != 1 {
            return refuse(
                "count",
                format!("manual machines are registered one at a time (count 1), got {}", body.count),
            );
        }
        if body.zones.is_some() {
            return refuse("zones", "a manual machine is where it is: zones do not apply to it");
        }
        return Ok(SpecialAdd::Manual { address });
    }
    if body.address.is_some() {
        return refuse("address", "an address is only for a manual machine: add \"manual\": true");
    }
    let Some(kind) = container else {
        return refuse("container", format!("host needs a container type: one of {}", kinds.join(", ")));
    };
    if !kinds.contains(&kind) {
        return refuse(
            "container",
            format!("unknown container type {kind:?}: this service runs {} containers", kinds.join(", ")),
        );
    }
    let Some(host) = host else {
        return refuse("host", "containers need a host: give the id of the machine to put them on");
    };
    if host.is_empty() {
        return refuse("host", "the host's id is empty");
    }
    if MachineId::new(host).is_container() {
        return refuse("host", format!("machine {host} is a container: containers go on top-level machines"));
    }
    if body.zones.is_some() {
        return refuse("zones", "containers take their host's zone: zones do not apply to them");
    }
    Ok(SpecialAdd::Containers { kind: kind.to_owned(), host: MachineId::new(host), count: body.count })
}

/// A manual machine's address: an IP address (v4 or v6) or a hostname (RFC 1123 labels of
/// letters, digits and hyphens, 1 to 63 characters, not starting or ending with a hyphen; 253
/// characters at most; one trailing dot allowed; lower-cased). All-numeric dotted names are
/// IPv4 addresses or nothing (`10.0.0.300` is refused).
pub fn parse_address(raw: &str) -> Result<String, String> {
    let text = raw.trim();
    if text.is_empty() {
        return Err("the address is empty: give an IP address or a hostname".into());
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let bad = |why: &str| Err(format!("{text:?} is not an IP address or a hostname: {why}"));
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.len() > 253 {
        return bad("a hostname has at most 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return bad("each part between dots has 1 to 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return bad("a hostname has only letters, digits, hyphens and dots");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a part of a hostname does not start or end with a hyphen");
        }
    }
    if labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        return bad("it looks like an IPv4 address but is not one");
    }
    Ok(name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: &[&str] = &["lxd", "kvm"];

    fn body(f: impl FnOnce(&mut AddMachines)) -> AddMachines {
        let mut b = AddMachines::plain(1, None);
        f(&mut b);
        b
    }

    fn field_of(b: AddMachines) -> &'static str {
        container_or_manual(&b, KINDS).unwrap_err().field
    }

    #[test]
    fn containers_need_a_known_type_and_a_top_level_host() {
        let ok = body(|b| {
            b.container = Some("lxd".into());
            b.host = Some(" 3 ".into());
            b.count = 2;
        });
        assert_eq!(
            container_or_manual(&ok, KINDS).unwrap(),
            SpecialAdd::Containers { kind: "lxd".into(), host: MachineId::new("3"), count: 2 }
        );
        assert_eq!(field_of(body(|b| b.host = Some("3".into()))), "container");
        assert_eq!(field_of(body(|b| b.container = Some("lxd".into()))), "host");
        let docker = body(|b| {
            b.container = Some("docker".into());
            b.host = Some("3".into());
        });
        let e = container_or_manual(&docker, KINDS).unwrap_err();
        assert_eq!(e.field, "container");
        assert!(e.to_string().contains("\"docker\"") && e.to_string().contains("lxd, kvm"), "{e}");
        let nested = body(|b| {
            b.container = Some("lxd".into());
            b.host = Some("3/lxd/0".into());
        });
        assert_eq!(field_of(nested), "host");
        let zoned = body(|b| {
            b.container = Some("kvm".into());
            b.host = Some("3".into());
            b.zones = Some(vec!["az1".into()]);
        });
        assert_eq!(field_of(zoned), "zones");
    }

    #[test]
    fn a_manual_machine_needs_one_valid_address_and_nothing_else() {
        let ok = body(|b| {
            b.manual = true;
            b.address = Some("Host-1.Example.com.".into());
        });
        assert_eq!(
            container_or_manual(&ok, KINDS).unwrap(),
            SpecialAdd::Manual { address: "host-1.example.com".into() }
        );
        assert_eq!(field_of(body(|b| b.manual = true)), "address");
        assert_eq!(field_of(body(|b| b.address = Some("10.0.0.5".into()))), "address");
        let bad = body(|b| {
            b.manual = true;
            b.address = Some("not an address".into());
        });
        let e = container_or_manual(&bad, KINDS).unwrap_err();
        assert_eq!(e.field, "address");
        assert!(e.to_string().starts_with("field \"address\":"), "{e}");
        let two = body(|b| {
            b.manual = true;
            b.address = Some("10.0.0.5".into());
            b.count = 2;
        });
        assert_eq!(field_of(two), "count");
        let both = body(|b| {
            b.manual = true;
            b.address = Some("10.0.0.5".into());
            b.container = Some("lxd".into());
        });
        assert_eq!(field_of(both), "container");
    }

    #[test]
    fn addresses_are_ips_or_hostnames() {
        assert_eq!(parse_address("10.0.0.5").unwrap(), "10.0.0.5");
        assert_eq!(parse_address(" fe80::1 ").unwrap(), "fe80::1");
        assert_eq!(parse_address("db-2").unwrap(), "db-2");
        assert_eq!(parse_address("NODE7.lan").unwrap(), "node7.lan");
        for bad in ["", "  ", "10.0.0.300", "1.2.3", "-a.b", "a-.b", "a..b", "a_b", "host name", "a/b", "http://x"] {
            assert!(parse_address(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_address(&"a".repeat(64)).is_err());
        assert!(parse_address(&["a"; 130].join(".")).is_err());
    }
}
