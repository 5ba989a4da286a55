//! `/v1/status`: the model, its machines, the cloud and the pool in one answer, read from the
//! counts the store keeps as it writes (no table is read whole); on a replica, its role and the
//! leader lease.

use std::collections::BTreeMap;

use actix_web::HttpResponse;

use super::auth::Authorized;
use super::errors::Result;
use super::target::State;
use super::wire::{StatusView, TransitionView};

#[utoipa::path(get, path = "/v1/status", tag = "service", operation_id = "status",
    responses((status = 200, description = "The model, its machines, the cloud and the pool", body = StatusView)))]
pub(super) async fn status(_: Authorized, st: State) -> Result<HttpResponse> {
    // No table is read whole, and nothing waits for the store's lane: the counts its last
    // commit published (it keeps them as it writes, and refreshes them after other replicas'
    // commits), the machines in error among them, the model's life.
    let counts = st.store.published_counts().await?;
    let cloud = match &st.cloud_store {
        Some(c) => Some(c.published_counts().await?.instances_by_state),
        None => None,
    };
    let (life, in_error) = (counts.model_life.clone(), counts.machines_in_error);
    let (instances, instances_error) = if st.broker_name == "sim" {
        // The simulated cloud is in the database: its instances are counted as it writes them.
        let by_state = cloud.as_ref().unwrap_or(&counts.instances_by_state);
        let live = by_state.iter().filter(|(state, _)| *state != "terminated").map(|(_, n)| *n);
        (Some(live.sum::<u64>() as usize), None)
    } else {
        instance_count(st.broker.read_instances(crate::service::cloud::listing::MAX_AGE).await.map(|(l, _)| l.len()))
    };
    let lease = match &st.replica {
        Some(r) => Some(r.lease_status().await?),
        None => None,
    };
    // A follower runs no provisioner: its pool and mode are the stored settings, and it is
    // never "idle" (it does not know what the leader has left to do).
    let running = if lease.as_ref().is_some_and(|l| l.role != "leader") { None } else { Some(st.running().await?) };
    let (pool, harvest_mode, idle) = match &running {
        Some(p) => (p.handle.pool().await?, p.handle.harvest_mode().await?.to_string(), p.handle.is_idle().await),
        None => {
            let settings = st.store.read(|s| s.settings()).await?;
            let pool = crate::snapshots::PoolStatus {
                size: settings.workers.unwrap_or(crate::config::DEFAULT_WORKERS),
                in_flight: 0,
                queued: 0,
            };
            (pool, settings.harvest_mode.unwrap_or_default().to_string(), false)
        }
    };
    let by_status: BTreeMap<String, usize> =
        counts.machines_by_status.iter().map(|(status, n)| (status.clone(), *n as usize)).collect();
    let view = StatusView {
        model_uuid: st.model_uuid.clone(),
        model_life: life,
        broker: st.broker_name.clone(),
        zones: st.zones.clone(),
        harvest_mode,
        workers: pool.size,
        machines: by_status.values().sum(),
        machines_in_error: in_error as usize,
        machines_by_status: by_status,
        instances,
        instances_error,
        jobs_in_flight: pool.in_flight,
        jobs_queued: pool.queued,
        broker_calls_in_flight: st.broker.in_flight(),
        idle,
        uptime_s: st.started.elapsed().as_secs_f64(),
        role: lease.as_ref().map(|l| l.role.to_owned()),
        leader: lease.as_ref().and_then(|l| l.leader.clone()),
        epoch: lease.as_ref().and_then(|l| l.epoch),
        replica: lease.as_ref().map(|l| l.replica.clone()),
        last_transition: lease.as_ref().and_then(|l| l.last_transition).map(|(from, to, why, ago)| TransitionView {
            from: from.to_owned(),
            to: to.to_owned(),
            why: why.to_owned(),
            seconds_ago: ago.as_secs_f64(),
        }),
        transitions: lease.as_ref().map(|l| l.transitions),
        models_led: st.models_led(),
    };
    Ok(HttpResponse::Ok().json(view))
}

/// The status's instance count: the count, or no count and why the listing failed (never a
/// count of 0 that only means "unknown").
fn instance_count(listed: std::result::Result<usize, crate::ports::BrokerError>) -> (Option<usize>, Option<String>) {
    match listed {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(format!("listing the cloud failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_listing_is_no_count_and_says_so() {
        assert_eq!(instance_count(Ok(3)), (Some(3), None));
        let (n, why) = instance_count(Err(crate::ports::BrokerError::transient("the cloud is down")));
        assert_eq!(n, None);
        assert!(why.is_some_and(|w| w.contains("listing the cloud failed") && w.contains("the cloud is down")));
        let view = StatusView {
            model_uuid: "u".into(),
            model_life: "alive".into(),
            broker: "sim".into(),
            zones: Vec::new(),
            harvest_mode: "destroyed".into(),
            workers: 1,
            machines: 0,
            machines_by_status: BTreeMap::new(),
            machines_in_error: 0,
            instances: None,
            instances_error: Some("listing the cloud failed: x".into()),
            jobs_in_flight: 0,
            jobs_queued: 0,
            broker_calls_in_flight: 0,
            idle: true,
            uptime_s: 0.0,
            role: None,
            leader: None,
            epoch: None,
            replica: None,
            last_transition: None,
            transitions: None,
            models_led: None,
        };
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["instances"], serde_json::Value::Null);
        assert_eq!(json["instances_error"], "listing the cloud failed: x");
    }
}
