//! Drift (issue 34): whether a machine's instance still matches what a start would make for it
//! today. Plain functions, used by the service's drift report (`GET /v1/drift`, `provisioner
//! drift`) and the simulator's report alike.
//!
//! An instance has drifted, for each reason that holds:
//! - `instance-type`: its type is one the machine's constraints now forbid (`instance-type=`
//!   names another, or the catalogue's entry for its type fails `arch`, `cores` or `mem`). A
//!   type the catalogue does not know is judged only against `instance-type=`.
//! - `image`: it was started from another image than the one a start uses today (the model's
//!   image changed: another AMI, an LXD alias pointed at a newer image). Judged only where the
//!   cloud says which image a start uses ([`crate::ports::Broker::current_image`]).
//! - `zone`: it runs outside the zones the machine allows (`zones=`, or a `zone=` placement).
//! - `tags`: its machine tag names another machine, or none (our identity changed outside us).
//!
//! Report-only: a drifted machine keeps its instance unless the model replaces drifted
//! machines (`replace-drifted`, through the hand-over).

use std::fmt;

use super::instance_types::InstanceType;
use super::placement::Placement;
use super::{CloudInstance, Constraints, MachineId};

/// One reason an instance has drifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftReason {
    /// Its type is one the constraints now forbid.
    InstanceType {
        /// The instance's type.
        instance_type: String,
        /// The constraint it fails, e.g. `cores=4 (it has 2)`.
        why: String,
    },
    /// It was started from another image than a start uses today.
    Image {
        /// The instance's image, if the cloud says.
        image: Option<String>,
        /// The image a start uses today.
        expected: String,
    },
    /// It runs outside the zones the machine allows.
    Zone {
        /// The instance's zone.
        zone: String,
        /// The zones the machine allows.
        allowed: Vec<String>,
    },
    /// Its machine tag names another machine, or none.
    Tags {
        /// The machine its tag names, if any.
        tagged_for: Option<String>,
    },
}

/// Every reason's kind, in [`drift_of`]'s order.
pub const KINDS: [&str; 4] = ["instance-type", "image", "zone", "tags"];

impl DriftReason {
    /// The reason's kind: `instance-type`, `image`, `zone` or `tags` (a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            DriftReason::InstanceType { .. } => "instance-type",
            DriftReason::Image { .. } => "image",
            DriftReason::Zone { .. } => "zone",
            DriftReason::Tags { .. } => "tags",
        }
    }
}

impl fmt::Display for DriftReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriftReason::InstanceType { instance_type, why } => {
                write!(f, "instance type {instance_type} is forbidden by the constraints: {why}")
            }
            DriftReason::Image { image: Some(image), expected } => {
                write!(f, "image {image} is not the one a start uses today ({expected})")
            }
            DriftReason::Image { image: None, expected } => {
                write!(f, "its image is not known, a start uses {expected} today")
            }
            DriftReason::Zone { zone, allowed } => {
                write!(f, "zone {zone} is outside the zones the machine allows ({})", allowed.join(", "))
            }
            DriftReason::Tags { tagged_for: Some(m) } => write!(f, "its machine tag names machine {m}"),
            DriftReason::Tags { tagged_for: None } => write!(f, "its machine tag is missing"),
        }
    }
}

/// What a start would make for a machine today.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The machine.
    pub machine: &'a MachineId,
    /// Its constraints now.
    pub constraints: &'a Constraints,
    /// Its placement directive, if any (`zone=...` bounds its zone).
    pub placement: Option<&'a str>,
    /// The cloud's instance types (the shipped catalogue).
    pub catalogue: &'a [InstanceType],
    /// The image a start uses today, where the cloud says ([`crate::ports::Broker::current_image`]).
    pub image: Option<&'a str>,
}

/// Every reason `instance` (the machine's recorded instance, as listed) has drifted from
/// `expected`, in a fixed order (type, image, zone, tags); empty when it has not.
pub fn drift_of(expected: &Expected<'_>, instance: &CloudInstance) -> Vec<DriftReason> {
    let mut out = Vec::new();
    let c = expected.constraints;
    if let Some(t) = &instance.instance_type {
        let why = match &c.instance_type {
            Some(want) if want != t => Some(format!("instance-type={want}")),
            Some(_) => None,
            None => expected.catalogue.iter().find(|x| &x.name == t).and_then(|x| {
                let hardware = c.arch.is_some() || c.cores.is_some() || c.mem_mb.is_some();
                hardware.then(|| x.unsatisfied(c)).flatten()
            }),
        };
        if let Some(why) = why {
            out.push(DriftReason::InstanceType { instance_type: t.clone(), why });
        }
    }
    if let Some(want) = expected.image.filter(|want| instance.image.as_deref() != Some(*want)) {
        out.push(DriftReason::Image { image: instance.image.clone(), expected: want.to_owned() });
    }
    if let Some(zone) = &instance.zone {
        let placed =
            expected.placement.and_then(|p| Placement::parse(p).ok()).and_then(|p| p.zone().map(str::to_owned));
        let allowed: Option<Vec<String>> = match (placed, &c.zones) {
            (Some(z), _) => Some(vec![z]),
            (None, Some(zs)) if !zs.is_empty() => Some(zs.clone()),
            _ => None,
        };
        if let Some(allowed) = allowed.filter(|a| !a.contains(zone)) {
            out.push(DriftReason::Zone { zone: zone.clone(), allowed });
        }
    }
    if instance.tags.machine.as_ref() != Some(expected.machine) {
        out.push(DriftReason::Tags { tagged_for: instance.tags.machine.as_ref().map(ToString::to_string) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::instance_types::shipped;
    use crate::model::{InstanceId, InstanceState, InstanceTags};

    fn instance(machine: &str, t: Option<&str>, zone: &str) -> CloudInstance {
        let tags = InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None };
        let mut i = CloudInstance::tagged(InstanceId::new("i-1"), InstanceState::Running, tags);
        i.instance_type = t.map(str::to_owned);
        i.zone = Some(zone.to_owned());
        i
    }

    #[test]
    fn an_instance_a_start_would_make_today_has_not_drifted() {
        let m = MachineId::new("0");
        let c = Constraints::parse("cores=2 zones=az1,az2").unwrap();
        let catalogue = shipped();
        let e = Expected { machine: &m, constraints: &c, placement: None, catalogue: &catalogue, image: None };
        assert_eq!(drift_of(&e, &instance("0", Some("t3.medium"), "az1")), Vec::new());
        // A bigger type than the cheapest still satisfies the constraints.
        assert_eq!(drift_of(&e, &instance("0", Some("m5.xlarge"), "az2")), Vec::new());
    }

    #[test]
    fn each_reason_is_named() {
        let m = MachineId::new("0");
        let c = Constraints::parse("cores=4").unwrap();
        let catalogue = shipped();
        let e = Expected {
            machine: &m,
            constraints: &c,
            placement: Some("zone=az2"),
            catalogue: &catalogue,
            image: Some("ami-2"),
        };
        let mut old = instance("7", Some("t3.medium"), "az1");
        old.image = Some("ami-1".into());
        let got = drift_of(&e, &old);
        let kinds: Vec<&str> = got.iter().map(DriftReason::kind).collect();
        assert_eq!(kinds, KINDS);
        assert_eq!(got[0].to_string(), "instance type t3.medium is forbidden by the constraints: cores=4 (it has 2)");
        assert_eq!(got[1].to_string(), "image ami-1 is not the one a start uses today (ami-2)");
        assert_eq!(got[2].to_string(), "zone az1 is outside the zones the machine allows (az2)");
        assert_eq!(got[3].to_string(), "its machine tag names machine 7");
        // An instance whose image the cloud does not say has drifted once a start uses one.
        assert_eq!(
            drift_of(&e, &instance("0", None, "az2"))[0].to_string(),
            "its image is not known, a start uses ami-2 today"
        );
        // The same image, or a cloud that does not say which image a start uses: no drift.
        old.image = Some("ami-2".into());
        assert!(!drift_of(&e, &old).iter().any(|r| r.kind() == "image"));
        let e = Expected { image: None, ..e };
        assert!(drift_of(&e, &instance("0", None, "az2")).is_empty());
        let pinned = Constraints::parse("instance-type=m5.large").unwrap();
        let e = Expected { constraints: &pinned, placement: None, ..e };
        assert_eq!(drift_of(&e, &instance("0", Some("t3.medium"), "az1"))[0].kind(), "instance-type");
        // An unknown type with no instance-type= constraint cannot be judged.
        let e = Expected { constraints: &c, ..e };
        assert!(drift_of(&e, &instance("0", Some("x9.huge"), "az1")).is_empty());
    }
}
