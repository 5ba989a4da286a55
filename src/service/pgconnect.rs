//! Connecting to PostgreSQL within a deadline, start-up included (feature `postgres`).
//!
//! The `postgres` client's `connect_timeout` bounds the socket's connection only: a peer that
//! accepts the connection and then says nothing (a pooler or proxy whose server is cut off, a
//! half-open path) keeps the start-up handshake waiting for ever, and with it the thread of the
//! store, the lease or the listener that asked (the partition test of `tests/serve/ha.rs`
//! found a healed ex-leader that never contended again). A [`Connector`] runs each attempt on
//! a thread of its own and waits at most the deadline for it; an attempt that overruns is kept
//! (at most one per connector, so a long partition costs one thread, not one per retry), and
//! its client is taken by the next call if it arrives after all.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use postgres::{Client, Config};

use crate::service::pgtls::PgTls;
use thiserror::Error;

/// Why no connection was made.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The server refused, or the socket could not be connected (or TLS failed: the cause is
    /// said, see [`describe`](crate::service::pgtls::describe)).
    #[error("{}", crate::service::pgtls::describe(.0))]
    Postgres(#[from] postgres::Error),
    /// The connection was made but its start-up did not finish in time.
    #[error("the server did not finish the connection's start-up within {0:?} (an attempt is still waiting)")]
    TimedOut(Duration),
    /// The connecting thread could not be started, or died.
    #[error("cannot run a connection attempt: {0}")]
    Thread(String),
}

/// Makes connections to one server, each attempt bounded by a deadline.
pub(crate) struct Connector {
    config: Config,
    /// The store URL's TLS settings.
    tls: PgTls,
    /// An attempt that overran its deadline: its answer, whenever it comes.
    pending: Option<Receiver<Result<Client, postgres::Error>>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").field("pending", &self.pending.is_some()).finish_non_exhaustive()
    }
}

/// Logs the server's notices (`NOTICE: relation "..." already exists, skipping`, ...) at debug:
/// remarks on statements that did what they were asked, not news for the operator (the
/// client's default logs them at info, and a replica's loops would repeat them for ever).
pub(crate) fn quiet_notices(config: &mut Config) -> &mut Config {
    config.notice_callback(|n| {
        tracing::debug!(severity = n.severity(), code = n.code().code(), "PostgreSQL says: {}", n.message())
    })
}

impl Connector {
    /// A connector for `config`, over TLS as `tls` says (its server notices logged at debug:
    /// [`quiet_notices`]).
    pub(crate) fn new(mut config: Config, tls: PgTls) -> Self {
        quiet_notices(&mut config);
        Self { config, tls, pending: None }
    }

    /// [`Connector::new`] from a `(configuration, TLS settings)` pair.
    pub(crate) fn new_with((config, tls): (Config, PgTls)) -> Self {
        Self::new(config, tls)
    }

    /// A connection, or why not within `deadline` (the attempt that overran goes on, and the
    /// next call waits for it rather than starting another).
    pub(crate) fn connect(&mut self, deadline: Duration) -> Result<Client, ConnectError> {
        let answer = match self.pending.take() {
            Some(rx) => rx,
            None => {
                let (tx, rx) = mpsc::channel();
                let config = self.config.clone();
                let tls = self.tls.clone();
                std::thread::Builder::new()
                    .name("pg-connect".into())
                    .spawn(move || {
                        let _ = tx.send(config.connect(tls));
                    })
                    .map_err(|e| ConnectError::Thread(e.to_string()))?;
                rx
            }
        };
        match answer.recv_timeout(deadline) {
            Ok(result) => Ok(result?),
            Err(RecvTimeoutError::Timeout) => {
                self.pending = Some(answer);
                Err(ConnectError::TimedOut(deadline))
            }
            Err(RecvTimeoutError::Disconnected) => Err(ConnectError::Thread("the connecting thread died".into())),
        }
    }
}

/// A peer on loopback that accepts one connection and then says nothing: a URL to it, and the
/// thread that holds the connection it accepted (joined and dropped: the peer goes away).
#[cfg(test)]
pub(crate) fn silent_peer() -> (String, std::thread::JoinHandle<std::io::Result<std::net::TcpStream>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    (format!("postgres://p@127.0.0.1:{port}/db"), held)
}

/// A URL to a loopback port nothing listens on.
#[cfg(test)]
pub(crate) fn refusing_peer() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("postgres://p@127.0.0.1:{port}/db")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that accepts and then says nothing: the attempt times out instead of hanging,
    /// and the next call waits for the same attempt (no second thread).
    #[test]
    fn a_silent_server_times_out_and_the_attempt_is_reused() {
        let (url, held) = silent_peer();
        let config: Config = url.parse().unwrap();
        let mut c = Connector::new(config, PgTls::disabled());
        let e = c.connect(Duration::from_millis(300)).err().expect("no server answered");
        assert!(matches!(e, ConnectError::TimedOut(_)), "{e:?}");
        assert!(c.pending.is_some(), "the attempt is kept");
        let e = c.connect(Duration::from_millis(100)).err().expect("no server answered");
        assert!(matches!(e, ConnectError::TimedOut(_)), "{e:?}");
        // The peer goes away: the kept attempt answers with the failure, and the slot is free.
        drop(held.join().unwrap().unwrap());
        let e = c.connect(Duration::from_secs(10)).err().expect("the peer went away");
        assert!(matches!(e, ConnectError::Postgres(_)), "{e:?}");
        assert!(c.pending.is_none());
    }

    /// Nothing listening: refused at once, not timed out.
    #[test]
    fn a_refused_connection_is_a_postgres_error() {
        let config: Config = refusing_peer().parse().unwrap();
        let e = Connector::new(config, PgTls::disabled()).connect(Duration::from_secs(10)).err().expect("refused");
        assert!(matches!(e, ConnectError::Postgres(_)), "{e:?}");
    }
}
