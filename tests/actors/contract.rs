//! The broker contract suite (`provisioner::testing::broker_contract`) against the fake cloud,
//! zoned and zoneless, and against brokers broken on purpose: each mutant must fail the
//! property it breaks, so the suite is shown to catch what it claims to.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use provisioner::model::{CloudInstance, InstanceId, MachineId};
use provisioner::ports::{BrokerFuture, StartInstanceParams, StartedInstance};
use provisioner::testing::broker_contract::{
    run_all, BrokerContract, ContractConfig, ContractError, Outcome, Property,
};
use provisioner::testing::{FakeBroker, FakeCloud};
use provisioner::Broker;

const OURS: &str = "model-contract";
const THEIRS: &str = "model-stranger";

fn config() -> ContractConfig {
    ContractConfig::new(OURS, THEIRS)
}

/// The zoned fake cloud keeps every promise, with latencies (a paused clock: no real time).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn the_fake_cloud_keeps_the_broker_contract() {
    let cloud = FakeCloud::with_zones(OURS, &["az1", "az2", "az3"]);
    cloud.set_zones(&["az1", "az2"], &["az3"]);
    cloud.set_latency(Duration::from_secs(5), Duration::from_secs(1));
    let report = run_all(&cloud.broker(), &cloud.broker_for(THEIRS), config()).await.unwrap();
    assert!(report.all_passed(), "{report}");
    assert_eq!(report.outcomes.len(), Property::ALL.len());
    // Everything the suite made is stopped again.
    let snap = cloud.snapshot().await;
    assert!(snap.instances.values().all(|i| i.instance.state == provisioner::model::InstanceState::Terminated));
}

/// A zoneless fake cloud passes too, with zones reported as not supported.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_zoneless_fake_cloud_reports_zones_as_not_supported() {
    let cloud = FakeCloud::new(OURS);
    let report = run_all(&cloud.broker(), &cloud.broker_for(THEIRS), config()).await.unwrap();
    assert_eq!(report.not_supported(), [(Property::ZonesAreHonoured, "zones")], "{report}");
}

/// What a mutant gets wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Every call gets a fresh client token: repeats make new instances.
    IgnoresClientTokens,
    /// Lists the other model's instances too.
    ListsForeignInstances,
    /// `release_instances` does nothing.
    ReleaseDoesNothing,
    /// `instances_of_start` matches the machine only, not the nonce.
    LooksUpByMachineOnly,
    /// A stop of an id that is gone fails the call.
    StopRefusesMissingIds,
    /// Starts land in the first zone whatever the params say.
    IgnoresZones,
    /// Never answers a listing (a broker that hangs).
    HangsOnListings,
}

struct Mutant {
    inner: FakeBroker,
    stranger: FakeBroker,
    flaw: Flaw,
    calls: AtomicU32,
}

impl Broker for Mutant {
    fn start_instance(&self, mut params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        if self.flaw == Flaw::IgnoresClientTokens {
            params.client_token = format!("{}#{}", params.client_token, self.calls.fetch_add(1, Ordering::Relaxed));
        }
        if self.flaw == Flaw::IgnoresZones {
            params.zone = Some("az1".into());
        }
        self.inner.start_instance(params)
    }
    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        if self.flaw == Flaw::StopRefusesMissingIds && ids.iter().any(|id| id.as_str().starts_with("i-0")) {
            return Box::pin(async { Err(provisioner::BrokerError::zone_independent("InvalidInstanceID.NotFound")) });
        }
        self.inner.stop_instances(ids)
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let (ours, theirs) = (self.inner.all_instances(), self.stranger.all_instances());
        let flaw = self.flaw;
        Box::pin(async move {
            match flaw {
                Flaw::HangsOnListings => futures::future::pending().await,
                Flaw::ListsForeignInstances => Ok([ours.await?, theirs.await?].concat()),
                _ => ours.await,
            }
        })
    }
    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        if self.flaw != Flaw::LooksUpByMachineOnly {
            return self.inner.instances_of_start(machine, nonce);
        }
        let all = self.inner.all_instances();
        Box::pin(
            async move { Ok(all.await?.into_iter().filter(|i| i.tags.machine.as_ref() == Some(&machine)).collect()) },
        )
    }
    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        if self.flaw == Flaw::ReleaseDoesNothing {
            return Box::pin(async { Ok(()) });
        }
        self.inner.release_instances(ids)
    }
    provisioner::forward_broker!(inner: supports_zones, availability_zones, retag_instance);
}

/// Runs the whole suite against a mutant of the zoned fake cloud; returns its error.
async fn broken(flaw: Flaw) -> ContractError {
    let cloud = FakeCloud::with_zones(OURS, &["az1", "az2"]);
    let mutant = Mutant { inner: cloud.broker(), stranger: cloud.broker_for(THEIRS), flaw, calls: AtomicU32::new(0) };
    let config = ContractConfig { timeout: Duration::from_secs(120), ..config() };
    match run_all(&mutant, &cloud.broker_for(THEIRS), config).await {
        Ok(report) => panic!("a broken broker passed:\n{report}"),
        Err(e) => e,
    }
}

fn says(e: &ContractError, what: &str) -> bool {
    e.to_string().contains(what)
}

/// Each mutant fails the property it breaks, with the error that says how (a hanging broker
/// in bounded time, not never).
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn every_broken_broker_fails_the_property_it_breaks() {
    type Matches = fn(&ContractError) -> bool;
    let cases: [(Flaw, Property, Matches); 7] = [
        (Flaw::IgnoresClientTokens, Property::RepeatedTokenIsIdempotent, |e| says(e, "a repeat of client token")),
        (Flaw::ListsForeignInstances, Property::OnlyOurModelIsListed, |e| says(e, "is listed as ours")),
        (Flaw::ReleaseDoesNothing, Property::ReleaseRemovesIdentity, |e| says(e, "still listed after its release")),
        (Flaw::LooksUpByMachineOnly, Property::InstancesOfStart, |e| says(e, "instances_of_start(")),
        (Flaw::StopRefusesMissingIds, Property::StopTerminates, |e| {
            matches!(e, ContractError::Call { call: "stop_instances", .. })
        }),
        (Flaw::IgnoresZones, Property::ZonesAreHonoured, |e| says(e, "a start into az2 made")),
        (Flaw::HangsOnListings, Property::StartIsTaggedAndListed, |e| matches!(e, ContractError::TimedOut { .. })),
    ];
    for (flaw, property, matches) in cases {
        let err = broken(flaw).await;
        assert_eq!(err.property(), property, "{err}");
        assert!(matches(&err), "{property}: {err:?}");
    }
}

/// One property at a time, as an embedder's `#[test]` per property would; a broker without
/// retags reports it as not supported.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn properties_run_one_at_a_time_and_a_missing_retag_is_reported() {
    struct NoRetag(FakeBroker);
    impl Broker for NoRetag {
        fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
            self.0.start_instance(params)
        }
        fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.0.stop_instances(ids)
        }
        fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
            self.0.all_instances()
        }
        fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.0.release_instances(ids)
        }
    }
    let cloud = FakeCloud::new(OURS);
    let (ours, theirs) = (NoRetag(cloud.broker()), cloud.broker_for(THEIRS));
    let suite = BrokerContract::new(&ours, &theirs, config());
    assert_eq!(suite.check(Property::RetagMovesInstance).await.unwrap(), Outcome::NotSupported("retag_instance"));
    for property in Property::ALL.into_iter().filter(|p| *p != Property::RetagMovesInstance) {
        assert!(suite.check(property).await.is_ok(), "{property}");
    }
}
