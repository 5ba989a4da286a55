//! Constraints in Juju's syntax: `arch=arm64 cores=4 mem=16G root-disk=64G instance-type=m5.large
//! zones=az1,az2 spaces=db,^dmz tags=ssd,^gpu`, parsed into [`Constraints`] and printed back.
//!
//! As Juju's `constraints.Parse`: items are separated by spaces; each is `key=value`; a key may
//! be given once; an empty value leaves the constraint unset. Sizes (`mem`, `root-disk`) are
//! non-negative numbers, in MiB when bare, with an optional `M`, `G`, `T` or `P` suffix (powers
//! of 1024), rounded up to a whole MiB (`mem=0.5G` is 512, `mem=1.5M` is 2). `cores` is a
//! non-negative integer; `arch` one of Juju's architectures; `zones`, `spaces` and `tags` are
//! comma-separated (`^name` excludes a space or a tag). Plain logic, no I/O.

use std::fmt;

use thiserror::Error;

use super::types::Constraints;

/// The architectures Juju knows (`arch.AllSupportedArches`).
pub const ARCHES: [&str; 5] = ["amd64", "arm64", "ppc64el", "s390x", "riscv64"];

/// The keys a constraint string may have, in the order they are printed.
pub const KEYS: [&str; 8] = ["arch", "cores", "mem", "root-disk", "tags", "instance-type", "spaces", "zones"];

/// Why a constraint string (or a constraints object) is refused. Each names the key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConstraintsError {
    /// An item that is not `key=value`.
    #[error("malformed constraint {item:?}: expected key=value")]
    Malformed {
        /// The item as given.
        item: String,
    },
    /// A key Juju does not know (or this provisioner does not support).
    #[error("unknown constraint {key:?}: expected one of {}", KEYS.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A key given twice.
    #[error("bad {key:?} constraint: already set")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// A value the key does not take.
    #[error("bad {key:?} constraint: {value:?} {reason}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What the key takes.
        reason: &'static str,
    },
}

impl ConstraintsError {
    /// The constraint's key the error is about (`None` for a malformed item).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConstraintsError::Malformed { .. } => None,
            ConstraintsError::UnknownKey { key } | ConstraintsError::Duplicate { key } => Some(key),
            ConstraintsError::BadValue { key, .. } => Some(key),
        }
    }
}

const SIZE: &str = "must be a non-negative number of MiB, with an optional M, G, T or P suffix";

/// A size in MiB: a non-negative number with an optional `M`/`G`/`T`/`P` suffix, rounded up.
pub fn parse_size(key: &'static str, value: &str) -> Result<u64, ConstraintsError> {
    let bad = || ConstraintsError::BadValue { key, value: value.to_owned(), reason: SIZE };
    let (number, factor) = match value.char_indices().last() {
        Some((i, 'M')) => (&value[..i], 1.0),
        Some((i, 'G')) => (&value[..i], 1024.0),
        Some((i, 'T')) => (&value[..i], 1024.0 * 1024.0),
        Some((i, 'P')) => (&value[..i], 1024.0 * 1024.0 * 1024.0),
        _ => (value, 1.0),
    };
    // Digits and at most one point: no sign, exponent, `inf` or `NaN`.
    let plain = !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && number.bytes().filter(|b| *b == b'.').count() <= 1
        && number != ".";
    if !plain {
        return Err(bad());
    }
    let n: f64 = number.parse().map_err(|_| bad())?;
    let mib = (n * factor).ceil();
    if !mib.is_finite() || mib >= i64::MAX as f64 {
        return Err(bad());
    }
    Ok(mib as u64)
}

fn parse_cores(value: &str) -> Result<u32, ConstraintsError> {
    let bad = || ConstraintsError::BadValue {
        key: "cores",
        value: value.to_owned(),
        reason: "must be a non-negative integer",
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    value.parse().map_err(|_| bad())
}

fn check_arch(value: &str) -> Result<(), ConstraintsError> {
    if ARCHES.contains(&value) {
        Ok(())
    } else {
        Err(ConstraintsError::BadValue {
            key: "arch",
            value: value.to_owned(),
            reason: "is not a known architecture (amd64, arm64, ppc64el, s390x, riscv64)",
        })
    }
}

/// A name in a list (`zones`, `spaces`, `tags`, `instance-type`): no blanks, commas or `=`;
/// `^` only first, and only where `negatable`.
fn check_name(key: &'static str, value: &str, negatable: bool) -> Result<(), ConstraintsError> {
    let name = if negatable { value.strip_prefix('^').unwrap_or(value) } else { value };
    let ok = !name.is_empty()
        && name.chars().all(|c| !c.is_whitespace() && !c.is_control() && c != ',' && c != '=' && c != '^');
    if ok {
        Ok(())
    } else {
        let reason = match (key, negatable) {
            (_, true) => "must be comma-separated names, each optionally prefixed with ^ (no empty ones)",
            ("instance-type", _) => "must be an instance type name",
            _ => "must be comma-separated names (no empty ones)",
        };
        Err(ConstraintsError::BadValue { key, value: value.to_owned(), reason })
    }
}

fn parse_list(key: &'static str, value: &str, negatable: bool) -> Result<Vec<String>, ConstraintsError> {
    let items: Vec<String> = value.split(',').map(str::to_owned).collect();
    for item in &items {
        check_name(key, item, negatable).map_err(|_| ConstraintsError::BadValue {
            key,
            value: value.to_owned(),
            reason: if negatable {
                "must be comma-separated names, each optionally prefixed with ^ (no empty ones)"
            } else {
                "must be comma-separated names (no empty ones)"
            },
        })?;
    }
    Ok(items)
}

impl Constraints {
    /// Parses a constraint string in Juju's syntax (see the module's docs).
    pub fn parse(text: &str) -> Result<Constraints, ConstraintsError> {
        let mut c = Constraints::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split_whitespace() {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConstraintsError::Malformed { item: item.to_owned() });
            };
            let Some(key) = KEYS.iter().copied().find(|k| *k == key) else {
                return Err(ConstraintsError::UnknownKey { key: key.to_owned() });
            };
            if seen.contains(&key) {
                return Err(ConstraintsError::Duplicate { key: key.to_owned() });
            }
            seen.push(key);
            if value.is_empty() {
                continue; // `mem=` leaves it unset, as in Juju
            }
            match key {
                "arch" => {
                    check_arch(value)?;
                    c.arch = Some(value.to_owned());
                }
                "cores" => c.cores = Some(parse_cores(value)?),
                "mem" => c.mem_mb = Some(parse_size("mem", value)?),
                "root-disk" => c.root_disk_mb = Some(parse_size("root-disk", value)?),
                "instance-type" => {
                    check_name("instance-type", value, false)?;
                    c.instance_type = Some(value.to_owned());
                }
                "zones" => c.zones = Some(parse_list("zones", value, false)?),
                "spaces" => c.spaces = parse_list("spaces", value, true)?,
                "tags" => c.tags = parse_list("tags", value, true)?,
                _ => return Err(ConstraintsError::UnknownKey { key: key.to_owned() }),
            }
        }
        Ok(c)
    }

    /// Checks constraints that came as a JSON object against the rules the string form
    /// follows (a known arch, names without blanks or commas, `^` only in spaces and tags).
    pub fn validate(&self) -> Result<(), ConstraintsError> {
        if let Some(a) = &self.arch {
            check_arch(a)?;
        }
        if let Some(t) = &self.instance_type {
            check_name("instance-type", t, false)?;
        }
        // Sizes as the string form could give them (a store keeps them as signed 64-bit).
        for (key, size) in [("mem", self.mem_mb), ("root-disk", self.root_disk_mb)] {
            if let Some(n) = size.filter(|n| *n > i64::MAX as u64) {
                return Err(ConstraintsError::BadValue { key, value: format!("{n}M"), reason: SIZE });
            }
        }
        let lists: [(&'static str, Option<&Vec<String>>, bool); 3] = [
            ("zones", self.zones.as_ref(), false),
            ("spaces", Some(&self.spaces), true),
            ("tags", Some(&self.tags), true),
        ];
        for (key, list, negatable) in lists {
            if key == "zones" && list.is_some_and(Vec::is_empty) {
                return Err(ConstraintsError::BadValue {
                    key,
                    value: String::new(),
                    reason: "must not be empty when given",
                });
            }
            for item in list.into_iter().flatten() {
                check_name(key, item, negatable)?;
            }
        }
        Ok(())
    }

    /// Whether nothing is constrained.
    pub fn is_empty(&self) -> bool {
        *self == Constraints::default()
    }
}

/// Juju's canonical form: `arch=.. cores=.. mem=..M root-disk=..M tags=.. instance-type=..
/// spaces=.. zones=..`, unset keys left out (`""` for no constraint). It parses back to the
/// same constraints.
impl fmt::Display for Constraints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<String> = Vec::new();
        if let Some(a) = &self.arch {
            items.push(format!("arch={a}"));
        }
        if let Some(c) = self.cores {
            items.push(format!("cores={c}"));
        }
        if let Some(m) = self.mem_mb {
            items.push(format!("mem={m}M"));
        }
        if let Some(m) = self.root_disk_mb {
            items.push(format!("root-disk={m}M"));
        }
        if !self.tags.is_empty() {
            items.push(format!("tags={}", self.tags.join(",")));
        }
        if let Some(t) = &self.instance_type {
            items.push(format!("instance-type={t}"));
        }
        if !self.spaces.is_empty() {
            items.push(format!("spaces={}", self.spaces.join(",")));
        }
        if let Some(z) = &self.zones {
            items.push(format!("zones={}", z.join(",")));
        }
        f.write_str(&items.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Constraints {
        Constraints::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn each_key_parses() {
        assert_eq!(parse("arch=arm64").arch.as_deref(), Some("arm64"));
        assert_eq!(parse("cores=4").cores, Some(4));
        assert_eq!(parse("cores=0").cores, Some(0));
        assert_eq!(parse("mem=16G").mem_mb, Some(16 * 1024));
        assert_eq!(parse("root-disk=64G").root_disk_mb, Some(64 * 1024));
        assert_eq!(parse("instance-type=m5.large").instance_type.as_deref(), Some("m5.large"));
        assert_eq!(parse("zones=az1,az2").zones, Some(vec!["az1".to_owned(), "az2".to_owned()]));
        assert_eq!(parse("spaces=db,^dmz").spaces, ["db", "^dmz"]);
        assert_eq!(parse("tags=a,b").tags, ["a", "b"]);
        assert_eq!(parse("tags=^c").tags, ["^c"]);
        let all = parse("  cores=4   mem=16G zones=az1,az2 ");
        assert_eq!((all.cores, all.mem_mb, all.zones.as_ref().map(Vec::len)), (Some(4), Some(16384), Some(2)));
        assert_eq!(parse(""), Constraints::default());
    }

    #[test]
    fn sizes_read_as_juju_reads_them() {
        for (text, mib) in [
            ("512", 512),
            ("512M", 512),
            ("0.5G", 512),
            ("1.5M", 2),
            ("2T", 2 * 1024 * 1024),
            ("1P", 1024 * 1024 * 1024),
            ("0", 0),
            (".5G", 512),
        ] {
            assert_eq!(parse_size("mem", text), Ok(mib), "{text}");
        }
        for bad in ["lots", "-1", "16g", "16GB", "G", "1e3", "inf", "NaN", "1.2.3", ".", "+4", " 4"] {
            let e = parse_size("mem", bad).unwrap_err();
            assert_eq!(e.key(), Some("mem"), "{bad}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn bad_input_is_refused_naming_the_key_and_value() {
        let e = Constraints::parse("cores=4 colour=blue").unwrap_err();
        assert_eq!(e, ConstraintsError::UnknownKey { key: "colour".into() });
        assert!(e.to_string().contains("\"colour\""), "{e}");
        let e = Constraints::parse("mem=lots").unwrap_err();
        assert_eq!(e.key(), Some("mem"));
        assert!(e.to_string().contains("\"lots\"") && e.to_string().contains("\"mem\""), "{e}");
        let e = Constraints::parse("mem=4G mem=8G").unwrap_err();
        assert_eq!(e, ConstraintsError::Duplicate { key: "mem".into() });
        let e = Constraints::parse("cores=-1").unwrap_err();
        assert_eq!(e.key(), Some("cores"));
        assert!(e.to_string().contains("\"-1\"") && e.to_string().contains("non-negative integer"), "{e}");
        assert_eq!(Constraints::parse("cores=99999999999").unwrap_err().key(), Some("cores"));
        assert_eq!(Constraints::parse("cores").unwrap_err(), ConstraintsError::Malformed { item: "cores".into() });
        assert_eq!(Constraints::parse("arch=vax").unwrap_err().key(), Some("arch"));
        assert_eq!(Constraints::parse("zones=az1,,az2").unwrap_err().key(), Some("zones"));
        assert_eq!(Constraints::parse("zones=^az1").unwrap_err().key(), Some("zones"));
        assert_eq!(Constraints::parse("tags=a,^").unwrap_err().key(), Some("tags"));
    }

    #[test]
    fn an_empty_value_leaves_the_key_unset_but_counts_as_given() {
        assert_eq!(parse("mem= cores=2"), Constraints { cores: Some(2), ..Constraints::default() });
        assert_eq!(Constraints::parse("mem= mem=4G").unwrap_err().key(), Some("mem"));
    }

    #[test]
    fn the_canonical_form_parses_back_to_the_same() {
        let c = parse(
            "zones=az1,az2 tags=ssd,^gpu mem=0.5G cores=4 arch=arm64 root-disk=8G instance-type=m5.large spaces=db",
        );
        let text = c.to_string();
        assert_eq!(
            text,
            "arch=arm64 cores=4 mem=512M root-disk=8192M tags=ssd,^gpu instance-type=m5.large spaces=db zones=az1,az2"
        );
        assert_eq!(parse(&text), c);
        assert_eq!(Constraints::default().to_string(), "");
    }

    #[test]
    fn objects_are_checked_by_the_same_rules() {
        assert_eq!(parse("cores=2 tags=^x").validate(), Ok(()));
        let c = Constraints { arch: Some("vax".into()), ..Constraints::default() };
        assert_eq!(c.validate().unwrap_err().key(), Some("arch"));
        let c = Constraints { tags: vec!["a b".into()], ..Constraints::default() };
        assert_eq!(c.validate().unwrap_err().key(), Some("tags"));
        let c = Constraints { zones: Some(Vec::new()), ..Constraints::default() };
        assert_eq!(c.validate().unwrap_err().key(), Some("zones"));
        let c = Constraints { instance_type: Some("^m5".into()), ..Constraints::default() };
        assert_eq!(c.validate().unwrap_err().key(), Some("instance-type"));
        let c = Constraints { mem_mb: Some(u64::MAX), ..Constraints::default() };
        assert_eq!(c.validate().unwrap_err().key(), Some("mem"));
        assert_eq!(parse_size("root-disk", "99999999999999999999P").unwrap_err().key(), Some("root-disk"));
    }
}
