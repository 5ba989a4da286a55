//! The audit log's writer: owns the file ([`AuditFile`]) and the refused requests' rate
//! ([`RefusedBook`]) on a thread of its own (file writes block), reached by messages.

use actix::prelude::*;
use tokio::time::Instant;

use std::path::PathBuf;

use super::line::{AuditLine, AuditWriteError};
use super::state::{AuditFile, Decision, RefusedBook, Rotation};

/// The writer of the audit log.
#[derive(Debug)]
pub(crate) struct AuditWriter {
    /// `None` if the file could not be opened on the writer's thread (every write says so).
    file: Option<AuditFile>,
    refused: RefusedBook,
}

impl Actor for AuditWriter {
    type Context = SyncContext<Self>;
}

impl AuditWriter {
    /// Starts the writer on a thread of its own, over the file at `path` (opened there; a
    /// path that cannot be opened was refused before, by [`super::AuditLog::open`]).
    pub(crate) fn start(path: PathBuf, rotation: Rotation) -> Addr<Self> {
        SyncArbiter::start(1, move || {
            let file = AuditFile::open(&path, rotation)
                .inspect_err(|e| tracing::error!(target: "audit", error = %e, "cannot open the audit log"))
                .ok();
            AuditWriter { file, refused: RefusedBook::default() }
        })
    }

    fn file(&mut self) -> Result<&mut AuditFile, AuditWriteError> {
        self.file.as_mut().ok_or(AuditWriteError::Stopped)
    }
}

/// Write this line (its answer once written, or why not: the line is then kept).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), AuditWriteError>")]
pub(crate) struct Record(pub AuditLine);

impl Handler<Record> for AuditWriter {
    type Result = Result<(), AuditWriteError>;
    fn handle(&mut self, m: Record, _ctx: &mut Self::Context) -> Self::Result {
        self.file()?.write(&m.0)
    }
}

/// Whether the file takes lines (those kept are written first).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), AuditWriteError>")]
pub(crate) struct WriterReady;

impl Handler<WriterReady> for AuditWriter {
    type Result = Result<(), AuditWriteError>;
    fn handle(&mut self, _m: WriterReady, _ctx: &mut Self::Context) -> Self::Result {
        self.file()?.ready()
    }
}

/// A request refused for want of a valid token: written at a bounded rate (whether it was).
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub(crate) struct Refused {
    /// Where it came from.
    pub peer: Option<std::net::IpAddr>,
    /// Its line.
    pub line: AuditLine,
    /// When.
    pub now: Instant,
}

impl Handler<Refused> for AuditWriter {
    type Result = bool;
    fn handle(&mut self, m: Refused, _ctx: &mut Self::Context) -> bool {
        match self.refused.refused(m.peer, m.now) {
            Decision::Suppress => false,
            Decision::Write { suppressed } => {
                let mut line = m.line;
                if suppressed > 0 {
                    line.what = Some(format!("and {suppressed} more refused from this peer since its last line"));
                }
                line.trace();
                // A refusal changed nothing: a failure to write it refuses no change by itself
                // (the kept line makes the next change wait, as any).
                if let Ok(file) = self.file() {
                    let _ = file.write(&line);
                }
                true
            }
        }
    }
}
