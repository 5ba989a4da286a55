//! The spread of the models' leaders over the replicas (issue 18, feature `postgres`): the thin
//! shell around [`share::plan`](crate::service::lease::share::plan). Every lease retry it
//! heartbeats this replica's membership and reads the live replicas and each running model's
//! lease ([`Members::view`], on a blocking thread), plans, and sends each model's lease actor
//! a [`SpreadOrder`]: try to acquire (the free models the plan gives this replica, and those it
//! holds), or not, or hand over (a controlled hand-over: the provisioner is stopped as at a
//! fail-over, then the lease released keeping its epoch, so another replica takes it at once
//! at `epoch + 1`). The leases alone arbitrate: the plan only decides who asks, and fencing is
//! the lease's, unchanged.
//!
//! At a clean stop, [`Spread::leave`] ends the rounds and deletes this replica's heartbeat,
//! so that the others stop counting it before its leases are released.
//!
//! The spread is an actor: each round and the leave are atomic responses (the actor answers
//! nothing else meanwhile), so that a leave waits for the round in flight and no heartbeat
//! follows it; the next round is asked for one retry after the last one ends.

use std::collections::{BTreeMap, BTreeSet};

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, AtomicResponse, Context, Handler, Message, WrapFuture};

use crate::service::lease::actor::SpreadOrder;
use crate::service::lease::members::{Members, ModelLease};
use crate::service::lease::share::{plan, ShareView};
use crate::service::lease::LeaseTimings;

use crate::service::runtime::{schema_name, DEFAULT_MODEL};

use super::ModelHost;

/// The membership connection, closed on a thread of its own when dropped.
struct OffRuntime(Option<Members>);

impl Drop for OffRuntime {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            if std::thread::Builder::new().name("spread-close".into()).spawn(move || drop(m)).is_err() {
                tracing::warn!("spread: cannot close the membership connection on a thread of its own");
            }
        }
    }
}

/// The running spread: [`Spread::leave`] at a clean stop.
#[derive(Debug, Clone)]
pub(crate) struct Spread {
    addr: Addr<SpreadActor>,
}

impl Spread {
    /// Runs the first round (so that a replica starting alone asks for its models' leases
    /// before its API answers, as it did before the spread), then the others every retry.
    pub(crate) async fn start(host: ModelHost, url: String, replica: String, timings: LeaseTimings) -> Self {
        let addr = SpreadActor { host, url, replica, timings, members: OffRuntime(None), stopped: false }.start();
        if addr.send(Round).await.is_err() {
            tracing::error!("spread: the first round was lost");
        }
        Self { addr }
    }

    /// A clean stop: no more rounds, and this replica's heartbeat deleted (bounded by one
    /// retry: a database that does not answer lets it expire on its own).
    pub(crate) async fn leave(&self) {
        if self.addr.send(Leave).await.is_err() {
            tracing::warn!("spread: cannot delete the heartbeat; it expires on its own");
        }
    }
}

/// The spread's actor: the membership connection, and whether the replica has left.
struct SpreadActor {
    host: ModelHost,
    url: String,
    replica: String,
    timings: LeaseTimings,
    /// Dropped off the runtime's thread (the sync client's close blocks, which a runtime's
    /// thread must not do); `None` after a failure: the next round reconnects.
    members: OffRuntime,
    stopped: bool,
}

impl std::fmt::Debug for SpreadActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpreadActor").field("replica", &self.replica).finish_non_exhaustive()
    }
}

impl Actor for SpreadActor {
    type Context = Context<Self>;
}

/// One round: heartbeat, read, plan, orders; the next one asked for a retry later.
#[derive(Message)]
#[rtype(result = "()")]
struct Round;

/// The clean stop.
#[derive(Message)]
#[rtype(result = "()")]
struct Leave;

impl Handler<Round> for SpreadActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Round, _: &mut Context<Self>) -> Self::Result {
        if self.stopped {
            return AtomicResponse::new(Box::pin(actix::fut::ready(())));
        }
        let (host, url, replica, timings) = (self.host.clone(), self.url.clone(), self.replica.clone(), self.timings);
        let mut members = self.members.0.take();
        let read = async move {
            let models = host.leases().await;
            let keys: Vec<ModelLease> = models
                .iter()
                .map(|(name, uuid, _)| ModelLease {
                    name: name.clone(),
                    schema: if name == DEFAULT_MODEL { "public".to_owned() } else { schema_name(name) },
                    uuid: uuid.clone(),
                })
                .collect();
            let read = actix_rt::task::spawn_blocking(move || {
                let result = (|| {
                    let m = match members.as_mut() {
                        Some(m) => m,
                        None => members.insert(Members::connect(&url, timings.retry(), &replica)?),
                    };
                    let (before, began) = (m.statements(), tokio::time::Instant::now());
                    let view = m.view(timings.lease(), &keys);
                    tracing::debug!(
                        models = keys.len(),
                        statements = m.statements() - before,
                        ms = began.elapsed().as_millis() as u64,
                        "spread: read the replicas and the leases"
                    );
                    view
                })();
                if result.is_err() {
                    members = None;
                }
                (members, result)
            })
            .await;
            (models, read)
        };
        AtomicResponse::new(Box::pin(read.into_actor(self).map(|(models, read), act, ctx| {
            act.members.0 = match read {
                Ok((m, Ok(view))) => {
                    act.order(&models, view);
                    m
                }
                Ok((m, Err(e))) => {
                    tracing::warn!(error = %e, "spread: cannot read the replicas and leases; trying again");
                    m
                }
                Err(e) => {
                    tracing::error!(error = %e, "spread: the round's thread was lost");
                    None
                }
            };
            ctx.notify_later(Round, act.timings.retry());
        })))
    }
}

impl Handler<Leave> for SpreadActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Leave, _: &mut Context<Self>) -> Self::Result {
        self.stopped = true;
        let (url, replica, timeout) = (self.url.clone(), self.replica.clone(), self.timings.retry());
        let replica_shown = replica.clone();
        let left = async move {
            let left = actix_rt::task::spawn_blocking(move || Members::connect(&url, timeout, &replica)?.leave()).await;
            match left {
                Ok(Ok(())) => tracing::info!(replica = %replica_shown, "spread: left the replicas"),
                Ok(Err(e)) => tracing::warn!(error = %e, "spread: cannot delete the heartbeat; it expires on its own"),
                Err(e) => tracing::warn!(error = %e, "spread: cannot delete the heartbeat; it expires on its own"),
            }
        };
        AtomicResponse::new(Box::pin(left.into_actor(self)))
    }
}

impl SpreadActor {
    /// Plans from the round's view and sends each model's lease actor its order.
    fn order(
        &self,
        models: &[(String, String, actix::Addr<crate::service::lease::actor::LeaseActor>)],
        view: crate::service::lease::members::MembersView,
    ) {
        let live: BTreeSet<String> = view.live;
        let seen: BTreeMap<String, Option<(String, i64)>> = view
            .leases
            .into_iter()
            .map(|(name, row)| (name, row.filter(|r| r.live).map(|r| (r.holder, r.epoch))))
            .collect();
        // The plan counts a model held only by a live replica: a dead one's lease is free to it
        // (the lease still decides when it can be taken).
        let holders: BTreeMap<String, Option<String>> = seen
            .iter()
            .map(|(name, h)| (name.clone(), h.as_ref().map(|(r, _)| r.clone()).filter(|r| live.contains(r))))
            .collect();
        let p = plan(ShareView { me: &self.replica, live: &live, holders: &holders });
        if !p.acquire.is_empty() || !p.release.is_empty() {
            tracing::info!(replica = %self.replica, share = p.share, live = live.len(), models = holders.len(),
                           acquire = ?p.acquire, release = ?p.release, "spread: planned");
        }
        for (name, _, lease) in models {
            let mine = holders.get(name).is_some_and(|h| h.as_deref() == Some(self.replica.as_str()));
            lease.do_send(SpreadOrder {
                seen: seen.get(name).cloned().flatten(),
                acquire: mine || p.acquire.contains(name),
                hand_over: p.release.contains(name),
            });
        }
    }
}
