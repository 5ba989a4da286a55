//! An audit line and the audit log's errors: what one change request writes (bounded fields,
//! one JSON line), the note a handler adds to it, and why the log cannot be opened or written.

use std::path::PathBuf;

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

/// A line could not be written (it is kept, and written first once the file takes lines).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub(crate) enum AuditWriteError {
    /// The file refused it (a full disk, a read-only file system): the system's words.
    #[error("the audit log {path} cannot be written: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        message: String,
    },
    /// The writer's thread is gone.
    #[error("the audit log's writer has stopped")]
    Stopped,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct AuditLine {
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

/// The longest path, summary or result kept in a line, in characters.
pub(crate) const MAX_FIELD: usize = 200;

/// `text` cut at `max` characters (`...` marks the cut).
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

impl AuditLine {
    /// The line with each field a request could make long cut at [`MAX_FIELD`] characters.
    pub(crate) fn bounded(mut self) -> Self {
        self.path = cut(&self.path, MAX_FIELD);
        self.method = cut(&self.method, 16);
        self.what = self.what.map(|w| cut(&w, MAX_FIELD));
        self.result = cut(&self.result, MAX_FIELD);
        self.token = self.token.map(|t| cut(&t, 64));
        self
    }

    /// The line as written: one JSON object and a newline.
    pub(crate) fn to_json_line(&self) -> String {
        let mut text = serde_json::to_string(self).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Emits the line as a tracing event with target `audit` (each value quoted and escaped,
    /// so that no request's text forges a log line).
    pub(crate) fn trace(&self) {
        tracing::info!(
            target: "audit",
            token = self.token.as_deref().unwrap_or("-"),
            method = ?self.method,
            path = ?self.path,
            status = self.status,
            what = ?self.what.as_deref().unwrap_or(""),
            result = ?self.result,
            "change request"
        );
    }
}

/// A handler's short summary of what its request did, left in the request's extensions for
/// the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuditNote(pub String);

/// The longest summary kept, in characters (a request's values can be long: a body may be
/// 256 KiB).
pub(crate) const MAX_NOTE: usize = 200;

impl AuditNote {
    /// A summary, cut at [`MAX_NOTE`] characters (`...` marks the cut).
    pub(crate) fn new(what: impl Into<String>) -> Self {
        Self(cut(&what.into(), MAX_NOTE))
    }
}

/// Whether a request is a change the audit log records: a `/v1` request whose method is not
/// `GET` or `HEAD`.
pub(crate) fn is_change(method: &str, path: &str) -> bool {
    (path == "/v1" || path.starts_with("/v1/")) && !matches!(method, "GET" | "HEAD")
}

/// The wall clock now, RFC 3339 in UTC with milliseconds. The audit log and token times record
/// when something happened in the world, which no tokio clock knows; the service runs on real
/// time only (never on a paused clock or in the simulator), so the ban on the wall clock in
/// library code (there for determinism) does not apply here.
#[allow(clippy::disallowed_methods)]
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Shortens a list of names for a summary: the first few, then how many more.
pub(crate) fn list_summary(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut out = names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        out.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    out
}
