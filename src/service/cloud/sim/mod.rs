//! The simulated cloud in real time (`--broker sim`): a [`Broker`] whose instances live in the
//! service's database, so that a restart or a crash of the service loses none of them.
//!
//! A start creates the instance at once (pending, tagged with the model, the machine and the
//! start's nonce, keyed by the client token so that a repeated call returns the same
//! instance), then waits the start latency and marks it running. An instance whose landing a
//! crash interrupted is landed by [`SimCloud::resume`] when the service comes back. Without a
//! latency to wait, creation and landing are one unit of work on the store (one round trip).
//!
//! As EC2 does, it is idempotent by client token: a start repeated with the token of one that
//! already made an instance (whatever became of the first call's answer) returns that instance,
//! landing it if it is still pending, and creates nothing; the same token with other
//! parameters (another machine or zone) is refused (`IdempotentParameterMismatch`). Tokens are
//! the model's own (stored under a model-scoped key, `ports::token_key`), and the
//! decision on a repeat is the one the fake cloud takes too (`ports::repeated_start`); the
//! broker contract suite (`testing::broker_contract`) checks both. Any failure
//! after the instance was written (its landing could not be recorded: a full disk, say) is
//! transient, so the provisioner treats the start as ambiguous and repeats it with the same
//! token.
//!
//! Instance types: a machine with hardware constraints (`arch`, `cores`, `mem`,
//! `instance-type`), or any machine when `[sim] instance_type` sets a default, gets a type
//! from the shipped catalogue ([`crate::model::instance_types`]), cheapest first, with the EC2
//! broker's per-type capacity fail-over: `[sim] out_of_capacity = ["TYPE:ZONE", ...]` makes a
//! type permanently out of capacity in a zone, and the start tries the next fitting type in the
//! same zone (under a token derived from its own, as the EC2 broker does) before failing
//! zone-specifically. The type is on the start's answer; the store does not keep it (a listing
//! shows none).
//!
//! State shared by concurrent starts has one owner each, reached by messages: an account's
//! start bucket is an `AccountBucket` actor's, a cloud's per-type fail-over a `TypeMemory`
//! actor's (in `actor.rs`; their plain cores in `state.rs`).
//! Both are started with their owner ([`SimAccount::new`], [`SimCloud::new`]), within the
//! service's actix system.

mod actor;
mod messages;
mod state;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;

use self::actor::{AccountBucket, TypeMemory};
use self::messages::{PickType, TakeStart};
use self::state::SimTypes;
use crate::model::instance_types::{self, has_hardware_constraint};
use crate::model::{CloudInstance, InstanceId, InstanceTags};
use crate::ports::{
    repeated_start, token_key, AvailabilityZone, Broker, BrokerError, BrokerFuture, StartInstanceParams,
    StartedInstance,
};
use crate::service::settings::{DEFAULT_SIM_START_LATENCY, DEFAULT_SIM_ZONES};
use crate::service::store::{Store, StoreError, Write, Written};

/// The simulated cloud's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SimSettings {
    /// Its availability zones (empty: a zoneless cloud).
    pub zones: Vec<String>,
    /// Zones it lists as unavailable: no instance starts there (a start that targets one
    /// fails as a zone-specific failure).
    pub unavailable_zones: Vec<String>,
    /// How long a start takes.
    pub start_latency: Duration,
    /// How long a stop takes.
    pub stop_latency: Duration,
    /// Its subnets and the zones each is in (`subnet=ID` placements derive their zones from
    /// it, as `DeriveAvailabilityZones` does).
    pub subnets: BTreeMap<String, Vec<String>>,
    /// The type of machines without hardware constraints (`None`: their instances have no
    /// type).
    pub instance_type: Option<String>,
    /// `(type, zone)` pairs out of capacity: a start of that type into that zone fails
    /// zone-specifically and the start tries its next fitting type.
    pub out_of_capacity: Vec<(String, String)>,
    /// Fault injection: the first this many start calls the cloud gets (since the service
    /// started, whatever their machine or zone) are refused with a zone-independent error.
    pub start_failures: u32,
    /// The simulated account whose start bucket every start spends (shared by the models on
    /// it); `None`: starts are never throttled.
    pub account: Option<SimAccount>,
}

/// A simulated cloud account's request bucket for starts, as a cloud enforces it (EC2's are
/// per account and region): every model on the account spends the same bucket; a start that
/// finds it empty is refused as throttled. Counts what it refused.
#[derive(Debug, Clone)]
pub(crate) struct SimAccount {
    name: String,
    bucket: Addr<AccountBucket>,
    throttled: Arc<std::sync::atomic::AtomicU64>,
}

impl PartialEq for SimAccount {
    fn eq(&self, other: &Self) -> bool {
        self.bucket == other.bucket
    }
}

impl Eq for SimAccount {}

impl SimAccount {
    /// An account named `name` that takes `per_second` starts a second (and as many at once),
    /// its bucket full now. Starts the bucket's owner (an actor): call it within an actix
    /// system.
    pub(crate) fn new(name: &str, per_second: u32) -> Self {
        let limit = crate::config::rate_limits::BucketLimit::new(per_second, f64::from(per_second));
        Self {
            name: name.to_owned(),
            bucket: AccountBucket::start(crate::actors::limiter::TokenBucket::new(limit)),
            throttled: Arc::default(),
        }
    }

    /// How many starts it refused as throttled (all its models').
    pub(crate) fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Spends a token for one start, or counts a throttled refusal.
    async fn take(&self) -> Result<(), BrokerError> {
        let took =
            self.bucket.send(TakeStart).await.map_err(|_| {
                BrokerError::transient(format!("simulated account {:?}: its bucket is gone", self.name))
            })?;
        if took {
            return Ok(());
        }
        self.throttled.fetch_add(1, Ordering::Relaxed);
        Err(BrokerError::throttled(format!(
            "simulated account {:?}: request limit exceeded for starts (RequestLimitExceeded)",
            self.name
        )))
    }
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            zones: DEFAULT_SIM_ZONES.map(String::from).to_vec(),
            unavailable_zones: Vec::new(),
            start_latency: DEFAULT_SIM_START_LATENCY,
            stop_latency: Duration::ZERO,
            subnets: DEFAULT_SIM_ZONES.iter().map(|z| (format!("subnet-{z}"), vec![(*z).to_owned()])).collect(),
            instance_type: None,
            out_of_capacity: Vec::new(),
            start_failures: 0,
            account: None,
        }
    }
}

/// The broker over the simulated cloud.
#[derive(Clone)]
pub(crate) struct SimCloud {
    store: Store,
    model_uuid: String,
    settings: SimSettings,
    /// The per-type fail-over (its owner, shared by the clones).
    failover: Addr<TypeMemory>,
    epoch: actix_rt::time::Instant,
    /// The start calls still to refuse (`start_failures`, counted down; shared by the clones).
    failures_left: Arc<AtomicU32>,
}

impl SimCloud {
    /// Sets the leader's fence on the store its instances are written to.
    #[cfg(feature = "postgres")]
    pub(crate) async fn set_fence(&self, fence: crate::service::store::Fence) -> Result<(), StoreError> {
        self.store.set_fence(Some(fence)).await
    }
}

/// Parses `[sim] out_of_capacity` entries, `TYPE:ZONE`; `None` for a malformed one.
pub(crate) fn parse_out_of_capacity(entries: &[String]) -> Option<Vec<(String, String)>> {
    entries
        .iter()
        .map(|e| match e.split_once(':') {
            Some((t, z)) if !t.trim().is_empty() && !z.trim().is_empty() => {
                Some((t.trim().to_owned(), z.trim().to_owned()))
            }
            _ => None,
        })
        .collect()
}

fn cloud_error(e: StoreError) -> BrokerError {
    BrokerError::transient(format!("simulated cloud: {e}"))
}

impl SimSettings {
    /// Every zone the cloud lists, available or not.
    pub(crate) fn known_zones(&self) -> Vec<String> {
        self.zones.iter().chain(&self.unavailable_zones).cloned().collect()
    }
}

/// The zones a start's placement implies (`DeriveAvailabilityZones`): `zone=Z` pins `Z`,
/// `subnet=S` the zones of `S`; nothing else restricts (empty). An unknown subnet is a
/// definite failure.
pub(crate) fn derive_zones(settings: &SimSettings, params: &StartInstanceParams) -> Result<Vec<String>, BrokerError> {
    let Some(placement) = params.placement.as_deref() else { return Ok(Vec::new()) };
    if let Some(zone) = placement.strip_prefix("zone=") {
        return Ok(vec![zone.to_owned()]);
    }
    if let Some(subnet) = placement.strip_prefix("subnet=") {
        return settings.subnets.get(subnet).cloned().ok_or_else(|| {
            BrokerError::zone_independent(format!("subnet {subnet:?} is not one of this cloud's subnets"))
        });
    }
    Ok(Vec::new())
}

/// Why a start would be refused before it reaches the cloud's records, if it would.
pub(crate) fn check_start(settings: &SimSettings, params: &StartInstanceParams) -> Result<(), BrokerError> {
    match &params.zone {
        Some(z) if settings.unavailable_zones.contains(z) => {
            Err(BrokerError::zone_specific(format!("zone {z:?} is unavailable")))
        }
        Some(z) if !settings.zones.is_empty() && !settings.zones.contains(z) => {
            Err(BrokerError::zone_specific(format!("zone {z:?} is not one of this cloud's zones")))
        }
        _ => Ok(()),
    }
}

impl SimCloud {
    /// A simulated cloud for the model `model_uuid` over `store`. Starts the owner of its
    /// per-type fail-over (an actor): call it within an actix system.
    pub(crate) fn new(store: Store, model_uuid: String, settings: SimSettings) -> Self {
        let types = SimTypes::new(instance_types::DEFAULT_CAPACITY_MEMORY, settings.out_of_capacity.clone());
        let failover = TypeMemory::start(types);
        let failures_left = Arc::new(AtomicU32::new(settings.start_failures));
        Self { store, model_uuid, settings, failover, epoch: actix_rt::time::Instant::now(), failures_left }
    }

    /// The injected fault (`start_failures`): refuses this start if the count is not used up,
    /// counting it down. The refusal is zone-independent (any zone would refuse it), so it uses
    /// a retry round; with `[retry] count = 0` the machine ends in provisioning error at once,
    /// and `machine retry` then provisions it (once the count is used up).
    fn injected_fault(&self) -> Result<(), BrokerError> {
        let took = self.failures_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        match took {
            Ok(left) => Err(BrokerError::zone_independent(format!(
                "simulated fault (--sim-start-failures): the cloud refused this start ({} of {} injected failures)",
                self.settings.start_failures - left + 1,
                self.settings.start_failures
            ))),
            Err(_) => Ok(()),
        }
    }

    /// The type and client token a start uses after the per-type fail-over in its zone:
    /// `Ok(None)` when no type is asked for (the start's own token then).
    async fn pick_type(&self, params: &StartInstanceParams) -> Result<Option<(String, String)>, BrokerError> {
        let default = self.settings.instance_type.as_deref();
        if !has_hardware_constraint(&params.constraints) && default.is_none() {
            return Ok(None);
        }
        let mut candidates = instance_types::choose(&params.constraints, &instance_types::shipped(), default)
            .map_err(|e| BrokerError::zone_independent(e.to_string()))?;
        candidates.truncate(instance_types::DEFAULT_TYPES_PER_ZONE);
        let zone = params.zone.as_deref();
        let pick = PickType {
            now: self.epoch.elapsed(),
            zone: params.zone.clone(),
            token: params.client_token.clone(),
            candidates,
        };
        let picked = self
            .failover
            .send(pick)
            .await
            .map_err(|_| BrokerError::transient("simulated cloud: its type fail-over is gone"))?;
        match picked {
            Ok(attempt) => Ok(Some((attempt.instance_type, attempt.client_token))),
            Err(last) => Err(BrokerError::zone_specific(format!(
                "InsufficientInstanceCapacity: no {} capacity in {}",
                last.unwrap_or_default(),
                zone.unwrap_or("this cloud")
            ))),
        }
    }

    /// Lands, after the start latency, every instance a crash left pending. Returns how many.
    pub(crate) async fn resume(&self) -> Result<usize, StoreError> {
        let pending = self.store.exec_lazy(|s| s.pending_instances()).await?;
        let n = pending.len();
        if n > 0 {
            let store = self.store.clone();
            let latency = self.settings.start_latency;
            actix_rt::spawn(async move {
                actix_rt::time::sleep(latency).await;
                for id in pending {
                    if let Err(e) = store.exec_lazy(move |s| s.land_instance(&id)).await {
                        tracing::warn!(error = %e, "cannot land a resumed instance");
                    }
                }
            });
        }
        Ok(n)
    }

    /// Every instance ever created, terminated and released ones included.
    #[cfg(test)]
    pub(crate) async fn all_records(&self) -> Result<Vec<crate::service::store::InstanceRecord>, StoreError> {
        self.store.exec_lazy(|s| s.all_instances()).await
    }
}

impl Broker for SimCloud {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let store = self.store.clone();
        let latency = self.settings.start_latency;
        let check = check_start(&self.settings, &params);
        let cloud = self.clone();
        Box::pin(async move {
            check?;
            if let Some(account) = &cloud.settings.account {
                account.take().await?;
            }
            cloud.injected_fault()?;
            let picked = cloud.pick_type(&params).await?;
            // Spot is always to be had in the simulated cloud: the instance runs on what was asked.
            let capacity = params.capacity;
            let token = token_key(&cloud.model_uuid, picked.as_ref().map_or(&params.client_token, |(_, t)| t));
            let instance_type = picked.map(|(t, _)| t);
            // Both of a start's writes are write-behind units, which the store may send with its
            // group's commit (PostgreSQL: a group of them costs a round trip or two, however
            // many starts it holds; one at a time, a start cost about ten round trips, and a
            // database 20 ms away held a model to 6 starts a second). Without a start latency to
            // wait, the instance is created running by the one unit; else it is created pending
            // and landed by a second unit once the latency has passed. A repeated token's
            // instance (a crash's leftover) is answered as it is, and landed by a second unit if
            // the repeat is the same start.
            let running = latency.is_zero();
            let write = Write::NewInstance {
                client_token: token,
                zone: params.zone.clone(),
                tags: params.tags.clone(),
                running,
            };
            let (record, new) = match store.write_behind(write).await.map_err(cloud_error)? {
                Written::Instance(record, new) => (record, new),
                other => {
                    return Err(BrokerError::transient(format!(
                        "simulated cloud: the store answered {other:?} for a start"
                    )))
                }
            };
            repeated_start(&params, &record.instance)?;
            let landed = if new && running {
                None
            } else {
                if new {
                    actix_rt::time::sleep(latency).await;
                }
                let write = Write::LandInstance { id: record.instance.id.clone() };
                match store.write_behind(write).await.map_err(cloud_error)? {
                    Written::Landed(landed) => landed,
                    other => {
                        return Err(BrokerError::transient(format!(
                            "simulated cloud: the store answered {other:?} for a landing"
                        )))
                    }
                }
            };
            let instance = CloudInstance {
                instance_type,
                capacity_type: Some(capacity),
                ..landed.map(|r| r.instance).unwrap_or(record.instance)
            };
            Ok(StartedInstance { display_name: format!("sim-{}", instance.id), instance })
        })
    }

    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let store = self.store.clone();
        let latency = self.settings.stop_latency;
        Box::pin(async move {
            if !latency.is_zero() {
                actix_rt::time::sleep(latency).await;
            }
            store.exec_lazy(move |s| s.terminate_instances(&ids)).await.map_err(cloud_error)
        })
    }

    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let store = self.store.clone();
        let model = self.model_uuid.clone();
        Box::pin(async move { store.exec_lazy(move |s| s.live_instances(&model)).await.map_err(cloud_error) })
    }

    fn supports_zones(&self) -> bool {
        !self.settings.known_zones().is_empty()
    }

    /// Its zones are its settings: they never change while it runs.
    fn zones_change(&self) -> bool {
        false
    }

    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        let mut zones: Vec<AvailabilityZone> = self.settings.zones.iter().map(AvailabilityZone::available).collect();
        zones.extend(
            self.settings.unavailable_zones.iter().map(|z| AvailabilityZone { name: z.clone(), available: false }),
        );
        Box::pin(async move { Ok(zones) })
    }

    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        let derived = derive_zones(&self.settings, params);
        Box::pin(async move { derived })
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        let store = self.store.clone();
        Box::pin(async move {
            let what = id.clone();
            match store.exec_lazy(move |s| s.retag_instance(&id, &tags)).await.map_err(cloud_error)? {
                true => Ok(()),
                false => Err(BrokerError::zone_independent(format!("instance {what} not found"))),
            }
        })
    }

    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let store = self.store.clone();
        Box::pin(async move { store.exec_lazy(move |s| s.release_instances(&ids)).await.map_err(cloud_error) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MachineId;

    fn params(zone: Option<&str>) -> StartInstanceParams {
        StartInstanceParams {
            machine: MachineId::new("0"),
            zone: zone.map(str::to_owned),
            constraints: Default::default(),
            placement: None,
            volumes: Vec::new(),
            nonce: "machine-0:n".into(),
            tags: InstanceTags::default(),
            extra_tags: Default::default(),
            client_token: "0/n/1".into(),
            distribution_group: Vec::new(),
            capacity: Default::default(),
            spot_max_price: None,
        }
    }

    /// A start repeated with its client token (after an ambiguous failure)
    /// gets the instance the first one made, landed if it was left pending, and nothing new;
    /// the same token with another zone is refused.
    #[test]
    fn a_repeated_client_token_returns_the_instance_already_made() {
        crate::service::cloud::on_a_fresh_store("simcloud-tokens", |store| async move {
            let settings = SimSettings { start_latency: Duration::ZERO, ..SimSettings::default() };
            let cloud = SimCloud::new(store.clone(), "m".into(), settings);
            let tags = InstanceTags { model: Some("m".into()), machine: Some(MachineId::new("0")), start: None };
            let p = StartInstanceParams { tags: tags.clone(), ..params(Some("az1")) };
            let first = cloud.start_instance(p.clone()).await.unwrap();
            let again = cloud.start_instance(p.clone()).await.unwrap();
            assert_eq!(again.instance.id, first.instance.id);
            assert_eq!(cloud.all_records().await.unwrap().len(), 1);

            // A start whose instance was written but whose landing failed: the repeat lands it.
            let t = tags.clone();
            let (left, _) =
                store.exec(move |s| s.create_instance(&token_key("m", "0/n/2"), Some("az1"), &t)).await.unwrap();
            assert_eq!(left.instance.state, crate::model::InstanceState::Pending);
            let p2 = StartInstanceParams { client_token: "0/n/2".into(), ..p.clone() };
            let landed = cloud.start_instance(p2.clone()).await.unwrap();
            assert_eq!(landed.instance.id, left.instance.id);
            assert_eq!(landed.instance.state, crate::model::InstanceState::Running);
            assert_eq!(cloud.all_records().await.unwrap().len(), 2, "the repeat created nothing");

            // The same token for another zone is a definite failure, and creates nothing.
            let elsewhere = StartInstanceParams { zone: Some("az2".into()), ..p2 };
            let err = cloud.start_instance(elsewhere).await.unwrap_err();
            assert!(err.message().contains("IdempotentParameterMismatch"), "{err:?}");
            assert_eq!(err.kind(), "zone_independent", "{err:?}");
            assert_eq!(cloud.all_records().await.unwrap().len(), 2);
        });
    }

    /// Without a start latency a start is one unit of work on the store (its instance created
    /// and landed together); with one, two (the pending instance first, so that a crash while
    /// it waits leaves the instance for `resume` to land). Either way the instance runs.
    #[test]
    fn a_start_without_latency_creates_and_lands_its_instance_in_one_store_call() {
        crate::service::cloud::on_a_fresh_store("simcloud-one-call", |store| async move {
            for (latency, calls) in [(Duration::ZERO, 1), (Duration::from_millis(5), 2)] {
                let cloud = SimCloud::new(
                    store.clone(),
                    "m".into(),
                    SimSettings { start_latency: latency, ..SimSettings::default() },
                );
                let token = format!("0/n/{}", latency.as_millis());
                let tags = InstanceTags { model: Some("m".into()), machine: Some(MachineId::new("0")), start: None };
                let p = StartInstanceParams { client_token: token, tags, ..params(Some("az1")) };
                let before = store.operations();
                let started = cloud.start_instance(p).await.unwrap();
                assert_eq!(store.operations() - before, calls, "latency {latency:?}");
                assert_eq!(started.instance.state, crate::model::InstanceState::Running);
            }
            assert!(store.exec(|s| s.pending_instances()).await.unwrap().is_empty());
        });
    }

    /// The broker contract suite against the simulated cloud, zoned (one zone listed as
    /// unavailable) and zoneless, with a second model's cloud on the same store as the
    /// stranger.
    #[test]
    fn the_simulated_cloud_keeps_the_broker_contract() {
        use crate::testing::broker_contract::{run_all, ContractConfig, Property};
        crate::service::cloud::on_a_fresh_store("simcloud-contract", |store| async move {
            let zoned = SimSettings {
                zones: vec!["az1".into(), "az2".into()],
                unavailable_zones: vec!["az3".into()],
                start_latency: Duration::from_millis(5),
                stop_latency: Duration::ZERO,
                subnets: BTreeMap::new(),
                ..SimSettings::default()
            };
            let zoneless = SimSettings { zones: Vec::new(), unavailable_zones: Vec::new(), ..zoned.clone() };
            for (run, settings) in [("zoned", zoned), ("zoneless", zoneless)] {
                let (ours, theirs) = (format!("m-{run}"), format!("other-{run}"));
                let cloud = SimCloud::new(store.clone(), ours.clone(), settings.clone());
                let stranger = SimCloud::new(store.clone(), theirs.clone(), settings.clone());
                let config =
                    ContractConfig { poll_interval: Duration::from_millis(10), ..ContractConfig::new(ours, theirs) };
                let report = run_all(&cloud, &stranger, config).await.unwrap_or_else(|e| panic!("{run}: {e}"));
                match run {
                    "zoned" => assert!(report.all_passed(), "{report}"),
                    _ => assert_eq!(report.not_supported(), [(Property::ZonesAreHonoured, "zones")], "{report}"),
                }
            }
        });
    }

    /// Constraints pick the cheapest fitting type of the shipped catalogue; a type out of
    /// capacity in a zone makes the same start take the next fitting type there (under a
    /// token of its own); only when every fitting type is out does the start fail
    /// zone-specifically.
    #[test]
    fn constraints_pick_a_type_and_capacity_fails_over_to_the_next_type() {
        crate::service::cloud::on_a_fresh_store("simcloud-types", |store| async move {
            let settings = SimSettings {
                start_latency: Duration::ZERO,
                out_of_capacity: parse_out_of_capacity(&["t3.large:az1".into(), "c5.large:az1".into()]).unwrap(),
                ..SimSettings::default()
            };
            let cloud = SimCloud::new(store.clone(), "m".into(), settings);
            let tags = InstanceTags { model: Some("m".into()), machine: Some(MachineId::new("0")), start: None };
            let shape = crate::model::Constraints { cores: Some(2), mem_mb: Some(8192), ..Default::default() };
            let p = |zone: &str, token: &str, c: &crate::model::Constraints| StartInstanceParams {
                tags: tags.clone(),
                constraints: c.clone(),
                client_token: token.into(),
                ..params(Some(zone))
            };
            let az2 = cloud.start_instance(p("az2", "0/n/1", &shape)).await.unwrap();
            assert_eq!(az2.instance.instance_type.as_deref(), Some("t3.large"));
            let az1 = cloud.start_instance(p("az1", "0/n/2", &shape)).await.unwrap();
            assert_eq!(az1.instance.instance_type.as_deref(), Some("m5.large"), "the next type, same zone");
            assert_eq!(az1.instance.zone.as_deref(), Some("az1"));
            // A repeat of that start (its answer lost) is the same call: the same instance.
            let again = cloud.start_instance(p("az1", "0/n/2", &shape)).await.unwrap();
            assert_eq!(again.instance.id, az1.instance.id);
            let only = crate::model::Constraints { instance_type: Some("c5.large".into()), ..Default::default() };
            let err = cloud.start_instance(p("az1", "0/n/3", &only)).await.unwrap_err();
            assert_eq!(err.kind(), "zone_specific", "{err:?}");
            assert!(err.message().contains("c5.large"), "{err:?}");
            let none = cloud.start_instance(p("az1", "0/n/4", &Default::default())).await.unwrap();
            assert_eq!(none.instance.instance_type, None, "no hardware asked, no default type");
            assert_eq!(cloud.all_records().await.unwrap().len(), 3);
        });
        assert_eq!(parse_out_of_capacity(&["m5.large".into()]), None);
    }

    /// `start_failures`: the first N starts are refused zone-independently and create
    /// nothing, whatever their machine; the next ones start.
    #[test]
    fn the_first_starts_fail_as_injected_then_starts_go_through() {
        crate::service::cloud::on_a_fresh_store("simcloud-faults", |store| async move {
            let settings = SimSettings { start_latency: Duration::ZERO, start_failures: 2, ..SimSettings::default() };
            let cloud = SimCloud::new(store.clone(), "m".into(), settings);
            let start = |machine: &str, token: &str| StartInstanceParams {
                machine: MachineId::new(machine),
                tags: InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None },
                client_token: token.into(),
                ..params(Some("az1"))
            };
            for (n, (machine, token)) in [("0", "0/n/1"), ("1", "1/n/1")].into_iter().enumerate() {
                let err = cloud.start_instance(start(machine, token)).await.unwrap_err();
                assert_eq!(err.kind(), "zone_independent", "{err:?}");
                assert!(err.message().contains(&format!("{} of 2", n + 1)), "{err:?}");
            }
            assert!(cloud.all_records().await.unwrap().is_empty(), "a refused start creates nothing");
            // The clones share the count: it is the cloud's, not a handle's.
            let again = cloud.clone().start_instance(start("0", "0/n/2")).await.unwrap();
            assert_eq!(again.instance.state, crate::model::InstanceState::Running);
            assert_eq!(cloud.all_records().await.unwrap().len(), 1);
        });
    }

    #[test]
    fn starts_outside_the_clouds_available_zones_fail_over() {
        let zones = SimSettings {
            zones: vec!["az1".to_owned(), "az2".to_owned()],
            unavailable_zones: vec!["az3".to_owned()],
            ..SimSettings::default()
        };
        assert_eq!(check_start(&zones, &params(Some("az1"))), Ok(()));
        let err = check_start(&zones, &params(Some("az9"))).unwrap_err();
        assert!(matches!(err, BrokerError::ZoneSpecific { .. }), "{err:?}");
        assert!(err.message().contains("az9"));
        let err = check_start(&zones, &params(Some("az3"))).unwrap_err();
        assert!(matches!(err, BrokerError::ZoneSpecific { .. }) && err.message().contains("unavailable"), "{err:?}");
        assert_eq!(zones.known_zones(), ["az1", "az2", "az3"]);
        let zoneless = SimSettings { zones: Vec::new(), ..SimSettings::default() };
        assert_eq!(check_start(&zoneless, &params(Some("anything"))), Ok(()));
        assert_eq!(check_start(&zones, &params(None)), Ok(()));
    }

    #[test]
    fn placements_derive_their_zones() {
        let settings = SimSettings {
            subnets: [
                ("subnet-az1".to_owned(), vec!["az1".to_owned()]),
                ("wide".to_owned(), vec!["az1".to_owned(), "az3".to_owned()]),
            ]
            .into(),
            ..SimSettings::default()
        };
        let placed = |p: &str| StartInstanceParams { placement: Some(p.to_owned()), ..params(None) };
        assert_eq!(derive_zones(&settings, &params(None)), Ok(Vec::new()));
        assert_eq!(derive_zones(&settings, &placed("zone=az2")), Ok(vec!["az2".to_owned()]));
        assert_eq!(derive_zones(&settings, &placed("subnet=subnet-az1")), Ok(vec!["az1".to_owned()]));
        assert_eq!(derive_zones(&settings, &placed("subnet=wide")).unwrap().len(), 2);
        let e = derive_zones(&settings, &placed("subnet=nope")).unwrap_err();
        assert!(matches!(e, BrokerError::ZoneIndependent { .. }) && e.message().contains("nope"), "{e:?}");
        assert_eq!(SimSettings::default().subnets.get("subnet-az2"), Some(&vec!["az2".to_owned()]));
    }
}
