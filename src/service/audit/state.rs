//! The audit log's plain cores: the rotating file with the lines it could not write yet
//! ([`AuditFile`]), and the rate at which refused requests are written ([`RefusedBook`]).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use file_rotate::compression::Compression;
use file_rotate::suffix::AppendCount;
use file_rotate::{ContentLimit, FileRotate};
use tokio::time::Instant;

use super::line::{AuditError, AuditLine, AuditWriteError};

/// How the file rotates: past `max_bytes` the file becomes `FILE.1` (the older ones move up
/// one) and a new one begins; `files` old ones are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The size past which the file rotates (whole lines: a line never straddles two files).
    pub max_bytes: u64,
    /// How many rotated files are kept besides the current one.
    pub files: usize,
}

impl Default for Rotation {
    fn default() -> Self {
        Self { max_bytes: 100 * 1024 * 1024, files: 5 }
    }
}

/// The room kept allocated past the audit log's end: far more than the lines of the changes
/// that can be in flight at once (a line is at most about a kilobyte).
pub(crate) const RESERVE: u64 = 256 * 1024;

/// The most lines kept in memory while the file takes none (beyond it the lines of refused
/// requests are dropped and counted; no change is made meanwhile, so none is a change's).
pub(crate) const MAX_PENDING: usize = 1_000;

/// The audit log's file: rotated by size, each line one `write` call, and the lines it could
/// not write kept (in order) until it can.
pub(crate) struct AuditFile {
    file: FileRotate<AppendCount>,
    path: PathBuf,
    pending: VecDeque<String>,
    /// Lines dropped because too many were pending.
    dropped: u64,
    /// The last write's failure, while the file takes no lines.
    failing: Option<String>,
}

impl std::fmt::Debug for AuditFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditFile").field("path", &self.path).field("pending", &self.pending.len()).finish()
    }
}

impl AuditFile {
    /// Opens (creating it, mode 0600) the file at `path` for appending.
    pub(crate) fn open(path: &Path, rotation: Rotation) -> Result<Self, AuditError> {
        let mut opts = std::fs::OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        // Opened here first: a path that cannot be opened is an error now, with its reason
        // (the rotating file would only report it at the first write).
        drop(opts.open(path).map_err(|source| AuditError { path: path.to_owned(), source })?);
        let limit = usize::try_from(rotation.max_bytes.max(1)).unwrap_or(usize::MAX);
        let file = FileRotate::new(
            path,
            AppendCount::new(rotation.files),
            ContentLimit::BytesSurpassed(limit),
            Compression::None,
            Some(opts),
        );
        Ok(Self { file, path: path.to_owned(), pending: VecDeque::new(), dropped: 0, failing: None })
    }

    /// Writes the pending lines, then `line`: `Err` (the line kept) if the file refused.
    pub(crate) fn write(&mut self, line: &AuditLine) -> Result<(), AuditWriteError> {
        let text = line.to_json_line();
        if self.pending.len() >= MAX_PENDING {
            self.dropped += 1;
        } else {
            self.pending.push_back(text);
        }
        self.flush()
    }

    /// Writes the pending lines, then makes sure the file has room for the next ones: `Ok`
    /// once none is left and the room is there. What a change waits for before it goes ahead.
    pub(crate) fn ready(&mut self) -> Result<(), AuditWriteError> {
        self.flush()?;
        self.reserve().map_err(|e| {
            let message = format!("no room for the next lines: {e}");
            self.failing = Some(message.clone());
            AuditWriteError::Write { path: self.path.clone(), message }
        })
    }

    /// Allocates [`RESERVE`] bytes past the file's end (its size unchanged: `fallocate` with
    /// `KEEP_SIZE`), so that the lines written next need no new space: a disk that fills up
    /// refuses the reservation, before a change, rather than the change's line, after it. A
    /// file system without `fallocate` (or a file that is not a regular one) reserves nothing.
    fn reserve(&self) -> std::io::Result<()> {
        let file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        if !file.metadata()?.is_file() {
            return Ok(());
        }
        let end = file.metadata()?.len();
        match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::KEEP_SIZE, end, RESERVE) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the pending lines: `Ok` once none is left.
    pub(crate) fn flush(&mut self) -> Result<(), AuditWriteError> {
        while let Some(text) = self.pending.front() {
            if let Err(e) = self.file.write_all(text.as_bytes()) {
                let message = e.to_string();
                self.failing = Some(message.clone());
                return Err(AuditWriteError::Write { path: self.path.clone(), message });
            }
            self.pending.pop_front();
        }
        if self.failing.take().is_some() {
            tracing::warn!(target: "audit", file = %self.path.display(), dropped = self.dropped,
                           "the audit log takes lines again: changes are accepted");
        }
        Ok(())
    }

    /// Lines kept, not yet written.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// What to do with a refused request's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Write it; `suppressed` lines of the same peer were not written since its last one.
    Write {
        /// Lines of this peer not written since its last written one.
        suppressed: u64,
    },
    /// Count it, do not write it.
    Suppress,
}

/// One peer's (or everyone's) token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Bucket {
    fn full(at: Instant, burst: f64) -> Self {
        Self { tokens: burst, at, suppressed: 0 }
    }

    fn take(&mut self, now: Instant, burst: f64, per_second: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The rate at which the lines of requests refused for want of a valid token are written: a
/// token bucket per peer address (`PER_PEER_BURST` at once, then `PER_PEER_RATE` a second) and
/// one for all peers together (`TOTAL_BURST`, `TOTAL_RATE`), so that no caller without a token,
/// nor many of them, can fill the disk through the audit log. The peers remembered are bounded
/// (`MAX_PEERS`: the one seen longest ago is forgotten first).
#[derive(Debug, Default)]
pub(crate) struct RefusedBook {
    peers: HashMap<Option<IpAddr>, Bucket>,
    total: Option<Bucket>,
    /// Lines not written, all peers together (the metric's count).
    suppressed_total: u64,
}

const PER_PEER_BURST: f64 = 5.0;
const PER_PEER_RATE: f64 = 1.0;
const TOTAL_BURST: f64 = 50.0;
const TOTAL_RATE: f64 = 10.0;
const MAX_PEERS: usize = 4_096;

impl RefusedBook {
    /// A refused request from `peer` at `now`: write its line or count it.
    pub(crate) fn refused(&mut self, peer: Option<IpAddr>, now: Instant) -> Decision {
        if !self.peers.contains_key(&peer) && self.peers.len() >= MAX_PEERS {
            let oldest = self.peers.iter().min_by_key(|(_, b)| b.at).map(|(p, _)| *p);
            if let Some(p) = oldest {
                self.peers.remove(&p);
            }
        }
        let bucket = self.peers.entry(peer).or_insert_with(|| Bucket::full(now, PER_PEER_BURST));
        let total = self.total.get_or_insert_with(|| Bucket::full(now, TOTAL_BURST));
        // The peer's token is taken only if the total has one too (both or neither).
        let peer_ok = bucket.take(now, PER_PEER_BURST, PER_PEER_RATE);
        if peer_ok && total.take(now, TOTAL_BURST, TOTAL_RATE) {
            Decision::Write { suppressed: std::mem::take(&mut bucket.suppressed) }
        } else {
            if peer_ok {
                bucket.tokens += 1.0;
            }
            bucket.suppressed += 1;
            self.suppressed_total += 1;
            Decision::Suppress
        }
    }

    /// Lines not written so far, all peers together.
    #[cfg(test)]
    pub(crate) fn suppressed_total(&self) -> u64 {
        self.suppressed_total
    }

    /// The peers remembered.
    #[cfg(test)]
    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// How long a quiet peer's bucket takes to fill again.
    fn refill() -> Duration {
        Duration::from_secs_f64(PER_PEER_BURST / PER_PEER_RATE)
    }

    fn line(status: u16) -> AuditLine {
        AuditLine {
            time: "2026-12-06T00:00:00.000Z".into(),
            token: None,
            method: "POST".into(),
            path: "/v1/machines".into(),
            status,
            what: None,
            result: "ok".into(),
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("provisioner-audit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn lines_append_one_json_object_each_and_a_bad_path_is_named() {
        let d = dir("append");
        let path = d.join("audit.log");
        AuditFile::open(&path, Rotation::default()).unwrap().write(&line(201)).unwrap();
        // Opened again (a restart), it appends.
        AuditFile::open(&path, Rotation::default()).unwrap().write(&line(403)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<AuditLine> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines, vec![line(201), line(403)]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let e = AuditFile::open(&d.join("missing/audit.log"), Rotation::default()).unwrap_err();
        assert!(e.to_string().contains("missing/audit.log"), "{e}");
    }

    #[test]
    fn the_file_rotates_by_size_in_whole_lines_and_keeps_so_many() {
        let d = dir("rotate");
        let path = d.join("audit.log");
        let mut f = AuditFile::open(&path, Rotation { max_bytes: 1_000, files: 2 }).unwrap();
        let one = line(201).to_json_line().len();
        for _ in 0..200 {
            f.write(&line(201)).unwrap();
        }
        let mut names: Vec<String> =
            std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["audit.log", "audit.log.1", "audit.log.2"]);
        for name in &names {
            let text = std::fs::read_to_string(d.join(name)).unwrap();
            assert!(text.len() <= 1_000 + 2 * one, "{name}: {} bytes", text.len());
            for l in text.lines() {
                serde_json::from_str::<AuditLine>(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}"));
            }
        }
    }

    /// A file that refuses lines (here `/dev/full`: every write fails with "no space left")
    /// keeps them, says why, and writes nothing else until it can.
    #[test]
    fn a_line_the_file_refuses_is_kept_and_reported() {
        let mut f = AuditFile::open(Path::new("/dev/full"), Rotation::default()).unwrap();
        let e = f.write(&line(201)).unwrap_err();
        assert!(e.to_string().contains("/dev/full") && e.to_string().contains("space"), "{e}");
        assert_eq!(f.pending(), 1);
        assert!(f.flush().is_err());
        for _ in 0..MAX_PENDING + 10 {
            let _ = f.write(&line(401));
        }
        assert_eq!(f.pending(), MAX_PENDING, "bounded");
    }

    #[test]
    fn refused_requests_are_written_at_a_bounded_rate_per_peer_and_in_total() {
        let t0 = Instant::now();
        let mut b = RefusedBook::default();
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let decisions: Vec<Decision> = (0..20).map(|_| b.refused(Some(a), t0)).collect();
        assert_eq!(decisions.iter().filter(|d| matches!(d, Decision::Write { .. })).count(), 5, "the burst");
        assert_eq!(b.suppressed_total(), 15);
        // A second later, one more, saying how many it stands for.
        assert_eq!(b.refused(Some(a), t0 + Duration::from_secs(1)), Decision::Write { suppressed: 15 });
        assert_eq!(b.refused(Some(a), t0 + Duration::from_secs(1)), Decision::Suppress);
        // Many peers at once: the total's burst, then its rate.
        let t1 = t0 + refill() * 2;
        let mut written = 0;
        for i in 0..1_000u32 {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x7f00_0000 + i));
            written += usize::from(matches!(b.refused(Some(peer), t1), Decision::Write { .. }));
        }
        assert_eq!(written, TOTAL_BURST as usize);
        let mut later = 0;
        for i in 0..1_000u32 {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x7f00_1000 + i));
            later += usize::from(matches!(b.refused(Some(peer), t1 + Duration::from_secs(1)), Decision::Write { .. }));
        }
        assert_eq!(later, TOTAL_RATE as usize);
        // The peers remembered stay bounded.
        for i in 0..(MAX_PEERS as u32 + 100) {
            b.refused(Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))), t1);
        }
        assert_eq!(b.peers(), MAX_PEERS);
    }
}
