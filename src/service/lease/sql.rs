//! The replica's lease connection (feature `postgres`): every model's lease steps carried out
//! on ONE connection and ONE thread per replica, however many models it hosts (a thread and a
//! connection per model made a replica of 100 models hold 100 of each, and their renewals
//! contend for the database's flushes). The thread takes the steps queued since its last
//! round together, in order, and commits the renewals among them together
//! ([`PgLeases::renew_all`]: one transaction, one flush); acquisitions and releases commit one
//! by one. A hung call delays every model's lease of this replica, but never an actor: each
//! lease's deadline is kept by its actor's timer, not by the call.
//!
//! [`LeaseSql`] is the handle (cheap to clone); each request names its lease ([`LeaseKey`])
//! and where its answer goes.

use std::sync::mpsc;
use std::time::Duration;

use actix::prelude::*;

use super::messages::Answered;
use super::pg::{LeaseKey, LeaseSqlError, PgLeases};
use super::state::{Answer, Step};
use crate::service::pgconnect::Connector;

/// At most this many queued steps are taken in one round (a bound on one transaction).
pub(crate) const MAX_ROUND: usize = 256;

/// The answer to a step not carried out because the connection failed earlier in its round.
const CONNECTION_FAILED: &str = "the lease connection failed";

/// One lease step and where its answer goes.
struct Request {
    key: LeaseKey,
    step: Step,
    answer: Recipient<Answered>,
}

/// The handle of a replica's lease thread. The thread ends when every handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct LeaseSql {
    requests: mpsc::Sender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("key", &self.key).field("step", &self.step).finish()
    }
}

impl LeaseSql {
    /// Starts the thread: connections to `url` as replica `holder`, every statement bounded by
    /// `timeout`, leases taken for `lease`.
    pub(crate) fn start(url: String, holder: String, timeout: Duration, lease: Duration) -> std::io::Result<Self> {
        let (requests, rx) = mpsc::channel();
        std::thread::Builder::new().name("lease".into()).spawn(move || run(url, holder, timeout, lease, rx))?;
        Ok(Self { requests })
    }

    /// Queues `step` for `key`; its [`Answered`] goes to `answer`. `false`: the thread is gone.
    pub(crate) fn send(&self, key: &LeaseKey, step: Step, answer: Recipient<Answered>) -> bool {
        self.requests.send(Request { key: key.clone(), step, answer }).is_ok()
    }
}

/// The thread: rounds of the queued steps until every handle is gone.
fn run(url: String, holder: String, timeout: Duration, lease: Duration, rx: mpsc::Receiver<Request>) {
    let mut conn: Option<PgLeases> = None;
    // One connector for the thread's life: a start-up that overruns is waited for by the next
    // attempt instead of hanging this thread (see `pgconnect`).
    let mut connector: Option<Connector> = None;
    while let Ok(first) = rx.recv() {
        let mut round = vec![first];
        while round.len() < MAX_ROUND {
            match rx.try_recv() {
                Ok(r) => round.push(r),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            let connected = (|| -> Result<PgLeases, LeaseSqlError> {
                let c = match connector.as_mut() {
                    Some(c) => c,
                    None => connector.insert(Connector::new_with(super::pg::lease_config(&url, timeout)?)),
                };
                PgLeases::connect_with(c, timeout, &holder)
            })();
            match connected {
                Ok(l) => conn = Some(l),
                Err(e) => {
                    let why = e.to_string();
                    for r in round {
                        r.answer.do_send(Answered(Answer::Failed(why.clone())));
                    }
                    continue;
                }
            }
        }
        let Some(leases) = conn.as_mut() else { continue };
        if !carry_out(leases, round, lease) {
            conn = None;
        }
    }
}

/// Carries out one round in order, consecutive renewals together. `false`: the connection
/// failed (every step not answered yet is answered as failed; the next round reconnects).
fn carry_out(leases: &mut PgLeases, round: Vec<Request>, lease: Duration) -> bool {
    let mut renewals: Vec<(Request, i64)> = Vec::new();
    let mut healthy = true;
    for r in round {
        if !healthy {
            r.answer.do_send(Answered(Answer::Failed(CONNECTION_FAILED.into())));
            continue;
        }
        if let Step::Renew { epoch } = r.step {
            renewals.push((r, epoch));
            continue;
        }
        healthy = renew(leases, &mut renewals, lease);
        if !healthy {
            r.answer.do_send(Answered(Answer::Failed(CONNECTION_FAILED.into())));
            continue;
        }
        let answer = match r.step {
            Step::Acquire => leases.acquire(&r.key, lease),
            Step::Release { epoch } => leases.release(&r.key, epoch),
            Step::Renew { .. } | Step::Wait => Ok(Answer::Failed("nothing asked".into())),
        };
        let answer = answer.unwrap_or_else(|e| {
            // A statement refused fails that step only; a failed connection is made anew.
            healthy = e.refused_by_server();
            Answer::Failed(e.to_string())
        });
        r.answer.do_send(Answered(answer));
    }
    healthy && renew(leases, &mut renewals, lease)
}

/// Commits the renewals gathered (if any) and answers each. `false`: the transaction failed.
fn renew(leases: &mut PgLeases, renewals: &mut Vec<(Request, i64)>, lease: Duration) -> bool {
    if renewals.is_empty() {
        return true;
    }
    let batch: Vec<(LeaseKey, i64)> = renewals.iter().map(|(r, epoch)| (r.key.clone(), *epoch)).collect();
    match leases.renew_all(&batch, lease) {
        Ok(answers) => {
            for ((r, _), a) in renewals.drain(..).zip(answers) {
                r.answer.do_send(Answered(a.unwrap_or_else(|e| Answer::Failed(e.to_string()))));
            }
            true
        }
        Err(e) => {
            let why = e.to_string();
            for (r, _) in renewals.drain(..) {
                r.answer.do_send(Answered(Answer::Failed(why.clone())));
            }
            false
        }
    }
}
