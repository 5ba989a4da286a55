//! The audit log: one JSON line per change request (every `/v1` request whose method is not
//! `GET` or `HEAD`, refused ones included), written to a file (`DATA_DIR/audit.log` by default;
//! `serve --audit-log FILE`, `[audit] file`, `PROVISIONER_AUDIT_LOG`) and emitted as a tracing
//! event with target `audit` (so `RUST_LOG=audit=info` and a log shipper see it too).
//!
//! A line is [`AuditLine`]: `time` (RFC 3339, UTC, the wall clock), `token` (the token's id:
//! `admin` for the data directory's token, `tok-N` for a created one, `null` when the request
//! carried no valid token; never the token itself), `method`, `path`, `status`, `what` (a
//! short summary a handler left: ids, counts, the token created), and `result` (`ok`, or the
//! error sentence the client got). Nothing a request carries is copied in but its method and
//! path, so no secret reaches the log.
//!
//! Durability: the file is opened in append mode and each line is written with one `write`
//! call before the answer leaves (no buffer in the process), so a crash of the service (even
//! `kill -9`) loses no line of an answered request; a power cut may lose what the operating
//! system had not yet written out (no fsync per line: it would cost a disk flush per request).
//! Lines from the API's worker threads do not interleave: `O_APPEND` writes of one buffer are
//! atomic with respect to each other on a local file system.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

/// The audit log cannot be opened.
#[derive(Debug, Error)]
#[error("cannot open the audit log {path}: {source}")]
pub struct AuditError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AuditLine {
    /// When the answer was made (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// The token's id (`admin`, `tok-N`), `null` without a valid token.
    pub token: Option<String>,
    /// The request's method.
    pub method: String,
    /// The request's path (no query string).
    pub path: String,
    /// The answer's status code.
    pub status: u16,
    /// What the request did or asked for, in short (`null` when the handler did not get that
    /// far).
    pub what: Option<String>,
    /// `ok`, or the error sentence the client got.
    pub result: String,
}

/// A handler's short summary of what its request did, left in the request's extensions for
/// the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditNote(pub String);

/// The longest summary kept, in characters (a request's values can be long: a body may be
/// 256 KiB).
pub const MAX_NOTE: usize = 200;

impl AuditNote {
    /// A summary, cut at [`MAX_NOTE`] characters (`...` marks the cut).
    pub fn new(what: impl Into<String>) -> Self {
        let what = what.into();
        match what.char_indices().nth(MAX_NOTE) {
            Some((cut, _)) => Self(format!("{}...", &what[..cut])),
            None => Self(what),
        }
    }
}

/// Whether a request is a change the audit log records: a `/v1` request whose method is not
/// `GET` or `HEAD`.
pub fn is_change(method: &str, path: &str) -> bool {
    (path == "/v1" || path.starts_with("/v1/")) && !matches!(method, "GET" | "HEAD")
}

/// The wall clock now, RFC 3339 in UTC with milliseconds. The audit log and token times record
/// when something happened in the world, which no tokio clock knows; the service runs on real
/// time only (never on a paused clock or in the simulator), so the ban on the wall clock in
/// library code (there for determinism) does not apply here.
#[allow(clippy::disallowed_methods)]
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Shortens a list of names for a summary: the first few, then how many more.
pub fn list_summary(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut out = names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        out.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    out
}

/// Where the audit lines go: the file, and tracing.
#[derive(Debug)]
pub struct AuditLog {
    file: std::fs::File,
    path: PathBuf,
}

impl AuditLog {
    /// Opens (creating it, mode 0600 where there are modes) the audit log at `path` for
    /// appending.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let mut opts = std::fs::OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let file = opts.open(path).map_err(|source| AuditError { path: path.to_owned(), source })?;
        Ok(Self { file, path: path.to_owned() })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one line (one `write` call, appended) and emits it as a tracing event with
    /// target `audit`. A line that cannot be written is reported as an error event (the
    /// request it records has been answered already).
    pub fn record(&self, line: &AuditLine) {
        tracing::info!(
            target: "audit",
            token = line.token.as_deref().unwrap_or("-"),
            method = %line.method,
            path = %line.path,
            status = line.status,
            what = line.what.as_deref().unwrap_or(""),
            result = %line.result,
            "change request"
        );
        let mut text = serde_json::to_string(line).unwrap_or_default();
        text.push('\n');
        if let Err(e) = (&self.file).write_all(text.as_bytes()) {
            tracing::error!(target: "audit", error = %e, file = %self.path.display(), "cannot write the audit log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_non_get_v1_requests() {
        assert!(is_change("POST", "/v1/machines"));
        assert!(is_change("DELETE", "/v1/tokens/tok-1"));
        assert!(is_change("PUT", "/v1"));
        assert!(!is_change("GET", "/v1/machines"));
        assert!(!is_change("HEAD", "/v1/status"));
        assert!(!is_change("POST", "/metrics"));
        assert!(!is_change("POST", "/v1x"));
    }

    #[test]
    fn lines_append_one_json_object_each() {
        let dir = std::env::temp_dir().join(format!("provisioner-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let _ = std::fs::remove_file(&path);
        let line = AuditLine {
            time: now_rfc3339(),
            token: Some("tok-1".into()),
            method: "POST".into(),
            path: "/v1/machines".into(),
            status: 201,
            what: Some("added 2 machines: 0, 1".into()),
            result: "ok".into(),
        };
        AuditLog::open(&path).unwrap().record(&line);
        // Opened again (a restart), it appends.
        AuditLog::open(&path).unwrap().record(&AuditLine { status: 403, ..line.clone() });
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<AuditLine> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], line);
        assert_eq!(lines[1].status, 403);
        assert!(line.time.ends_with('Z') && line.time.len() == 24, "{}", line.time);
        let e = AuditLog::open(&dir.join("missing/audit.log")).unwrap_err();
        assert!(e.to_string().contains("missing/audit.log"), "{e}");
    }

    #[test]
    fn long_notes_are_cut() {
        assert_eq!(AuditNote::new("set workers to \"4\"").0, "set workers to \"4\"");
        let long = AuditNote::new("é".repeat(MAX_NOTE + 50)).0;
        assert_eq!(long.chars().count(), MAX_NOTE + 3);
        assert!(long.ends_with("..."));
    }

    #[test]
    fn long_lists_are_shortened() {
        let names: Vec<String> = (0..12).map(|i| i.to_string()).collect();
        assert_eq!(list_summary(&names[..2]), "0, 1");
        assert_eq!(list_summary(&names), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more");
    }
}
