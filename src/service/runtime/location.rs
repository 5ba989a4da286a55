//! Where a model's store lives: `default`'s in the data directory's `provisioner.db` (or
//! PostgreSQL's `public` schema), every other model's in [`model_db`] (`models/NAME.db`) or in
//! its own schema ([`schema_name`], reached by [`schema_url`]); [`pg_schema`] creates, opens or
//! drops such a schema.

use std::path::PathBuf;

/// The model every service has from its start; the plain `/v1/...` routes mean it.
pub(crate) const DEFAULT_MODEL: &str = "default";

/// The folder of the data directory that holds the models other than `default` (one SQLite
/// file each, `NAME.db`).
pub(crate) const MODELS_DIR: &str = "models";

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`): a longer one is cut short.
pub(crate) const PG_MAX_IDENTIFIER: usize = 63;

/// The PostgreSQL schema of a model other than `default` (whose tables stay in `public`):
/// `model_` and the name with `-` as `_`. A name of 58 to 63 characters would make that longer
/// than PostgreSQL's 63 bytes; such a name's schema is `modelh_`, its first 39 characters
/// and 16 hex digits of its SHA-256 (63 bytes): unique per name, and never a shorter name's
/// (theirs start `model_`), so the schemas of existing models keep their names.
pub(crate) fn schema_name(model: &str) -> String {
    let plain = format!("model_{}", model.replace('-', "_"));
    if plain.len() <= PG_MAX_IDENTIFIER {
        return plain;
    }
    let hash = crate::service::token::sha256_hex(model);
    let head = &plain["model_".len()..][..PG_MAX_IDENTIFIER - "modelh_".len() - 1 - 16];
    format!("modelh_{head}_{}", &hash[..16])
}

/// `url` with the connection's `search_path` set to `schema`: a `postgres://` URL gets an
/// `options` query parameter, a key=value string an `options` key.
pub(crate) fn schema_url(url: &str, schema: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-c%20search_path%3D{schema}")
    } else {
        format!("{url} options='-c search_path={schema}'")
    }
}

/// The SQLite file of a model other than `default`.
pub(crate) fn model_db(data_dir: &std::path::Path, model: &str) -> PathBuf {
    data_dir.join(MODELS_DIR).join(format!("{model}.db"))
}

/// Why a model's schema could not be created or dropped.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum SchemaError {
    /// PostgreSQL failed.
    #[cfg(feature = "postgres")]
    #[error("the models directory (table provisioner_models): {}", crate::service::pgtls::describe(.0))]
    Postgres(#[source] postgres::Error),
    /// The blocking task was lost, or the URL is not one.
    #[error("the models directory: {0}")]
    Task(String),
}

/// What to do to a model's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum SchemaOp {
    /// Create it if it is not there (an existing model's).
    Open,
    /// Create it for a new model: one left by an earlier model of the same name (a drop that
    /// failed) is renamed aside first, never taken as the new model's history.
    Fresh,
    /// Drop it with its tables (a removed model's).
    Drop,
}

/// Carries out `op` on a model's schema, over a connection of its own.
#[cfg(feature = "postgres")]
pub(crate) async fn pg_schema(url: &str, schema: &str, op: SchemaOp) -> Result<(), SchemaError> {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    actix_rt::task::spawn_blocking(move || {
        let (config, tls) =
            crate::service::store::PgStore::config(&url).map_err(|e| SchemaError::Task(e.to_string()))?;
        let mut client = config.connect(tls).map_err(SchemaError::Postgres)?;
        // The name is a checked model name with `-` as `_`: no quoting issue.
        if op == SchemaOp::Fresh {
            let there = client
                .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
                .map_err(SchemaError::Postgres)?
                .is_some();
            if there {
                // Within PostgreSQL's 63 bytes (a longer name would be cut short, and a second
                // orphan of the same model would then collide with the first).
                let keep = PG_MAX_IDENTIFIER - "_orphaned_".len() - 8;
                let aside = format!(
                    "{}_orphaned_{}",
                    schema.get(..keep).unwrap_or(&schema),
                    crate::service::token::new_secret().get(..8).unwrap_or("x")
                );
                client
                    .batch_execute(&format!("ALTER SCHEMA \"{schema}\" RENAME TO \"{aside}\""))
                    .map_err(SchemaError::Postgres)?;
                tracing::warn!(%schema, %aside, "moved an earlier model's schema aside");
            }
        }
        let sql = match op {
            SchemaOp::Open | SchemaOp::Fresh => format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""),
            SchemaOp::Drop => format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
        };
        client.batch_execute(&sql).map_err(SchemaError::Postgres)
    })
    .await
    .map_err(|e| SchemaError::Task(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_gets_its_own_schema_in_the_url() {
        assert_eq!(schema_name("team-a"), "model_team_a");
        // The longest short form is kept as it always was; longer ones are shortened, unique.
        let n57 = "b".repeat(57);
        assert_eq!(schema_name(&n57), format!("model_{n57}"));
        let (a, b) = (format!("{}a", "x-".repeat(31)), format!("{}b", "x-".repeat(31)));
        assert_eq!(a.len(), 63);
        let (sa, sb) = (schema_name(&a), schema_name(&b));
        assert!(sa.len() == PG_MAX_IDENTIFIER && sb.len() == PG_MAX_IDENTIFIER, "{sa} {sb}");
        assert_ne!(sa, sb);
        assert!(sa.starts_with("modelh_x_x_") && sa.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'), "{sa}");
        assert_eq!(schema_name(&"c".repeat(58)).len(), PG_MAX_IDENTIFIER);
        assert_eq!(schema_url("postgres://u@h/db", "model_a"), "postgres://u@h/db?options=-c%20search_path%3Dmodel_a");
        assert_eq!(
            schema_url("postgres://u@h/db?sslmode=disable", "model_a"),
            "postgres://u@h/db?sslmode=disable&options=-c%20search_path%3Dmodel_a"
        );
        assert_eq!(schema_url("host=h dbname=d", "model_a"), "host=h dbname=d options='-c search_path=model_a'");
        #[cfg(feature = "postgres")]
        let (config, _) = crate::service::store::PgStore::config(&schema_url("postgres://u@h/db", "model_a")).unwrap();
        #[cfg(feature = "postgres")]
        assert!(config.get_options().unwrap().starts_with("-c search_path=model_a"), "{:?}", config.get_options());
    }
}
