//! The intent broker: each start's token and parameters written before the call, the
//! unsettled ones repeated, a settled one dropped.

// A scripted broker shared with the test through a std mutex (no actor involved).
#![allow(clippy::disallowed_types)]

use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId};

/// Answers its starts from a script and records every call.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<StartedInstance, BrokerError>>>,
    calls: Mutex<Vec<StartInstanceParams>>,
}

fn started(id: &str) -> Result<StartedInstance, BrokerError> {
    Ok(StartedInstance {
        instance: CloudInstance {
            id: InstanceId::new(id),
            state: InstanceState::Running,
            zone: Some("az1".into()),
            tags: InstanceTags::default(),
            age: None,
            instance_type: None,
            capacity_type: None,
            image: None,
        },
        display_name: String::new(),
    })
}

impl Broker for Scripted {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        self.calls.lock().unwrap().push(params);
        let answer = self.answers.lock().unwrap().pop_front().unwrap_or_else(|| started("i-default"));
        async move { answer }.boxed()
    }
    fn stop_instances(&self, _ids: Vec<InstanceId>) -> BrokerFuture<()> {
        async { Ok(()) }.boxed()
    }
    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        async { Ok(Vec::new()) }.boxed()
    }
    fn release_instances(&self, _ids: Vec<InstanceId>) -> BrokerFuture<()> {
        async { Ok(()) }.boxed()
    }
}

fn params(machine: &str, token: &str) -> StartInstanceParams {
    StartInstanceParams {
        machine: MachineId::new(machine),
        zone: Some("az1".into()),
        constraints: crate::model::Constraints::parse("cores=2 mem=4G").unwrap(),
        placement: None,
        volumes: Vec::new(),
        nonce: format!("machine-{machine}:n"),
        tags: InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None },
        extra_tags: Default::default(),
        client_token: token.into(),
        distribution_group: vec![MachineId::new("7")],
        capacity: Default::default(),
        spot_max_price: None,
    }
}

/// A start whose answer was lost keeps its intent; after a restart (a new broker over the
/// same database) `resume` repeats it with the same token and parameters, then drops it. A
/// settled start (an instance, or a definite refusal) leaves no intent.
#[test]
fn an_unsettled_start_is_repeated_by_its_token_after_a_restart() {
    crate::service::cloud::on_a_fresh_store("intents-resume", |store| async move {
        let before = Arc::new(Scripted::default());
        before.answers.lock().unwrap().extend([
            started("i-1"),
            Err(BrokerError::zone_specific("no capacity in az1")),
            Err(BrokerError::transient("connection reset before the answer")),
        ]);
        let broker = IntentBroker::new(before.clone(), store.clone());
        broker.start_instance(params("1", "tok-1")).await.unwrap();
        broker.start_instance(params("2", "tok-2")).await.unwrap_err();
        let lost = broker.start_instance(params("3", "tok-3")).await.unwrap_err();
        assert!(lost.is_ambiguous());
        let left = store.exec(|s| s.start_intents()).await.unwrap();
        assert_eq!(left.len(), 1, "only the unsettled start is left: {left:?}");

        // The restart: a new broker over the same store repeats it before anything else.
        let after = Arc::new(Scripted::default());
        after.answers.lock().unwrap().push_back(started("i-3"));
        let broker = IntentBroker::new(after.clone(), store.clone());
        assert_eq!(broker.resume().await.unwrap(), 1);
        assert_eq!(*after.calls.lock().unwrap(), vec![params("3", "tok-3")], "same token, same parameters");
        assert!(store.exec(|s| s.start_intents()).await.unwrap().is_empty(), "settled by the repeat");
        assert_eq!(broker.resume().await.unwrap(), 0, "nothing is repeated twice");
    });
}

/// A repeat that fails ambiguously is made again with the same token until it settles; one
/// that keeps failing ambiguously is `Unsettled` after `REPEAT_ATTEMPTS` calls, and its intent
/// stays for the next resume (the provisioner does not run meanwhile). A definite refusal
/// settles it.
#[test]
fn a_repeat_that_fails_ambiguously_is_made_again_and_never_left_behind() {
    crate::service::cloud::on_a_fresh_store("intents-repeat-again", |store| async move {
        for (m, t) in [("1", "tok-1"), ("2", "tok-2")] {
            let text = serde_json::to_string(&params(m, t)).unwrap();
            let machine = MachineId::new(m);
            store.exec(move |s| s.put_start_intent(t, &machine, &text)).await.unwrap();
        }
        let lost = || Err(BrokerError::transient("connection reset before the answer"));
        // Machine 1's repeat is lost twice, then answered; machine 2's is lost every time.
        let cloud = Arc::new(Scripted::default());
        cloud.answers.lock().unwrap().extend([lost(), lost(), started("i-1"), lost(), lost(), lost()]);
        let broker = IntentBroker::new(cloud.clone(), store.clone()).with_repeat_pause(Duration::from_millis(5));
        match broker.resume().await {
            Err(ResumeError::Unsettled { machine, token, attempts, source }) => {
                assert_eq!((machine.as_str(), token.as_str(), attempts), ("2", "tok-2", REPEAT_ATTEMPTS));
                assert!(source.is_ambiguous());
            }
            other => panic!("machine 2's start cannot be settled: {other:?}"),
        }
        let tokens: Vec<String> = cloud.calls.lock().unwrap().iter().map(|p| p.client_token.clone()).collect();
        assert_eq!(tokens, ["tok-1", "tok-1", "tok-1", "tok-2", "tok-2", "tok-2"], "each repeat by its own token");
        let left = store.exec(|s| s.start_intents()).await.unwrap();
        assert_eq!(left.len(), 1, "machine 1's is settled, machine 2's stays: {left:?}");
        assert!(left[0].contains("tok-2"));

        // The cloud answers again: refused, which settles it too.
        let cloud = Arc::new(Scripted::default());
        cloud.answers.lock().unwrap().push_back(Err(BrokerError::zone_specific("no capacity in az1")));
        let broker = IntentBroker::new(cloud.clone(), store.clone());
        assert_eq!(broker.resume().await.unwrap(), 1);
        assert!(store.exec(|s| s.start_intents()).await.unwrap().is_empty());
    });
}

/// The intent is written before the call, fenced: a replica that lost the lease cannot
/// write it, and then makes no call at all (nothing reached the cloud: a definite failure).
#[cfg(feature = "postgres")]
#[test]
fn a_fenced_out_leader_writes_no_intent_and_makes_no_call() {
    let pg = crate::testing::TempPostgres::start("intents-fence").unwrap();
    let url = pg.url().to_owned();
    // The model, and another replica's lease on it, before the store's actor runs.
    use crate::service::store::StoreBackend;
    let model = crate::service::store::PgStore::open(&url).unwrap().model_uuid().unwrap();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .execute(
            "INSERT INTO leader_lease (model_uuid, holder, epoch, expires_at) \
             VALUES ($1, 'replica-b', 2, now() + interval '1 minute')",
            &[&model],
        )
        .unwrap();
    actix_rt::System::new().block_on(async move {
        let store = Store::start_postgres(&url).unwrap();
        let fence = crate::service::store::Fence::new(model, "replica-a", 1);
        store.set_fence(Some(fence)).await.unwrap();
        let inner = Arc::new(Scripted::default());
        let broker = IntentBroker::new(inner.clone(), store.clone());
        let e = broker.start_instance(params("1", "tok-1")).await.unwrap_err();
        assert!(!e.is_ambiguous() && e.to_string().contains("fenced"), "{e}");
        assert!(inner.calls.lock().unwrap().is_empty(), "no cloud call without an intent");
        assert!(store.exec(|s| s.start_intents()).await.unwrap().is_empty());
    });
}
