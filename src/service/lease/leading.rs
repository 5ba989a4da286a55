//! What the leader runs, and only the leader: the provisioner actors of the current epoch.
//! [`Leading`] keeps them; the lease's hooks tell it when this replica leads (`Lead`) and when
//! it no longer does (`Follow`: the actors are stopped at once, in-flight cloud calls
//! abandoned); provisioners started for an epoch that is no longer led are stopped as soon as
//! they are handed over, so a slow start never runs beside a newer leader.

use actix::prelude::*;

/// The provisioner actors of one epoch.
#[derive(Clone)]
pub struct Provisioners {
    /// The environ provisioner.
    pub handle: crate::ProvisionerHandle,
    /// The container provisioners, where the cloud runs containers.
    pub containers: Option<crate::ContainersHandle>,
}

impl Provisioners {
    /// Stops them at once.
    pub fn stop(&self) {
        self.handle.close_starts();
        self.handle.shutdown();
        if let Some(c) = &self.containers {
            c.shutdown();
        }
    }
}

/// Keeps the leader's provisioners.
pub struct Leading {
    epoch: Option<i64>,
    running: Option<Provisioners>,
    /// The store, to re-read every machine id after a notification that covers them all
    /// (notifications come with PostgreSQL only).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    store: crate::service::store::Store,
}

impl Leading {
    /// Nothing led yet.
    pub fn new(store: crate::service::store::Store) -> Self {
        Self { epoch: None, running: None, store }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
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
pub struct Lead(pub i64);

/// This replica no longer leads: stop the provisioners now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Follow;

/// The provisioners started for an epoch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Started(pub i64, pub Provisioners);

/// The provisioners running, if this replica leads.
#[derive(Message)]
#[rtype(result = "Option<Provisioners>")]
pub struct Current;

impl Handler<Lead> for Leading {
    type Result = ();
    fn handle(&mut self, m: Lead, _ctx: &mut Self::Context) {
        if let Some(p) = self.running.take() {
            p.stop();
        }
        self.epoch = Some(m.0);
    }
}

impl Handler<Follow> for Leading {
    type Result = ();
    fn handle(&mut self, _m: Follow, _ctx: &mut Self::Context) {
        self.epoch = None;
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
/// changes. A notice for every machine (`all`, a model change) or a reconnection (`resync`,
/// notices may have been missed) re-reads every machine id. Followers ignore them.
#[cfg(feature = "postgres")]
impl Handler<super::listen::Changed> for Leading {
    type Result = ();
    fn handle(&mut self, m: super::listen::Changed, ctx: &mut Self::Context) {
        if self.running.is_none() {
            return;
        }
        let notice: Option<crate::service::store::Notice> = serde_json::from_str(&m.payload).ok();
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
