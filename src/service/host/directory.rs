//! The models directory, plain: which models the service hosts (name, uuid, cloud, life), the
//! rule for their names, and what adding, destroying and removing one may do. No actix, no
//! I/O: [`super::persist`] keeps it on disk (SQLite deployments) or in PostgreSQL, and
//! [`super::ModelHost`] runs each model's provisioners.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub(crate) use crate::service::runtime::DEFAULT_MODEL;

/// The longest model name (Juju's rule: 63 characters, a DNS label).
pub(crate) const MAX_NAME_LEN: usize = 63;

/// Why a directory operation was refused. The API answers [`ModelsError::status`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum ModelsError {
    /// The name breaks Juju's rule (400).
    #[error(
        "invalid model name {name:?}: {why} (a model name is 1 to 63 lowercase letters, digits and hyphens, \
         starting with a letter or digit and not ending with a hyphen)"
    )]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A model of that name exists (409).
    #[error("model {0:?} already exists")]
    Exists(String),
    /// No model of that name (404).
    #[error("model {0:?} not found: `provisioner model list` shows the models")]
    Unknown(String),
    /// `default` cannot be added again once destroyed (409).
    #[error(
        "the model \"default\" was destroyed and cannot be added again: its database (provisioner.db) holds the \
         service's API tokens; choose another name"
    )]
    DefaultReserved,
    /// `default` is destroyed only with force (409).
    #[error("the model \"default\" is destroyed only with --force (the plain /v1 routes and every client command without -m use it)")]
    DefaultNeedsForce,
    /// A cloud setting that does not fit the model's broker, or is malformed (400).
    #[error("{0}")]
    Cloud(String),
}

impl ModelsError {
    /// The HTTP status the API answers for it.
    pub(crate) fn status(&self) -> u16 {
        match self {
            ModelsError::InvalidName { .. } | ModelsError::Cloud(_) => 400,
            ModelsError::Exists(_) | ModelsError::DefaultNeedsForce | ModelsError::DefaultReserved => 409,
            ModelsError::Unknown(_) => 404,
        }
    }
}

/// Checks a model name against Juju's rule: 1 to 63 characters, lowercase ASCII letters, digits
/// and hyphens, not starting or ending with a hyphen.
pub(crate) fn check_name(name: &str) -> Result<(), ModelsError> {
    let bad = |why| Err(ModelsError::InvalidName { name: name.to_owned(), why });
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("it is longer than 63 characters");
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        return if c.is_ascii_uppercase() {
            bad("it has an uppercase letter")
        } else {
            bad("it has a character other than a-z, 0-9 and -")
        };
    }
    if name.starts_with('-') {
        return bad("it starts with a hyphen");
    }
    if name.ends_with('-') {
        return bad("it ends with a hyphen");
    }
    Ok(())
}

/// A model's life in the directory: alive, or dying (its destruction under way; it is removed
/// from the directory once its instances are gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ModelLife {
    /// Running.
    #[default]
    Alive,
    /// Being destroyed.
    Dying,
}

impl ModelLife {
    /// As the API spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ModelLife::Alive => "alive",
            ModelLife::Dying => "dying",
        }
    }
}

/// The cloud a model uses: the service's (`serve`'s flags) where a field is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct CloudSettings {
    /// `sim` or `ec2` (`None`: the service's `--broker`).
    pub broker: Option<String>,
    /// The simulated cloud's zones (sim).
    pub zones: Option<Vec<String>>,
    /// The simulated account whose request limits the model shares with the other models on
    /// it (sim; `None`: `default`).
    pub account: Option<String>,
    /// EC2's region (ec2).
    pub region: Option<String>,
    /// EC2's endpoint (ec2).
    pub endpoint: Option<String>,
    /// EC2's image id (ec2).
    pub image: Option<String>,
    /// LXD's settings (lxd): each one left out is the service's `--lxd-...`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lxd: Option<crate::service::settings::LxdSettings>,
}

impl CloudSettings {
    /// Checks the settings for `broker` (the model's, resolved): a setting of the other cloud
    /// is refused, naming it; zones must be non-empty names; `broker` must be `sim` or `ec2`.
    pub(crate) fn check(&self, broker: &str) -> Result<(), ModelsError> {
        if !["sim", "ec2", "lxd"].contains(&broker) {
            return Err(ModelsError::Cloud(format!("broker must be sim, ec2 or lxd, got {broker:?}")));
        }
        let lxd = self.lxd.clone().unwrap_or_default().named();
        let given = |v: &Option<String>| v.is_some();
        let settings: [(&str, Vec<(&str, bool)>); 3] = [
            (
                "ec2",
                [("region", &self.region), ("endpoint", &self.endpoint), ("image", &self.image)]
                    .map(|(n, v)| (n, given(v)))
                    .to_vec(),
            ),
            ("sim", vec![("account", given(&self.account))]),
            ("lxd", lxd.iter().map(|(n, v)| (*n, v.is_some())).collect()),
        ];
        for (other, named) in settings.iter().filter(|(owner, _)| *owner != broker) {
            if let Some((name, _)) = named.iter().find(|(_, set)| *set) {
                return Err(ModelsError::Cloud(format!(
                    "--{name} is a setting of the {other} broker, and this model uses {broker}"
                )));
            }
        }
        if broker != "sim" && self.zones.is_some() {
            return Err(ModelsError::Cloud(format!(
                "--zones is a setting of the sim broker ({} lists its own zones)",
                if broker == "ec2" { "EC2" } else { "LXD" }
            )));
        }
        if let Some((name, _)) = lxd.iter().find(|(_, v)| v.as_deref().is_some_and(|v| v.trim().is_empty())) {
            return Err(ModelsError::Cloud(format!("--{name} must not be empty")));
        }
        if let Some(zones) = &self.zones {
            if zones.is_empty() || zones.iter().any(|z| z.trim().is_empty() || z.contains(char::is_whitespace)) {
                return Err(ModelsError::Cloud(format!(
                    "--zones must be zone names separated by commas, got {zones:?}"
                )));
            }
        }
        for (name, value) in [("account", &self.account), ("region", &self.region), ("image", &self.image)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(ModelsError::Cloud(format!("--{name} must not be empty")));
            }
        }
        Ok(())
    }
}

/// One model as the directory knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelEntry {
    /// Its name (unique; [`check_name`]).
    pub name: String,
    /// Its uuid, once its store has drawn one.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Its cloud.
    #[serde(default)]
    pub cloud: CloudSettings,
    /// Alive or dying.
    #[serde(default)]
    pub life: ModelLife,
}

impl ModelEntry {
    /// A new, alive model.
    pub(crate) fn new(name: &str, cloud: CloudSettings) -> Self {
        Self { name: name.to_owned(), uuid: None, cloud, life: ModelLife::Alive }
    }
}

/// The models a service hosts, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Directory {
    /// By name.
    pub models: BTreeMap<String, ModelEntry>,
}

impl Directory {
    /// A directory with the `default` model alone (a new service, or one from before models).
    pub(crate) fn with_default() -> Self {
        let mut d = Self::default();
        d.models.insert(DEFAULT_MODEL.to_owned(), ModelEntry::new(DEFAULT_MODEL, CloudSettings::default()));
        d
    }

    /// The model named `name`.
    pub(crate) fn get(&self, name: &str) -> Result<&ModelEntry, ModelsError> {
        self.models.get(name).ok_or_else(|| ModelsError::Unknown(name.to_owned()))
    }

    /// Adds a new model: its name checked, its cloud settings checked for `broker` (the
    /// model's, resolved against the service's), refused if the name is taken. Nothing
    /// changes on a refusal.
    pub(crate) fn add(&mut self, entry: ModelEntry, broker: &str) -> Result<(), ModelsError> {
        check_name(&entry.name)?;
        entry.cloud.check(broker)?;
        if self.models.contains_key(&entry.name) {
            return Err(ModelsError::Exists(entry.name));
        }
        if entry.name == DEFAULT_MODEL {
            return Err(ModelsError::DefaultReserved);
        }
        self.models.insert(entry.name.clone(), entry);
        Ok(())
    }

    /// Records the uuid its store drew.
    pub(crate) fn set_uuid(&mut self, name: &str, uuid: &str) -> Result<(), ModelsError> {
        let e = self.models.get_mut(name).ok_or_else(|| ModelsError::Unknown(name.to_owned()))?;
        e.uuid = Some(uuid.to_owned());
        Ok(())
    }

    /// Starts a model's destruction: `default` only with `force`. Answers whether it was
    /// alive (a dying model's destruction is already under way).
    pub(crate) fn destroy(&mut self, name: &str, force: bool) -> Result<bool, ModelsError> {
        if name == DEFAULT_MODEL && !force && self.models.contains_key(name) {
            return Err(ModelsError::DefaultNeedsForce);
        }
        let e = self.models.get_mut(name).ok_or_else(|| ModelsError::Unknown(name.to_owned()))?;
        let was_alive = e.life == ModelLife::Alive;
        e.life = ModelLife::Dying;
        Ok(was_alive)
    }

    /// Removes a model (its destruction done). Answers whether it was there.
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        self.models.remove(name).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_juju_rule() {
        for good in ["default", "a", "team-1", "0abc", &"x".repeat(63)] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        let why = |n: &str| match check_name(n) {
            Err(ModelsError::InvalidName { why, .. }) => why,
            other => panic!("{n:?}: {other:?}"),
        };
        assert_eq!(why(""), "it is empty");
        assert_eq!(why(&"x".repeat(64)), "it is longer than 63 characters");
        assert_eq!(why("Team"), "it has an uppercase letter");
        assert_eq!(why("a_b"), "it has a character other than a-z, 0-9 and -");
        assert_eq!(why("a.b"), "it has a character other than a-z, 0-9 and -");
        assert_eq!(why("-a"), "it starts with a hyphen");
        assert_eq!(why("a-"), "it ends with a hyphen");
        let e = check_name("Bad").unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("\"Bad\""), "{e}");
    }

    #[test]
    fn adding_refuses_duplicates_and_bad_input_and_changes_nothing() {
        let mut d = Directory::with_default();
        d.add(ModelEntry::new("a", CloudSettings::default()), "sim").unwrap();
        let before = d.clone();
        assert_eq!(d.add(ModelEntry::new("a", CloudSettings::default()), "sim"), Err(ModelsError::Exists("a".into())));
        assert_eq!(d.add(ModelEntry::new("default", CloudSettings::default()), "sim").unwrap_err().status(), 409);
        assert_eq!(d.add(ModelEntry::new("B", CloudSettings::default()), "sim").unwrap_err().status(), 400);
        let region = CloudSettings { region: Some("us-east-1".into()), ..CloudSettings::default() };
        let e = d.add(ModelEntry::new("c", region), "sim").unwrap_err();
        assert_eq!(e.to_string(), "--region is a setting of the ec2 broker, and this model uses sim");
        let account = CloudSettings { account: Some("x".into()), ..CloudSettings::default() };
        assert_eq!(d.add(ModelEntry::new("c", account), "ec2").unwrap_err().status(), 400);
        let zones = CloudSettings { zones: Some(vec![]), ..CloudSettings::default() };
        assert_eq!(d.add(ModelEntry::new("c", zones), "sim").unwrap_err().status(), 400);
        assert_eq!(d.add(ModelEntry::new("c", CloudSettings::default()), "gce").unwrap_err().status(), 400);
        assert_eq!(d, before);
        assert_eq!(d.models.keys().collect::<Vec<_>>(), ["a", "default"]);
    }

    #[test]
    fn destroying_default_needs_force_and_unknown_models_are_named() {
        let mut d = Directory::with_default();
        d.add(ModelEntry::new("a", CloudSettings::default()), "sim").unwrap();
        assert_eq!(d.destroy("default", false), Err(ModelsError::DefaultNeedsForce));
        assert_eq!(d.get("default").unwrap().life, ModelLife::Alive);
        assert_eq!(d.destroy("nope", true), Err(ModelsError::Unknown("nope".into())));
        assert_eq!(
            d.get("nope").unwrap_err().to_string(),
            "model \"nope\" not found: `provisioner model list` shows the models"
        );
        assert_eq!(d.destroy("a", false), Ok(true));
        assert_eq!(d.destroy("a", false), Ok(false), "a second destroy finds it dying");
        assert_eq!(d.get("a").unwrap().life, ModelLife::Dying);
        assert_eq!(d.destroy("default", true), Ok(true));
        assert!(d.remove("a"));
        assert!(!d.remove("a"));
        assert!(d.remove("default"));
        let again = d.add(ModelEntry::new("default", CloudSettings::default()), "sim");
        assert_eq!(again, Err(ModelsError::DefaultReserved), "its database holds the tokens");
    }

    #[test]
    fn the_directory_reads_back_what_it_wrote() {
        let mut d = Directory::with_default();
        let cloud =
            CloudSettings { zones: Some(vec!["z1".into()]), account: Some("acct".into()), ..Default::default() };
        d.add(ModelEntry::new("team-a", cloud), "sim").unwrap();
        d.set_uuid("team-a", "u-1").unwrap();
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Directory>(&text).unwrap(), d);
        assert!(serde_json::from_str::<Directory>(r#"{"models":{},"extra":1}"#).is_err());
    }
}
