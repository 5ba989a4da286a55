//! The instance-type catalogue: which instance types satisfy a machine's hardware constraints,
//! cheapest first, as Juju picks them, and the order a start tries them in when a zone runs out
//! of capacity for one type ([`TypeFailover`]).
//!
//! Plain data and decisions (no actix, no SDK), here in `model` because three layers use it:
//! the EC2 broker (its catalogue comes from `DescribeInstanceTypes`, joined with
//! [`price_per_hour`]), the fake cloud the simulator drives and the service's simulated cloud
//! (both use [`shipped`]).
//!
//! How a type is chosen ([`choose`]):
//! - An explicit `instance-type=` wins: that type only; an error if the catalogue does not know
//!   it or it does not satisfy `arch`/`cores`/`mem`.
//! - No hardware constraint (`arch`, `cores`, `mem`, `instance-type` all unset): the configured
//!   default type, if any (it need not be in the catalogue); with no default, the cheapest
//!   `amd64` type with at least [`MIN_MEM_MB`] of memory (Juju's minimum-memory heuristic:
//!   never a tiny instance by accident).
//! - Otherwise every type whose architecture is `arch` (default `amd64`), with at least `cores`
//!   vCPUs and `mem` MiB of memory (without `mem=`, at least [`MIN_MEM_MB`]), cheapest first. Types without a known price come after every
//!   priced one, ordered by cores, then memory, then name (smallest first). Burstable types
//!   (t3, t4g) are included, as in Juju. `root-disk` does not choose a type: it sizes the root
//!   volume.

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

use super::{CapacityType, Constraints, UsdPerHour};

/// How long a `(type, zone)` pair out of capacity is tried last, by default (as the engine's
/// capacity memory of a zone).
pub const DEFAULT_CAPACITY_MEMORY: Duration = Duration::from_secs(180);

/// Most candidate types one start tries in one zone, by default, before the zone counts as
/// failed for it.
pub const DEFAULT_TYPES_PER_ZONE: usize = 4;

/// Least memory of the type chosen when a machine has no hardware constraint and no default
/// type is configured (Juju's minimum-memory heuristic, 1 GiB).
pub const MIN_MEM_MB: u64 = 1024;

/// One instance type: its hardware and, when known, its on-demand price.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    /// Its name, e.g. `m5.large`.
    pub name: String,
    /// Its architecture, as Juju names it: `amd64` or `arm64` (empty when unknown).
    pub arch: String,
    /// vCPUs (0 when unknown).
    pub cores: u32,
    /// Memory in MiB (0 when unknown).
    pub mem_mb: u64,
    /// On-demand price in USD per hour, when known.
    pub price_per_hour: Option<f64>,
}

impl InstanceType {
    /// A type known by name only (a configured default the catalogue does not list).
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into(), arch: String::new(), cores: 0, mem_mb: 0, price_per_hour: None }
    }

    /// The first hardware constraint this type fails, as `cores=4` etc.; `None` if it satisfies
    /// them all.
    pub fn unsatisfied(&self, c: &Constraints) -> Option<String> {
        if self.arch != c.arch_or_default() {
            return Some(format!("arch={} (it is {})", c.arch_or_default(), self.arch));
        }
        if let Some(n) = c.cores.filter(|n| self.cores < *n) {
            return Some(format!("cores={n} (it has {})", self.cores));
        }
        if let Some(m) = c.mem_mb.filter(|m| self.mem_mb < *m) {
            return Some(format!("mem={m}M (it has {}M)", self.mem_mb));
        }
        None
    }
}

/// Why no instance type can be chosen.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChooseError {
    /// `instance-type=` names a type the catalogue does not know.
    #[error("instance type {0:?} is unknown to this cloud")]
    UnknownType(String),
    /// `instance-type=` names a type that does not satisfy the other constraints.
    #[error("instance type {name:?} does not satisfy the constraints: {why}")]
    Unsatisfied {
        /// The type.
        name: String,
        /// The first constraint it fails.
        why: String,
    },
    /// No type satisfies the constraints.
    #[error("no instance type satisfies the constraints {0}")]
    NoMatch(String),
}

/// Whether the constraints ask for hardware (and so need the catalogue).
pub fn has_hardware_constraint(c: &Constraints) -> bool {
    c.arch.is_some() || c.cores.is_some() || c.mem_mb.is_some() || c.instance_type.is_some()
}

/// The order types are preferred in: priced ones cheapest first, then unpriced ones by cores,
/// memory and name; the name breaks every tie, so the order is fixed.
fn cheapest_first(a: &InstanceType, b: &InstanceType) -> std::cmp::Ordering {
    let price = match (a.price_per_hour, b.price_per_hour) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    };
    price.then(a.cores.cmp(&b.cores)).then(a.mem_mb.cmp(&b.mem_mb)).then_with(|| a.name.cmp(&b.name))
}

/// The types that may start a machine with these constraints, best first (see the module
/// docs). Never empty on `Ok`.
pub fn choose(
    constraints: &Constraints,
    catalogue: &[InstanceType],
    default_type: Option<&str>,
) -> Result<Vec<InstanceType>, ChooseError> {
    if let Some(name) = &constraints.instance_type {
        let t = catalogue.iter().find(|t| &t.name == name).ok_or_else(|| ChooseError::UnknownType(name.clone()))?;
        if let Some(why) = t.unsatisfied(constraints) {
            return Err(ChooseError::Unsatisfied { name: name.clone(), why });
        }
        return Ok(vec![t.clone()]);
    }
    if !has_hardware_constraint(constraints) {
        if let Some(name) = default_type {
            let t = catalogue.iter().find(|t| t.name == name).cloned().unwrap_or_else(|| InstanceType::named(name));
            return Ok(vec![t]);
        }
    }
    // No `mem=`: at least a GiB, as Juju's minimum-memory heuristic has it.
    let wanted = Constraints { mem_mb: Some(constraints.mem_mb.unwrap_or(MIN_MEM_MB)), ..constraints.clone() };
    let wanted = &wanted;
    let mut fit: Vec<InstanceType> = catalogue.iter().filter(|t| t.unsatisfied(wanted).is_none()).cloned().collect();
    if fit.is_empty() {
        return Err(ChooseError::NoMatch(constraints.shape()));
    }
    fit.sort_by(cheapest_first);
    Ok(fit)
}

/// Approximate on-demand prices, USD per hour, Linux, region us-east-1, as AWS's EC2 on-demand
/// pricing page listed them in 2024 (<https://aws.amazon.com/ec2/pricing/on-demand/>). Only their
/// order matters here (they choose the cheapest type); other regions' prices keep roughly the
/// same order. With the hardware of each type: name, arch, vCPUs, MiB.
const SHIPPED: &[(&str, &str, u32, u64, f64)] = &[
    ("t3.nano", "amd64", 2, 512, 0.0052),
    ("t3.micro", "amd64", 2, 1024, 0.0104),
    ("t3.small", "amd64", 2, 2048, 0.0208),
    ("t3.medium", "amd64", 2, 4096, 0.0416),
    ("t3.large", "amd64", 2, 8192, 0.0832),
    ("t3.xlarge", "amd64", 4, 16384, 0.1664),
    ("t3.2xlarge", "amd64", 8, 32768, 0.3328),
    ("t4g.micro", "arm64", 2, 1024, 0.0084),
    ("t4g.small", "arm64", 2, 2048, 0.0168),
    ("t4g.medium", "arm64", 2, 4096, 0.0336),
    ("t4g.large", "arm64", 2, 8192, 0.0672),
    ("m5.large", "amd64", 2, 8192, 0.096),
    ("m5.xlarge", "amd64", 4, 16384, 0.192),
    ("m5.2xlarge", "amd64", 8, 32768, 0.384),
    ("m5.4xlarge", "amd64", 16, 65536, 0.768),
    ("m6i.large", "amd64", 2, 8192, 0.096),
    ("m6i.xlarge", "amd64", 4, 16384, 0.192),
    ("m6g.medium", "arm64", 1, 4096, 0.0385),
    ("m6g.large", "arm64", 2, 8192, 0.077),
    ("m6g.xlarge", "arm64", 4, 16384, 0.154),
    ("c5.large", "amd64", 2, 4096, 0.085),
    ("c5.xlarge", "amd64", 4, 8192, 0.17),
    ("c5.2xlarge", "amd64", 8, 16384, 0.34),
    ("c5.4xlarge", "amd64", 16, 32768, 0.68),
    ("c6g.large", "arm64", 2, 4096, 0.068),
    ("c6g.xlarge", "arm64", 4, 8192, 0.136),
    ("r5.large", "amd64", 2, 16384, 0.126),
    ("r5.xlarge", "amd64", 4, 32768, 0.252),
    ("r5.2xlarge", "amd64", 8, 65536, 0.504),
    ("r6g.large", "arm64", 2, 16384, 0.1008),
];

/// The shipped price of a type (see [`shipped`] for where the numbers come from).
pub fn price_per_hour(name: &str) -> Option<f64> {
    SHIPPED.iter().find(|t| t.0 == name).map(|t| t.4)
}

/// The catalogue shipped in the crate: thirty common types of the t3, t4g, m5, m6i, m6g, c5,
/// c6g, r5 and r6g families with their hardware and approximate us-east-1 on-demand prices
/// (AWS's on-demand pricing page, 2024). The simulated clouds use it as their catalogue; the
/// EC2 broker takes the hardware from `DescribeInstanceTypes` and only the prices from here.
pub fn shipped() -> Vec<InstanceType> {
    SHIPPED
        .iter()
        .map(|&(name, arch, cores, mem_mb, price)| InstanceType {
            name: name.to_owned(),
            arch: arch.to_owned(),
            cores,
            mem_mb,
            price_per_hour: Some(price),
        })
        .collect()
}

/// The spot price of a type, as a share of its on-demand price, when no spot price of its own
/// is given (the fake cloud's rule, issue 33).
pub const SPOT_PRICE_RATIO: f64 = 0.3;

/// What an instance of type `instance_type` (`None`: it has none) costs an hour on `capacity`,
/// from `catalogue`'s on-demand prices: on-demand, the type's on-demand price; spot,
/// `spot_price` when one is given (every type's, even a typeless instance's), else
/// [`SPOT_PRICE_RATIO`] of the on-demand price. `None` when not known (no type, a type the
/// catalogue does not know or does not price, and no `spot_price` for a spot one).
///
/// The one rule for a price: the fake cloud charges a spot start this (and refuses it above
/// the call's maximum), and the simulator's report sums it into the fleet's cost.
pub fn hourly_price(
    catalogue: &[InstanceType],
    instance_type: Option<&str>,
    capacity: CapacityType,
    spot_price: Option<UsdPerHour>,
) -> Option<UsdPerHour> {
    let on_demand = || catalogue.iter().find(|t| Some(t.name.as_str()) == instance_type)?.price_per_hour;
    match capacity {
        CapacityType::OnDemand => UsdPerHour::new(on_demand()?),
        CapacityType::Spot => spot_price.or_else(|| UsdPerHour::new(on_demand()? * SPOT_PRICE_RATIO)),
    }
}

/// One call to make: start with this type under this client token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeAttempt {
    /// The instance type.
    pub instance_type: String,
    /// The client token of this call: the start's own for the best candidate (so a start with
    /// one candidate calls exactly as before), `<token>/<type>` for the others. Derived, never
    /// random: a retry of an ambiguous failure makes the same call again.
    pub client_token: String,
}

/// How long an ambiguous attempt's type is remembered for its client token.
const PENDING_TTL: Duration = Duration::from_secs(3600);

/// The per-type capacity fail-over inside one start (Karpenter's, which Juju lacks: Juju only
/// moves zone): the order a start tries its candidate types in, in one zone, and the memory of
/// `(type, zone)` pairs that recently ran out of capacity.
///
/// - Candidates come from [`choose`], best first. A pair that failed less than `memory` ago
///   goes last (it is still tried when every other type failed too: the memory only steers).
/// - A start whose attempt failed ambiguously (the call may have made an instance) tries that
///   same type, with the same token, first next time: a retry repeats the call it retries.
/// - The broker returns a zone-specific failure only when every candidate failed in the zone.
///
/// Time is a [`Duration`] since an epoch the owner keeps (its clock, paused or not).
#[derive(Debug, Clone, Default)]
pub struct TypeFailover {
    memory: Duration,
    /// `(type, zone)` → until when it is avoided.
    failed: BTreeMap<(String, String), Duration>,
    /// Client token of the start → the type of its ambiguous attempt, and when.
    pending: BTreeMap<String, (String, Duration)>,
}

impl TypeFailover {
    /// A fail-over remembering capacity failures for `memory` (zero: no memory).
    pub fn new(memory: Duration) -> Self {
        Self { memory, ..Self::default() }
    }

    /// The attempts of one start (`token`, its client token) in `zone`, in order.
    pub fn order(
        &mut self,
        now: Duration,
        zone: Option<&str>,
        token: &str,
        candidates: &[InstanceType],
    ) -> Vec<TypeAttempt> {
        self.failed.retain(|_, until| *until > now);
        self.pending.retain(|_, (_, at)| now.saturating_sub(*at) < PENDING_TTL);
        let attempt = |i: usize, t: &InstanceType| TypeAttempt {
            instance_type: t.name.clone(),
            client_token: if i == 0 { token.to_owned() } else { format!("{token}/{}", t.name) },
        };
        let zone = zone.unwrap_or("");
        let pending = self.pending.get(token).map(|(t, _)| t.as_str());
        let remembered = |t: &InstanceType| self.failed.contains_key(&(t.name.clone(), zone.to_owned()));
        let mut first = Vec::new();
        let mut fresh = Vec::new();
        let mut last = Vec::new();
        for (i, t) in candidates.iter().enumerate() {
            let a = attempt(i, t);
            if Some(t.name.as_str()) == pending {
                first.push(a);
            } else if remembered(t) {
                last.push(a);
            } else {
                fresh.push(a);
            }
        }
        first.into_iter().chain(fresh).chain(last).collect()
    }

    /// `instance_type` ran out of capacity in `zone` (a zone-specific failure).
    pub fn capacity_failed(&mut self, now: Duration, instance_type: &str, zone: Option<&str>) {
        if !self.memory.is_zero() {
            self.failed.insert((instance_type.to_owned(), zone.unwrap_or("").to_owned()), now + self.memory);
        }
    }

    /// The attempt of start `token` with `instance_type` failed ambiguously: retry it first.
    pub fn ambiguous(&mut self, now: Duration, token: &str, instance_type: &str) {
        self.pending.insert(token.to_owned(), (instance_type.to_owned(), now));
    }

    /// Start `token` ended (an instance, or a definite failure): nothing to repeat.
    pub fn settled(&mut self, token: &str) {
        self.pending.remove(token);
    }

    /// Whether `(instance_type, zone)` is remembered as out of capacity at `now`.
    pub fn is_remembered(&self, now: Duration, instance_type: &str, zone: Option<&str>) -> bool {
        self.failed.get(&(instance_type.to_owned(), zone.unwrap_or("").to_owned())).is_some_and(|until| *until > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hourly_price_is_the_on_demand_price_or_the_spot_price() {
        let shipped = shipped();
        let price = |t, c, s| hourly_price(&shipped, t, c, s).map(UsdPerHour::dollars);
        assert_eq!(price(Some("t3.medium"), CapacityType::OnDemand, None), Some(0.0416));
        // Spot: SPOT_PRICE_RATIO of on-demand, unless a spot price is given (typeless too).
        assert_eq!(price(Some("t3.medium"), CapacityType::Spot, None), Some(0.01248));
        let given = UsdPerHour::new(0.02);
        assert_eq!(price(Some("t3.medium"), CapacityType::Spot, given), Some(0.02));
        assert_eq!(price(None, CapacityType::Spot, given), Some(0.02));
        // A given spot price is no on-demand price; no type, or one not in the catalogue: unknown.
        assert_eq!(price(Some("t3.medium"), CapacityType::OnDemand, given), Some(0.0416));
        assert_eq!(price(None, CapacityType::OnDemand, given), None);
        assert_eq!(price(None, CapacityType::Spot, None), None);
        assert_eq!(price(Some("x9.huge"), CapacityType::Spot, None), None);
        let unpriced = [InstanceType::named("x9.huge")];
        assert_eq!(hourly_price(&unpriced, Some("x9.huge"), CapacityType::OnDemand, None), None);
    }

    fn c(cores: Option<u32>, mem_mb: Option<u64>) -> Constraints {
        Constraints { cores, mem_mb, ..Constraints::default() }
    }

    fn names(v: &[InstanceType]) -> Vec<&str> {
        v.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn the_cheapest_satisfying_type_comes_first() {
        let got = choose(&c(Some(2), Some(8192)), &shipped(), Some("t3.micro")).unwrap();
        assert_eq!(names(&got)[..4], ["t3.large", "m5.large", "m6i.large", "r5.large"]);
        assert!(got.iter().all(|t| t.arch == "amd64" && t.cores >= 2 && t.mem_mb >= 8192));
        let arm = Constraints { arch: Some("arm64".into()), ..c(Some(2), Some(8192)) };
        assert_eq!(names(&choose(&arm, &shipped(), None).unwrap())[..2], ["t4g.large", "m6g.large"]);
        let big = choose(&c(Some(16), None), &shipped(), None).unwrap();
        assert_eq!(names(&big), ["c5.4xlarge", "m5.4xlarge"]);
        // Without `mem=`, at least a GiB: t3.micro, not the cheaper t3.nano (512 MiB).
        assert_eq!(names(&choose(&c(Some(2), None), &shipped(), Some("m5.large")).unwrap())[0], "t3.micro");
        assert_eq!(names(&choose(&c(None, Some(512)), &shipped(), None).unwrap())[0], "t3.nano");
    }

    #[test]
    fn an_explicit_instance_type_wins_and_must_fit() {
        let want = Constraints { instance_type: Some("m5.xlarge".into()), ..c(Some(2), None) };
        assert_eq!(names(&choose(&want, &shipped(), None).unwrap()), ["m5.xlarge"]);
        let unknown = Constraints { instance_type: Some("x9.huge".into()), ..Constraints::default() };
        assert_eq!(choose(&unknown, &shipped(), None), Err(ChooseError::UnknownType("x9.huge".into())));
        let small = Constraints { instance_type: Some("t3.micro".into()), ..c(None, Some(4096)) };
        let err = choose(&small, &shipped(), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "instance type \"t3.micro\" does not satisfy the constraints: mem=4096M (it has 1024M)"
        );
        let arm = Constraints { instance_type: Some("m5.large".into()), arch: Some("arm64".into()), ..c(None, None) };
        assert!(matches!(choose(&arm, &shipped(), None), Err(ChooseError::Unsatisfied { .. })));
    }

    #[test]
    fn no_hardware_constraint_takes_the_default_type_or_the_cheapest_with_a_gib() {
        let none = Constraints { zones: Some(vec!["az1".into()]), ..Constraints::default() };
        assert_eq!(names(&choose(&none, &shipped(), Some("m5.large")).unwrap()), ["m5.large"]);
        // A default the catalogue does not list is used as it is.
        let got = choose(&none, &shipped(), Some("z1d.large")).unwrap();
        assert_eq!(got, vec![InstanceType::named("z1d.large")]);
        assert_eq!(names(&choose(&none, &shipped(), None).unwrap())[0], "t3.micro");
    }

    #[test]
    fn nothing_fits_is_an_error_naming_the_constraints() {
        let err = choose(&c(Some(64), None), &shipped(), None).unwrap_err();
        assert_eq!(err, ChooseError::NoMatch("arch=amd64 cores=64".into()));
        assert_eq!(err.to_string(), "no instance type satisfies the constraints arch=amd64 cores=64");
    }

    #[test]
    fn unpriced_types_come_after_priced_ones_by_cores_memory_name() {
        let t = |name: &str, cores, mem_mb, price| InstanceType {
            name: name.into(),
            arch: "amd64".into(),
            cores,
            mem_mb,
            price_per_hour: price,
        };
        let cat = vec![
            t("b.big", 8, 8192, None),
            t("a.small", 2, 8192, None),
            t("c.mid", 2, 4096, None),
            t("p.priced", 16, 65536, Some(1.0)),
            t("a.same", 2, 4096, None),
        ];
        assert_eq!(
            names(&choose(&c(Some(2), None), &cat, None).unwrap()),
            ["p.priced", "a.same", "c.mid", "a.small", "b.big"]
        );
        assert_eq!(price_per_hour("m5.large"), Some(0.096));
        assert_eq!(price_per_hour("nope.large"), None);
    }

    fn types(names: &[&str]) -> Vec<InstanceType> {
        names.iter().map(|n| InstanceType::named(*n)).collect()
    }

    fn tried(v: &[TypeAttempt]) -> Vec<(&str, &str)> {
        v.iter().map(|a| (a.instance_type.as_str(), a.client_token.as_str())).collect()
    }

    #[test]
    fn the_best_type_keeps_the_start_token_the_others_derive_theirs() {
        let mut f = TypeFailover::new(Duration::from_secs(180));
        let got = f.order(Duration::ZERO, Some("az1"), "tok", &types(&["a", "b", "c"]));
        assert_eq!(tried(&got), [("a", "tok"), ("b", "tok/b"), ("c", "tok/c")]);
    }

    #[test]
    fn a_type_out_of_capacity_in_a_zone_goes_last_there_for_a_while() {
        let mut f = TypeFailover::new(Duration::from_secs(180));
        let cands = types(&["a", "b", "c"]);
        f.capacity_failed(Duration::from_secs(10), "a", Some("az1"));
        assert!(f.is_remembered(Duration::from_secs(10), "a", Some("az1")));
        let got = f.order(Duration::from_secs(20), Some("az1"), "t2", &cands);
        assert_eq!(tried(&got), [("b", "t2/b"), ("c", "t2/c"), ("a", "t2")], "still tried, last");
        // Another zone is not affected.
        let other = f.order(Duration::from_secs(20), Some("az2"), "t3", &cands);
        assert_eq!(tried(&other)[0], ("a", "t3"));
        // The memory fades.
        let later = f.order(Duration::from_secs(190), Some("az1"), "t4", &cands);
        assert_eq!(tried(&later)[0], ("a", "t4"));
        assert!(!f.is_remembered(Duration::from_secs(190), "a", Some("az1")));
        // No memory: nothing is remembered.
        let mut none = TypeFailover::new(Duration::ZERO);
        none.capacity_failed(Duration::ZERO, "a", Some("az1"));
        assert_eq!(tried(&none.order(Duration::ZERO, Some("az1"), "t", &cands))[0], ("a", "t"));
    }

    #[test]
    fn a_retry_after_an_ambiguous_failure_repeats_the_same_call_first() {
        let mut f = TypeFailover::new(Duration::from_secs(180));
        let cands = types(&["a", "b", "c"]);
        // a ran out of capacity, b's answer was lost: the retry calls b with b's token again,
        // even though the memory of a has faded and would put a first.
        f.capacity_failed(Duration::ZERO, "a", Some("az1"));
        f.ambiguous(Duration::ZERO, "tok", "b");
        let got = f.order(Duration::from_secs(200), Some("az1"), "tok", &cands);
        assert_eq!(tried(&got), [("b", "tok/b"), ("a", "tok"), ("c", "tok/c")]);
        f.settled("tok");
        assert_eq!(tried(&f.order(Duration::from_secs(200), Some("az1"), "tok", &cands))[0], ("a", "tok"));
        // Forgotten after an hour.
        f.ambiguous(Duration::ZERO, "old", "c");
        assert_eq!(tried(&f.order(Duration::from_secs(3600), Some("az1"), "old", &cands))[0], ("a", "old"));
    }
}
