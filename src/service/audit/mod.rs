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
//! Bounded (issue 30): a line is at most a few hundred bytes whatever the request
//! ([`AuditLine::bounded`]: the path, the summary and the result cut at [`MAX_FIELD`]
//! characters, `...` marking the cut; JSON escapes every control character); the requests
//! refused for want of a valid token (401) are written at a bounded rate per peer and in total
//! (`state::RefusedBook`; the others are counted in `provisioner_audit_lines_suppressed`, and
//! the next line of that peer says how many it stands for); and the file rotates by size
//! (`[audit] max_size`, default 100 MiB, and `[audit] files` kept, default 5: `audit.log.1` is
//! the newest old one), with the `file-rotate` crate.
//!
//! No unaudited change: before a change request reaches its handler the writer is asked whether
//! it can write ([`AuditLog::ready`]): the lines it kept are written, and room for the next
//! lines is allocated past the file's end ([`RESERVE`], `fallocate` keeping the size), so that a
//! disk that fills up refuses the room before a change rather than the change's line after it.
//! If either fails (a full disk, a file gone read-only), the change is refused with a 503 and
//! nothing is changed, while reads keep working. A line that could not be written anyway is
//! kept in memory and written first once the file takes lines again.
//!
//! Durability: each line is written with one `write` call before the answer leaves (no buffer
//! in the process), so a crash of the service (even `kill -9`) loses no line of an answered
//! request; a power cut may lose what the operating system had not yet written out (no fsync
//! per line: it would cost a disk flush per request). One writer owns the file
//! ([`AuditWriter`], on a thread of its own: file writes block), reached by messages.

mod actor;
mod line;
mod state;

pub(crate) use actor::{AuditWriter, Record, Refused, WriterReady};
pub(crate) use line::{is_change, list_summary, now_rfc3339, AuditError, AuditLine, AuditNote, AuditWriteError};
pub(crate) use state::{AuditFile, Rotation};

use std::path::Path;

/// Where the audit lines go: the writer of the file (and tracing). Cheap to share.
#[derive(Debug)]
pub(crate) struct AuditLog {
    writer: actix::Addr<AuditWriter>,
}

impl AuditLog {
    /// Opens (creating it, mode 0600) the audit log at `path` for appending, rotated as
    /// `rotation` says, and starts its writer's thread. Must be called inside an actix system.
    pub(crate) fn open(path: &Path, rotation: Rotation) -> Result<Self, AuditError> {
        // Opened here first, so that a path that cannot be opened is an error now.
        drop(AuditFile::open(path, rotation)?);
        let writer = AuditWriter::start(path.to_owned(), rotation);
        Ok(Self { writer })
    }

    /// Whether a change may go ahead: the writer takes lines (any kept from a failure are
    /// written first). A change is refused while it does not.
    pub(crate) async fn ready(&self) -> Result<(), AuditWriteError> {
        self.writer.send(WriterReady).await.map_err(|_| AuditWriteError::Stopped)?
    }

    /// Writes one line (bounded, one `write` call, appended) and emits it as a tracing event
    /// with target `audit`. A line that cannot be written is kept and reported.
    pub(crate) async fn record(&self, line: AuditLine) -> Result<(), AuditWriteError> {
        let line = line.bounded();
        line.trace();
        let written = self.writer.send(Record(line)).await.map_err(|_| AuditWriteError::Stopped)?;
        if let Err(e) = &written {
            tracing::error!(target: "audit", error = %e, "cannot write the audit log: changes are refused until it can");
        }
        written
    }

    /// A request refused for want of a valid token, from `peer`: written if its peer (and all
    /// peers together) are within their rate, else counted. Whether it was written.
    pub(crate) async fn refused(
        &self,
        peer: Option<std::net::IpAddr>,
        line: AuditLine,
        now: actix_rt::time::Instant,
    ) -> bool {
        let line = line.bounded();
        self.writer.send(Refused { peer, line, now }).await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::line::{MAX_FIELD, MAX_NOTE};
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
    fn a_line_is_bounded_whatever_the_request() {
        let line = AuditLine {
            time: now_rfc3339(),
            token: None,
            method: "POST".into(),
            path: format!("/v1/{}", "A".repeat(60_000)),
            status: 401,
            what: Some(format!("removed 9\n2030-01-01T00:00:00Z  INFO audit: {}", "x".repeat(1000))),
            result: format!("unknown machine {}", "é".repeat(5000)),
        }
        .bounded();
        let text = line.to_json_line();
        assert!(text.len() < 1200, "{} bytes", text.len());
        assert!(line.path.ends_with("...") && line.path.chars().count() == MAX_FIELD + 3);
        assert_eq!(text.matches('\n').count(), 1, "one line, its newlines escaped: {text}");
        let back: AuditLine = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(back, line);
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
