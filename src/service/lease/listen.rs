//! How followers learn of changes: `LISTEN provisioner_changes` on a dedicated connection, on
//! a thread of its own, forwarding each notification's payload (the store's JSON notice) to a
//! recipient, e.g. to refresh the event stream or caches a follower serves. Not polling: the
//! thread blocks on the connection until a notification arrives; a lost connection is
//! reconnected after `retry` (and a [`Changed`] with `resync: true` tells the recipient that
//! it may have missed some, so that it reads afresh).
//!
//! A replica hosting many models listens once: [`NoticeHub`] takes the one listener's
//! notifications and hands each to the model it names (a reconnection to every model), so a
//! replica holds one LISTEN connection and thread, not one per model.

use std::time::Duration;

use actix::prelude::*;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use crate::service::pgconnect::Connector;

/// The channel the store notifies on.
pub(crate) const CHANNEL: &str = "provisioner_changes";

/// A change notification (or a reconnection, after which changes may have been missed).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub(crate) struct Changed {
    /// The notification's payload (empty on a resync).
    pub payload: String,
    /// The connection was (re)established: read everything afresh.
    pub resync: bool,
    /// The backend process id of the session that notified (0 on a resync): a store compares
    /// it with its own session's to tell its own changes from other replicas'.
    pub sender: i32,
}

/// The replica's one listener, shared by its models: hands each notification to the models'
/// subscribers by the `model_uuid` it names (a notice naming none, and a reconnection, to all).
#[derive(Debug, Default)]
pub(crate) struct NoticeHub {
    models: std::collections::BTreeMap<String, Vec<Recipient<Changed>>>,
}

impl NoticeHub {
    /// Starts the hub and its listening thread on `url` (reconnecting after `retry`).
    pub(crate) fn start_listening(url: String, retry: Duration) -> std::io::Result<Addr<Self>> {
        let hub = Self::default().start();
        listen(url, retry, hub.clone().recipient())?;
        Ok(hub)
    }
}

impl Actor for NoticeHub {
    type Context = Context<Self>;
}

/// Hands model `model_uuid`'s notices to `to` from now on (starting with a resync: what was
/// committed before is to be read afresh).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Subscribe {
    /// The model.
    pub model_uuid: String,
    /// Where its notices go.
    pub to: Recipient<Changed>,
}

impl Handler<Subscribe> for NoticeHub {
    type Result = ();
    fn handle(&mut self, m: Subscribe, _ctx: &mut Self::Context) {
        m.to.do_send(Changed { payload: String::new(), resync: true, sender: 0 });
        self.models.entry(m.model_uuid).or_default().push(m.to);
    }
}

/// The model a notice names (the store's notices are JSON with a `model_uuid`).
#[derive(serde::Deserialize)]
struct Named {
    model_uuid: Option<String>,
}

impl Handler<Changed> for NoticeHub {
    type Result = ();
    fn handle(&mut self, m: Changed, _ctx: &mut Self::Context) {
        let named =
            if m.resync { None } else { serde_json::from_str::<Named>(&m.payload).ok().and_then(|n| n.model_uuid) };
        // Queued whatever the mailbox's size (a notice dropped is a change a follower never
        // learns of); a subscriber gone (its model stopped) is dropped.
        let keep = |to: &Recipient<Changed>| {
            to.do_send(m.clone());
            to.connected()
        };
        match named {
            Some(uuid) => {
                if let Some(subs) = self.models.get_mut(&uuid) {
                    subs.retain(keep);
                }
            }
            None => {
                for subs in self.models.values_mut() {
                    subs.retain(keep);
                }
            }
        }
        self.models.retain(|_, subs| !subs.is_empty());
    }
}

/// Starts the listening thread; it runs while the recipient is alive.
pub(crate) fn listen(url: String, retry: Duration, to: Recipient<Changed>) -> std::io::Result<()> {
    std::thread::Builder::new().name("listen".into()).spawn(move || {
        // One connector for the thread's life: a start-up that overruns is waited for by the
        // next attempt instead of hanging this thread (see `pgconnect`).
        let mut connector = None;
        loop {
            match listen_once(&url, retry, &to, &mut connector) {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(reason = %e, "LISTEN {CHANNEL}: connection lost; reconnecting");
                    // A blocking wait on this thread of its own (no actor runs here).
                    let (tx, rx) = std::sync::mpsc::channel::<()>();
                    let _keep = tx;
                    let _ = rx.recv_timeout(retry);
                }
            }
        }
    })?;
    Ok(())
}

/// One connection's life: `Ok` when the recipient is gone, `Err` when the connection is.
fn listen_once(
    url: &str,
    retry: Duration,
    to: &Recipient<Changed>,
    connector: &mut Option<Connector>,
) -> Result<(), String> {
    let c = match connector.as_mut() {
        Some(c) => c,
        None => {
            let (config, tls) = crate::service::pgtls::parse(url).map_err(|e| e.to_string())?;
            let mut config = postgres::Config::from(config);
            config
                .connect_timeout(retry)
                .keepalives_idle(retry.max(Duration::from_secs(1)))
                .application_name("provisioner-listen");
            connector.insert(Connector::new(config, tls))
        }
    };
    let mut client: Client = c.connect(retry).map_err(|e| e.to_string())?;
    client.batch_execute(&format!("LISTEN {CHANNEL}")).map_err(|e| e.to_string())?;
    // Every notification queued, whatever the mailbox's size: one dropped would be a change
    // the recipient never learns of (after a burst of changes, the last ones).
    let gone = |msg: Changed| {
        to.do_send(msg);
        !to.connected()
    };
    if gone(Changed { payload: String::new(), resync: true, sender: 0 }) {
        return Ok(());
    }
    loop {
        // Blocks until a notification arrives or `retry` passes (then the recipient and the
        // connection are checked).
        {
            let mut notifications = client.notifications();
            let mut it = notifications.timeout_iter(retry);
            while let Some(n) = it.next().map_err(|e| e.to_string())? {
                if gone(Changed { payload: n.payload().to_owned(), resync: false, sender: n.process_id() }) {
                    return Ok(());
                }
            }
        }
        if !to.connected() {
            return Ok(());
        }
        if client.is_closed() {
            return Err("the connection closed".to_owned());
        }
    }
}
