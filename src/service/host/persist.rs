//! Where the models directory is kept, so that a restarted service runs every model again:
//! `models.json` in the data directory with SQLite (written whole to a temporary file, synced,
//! then renamed over the old one), or one row of table `provisioner_models` in PostgreSQL's
//! `public` schema (read and written in one transaction, the row locked), beside the
//! `default` model's tables. No store code is involved: the directory is the service's, each
//! model's store is its own.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::directory::{Directory, ModelsError};

/// The directory's file name in the data directory (SQLite deployments).
pub(crate) const DIRECTORY_FILE: &str = "models.json";

/// Why the directory could not be read or written.
#[derive(Debug, Error)]
pub(crate) enum PersistError {
    /// The operation itself was refused (nothing was written).
    #[error("{0}")]
    Refused(#[from] ModelsError),
    /// A file operation failed.
    #[error("the models directory {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file or row does not parse.
    #[error("the models directory {what} is damaged: {source}")]
    Damaged {
        /// The file or table.
        what: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// PostgreSQL failed.
    #[cfg(feature = "postgres")]
    #[error("the models directory (table provisioner_models): {}", crate::service::pgtls::describe(.0))]
    Postgres(#[source] postgres::Error),
    /// The blocking task was lost.
    #[error("the models directory: {0}")]
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Task(String),
}

/// Where the directory lives.
#[derive(Debug, Clone)]
pub(crate) enum DirectoryStore {
    /// `models.json` in this data directory.
    File(PathBuf),
    /// The `provisioner_models` table of this database (its `public` schema), and whether
    /// this process has made sure the table is there (its DDL runs once, not at every read
    /// of a replica following the directory).
    #[cfg(feature = "postgres")]
    Postgres(String, std::sync::Arc<std::sync::atomic::AtomicBool>),
}

impl DirectoryStore {
    /// The directory in the database at `url` (its table made at the first use).
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(url: String) -> Self {
        DirectoryStore::Postgres(url, std::sync::Arc::default())
    }

    /// Reads the directory (a service from before models, or a new one, has `default` alone).
    pub(crate) async fn load(&self) -> Result<Directory, PersistError> {
        self.update(|_| Ok(())).await.map(|((), d)| d)
    }

    /// Applies `change` to the directory and keeps the result, all or nothing: a refusal
    /// writes nothing. Answers what `change` answered and the directory as written.
    pub(crate) async fn update<T: Send + 'static>(
        &self,
        change: impl FnOnce(&mut Directory) -> Result<T, ModelsError> + Send + 'static,
    ) -> Result<(T, Directory), PersistError> {
        match self {
            DirectoryStore::File(dir) => {
                let path = dir.join(DIRECTORY_FILE);
                let mut d = read_file(&path)?;
                let before = d.clone();
                let out = change(&mut d)?;
                if d != before || !path.exists() {
                    write_file(&path, &d)?;
                }
                Ok((out, d))
            }
            #[cfg(feature = "postgres")]
            DirectoryStore::Postgres(url, made) => {
                let (url, made) = (url.clone(), made.clone());
                actix_rt::task::spawn_blocking(move || pg_update(&url, &made, change))
                    .await
                    .map_err(|e| PersistError::Task(e.to_string()))?
            }
        }
    }
}

fn read_file(path: &Path) -> Result<Directory, PersistError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|source| PersistError::Damaged { what: path.display().to_string(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Directory::with_default()),
        Err(source) => Err(PersistError::Io { path: path.to_owned(), source }),
    }
}

/// Writes the whole directory to `path.tmp` (0600), syncs it, renames it over `path`, and
/// syncs the directory: a crash leaves the old file or the new one, never half of one.
fn write_file(path: &Path, d: &Directory) -> Result<(), PersistError> {
    use std::io::Write;
    let io = |p: &Path| {
        let p = p.to_owned();
        move |source| PersistError::Io { path: p, source }
    };
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(d)
        .map_err(|source| PersistError::Damaged { what: path.display().to_string(), source })?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(io(&tmp))?;
    f.write_all(&text).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io(parent))?;
    }
    Ok(())
}

#[cfg(feature = "postgres")]
const PG_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS public.provisioner_models \
     (id INT PRIMARY KEY CHECK (id = 1), directory TEXT NOT NULL)";

#[cfg(feature = "postgres")]
fn pg_update<T>(
    url: &str,
    made: &std::sync::atomic::AtomicBool,
    change: impl FnOnce(&mut Directory) -> Result<T, ModelsError>,
) -> Result<(T, Directory), PersistError> {
    use std::sync::atomic::Ordering;
    let (config, tls) = crate::service::store::PgStore::config(url).map_err(|e| PersistError::Task(e.to_string()))?;
    let mut client = config.connect(tls).map_err(PersistError::Postgres)?;
    let mut tx = client.transaction().map_err(PersistError::Postgres)?;
    // The table, once: two replicas creating it at once are serialised by the migrations'
    // advisory lock. Found gone later (a database restored without it), it is made again at
    // the next call.
    if !made.load(Ordering::SeqCst) {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&0x7072_6f77_i64]).map_err(PersistError::Postgres)?;
        tx.batch_execute(PG_TABLE_SQL).map_err(PersistError::Postgres)?;
    }
    let row =
        tx.query_opt("SELECT directory FROM public.provisioner_models WHERE id = 1 FOR UPDATE", &[]).map_err(|e| {
            if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) {
                made.store(false, Ordering::SeqCst);
            }
            PersistError::Postgres(e)
        })?;
    let mut d = match row {
        Some(r) => {
            let text: String = r.try_get(0).map_err(PersistError::Postgres)?;
            serde_json::from_str(&text)
                .map_err(|source| PersistError::Damaged { what: "table provisioner_models".into(), source })?
        }
        None => Directory::with_default(),
    };
    let out = change(&mut d)?;
    let text = serde_json::to_string(&d)
        .map_err(|source| PersistError::Damaged { what: "table provisioner_models".into(), source })?;
    tx.execute(
        "INSERT INTO public.provisioner_models (id, directory) VALUES (1, $1) \
         ON CONFLICT (id) DO UPDATE SET directory = EXCLUDED.directory",
        &[&text],
    )
    .map_err(PersistError::Postgres)?;
    tx.commit().map_err(PersistError::Postgres)?;
    made.store(true, Ordering::SeqCst);
    Ok((out, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::host::directory::{CloudSettings, ModelEntry};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("provisioner-models-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[actix_rt::test]
    async fn the_file_survives_a_reload_and_a_refusal_writes_nothing() {
        let dir = temp_dir("file");
        let store = DirectoryStore::File(dir.clone());
        assert_eq!(store.load().await.unwrap(), Directory::with_default());
        assert!(dir.join(DIRECTORY_FILE).exists(), "a new service writes its directory");
        store.update(|d| d.add(ModelEntry::new("a", CloudSettings::default()), "sim")).await.unwrap();
        let written = std::fs::read(dir.join(DIRECTORY_FILE)).unwrap();
        let refused = store.update(|d| d.add(ModelEntry::new("a", CloudSettings::default()), "sim")).await;
        assert!(matches!(refused, Err(PersistError::Refused(ModelsError::Exists(_)))), "{refused:?}");
        assert_eq!(std::fs::read(dir.join(DIRECTORY_FILE)).unwrap(), written);
        let reloaded = DirectoryStore::File(dir.clone()).load().await.unwrap();
        assert_eq!(reloaded.models.keys().collect::<Vec<_>>(), ["a", "default"]);
        std::fs::write(dir.join(DIRECTORY_FILE), b"{not json").unwrap();
        assert!(matches!(store.load().await, Err(PersistError::Damaged { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
