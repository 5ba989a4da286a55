//! The data directory and its token file: [`prepare_data_dir`] decides whether a directory may
//! be opened as it is (a lost model is refused, `--init` clears the leftovers), and
//! [`ensure_token`] reads or creates the API token (`token`, mode 0600, written atomically).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::service::error::{data_dir_error, data_dir_io, FileOp, ServeError};
use crate::service::store::DB_FILE;

/// The token file's name inside the data directory.
pub(crate) const TOKEN_FILE: &str = "token";

/// The permission bits others than the owner have on `path` (0 where there are no such bits).
fn shared_mode(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o777).filter(|m| m & 0o077 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Reads the API token from `dir/token`, or creates it (32 random bytes, hex; mode 0600). An
/// existing token file that others can read is used, with a warning.
pub(crate) fn ensure_token(dir: &Path) -> Result<String, ServeError> {
    match read_token(dir)? {
        Some(token) => Ok(token),
        None => write_new_token(dir),
    }
}

/// Reads the API token from `dir/token`, if there is one (an empty file is an error).
pub(crate) fn read_token(dir: &Path) -> Result<Option<String>, ServeError> {
    let path = dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => {
            if let Some(mode) = shared_mode(&path) {
                tracing::warn!(
                    "the API token file {} is readable by others (mode {mode:o}): anyone who can read it can drive \
                     the API; make it private with `chmod 600 {}`",
                    path.display(),
                    path.display()
                );
            }
            Ok(Some(t.trim().to_owned()))
        }
        Ok(_) => Err(data_dir_error(dir, format!("{} is empty; delete it to get a new token", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(data_dir_io(dir, FileOp::Read, &path)(e)),
    }
}

/// Writes a new API token to `dir/token` (mode 0600, fsynced) and answers it.
fn write_new_token(dir: &Path) -> Result<String, ServeError> {
    write_token(dir, crate::service::token::new_secret())
}

/// Writes `token` to `dir/token` atomically: whole to `token.tmp` (mode 0600), synced, renamed
/// over `token`, the directory synced; a crash leaves no token file or the whole one.
pub(crate) fn write_token(dir: &Path, token: String) -> Result<String, ServeError> {
    let path = dir.join(TOKEN_FILE);
    let tmp = dir.join(format!("{TOKEN_FILE}.tmp"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(data_dir_io(dir, FileOp::Create, &tmp))?;
    f.write_all(format!("{token}\n").as_bytes()).and_then(|()| f.sync_all()).map_err(data_dir_io(
        dir,
        FileOp::Write,
        &tmp,
    ))?;
    std::fs::rename(&tmp, &path).map_err(data_dir_io(dir, FileOp::Create, &path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(data_dir_io(dir, FileOp::Write, dir))?;
    Ok(token)
}

/// `name`, or `name.1`, `name.2`... : the first that does not exist.
pub(crate) fn aside(path: &Path) -> PathBuf {
    let base = path.with_file_name(format!(
        "{}.orphaned",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let mut candidate = base.clone();
    let mut n = 0;
    while candidate.exists() {
        n += 1;
        candidate = PathBuf::from(format!("{}.{n}", base.display()));
    }
    candidate
}

/// Decides whether the data directory may be opened as it is, before anything is written to
/// it. A new model is created only in a directory with no database, no WAL and no token, or
/// with `init`; a zero-length database, or a WAL or token without their database, mean a model
/// existed here and was lost, so that is refused (its instances would be orphaned). With
/// `init` on such a directory, the leftovers are cleared (a WAL is moved aside, not replayed
/// into the new model). `init` on a directory that holds a database is refused.
/// A new database file is created private (0600; SQLite gives its WAL the same mode), and an
/// existing one that others can read is made private.
pub(crate) fn prepare_data_dir(dir: &Path, init: bool) -> Result<(), ServeError> {
    let db = dir.join(DB_FILE);
    let wal = dir.join(format!("{DB_FILE}-wal"));
    let shm = dir.join(format!("{DB_FILE}-shm"));
    let token = dir.join(TOKEN_FILE);
    let size = match std::fs::metadata(&db) {
        Ok(m) => Some(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(data_dir_io(dir, FileOp::Read, &db)(e)),
    };
    let recover = "restore it from a backup; or, to create a new model (the old model's instances in the cloud \
                   will no longer be managed), start with `serve --init`";
    match size {
        Some(n) if n > 0 && init => {
            return Err(ServeError::InitOverModel { dir: dir.to_owned(), db });
        }
        Some(0) if !init => {
            return Err(data_dir_error(
                dir,
                format!("the database {} is empty (zero length): the model it held is lost; {recover}", db.display()),
            ))
        }
        None if !init && (wal.exists() || token.exists()) => {
            let left: Vec<String> = [&wal, &token]
                .iter()
                .filter(|p| p.exists())
                .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
                .collect();
            return Err(data_dir_error(
                dir,
                format!(
                    "the database {} is missing, but {} from an earlier run {} still there: the model is lost unless \
                     you {recover}",
                    db.display(),
                    left.join(" and "),
                    if left.len() > 1 { "are" } else { "is" }
                ),
            ));
        }
        _ => {}
    }
    if size.is_some_and(|n| n == 0) {
        std::fs::remove_file(&db).map_err(data_dir_io(dir, FileOp::Remove, &db))?;
    }
    if size.is_none_or(|n| n == 0) {
        // A new model: no leftovers of the old one may be replayed into it.
        if wal.exists() {
            let to = aside(&wal);
            std::fs::rename(&wal, &to).map_err(data_dir_io(dir, FileOp::MoveAside, &wal))?;
            tracing::warn!(from = %wal.display(), to = %to.display(), "moved the old model's write-ahead log aside");
        }
        if shm.exists() {
            std::fs::remove_file(&shm).map_err(data_dir_io(dir, FileOp::Remove, &shm))?;
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        opts.open(&db).map_err(data_dir_io(dir, FileOp::Create, &db))?;
        if init {
            tracing::info!(database = %db.display(), "--init: creating a new model");
        }
    } else {
        #[cfg(unix)]
        for f in [&db, &wal, &shm] {
            if let Some(mode) = shared_mode(f) {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).map_err(data_dir_io(
                    dir,
                    FileOp::MakePrivate,
                    f,
                ))?;
                tracing::warn!(file = %f.display(), "the file was readable by others (mode {mode:o}); made it 0600");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_file_operation_keeps_the_io_error_as_its_source() {
        let dir = std::env::temp_dir().join(format!("provisioner-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The token file is a directory: reading it fails, and not because it is missing.
        std::fs::create_dir_all(dir.join(TOKEN_FILE)).unwrap();
        let err = ensure_token(&dir).unwrap_err();
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<std::io::Error>());
        let io = source.expect("the io::Error is the source");
        assert!(matches!(err, ServeError::DataDirIo { op: FileOp::Read, .. }), "{err:?}");
        let token = dir.join(TOKEN_FILE);
        assert_eq!(
            err.to_string(),
            format!("cannot use data directory {}: cannot read {}: {io}", dir.display(), token.display())
        );
        assert_eq!(err.exit_code(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
