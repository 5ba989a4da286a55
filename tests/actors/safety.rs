//! Cloud safety: the client-side rate limiter, jittered backoff, recovery from a crash
//! between a start and its record, and safe harvesting (grace period, cap per pass).

use std::time::Duration;

use provisioner::config::rate_limits::{BucketLimit, RateLimits};
use provisioner::model::InstanceState;
use provisioner::testing::{CloudOp, FakeModel};
use provisioner::{HarvestMode, Machine, MachineId, ProvisionerConfig, ProvisionerEvent};

use crate::support::*;

fn many(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn all_started(ids: &[String]) -> impl Fn(&provisioner::testing::ModelSnapshot) -> bool + '_ {
    move |m| ids.iter().all(|id| instance_of(m, id).is_some())
}

/// 100 machines (and their ids) to start against a cloud allowing 10 starts at once then 2 per
/// second.
fn throttled_hundred(config: ProvisionerConfig) -> (Harness, Vec<String>) {
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.set_rate_limit(RateLimits { start: Some(BucketLimit::new(10, 2.0)), ..RateLimits::unlimited() });
    let ids = many(100);
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    (Harness::new(config, cloud, FakeModel::with_machines(machines(&id_refs))), ids)
}

/// Part 1: 100 starts against a cloud allowing 10 at once then 2 per second (ideal 45 s). The
/// limiter, sized for EC2 (50 at once then 5 per second), learns the cloud's pace: the run
/// ends close to the ideal with few throttled calls, and no machine fails.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn the_limiter_adapts_to_a_throttling_cloud() {
    let (h, ids) = throttled_hundred(ProvisionerConfig { workers: 16, ..test_config() });
    let t0 = actix_rt::time::Instant::now();
    h.until_model(Duration::from_secs(120), all_started(&ids)).await;
    let took = t0.elapsed();
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    let throttled = starts.iter().filter(|c| c.throttled).count();
    assert!(took <= Duration::from_secs(50), "took {took:?} against the 45 s ideal");
    assert!(throttled <= 20, "{throttled} throttled calls");
    assert_eq!(starts.len() - throttled, 100, "one successful start per machine");
    let limiter = h.handle.limiter().await.unwrap();
    let start = limiter.classes.iter().find(|c| c.class == provisioner::config::rate_limits::ApiClass::Start).unwrap();
    assert!(start.rate < 5.0, "the start rate came down from its default: {}", start.rate);
    assert_eq!(start.throttled as usize, throttled);
}

/// Part 1: with the limiter off the same cloud refuses many more calls (the limiter is what
/// keeps them down), yet still no machine fails: a throttled call uses no round.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn without_the_limiter_throttling_costs_calls_but_no_machine() {
    let (h, ids) =
        throttled_hundred(ProvisionerConfig { workers: 16, rate_limits: RateLimits::unlimited(), ..test_config() });
    h.until_model(Duration::from_secs(300), all_started(&ids)).await;
    let cloud = h.cloud().await;
    let throttled = cloud.calls_of(CloudOp::StartInstance).iter().filter(|c| c.throttled).count();
    assert!(throttled > 50, "only {throttled} throttled calls without a client limit");
    assert!(h.handle.limiter().await.unwrap().classes.is_empty());
}

/// Part 1: a client limit within the cloud's is never throttled, and paces calls exactly.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_client_limit_within_the_clouds_is_never_throttled() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_rate_limit(RateLimits { start: Some(BucketLimit::new(2, 1.0)), ..RateLimits::unlimited() });
    let limits = RateLimits { start: Some(BucketLimit::new(2, 1.0)), ..RateLimits::ec2() };
    let ids = many(6);
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let h = Harness::new(
        ProvisionerConfig { rate_limits: limits, ..test_config() },
        cloud,
        FakeModel::with_machines(machines(&id_refs)),
    );
    h.until_model(Duration::from_secs(30), all_started(&ids)).await;
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 6);
    assert!(starts.iter().all(|c| !c.throttled));
    // Two at once, then one per second.
    let secs: Vec<u64> = starts.iter().map(|c| c.at.as_secs()).collect();
    assert_eq!(secs, vec![0, 0, 1, 2, 3, 4]);
}

/// Part 3: a crash after StartInstance returned but before SetInstanceInfo landed. The new
/// incarnation adopts the tagged instance: one start, one instance.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_crash_between_a_start_and_its_record_adopts_the_instance() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(10), Duration::ZERO);
    let model = FakeModel::new(vec![Machine::pending("0")]);
    model.set_write_latency(Duration::from_secs(5));
    let h = Harness::new(test_config(), cloud, model);
    h.run_for(Duration::from_secs(12)).await;
    // The start returned at 10 s; its record is still on its way.
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 1);
    assert_eq!(instance_of(&h.model().await, "0"), None);
    let h = h.restart(test_config());
    let model = h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some()).await;
    h.settle().await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1, "started twice");
    assert_eq!(cloud.live_instances_of(&MachineId::new("0")).len(), 1);
    assert_eq!(instance_of(&model, "0").as_deref(), Some("i-1"));
}

/// Part 4: in mode unknown an unknown instance younger than the grace period is spared and
/// harvested once it has aged past it (on a fresh listing); an old one goes at once.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn young_unknown_instances_wait_out_the_grace_period() {
    let config = ProvisionerConfig { harvest_grace: Duration::from_secs(300), ..with_mode(HarvestMode::Unknown) };
    let cloud = zoneless_cloud();
    cloud.launch_aged("old", None, None, InstanceState::Running, false, OLD);
    cloud.launch_aged("young", None, None, InstanceState::Running, false, Duration::from_secs(100));
    let h = Harness::new(config, cloud, FakeModel::new(Vec::new()));
    h.run_for(Duration::from_secs(10)).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.state_of("old"), Some(InstanceState::Terminated));
    assert_eq!(cloud.state_of("young"), Some(InstanceState::Running));
    // 200 s later it is 300 s old: harvested then, not before.
    h.run_for(Duration::from_secs(185)).await;
    assert_eq!(h.cloud().await.state_of("young"), Some(InstanceState::Running));
    h.run_for(Duration::from_secs(10)).await;
    assert_eq!(h.cloud().await.state_of("young"), Some(InstanceState::Terminated));
    assert_eq!(stops(&h.cloud().await), vec![vec!["old".to_string()], vec!["young".to_string()]]);
    // Each pass that spared it says so (the service counts these as harvest decisions).
    let deferred: Vec<ProvisionerEvent> =
        h.events().await.into_iter().filter(|e| matches!(e, ProvisionerEvent::HarvestDeferred { .. })).collect();
    assert!(!deferred.is_empty(), "no harvest-deferred event");
    assert!(
        deferred.iter().all(|e| *e == ProvisionerEvent::HarvestDeferred { spared_by_grace: 1, held_back_by_cap: 0 }),
        "{deferred:?}"
    );
}

/// Part 4: a harvest pass stops at most `harvest_max_stops` unknown instances; the rest go one
/// pass interval (the resync interval) per batch, however many harvests are asked for
/// meanwhile, and no timer is left once all are gone.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_harvest_pass_stops_at_most_the_cap() {
    let config = ProvisionerConfig {
        harvest_grace: Duration::ZERO,
        harvest_max_stops: 3,
        resync_interval: Duration::from_secs(60),
        ..with_mode(HarvestMode::All)
    };
    let cloud = zoneless_cloud();
    for i in 0..7 {
        cloud.launch_aged(&format!("u-{i}"), None, None, InstanceState::Running, false, OLD);
    }
    let h = Harness::new(config, cloud, FakeModel::new(Vec::new()));
    h.run_for(Duration::from_secs(10)).await;
    assert_eq!(stops(&h.cloud().await), vec![vec!["u-0", "u-1", "u-2"]]);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(stops(&h.cloud().await).len(), 2);
    h.run_for(Duration::from_secs(60)).await;
    let all = stops(&h.cloud().await);
    assert_eq!(all, vec![vec!["u-0", "u-1", "u-2"], vec!["u-3", "u-4", "u-5"], vec!["u-6"]]);
    let held: Vec<usize> = h
        .events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            ProvisionerEvent::HarvestDeferred { held_back_by_cap, .. } => Some(held_back_by_cap),
            _ => None,
        })
        .collect();
    assert_eq!(held.first(), Some(&4), "the first pass held four back: {held:?}");
    assert!(held.contains(&1), "the second pass held one back: {held:?}");
    h.settle().await;
    assert!(h.handle.is_idle().await, "no recheck left pending");
}

/// A start fault whose call makes the instance and then loses its answer (a lost response).
fn lost(machine: &str, times: u32) -> provisioner::testing::Fault {
    provisioner::testing::Fault {
        lost_response: true,
        ..provisioner::testing::Fault::zone_specific(machine, times, "connection reset before the answer")
    }
}

/// Every instance the cloud ever made for `machine`, terminated ones included.
fn ever_made_for(cloud: &provisioner::testing::CloudSnapshot, machine: &str) -> Vec<String> {
    let m = MachineId::new(machine);
    cloud
        .instances
        .values()
        .filter(|i| i.instance.tags.machine.as_ref() == Some(&m))
        .map(|i| i.instance.id.to_string())
        .collect()
}

/// A start whose call made the instance but failed transiently (the answer
/// was lost) is repeated with the same client token, zone and parameters, so the cloud answers
/// with the instance it made: the machine ends with exactly one instance ever made for it.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_lost_answer_is_retried_with_the_same_token_and_zone() {
    let cloud = zoned_cloud(&["az1", "az2", "az3"]);
    cloud.add_fault(lost("0", 1));
    let config = with_retries(3, Duration::from_secs(10));
    let h = Harness::new(config, cloud, FakeModel::new(vec![Machine::pending("0")]));
    let model = h.until_model(Duration::from_secs(120), |m| instance_of(m, "0").is_some()).await;
    let cloud = h.cloud().await;
    let starts = cloud.calls_of(CloudOp::StartInstance);
    assert_eq!(starts.len(), 2, "one lost answer, one repeat");
    let (a, b) = (starts[0].params.as_ref().unwrap(), starts[1].params.as_ref().unwrap());
    assert_eq!(a.client_token, b.client_token, "the repeat reuses the client token");
    assert_eq!(a.zone, b.zone, "and the zone");
    assert_eq!(**a, **b, "and every other parameter");
    assert_eq!(ever_made_for(&cloud, "0"), vec![instance_of(&model, "0").unwrap()]);
    assert!(cloud.duplicates.is_empty(), "{:?}", cloud.duplicates);
}

/// Four lost answers in a row (the issue saw 13 instances for 9 machines on moto): still one
/// instance ever made per machine, each recorded and running.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn lost_answers_four_times_in_a_row_make_one_instance_per_machine() {
    let cloud = zoned_cloud(&["az1", "az2"]);
    let ids = many(9);
    for id in &ids {
        cloud.add_fault(lost(id, 4));
    }
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let config = with_retries(10, Duration::from_secs(1));
    let h = Harness::new(config, cloud, FakeModel::new(id_refs.iter().map(|i| Machine::pending(*i)).collect()));
    let model = h.until_model(Duration::from_secs(600), all_started(&ids)).await;
    let cloud = h.cloud().await;
    for id in &ids {
        let made = ever_made_for(&cloud, id);
        assert_eq!(made, vec![instance_of(&model, id).unwrap()], "machine {id}");
        assert_eq!(cloud.state_of(&made[0]), Some(InstanceState::Running));
    }
    assert!(cloud.duplicates.is_empty(), "{:?}", cloud.duplicates);
}

/// Out of rounds after a lost answer (retry count 0): before giving up, the start looks for an
/// instance tagged for it and keeps the one the lost call made instead of erroring.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn out_of_rounds_after_a_lost_answer_the_start_looks_before_failing() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.add_fault(lost("0", 1));
    let config = with_retries(0, Duration::from_secs(10));
    let h = Harness::new(config, cloud, FakeModel::new(vec![Machine::pending("0")]));
    let model = h.until_model(Duration::from_secs(60), |m| instance_of(m, "0").is_some()).await;
    let cloud = h.cloud().await;
    assert_eq!(cloud.calls_of(CloudOp::StartInstance).len(), 1);
    assert_eq!(ever_made_for(&cloud, "0"), vec![instance_of(&model, "0").unwrap()]);
    assert_eq!(model.machine("0").unwrap().machine.status, provisioner::MachineStatus::Started);
}

/// The machine dies while a start call whose answer will be lost is in flight: the instance
/// that call made is found by its tags and stopped with the machine (default mode), not left
/// running.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn a_machine_that_dies_after_a_lost_answer_takes_its_instance_with_it() {
    let cloud = zoned_cloud(&["az1"]);
    cloud.set_latency(Duration::from_secs(5), Duration::ZERO);
    cloud.add_fault(lost("0", 1));
    let config = with_retries(3, Duration::from_secs(30));
    let h = Harness::new(config, cloud, FakeModel::new(vec![Machine::pending("0")]));
    h.run_for(Duration::from_secs(2)).await;
    assert_eq!(h.cloud().await.calls_of(CloudOp::StartInstance).len(), 1, "the call is in flight");
    h.model.set_life("0", provisioner::Life::Dead);
    let model = h.until_model(Duration::from_secs(300), |m| m.machine("0").unwrap().removed).await;
    let cloud = h.cloud().await;
    let made = ever_made_for(&cloud, "0");
    assert_eq!(made.len(), 1);
    assert_eq!(cloud.state_of(&made[0]), Some(InstanceState::Terminated), "{:?}", model.machine("0"));
}

/// The calls a broker makes on its own (a batched start's tagging) are paced by the same
/// limiter: `start` hands the broker the limiter's gate as its pacer (`pace_follow_ups`); a
/// token of the `stop` class waits its turn in that bucket, and a throttled report slows the
/// class down. Without a client-side limit nothing is handed over.
#[actix_rt::test(system = "provisioner::testing::PausedSystem")]
async fn the_brokers_own_calls_are_paced_by_the_provisioners_limiter() {
    use provisioner::config::rate_limits::ApiClass;
    use provisioner::model::{CloudInstance, InstanceId};
    use provisioner::ports::{Broker, BrokerFuture, Pacer, StartInstanceParams, StartedInstance};
    use std::sync::{Arc, OnceLock};

    /// The fake cloud's broker, keeping the pacer it is handed.
    struct Keeps {
        inner: Arc<dyn Broker>,
        pacer: OnceLock<Arc<dyn Pacer>>,
    }
    impl Broker for Keeps {
        fn pace_follow_ups(&self, pacer: Arc<dyn Pacer>) {
            assert!(self.pacer.set(pacer).is_ok(), "one pacer per start");
        }
        fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
            self.inner.start_instance(params)
        }
        fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.inner.stop_instances(ids)
        }
        fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
            self.inner.all_instances()
        }
        fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.inner.release_instances(ids)
        }
    }

    let cloud = zoned_cloud(&["az1"]);
    let limits = RateLimits { stop: Some(BucketLimit::new(1, 1.0)), ..RateLimits::ec2() };
    let keeps = Arc::new(Keeps { inner: Arc::new(cloud.broker()), pacer: OnceLock::new() });
    let config = ProvisionerConfig { rate_limits: limits, ..test_config() };
    let handle = provisioner::start(config, keeps.clone(), Arc::new(FakeModel::new(Vec::new()).api())).unwrap();
    let pacer = keeps.pacer.get().cloned().expect("the limiter's gate is handed to the broker");
    let t0 = actix_rt::time::Instant::now();
    let first = pacer.token(ApiClass::Stop).await;
    let second = pacer.token(ApiClass::Stop).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(1), "the second waits for the bucket's next token");
    pacer.report(ApiClass::Stop, first, false);
    pacer.report(ApiClass::Stop, second, true);
    actix_rt::time::sleep(Duration::from_millis(10)).await;
    let limiter = handle.limiter().await.unwrap();
    let stop = limiter.classes.iter().find(|c| c.class == ApiClass::Stop).unwrap();
    assert_eq!(stop.throttled, 1, "the throttled report counts");
    assert!(stop.rate < 1.0, "and slows the class down: {}", stop.rate);
    handle.shutdown();

    let unlimited = Arc::new(Keeps { inner: Arc::new(cloud.broker()), pacer: OnceLock::new() });
    let config = ProvisionerConfig { rate_limits: RateLimits::unlimited(), ..test_config() };
    let handle = provisioner::start(config, unlimited.clone(), Arc::new(FakeModel::new(Vec::new()).api())).unwrap();
    assert!(unlimited.pacer.get().is_none(), "no limiter, no pacer");
    handle.shutdown();
}
