//! What the leader runs, and only the leader: the provisioner actors of the current epoch.
//! [`Leading`] keeps them; the lease's hooks tell it when this replica leads (`Lead`) and when
//! it no longer does (`Follow`: the actors are stopped at once, in-flight cloud calls
//! abandoned); provisioners started for an epoch that is no longer led are stopped as soon as
//! they are handed over, so a slow start never runs beside a newer leader.
// Without PostgreSQL there are no replicas: only the types the status shows are used.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use actix::prelude::*;

/// The provisioner actors of one epoch.
#[derive(Clone)]
pub(crate) struct Provisioners {
    /// The environ provisioner.
    pub handle: crate::ProvisionerHandle,
    /// The container provisioners, where the cloud runs containers.
    pub containers: Option<crate::ContainersHandle>,
}

impl Provisioners {
    /// Stops them at once.
    pub(crate) fn stop(&self) {
        self.handle.close_starts();
        self.handle.shutdown();
        if let Some(c) = &self.containers {
            c.shutdown();
        }
    }
}

/// How long change notices are gathered before the gauges' counts are refreshed (at most one
/// recount of the store per period, on leaders and followers alike).
pub(crate) const COUNTS_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The change notices heard since the last refresh of the gauges' counts: plain, so that the
/// debounce is tested without a runtime.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CountsRefresh {
    scheduled: bool,
    resync: bool,
    senders: std::collections::BTreeSet<i32>,
}

impl CountsRefresh {
    /// A notice (from the session `sender`) or a reconnection: `true` when a refresh must be
    /// scheduled now (none is pending).
    pub(crate) fn note(&mut self, resync: bool, sender: i32) -> bool {
        self.resync |= resync;
        if !resync {
            self.senders.insert(sender);
        }
        !std::mem::replace(&mut self.scheduled, true)
    }

    /// The refresh is due: whether it follows a reconnection, and the senders heard.
    pub(crate) fn take(&mut self) -> (bool, Vec<i32>) {
        self.scheduled = false;
        (std::mem::take(&mut self.resync), std::mem::take(&mut self.senders).into_iter().collect())
    }
}

/// Keeps the leader's provisioners.
pub(crate) struct Leading {
    epoch: Option<i64>,
    running: Option<Provisioners>,
    /// The epoch led whose provisioners could not start (its fence could not be set, or the
    /// starts an earlier leader left in flight could not be settled): the probe fails, so the
    /// lease steps down rather than holding the model without acting.
    not_acting: Option<i64>,
    /// The gauges' counts to refresh after other replicas' changes.
    counts: CountsRefresh,
    /// The store, to re-read every machine id after a notification that covers them all
    /// (notifications come with PostgreSQL only).
    store: crate::service::store::Store,
    /// The model this replica leads: notices of other models (many models share the
    /// database's channel) are ignored. `None`: every notice is this model's.
    model_uuid: Option<String>,
    /// The simulated cloud's own store, if it has one apart from the model's
    /// ([`Store::companion`](crate::service::store::Store::companion)): its instance counts
    /// are refreshed with the model's.
    cloud_store: Option<crate::service::store::Store>,
}

impl Leading {
    /// Nothing led yet.
    pub(crate) fn new(store: crate::service::store::Store) -> Self {
        Self {
            epoch: None,
            running: None,
            not_acting: None,
            counts: CountsRefresh::default(),
            store,
            model_uuid: None,
            cloud_store: None,
        }
    }

    /// Refreshes the counts of the cloud's own store too (`None`: the cloud has none).
    pub(crate) fn with_cloud_store(self, cloud_store: Option<crate::service::store::Store>) -> Self {
        Self { cloud_store, ..self }
    }

    /// Hears only the notices of the model with this uuid (a service hosting many models).
    pub(crate) fn for_model(self, model_uuid: &str) -> Self {
        Self { model_uuid: Some(model_uuid.to_owned()), ..self }
    }

    fn machines_changed(&self, ids: Vec<crate::model::MachineId>) {
        if let Some(p) = &self.running {
            let msg = crate::MachinesChanged { ids };
            p.handle.machines_changed().do_send(msg.clone());
            if let Some(c) = &p.containers {
                c.machines_changed().do_send(msg);
            }
        }
    }
}

impl Actor for Leading {
    type Context = Context<Self>;
}

/// This replica leads at this epoch (its provisioners are being started).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Lead(pub i64);

/// This replica no longer leads: stop the provisioners now.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Follow;

/// The provisioners started for an epoch.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Started(pub i64, pub Provisioners);

/// The provisioners running, if this replica leads.
#[derive(Message)]
#[rtype(result = "Option<Provisioners>")]
pub(crate) struct Current;

/// The provisioners of this epoch could not be started: the replica does not act.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NotActing(pub i64);

/// What the lease's probe of this replica's work finds.
#[derive(Message)]
#[rtype(result = "Acting")]
pub(crate) struct Probe;

/// What this replica does for its model, as the lease's probe sees it.
#[derive(Clone)]
pub(crate) enum Acting {
    /// It does not lead.
    Following,
    /// It leads, and its provisioners are being started (the fence set, the starts left in
    /// flight settled).
    Starting,
    /// It leads, and its provisioners run.
    Running(Box<Provisioners>),
    /// It leads, but its provisioners could not start: it should step down.
    Stuck,
}

impl Handler<Lead> for Leading {
    type Result = ();
    fn handle(&mut self, m: Lead, _ctx: &mut Self::Context) {
        if let Some(p) = self.running.take() {
            p.stop();
        }
        self.epoch = Some(m.0);
        self.not_acting = None;
    }
}

impl Handler<NotActing> for Leading {
    type Result = ();
    fn handle(&mut self, NotActing(epoch): NotActing, _ctx: &mut Self::Context) {
        if self.epoch == Some(epoch) {
            self.not_acting = Some(epoch);
        }
    }
}

impl Handler<Probe> for Leading {
    type Result = MessageResult<Probe>;
    fn handle(&mut self, _m: Probe, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(match (&self.epoch, &self.running) {
            (None, _) => Acting::Following,
            (Some(_), Some(p)) => Acting::Running(Box::new(p.clone())),
            (Some(e), None) if self.not_acting == Some(*e) => Acting::Stuck,
            (Some(_), None) => Acting::Starting,
        })
    }
}

impl Handler<Follow> for Leading {
    type Result = ();
    fn handle(&mut self, _m: Follow, _ctx: &mut Self::Context) {
        self.epoch = None;
        self.not_acting = None;
        if let Some(p) = self.running.take() {
            tracing::warn!("no longer the leader: the provisioner is stopped (in-flight cloud calls abandoned)");
            p.stop();
        }
    }
}

impl Handler<Started> for Leading {
    type Result = ();
    fn handle(&mut self, Started(epoch, p): Started, _ctx: &mut Self::Context) {
        if self.epoch == Some(epoch) {
            if let Some(old) = self.running.replace(p) {
                old.stop();
            }
        } else {
            p.stop();
        }
    }
}

impl Handler<Current> for Leading {
    type Result = MessageResult<Current>;
    fn handle(&mut self, _m: Current, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.running.clone())
    }
}

/// A change another replica committed (the API's writes on a follower), heard by `LISTEN
/// provisioner_changes`: the leader's provisioners hear it as they hear their own store's
/// changes (the store's own notices, which its actor published already, are not heard again:
/// `from_elsewhere`). A notice for every machine (`all`, a model change) or a reconnection
/// (`resync`, notices may have been missed) re-reads every machine id. On every replica, the notices of
/// other sessions refresh the metrics' state gauges (one recount per [`COUNTS_REFRESH`] at
/// most): a follower's gauges follow the leader's writes, and the leader's the followers' adds.
#[cfg(feature = "postgres")]
impl Handler<super::listen::Changed> for Leading {
    type Result = ();
    fn handle(&mut self, m: super::listen::Changed, ctx: &mut Self::Context) {
        // The store's own commits (every group commit of the leader's sends one): it published
        // their changes and counts itself. Not even parsed (up to 200 ids each).
        if !from_elsewhere(&m, self.store.session_pid()) {
            return;
        }
        let notice: Option<crate::service::store::Notice> = serde_json::from_str(&m.payload).ok();
        if let (Some(n), Some(mine)) = (&notice, &self.model_uuid) {
            if &n.model_uuid != mine {
                return; // another model's change
            }
        }
        if self.counts.note(m.resync, m.sender) {
            ctx.run_later(COUNTS_REFRESH, |act, ctx| {
                let (resync, senders) = act.counts.take();
                if let Some(cloud) = act.cloud_store.clone() {
                    // Its instances change by its own writes (counted as they commit; they send
                    // no notice) and by other replicas' clouds: the model's own session's
                    // notices are no news to it.
                    let own = act.store.session_pid();
                    let others: Vec<i32> = senders.iter().copied().filter(|p| Some(*p) != own).collect();
                    refresh_counts(&cloud, resync, others, ctx);
                }
                let store = act.store.clone();
                refresh_counts(&store, resync, senders, ctx);
            });
        }
        if self.running.is_none() {
            return;
        }
        let everything = m.resync || notice.as_ref().is_some_and(|n| n.all || n.kind == "model");
        if everything {
            let read = self.store.exec(|s| s.machine_ids());
            ctx.spawn(actix::fut::wrap_future::<_, Self>(read).map(|ids, act, _ctx| match ids {
                Ok(ids) => act.machines_changed(ids),
                Err(e) => tracing::warn!(error = %e, "cannot re-read the machines after a change notice"),
            }));
        } else if let Some(n) = notice.filter(|n| n.kind == "machines" && !n.ids.is_empty()) {
            self.machines_changed(n.ids.into_iter().map(crate::model::MachineId::new).collect());
        }
    }
}

/// Has `store` recount what the sessions `senders` (or a reconnection, `resync`) changed, and
/// publish the counts to its watchers.
#[cfg(feature = "postgres")]
fn refresh_counts(store: &crate::service::store::Store, resync: bool, senders: Vec<i32>, ctx: &mut Context<Leading>) {
    let refresh = store.exec(move |s| s.refresh_counts(resync, &senders));
    ctx.spawn(actix::fut::wrap_future::<_, Leading>(refresh).map(|done, _act, _ctx| {
        if let Err(e) = done {
            tracing::warn!(error = %e, "cannot refresh the metrics' counts after a change notice");
        }
    }));
}

/// Whether a change notice is news to the leader's provisioners: a reconnection, or a change
/// another session committed. The store's own commits (`own`, its session) were published to
/// them by the store already; hearing them again cost a read per notice, and every machine id
/// re-read (and refreshed) at each add of more than 200 machines.
#[cfg(feature = "postgres")]
fn from_elsewhere(m: &super::listen::Changed, own: Option<i32>) -> bool {
    m.resync || own != Some(m.sender)
}

#[cfg(test)]
mod tests {
    use super::CountsRefresh;

    /// The store's own notices are not heard again; another session's and a resync are.
    #[cfg(feature = "postgres")]
    #[test]
    fn the_stores_own_notices_are_not_heard_again() {
        use super::super::listen::Changed;
        let notice = |sender| Changed { payload: String::new(), resync: false, sender };
        assert!(!super::from_elsewhere(&notice(42), Some(42)), "its own");
        assert!(super::from_elsewhere(&notice(7), Some(42)), "another session's");
        assert!(super::from_elsewhere(&notice(42), None), "no session known: heard");
        let resync = Changed { payload: String::new(), resync: true, sender: 0 };
        assert!(super::from_elsewhere(&resync, Some(0)), "a reconnection");
    }

    /// A leader whose provisioners could not start at its epoch answers its probe "not
    /// acting" (so the lease steps it down); an older epoch's word does not count, and a new
    /// epoch or following clears it.
    #[test]
    fn a_leader_that_cannot_start_its_provisioners_fails_its_probe() {
        use super::{Acting, Follow, Lead, Leading, NotActing, Probe};
        use actix::Actor;
        crate::service::cloud::on_a_fresh_store("leading-not-acting", |store| async move {
            let leading = Leading::new(store).start();
            let probe = || async { leading.send(Probe).await.unwrap() };
            assert!(matches!(probe().await, Acting::Following));
            leading.send(Lead(3)).await.unwrap();
            assert!(matches!(probe().await, Acting::Starting), "resuming: progressing");
            leading.send(NotActing(2)).await.unwrap();
            assert!(matches!(probe().await, Acting::Starting), "an older epoch's failure does not count");
            leading.send(NotActing(3)).await.unwrap();
            assert!(matches!(probe().await, Acting::Stuck));
            leading.send(Lead(4)).await.unwrap();
            assert!(matches!(probe().await, Acting::Starting), "a new epoch tries again");
            leading.send(NotActing(4)).await.unwrap();
            leading.send(Follow).await.unwrap();
            assert!(matches!(probe().await, Acting::Following), "stepped down: nothing to probe");
        });
    }

    #[test]
    fn notices_are_gathered_into_one_refresh_per_period() {
        let mut c = CountsRefresh::default();
        assert!(c.note(false, 7), "the first notice schedules a refresh");
        assert!(!c.note(false, 9), "later ones join it");
        assert!(!c.note(false, 7));
        assert_eq!(c.take(), (false, vec![7, 9]));
        assert!(c.note(true, 0), "after the refresh, the next notice schedules another");
        assert_eq!(c.take(), (true, vec![]), "a reconnection asks for a recount, with no sender");
        assert_eq!(c.take(), (false, vec![]));
    }
}
