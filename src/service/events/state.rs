//! The plain core of the event streams' limits (no actor here; [`crate::service::events`] is
//! the shell): which streams are open and whose token holds them ([`StreamBook`]: the caps per
//! token and in total, the streams of a revoked token to end), and when a client that takes no
//! frame is idle ([`IdleWatch`]).
//!
//! A stream counts against the caps from its admission until its connection lets it go (the
//! client disconnected, or its stream ended and the server finished the response).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use actix_rt::time::Instant;
use thiserror::Error;

use crate::service::settings::EventsSettings;
use crate::service::token::ADMIN_ID;

/// Why a new stream is refused (429): a cap is reached.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum StreamRefused {
    /// The token holds its most streams.
    #[error(
        "the API token {token} already holds {cap} event streams open on this replica, the most one token may: \
         close one, or raise the cap with max_streams_per_token in the [events] section of the config file"
    )]
    PerToken {
        /// The token's id.
        token: String,
        /// `max_streams_per_token`.
        cap: usize,
    },
    /// The replica holds its most streams, all tokens together.
    #[error(
        "this replica already holds {cap} event streams open, the most it allows: close one, or raise the cap \
         with max_streams in the [events] section of the config file"
    )]
    Total {
        /// `max_streams`.
        cap: usize,
    },
}

/// One open stream: the token that opened it, and whether it has been told to end.
#[derive(Debug, Clone)]
struct Entry {
    token: String,
    ended: bool,
}

/// The open streams of a replica (every model's), by id.
#[derive(Debug)]
pub(crate) struct StreamBook {
    limits: EventsSettings,
    open: BTreeMap<u64, Entry>,
    next: u64,
}

impl StreamBook {
    /// No stream open yet.
    pub(crate) fn new(limits: EventsSettings) -> Self {
        Self { limits, open: BTreeMap::new(), next: 0 }
    }

    /// Admits a stream for `token` (its id): its id, or why not (nothing counted then).
    pub(crate) fn admit(&mut self, token: &str) -> Result<u64, StreamRefused> {
        if self.open.len() >= self.limits.max_streams {
            return Err(StreamRefused::Total { cap: self.limits.max_streams });
        }
        if self.open.values().filter(|e| e.token == token).count() >= self.limits.max_streams_per_token {
            return Err(StreamRefused::PerToken { token: token.to_owned(), cap: self.limits.max_streams_per_token });
        }
        self.next += 1;
        self.open.insert(self.next, Entry { token: token.to_owned(), ended: false });
        Ok(self.next)
    }

    /// The stream is gone (again: nothing).
    pub(crate) fn release(&mut self, id: u64) {
        self.open.remove(&id);
    }

    /// How many streams are open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// The created tokens (never `admin`, which cannot be revoked) holding streams not yet told
    /// to end: those whose revocation to look for.
    pub(crate) fn tokens_to_check(&self) -> BTreeSet<String> {
        self.open.values().filter(|e| !e.ended && e.token != ADMIN_ID).map(|e| e.token.clone()).collect()
    }

    /// The streams to end because their token is in `revoked` (each once: marked ended; they
    /// still count until released).
    pub(crate) fn end_revoked(&mut self, revoked: &BTreeSet<String>) -> Vec<(u64, String)> {
        self.open
            .iter_mut()
            .filter(|(_, e)| !e.ended && revoked.contains(&e.token))
            .map(|(id, e)| {
                e.ended = true;
                (*id, e.token.clone())
            })
            .collect()
    }
}

/// Whether a client takes its frames: idle once frames have waited for it and none was taken
/// for the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdleWatch {
    taken: u64,
    since: Instant,
}

impl IdleWatch {
    /// A client that has taken nothing, as of `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self { taken: 0, since: now }
    }

    /// Whether the client is idle at `now`: `taken` is how many frames it has taken so far,
    /// `waiting` how many wait for it. A frame taken (or none waiting) starts the clock again.
    pub(crate) fn idle(&mut self, taken: u64, waiting: usize, now: Instant, limit: Duration) -> bool {
        if taken != self.taken || waiting == 0 {
            self.taken = taken;
            self.since = now;
            return false;
        }
        now.duration_since(self.since) >= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_token: usize, total: usize) -> EventsSettings {
        EventsSettings { max_streams_per_token: per_token, max_streams: total, ..EventsSettings::default() }
    }

    #[test]
    fn a_token_gets_at_most_its_cap_and_the_replica_at_most_its_total() {
        let mut book = StreamBook::new(limits(2, 3));
        let a1 = book.admit("tok-1").unwrap();
        book.admit("tok-1").unwrap();
        let refused = book.admit("tok-1").unwrap_err();
        assert_eq!(refused, StreamRefused::PerToken { token: "tok-1".into(), cap: 2 });
        assert!(refused.to_string().contains("max_streams_per_token") && refused.to_string().contains("tok-1"));
        book.admit("admin").unwrap();
        let refused = book.admit("tok-2").unwrap_err();
        assert_eq!(refused, StreamRefused::Total { cap: 3 });
        assert!(refused.to_string().contains("max_streams in the [events] section"), "{refused}");
        assert_eq!(book.len(), 3, "a refusal counts nothing");
        // One let go makes room (twice: no harm).
        book.release(a1);
        book.release(a1);
        book.admit("tok-2").unwrap();
        assert!(book.admit("tok-1").is_err(), "full again");
    }

    #[test]
    fn a_revoked_tokens_streams_are_ended_once_and_counted_until_released() {
        let mut book = StreamBook::new(limits(8, 8));
        let a = book.admit("tok-1").unwrap();
        let b = book.admit("tok-2").unwrap();
        let c = book.admit("tok-1").unwrap();
        book.admit("admin").unwrap();
        assert_eq!(book.tokens_to_check(), BTreeSet::from(["tok-1".to_owned(), "tok-2".to_owned()]));
        let revoked = BTreeSet::from(["tok-1".to_owned()]);
        assert_eq!(book.end_revoked(&revoked), [(a, "tok-1".to_owned()), (c, "tok-1".to_owned())]);
        assert!(book.end_revoked(&revoked).is_empty(), "each once");
        assert_eq!(book.tokens_to_check(), BTreeSet::from(["tok-2".to_owned()]));
        assert_eq!(book.len(), 4);
        book.release(a);
        book.release(c);
        book.release(b);
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn a_client_is_idle_when_frames_wait_and_none_is_taken_for_the_limit() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(60);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = IdleWatch::new(t0);
        // Nothing waiting: never idle, however long.
        assert!(!w.idle(0, 0, at(100), limit));
        // Frames wait from 100 s on and none is taken.
        assert!(!w.idle(0, 3, at(159), limit));
        assert!(w.idle(0, 3, at(160), limit));
        // One taken: the clock starts again.
        assert!(!w.idle(1, 5, at(161), limit));
        assert!(!w.idle(1, 5, at(220), limit));
        assert!(w.idle(1, 5, at(221), limit));
    }
}
