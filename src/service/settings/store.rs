//! `[store]`: the store's URL, `sqlite` or `postgres://...`, checked, and shown with its
//! password redacted.

use std::str::FromStr;

use clap::Args;
use serde::Deserialize;

use super::parse::optional_from_str;

/// How many threads every model's store runs on, together, unless `[store] threads` says:
/// enough for the disks' and the database's parallelism, few enough that a thousand models
/// cost a handful of threads.
pub const DEFAULT_STORE_THREADS: usize = 8;

/// Where the service keeps the model, its API token's hash, its settings and the simulated
/// cloud (`[store]` in the config file, `--store`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// The store: `sqlite` (the embedded database in the data directory) or a PostgreSQL URL,
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (a build with the `postgres` feature)
    /// [default: sqlite].
    #[arg(id = "store", long = "store", env = "PROVISIONER_STORE", value_name = "sqlite|postgres://...",
          value_parser = StoreUrl::from_str)]
    #[serde(deserialize_with = "optional_from_str")]
    pub url: Option<StoreUrl>,
    /// The threads every model's store runs on, together (1 to 256) [default: 8]. Each store is
    /// pinned to one of them; a model costs no thread of its own.
    #[arg(id = "store-threads", long = "store-threads", env = "PROVISIONER_STORE_THREADS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
}

impl StoreSection {
    /// The store to use.
    pub fn url(&self) -> StoreUrl {
        self.url.clone().unwrap_or_default()
    }

    /// The threads the stores run on.
    pub fn threads(&self) -> usize {
        self.threads.map_or(DEFAULT_STORE_THREADS, usize::from)
    }
}

/// A store, as `--store` names it.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum StoreUrl {
    /// SQLite in the data directory.
    #[default]
    Sqlite,
    /// PostgreSQL at this URL (`postgres://` or `postgresql://`).
    Postgres(String),
}

impl StoreUrl {
    /// The URL with its password masked, for logs and messages.
    pub fn redacted(&self) -> String {
        match self {
            StoreUrl::Sqlite => "sqlite".into(),
            StoreUrl::Postgres(url) => redact_password(url),
        }
    }
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl FromStr for StoreUrl {
    type Err = String;
    /// `sqlite`, or a `postgres://` / `postgresql://` URL with a host (and a numeric port, if
    /// any); with the `postgres` feature, also whatever the PostgreSQL client itself refuses, and
    /// TLS settings that cannot be used (`sslmode`, `sslrootcert`: see `pgtls`).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "sqlite" {
            return Ok(StoreUrl::Sqlite);
        }
        let expected = "expected `sqlite` or postgres://USER@HOST[:PORT]/DATABASE";
        let Some(rest) = s.strip_prefix("postgres://").or_else(|| s.strip_prefix("postgresql://")) else {
            return Err(format!("unknown store {:?}: {expected}", redact_password(s)));
        };
        let shown = redact_password(s);
        if s.chars().any(char::is_whitespace) {
            return Err(format!("{shown:?} has white space in it: {expected}"));
        }
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = match hostport.strip_prefix('[') {
            // [::1]:5432
            Some(v6) => match v6.split_once(']') {
                Some((h, p)) => (h, p.strip_prefix(':')),
                None => return Err(format!("{shown:?} has an unclosed [ in its host: {expected}")),
            },
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            },
        };
        if host.is_empty() {
            return Err(format!("{shown:?} names no host: {expected}"));
        }
        if let Some(p) = port {
            if p.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(format!("{shown:?} has a bad port {p:?}: {expected}"));
            }
        }
        #[cfg(feature = "postgres")]
        // Its TLS settings too: an sslmode it does not know, an sslrootcert that cannot be read.
        if let Err(e) = crate::service::pgtls::parse(s) {
            return Err(format!("{shown:?}: {e}"));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(format!(
            "{shown:?}: this build has no PostgreSQL store: build with `--features postgres`, or use `sqlite`"
        ));
        #[cfg(feature = "postgres")]
        Ok(StoreUrl::Postgres(s.to_owned()))
    }
}
