use std::collections::BTreeSet;

use super::state::*;
use crate::actors::zones::ZoneBook;
use crate::model::FailOutcome;
use crate::model::ZoneRequest;
use crate::model::{InstanceId, Machine, MachineId, ProvisioningInfo};

fn start(id: &str) -> Job {
    Job::Start(Box::new(StartJob {
        machine: Machine::pending(id),
        info: std::sync::Arc::new(ProvisioningInfo::default()),
        group: Vec::new(),
        adopt: None,
        replaces: None,
        trace: crate::trace::Carried::none(),
    }))
}

fn stop(instance: &str) -> Job {
    Job::Stop(StopJob { instances: vec![InstanceId::new(instance)], machines: Vec::new(), attempt: 0, eager: false })
}

fn release(instance: &str) -> Job {
    Job::Release(ReleaseJob { instances: vec![InstanceId::new(instance)], machines: Vec::new(), attempt: 0 })
}

/// A short name for a job, to compare orders.
fn name(job: &Job) -> String {
    match job {
        Job::Start(s) => format!("start {}", s.machine.id),
        Job::Stop(s) => format!("stop {}", s.instances[0]),
        Job::Release(r) => format!("release {}", r.instances[0]),
    }
}

// ---- PoolBook ---------------------------------------------------------------------------------

#[test]
fn pool_never_runs_more_than_its_size() {
    let mut pool = PoolBook::new(2);
    for i in 0..5 {
        pool.push(start(&i.to_string()));
    }
    assert_eq!(pool.queued(), 5);
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_none(), "a third job while two run");
    assert_eq!(pool.in_flight(), 2);
    assert_eq!(pool.queued(), 3);

    pool.finished();
    assert_eq!(pool.in_flight(), 1);
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_none());

    // Drain: never more than two at once, every job run exactly once.
    let mut ran = 3;
    while pool.queued() > 0 {
        pool.finished();
        while let Some(_job) = pool.take_next() {
            ran += 1;
            assert!(pool.in_flight() <= pool.size());
        }
    }
    assert_eq!(ran, 5);
}

/// With batched starts a worker carries a batch: up to size × batch starts run at once, other
/// jobs still `size`, and no start overtakes a stop waiting for a worker.
#[test]
fn a_batching_pool_runs_a_batch_of_starts_per_worker_never_ahead_of_a_stop() {
    let mut pool = PoolBook::new(2).with_batches(3);
    for i in 0..8 {
        pool.push(start(&i.to_string()));
    }
    let mut ran = 0;
    while pool.take_next().is_some() {
        ran += 1;
    }
    assert_eq!((ran, pool.in_flight()), (6, 6), "two workers, three starts each");
    pool.push(stop("i-1"));
    pool.finished();
    assert!(pool.take_next().is_none(), "six would still fit no stop: it waits for a worker");
    for _ in 0..4 {
        pool.finished();
    }
    assert_eq!(pool.take_next().as_ref().map(name).as_deref(), Some("stop i-1"), "the stop first");
    assert_eq!(pool.take_next().as_ref().map(name).as_deref(), Some("start 6"));
    // Without batching, one start per worker (as before).
    let mut plain = PoolBook::new(2);
    for i in 0..3 {
        plain.push(start(&i.to_string()));
    }
    assert!(plain.take_next().is_some() && plain.take_next().is_some());
    assert!(plain.take_next().is_none());
}

#[test]
fn pool_runs_stops_and_releases_before_queued_starts() {
    let mut pool = PoolBook::new(10);
    pool.push(start("0"));
    pool.push(start("1"));
    pool.push(stop("i-a"));
    pool.push(release("i-b"));
    pool.push(stop("i-c"));
    let order: Vec<String> = std::iter::from_fn(|| pool.take_next()).map(|j| name(&j)).collect();
    assert_eq!(order, ["stop i-a", "release i-b", "stop i-c", "start 0", "start 1"]);
}

#[test]
fn pool_runs_a_stop_queued_behind_starts_as_soon_as_a_worker_frees() {
    let mut pool = PoolBook::new(1);
    pool.push(start("0"));
    pool.push(start("1"));
    assert_eq!(name(&pool.take_next().unwrap()), "start 0");
    pool.push(stop("i-x"));
    assert!(pool.take_next().is_none());
    pool.finished();
    assert_eq!(name(&pool.take_next().unwrap()), "stop i-x");
}

#[test]
fn pool_resize_down_keeps_queued_and_in_flight_jobs() {
    let mut pool = PoolBook::new(3);
    for i in 0..5 {
        pool.push(start(&i.to_string()));
    }
    let mut ran: Vec<String> = (0..3).map(|_| name(&pool.take_next().unwrap())).collect();
    pool.resize(1);
    assert_eq!(pool.size(), 1);
    assert_eq!(pool.in_flight(), 3, "jobs in flight are not dropped");
    assert_eq!(pool.queued(), 2, "queued jobs are not dropped");
    assert!(pool.take_next().is_none());

    pool.finished();
    pool.finished();
    assert_eq!(pool.in_flight(), 1);
    assert!(pool.take_next().is_none(), "still at the new limit");

    while pool.queued() > 0 {
        pool.finished();
        let job = pool.take_next().expect("a free worker takes the next job");
        ran.push(name(&job));
        assert_eq!(pool.in_flight(), 1);
    }
    let all: BTreeSet<String> = ran.iter().cloned().collect();
    assert_eq!(ran.len(), 5);
    assert_eq!(all, (0..5).map(|i| format!("start {i}")).collect::<BTreeSet<_>>());
}

#[test]
fn pool_resize_up_lets_more_run() {
    let mut pool = PoolBook::new(1);
    for i in 0..4 {
        pool.push(start(&i.to_string()));
    }
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_none());
    pool.resize(3);
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_some());
    assert!(pool.take_next().is_none());
    assert_eq!(pool.in_flight(), 3);
    assert_eq!(pool.queued(), 1);
}

#[test]
fn pool_finished_never_goes_below_zero() {
    let mut pool = PoolBook::new(1);
    pool.finished();
    assert_eq!(pool.in_flight(), 0);
    pool.push(start("0"));
    assert!(pool.take_next().is_some());
    assert_eq!(pool.in_flight(), 1);
}

// ---- Attempts ---------------------------------------------------------------------------------

/// What a simulated start did.
#[derive(Debug, Default)]
struct Run {
    /// Every StartInstance call, with the zone it was given.
    calls: Vec<Option<String>>,
    fail_overs: u32,
    new_rounds: u32,
    backoffs: u32,
}

/// Runs the start procedure's loop (as `workers::start::run_start` does) against a real
/// `ZoneBook` and a cloud whose every call fails with `failure(call_number)`, until the
/// failure is final.
fn simulate(count: u32, zones: &[&str], mut failure: impl FnMut(usize) -> FailureKind) -> Run {
    let mut book = ZoneBook::new(42);
    book.update_zones(&zones.iter().map(|z| ((*z).to_owned(), true)).collect::<Vec<_>>());
    let machine = MachineId::new("0");
    let mut attempts = Attempts::new(count);
    let mut run = Run::default();
    loop {
        assert!(run.calls.len() < 10_000, "the start never gives up");
        let zone = book.choose(&machine, ZoneRequest::default()).expect("a suitable zone");
        run.calls.push(zone.clone());
        // A zone-specific error without a zone counts as independent (as in run_start).
        let kind = match failure(run.calls.len()) {
            FailureKind::Zone if zone.is_none() => FailureKind::Independent,
            k => k,
        };
        let mut step = attempts.on_failure(kind);
        if step == Step::MarkZone {
            step = attempts.on_zone_outcome(book.mark_failed(&machine, zone.as_deref().unwrap()));
        } else {
            book.release_reservation(&machine);
        }
        match step {
            Step::Final => break,
            Step::FailOver => run.fail_overs += 1,
            Step::NewRound => run.new_rounds += 1,
            Step::Backoff => run.backoffs += 1,
            Step::MarkZone => panic!("zone failure left unresolved"),
            Step::OnDemand => panic!("an on-demand start never falls back"),
        }
    }
    book.release(&machine);
    run
}

#[test]
fn attempts_without_zones_make_count_plus_one_calls() {
    for n in 0..6 {
        let run = simulate(n, &[], |_| FailureKind::Independent);
        assert_eq!(run.calls.len(), n as usize + 1, "count {n}");
        assert_eq!(run.new_rounds, n);
        assert!(run.calls.iter().all(Option::is_none));
        // A "zone-specific" error on a zoneless cloud is just another failure.
        let run = simulate(n, &[], |_| FailureKind::Zone);
        assert_eq!(run.calls.len(), n as usize + 1, "count {n}, zone errors without zones");
    }
}

#[test]
fn attempts_with_zones_make_count_times_zones_plus_one_calls() {
    let all = ["az1", "az2", "az3", "az4"];
    for z in 1..=all.len() {
        for n in 0..5u32 {
            let run = simulate(n, &all[..z], |_| FailureKind::Zone);
            assert_eq!(run.calls.len(), n as usize * z + 1, "count {n}, {z} zones");
            assert_eq!(run.new_rounds, n, "one round per pass over the zones");
            assert_eq!(run.fail_overs as usize, n as usize * (z - 1));
            // Within each round every eligible zone is tried exactly once.
            for round in run.calls[..n as usize * z].chunks(z) {
                let distinct: BTreeSet<&Option<String>> = round.iter().collect();
                assert_eq!(distinct.len(), z, "count {n}, {z} zones: a zone was retried within a round: {round:?}");
                assert!(round.iter().all(Option::is_some));
            }
        }
    }
}

#[test]
fn attempts_with_independent_failures_use_a_round_per_call_even_with_zones() {
    let run = simulate(2, &["az1", "az2", "az3"], |_| FailureKind::Independent);
    assert_eq!(run.calls.len(), 3);
    assert_eq!(run.fail_overs, 0);
    assert_eq!(run.new_rounds, 2);
}

#[test]
fn throttled_failures_never_consume_rounds() {
    let mut a = Attempts::new(2);
    for i in 1..=5 {
        assert_eq!(a.on_failure(FailureKind::Throttled), Step::Backoff);
        assert_eq!(a.throttled(), i);
        assert_eq!(a.rounds_left(), 2);
    }
    // Even with no rounds left, throttling only waits.
    let mut a = Attempts::new(0);
    assert_eq!(a.on_failure(FailureKind::Throttled), Step::Backoff);
    assert_eq!(a.rounds_left(), 0);

    // Every other call throttled: still N+1 real failures, plus one throttled call before each.
    for n in 0..4u32 {
        let run =
            simulate(n, &[], |call| if call % 2 == 1 { FailureKind::Throttled } else { FailureKind::Independent });
        assert_eq!(run.backoffs, n + 1);
        assert_eq!(run.calls.len(), 2 * (n as usize + 1), "count {n}");
        assert_eq!(run.new_rounds, n);
    }
    // Throttling between zone fail-overs neither uses a round nor marks the zone.
    let run =
        simulate(1, &["az1", "az2"], |call| if call % 3 == 0 { FailureKind::Throttled } else { FailureKind::Zone });
    let real = run.calls.len() - run.backoffs as usize;
    assert_eq!(real, 2 + 1, "N·Z+1 real calls, throttled ones aside");
}

#[test]
fn count_zero_makes_the_first_failure_final_even_with_zones_left() {
    let mut a = Attempts::new(0);
    assert_eq!(a.on_failure(FailureKind::Zone), Step::Final);
    let mut a = Attempts::new(0);
    assert_eq!(a.on_failure(FailureKind::Independent), Step::Final);

    let run = simulate(0, &["az1", "az2", "az3"], |_| FailureKind::Zone);
    assert_eq!(run.calls.len(), 1);
    assert_eq!(run.fail_overs, 0);
}

#[test]
fn attempts_zone_failure_asks_the_allocator_and_follows_its_answer() {
    let mut a = Attempts::new(1);
    assert_eq!(a.on_failure(FailureKind::Zone), Step::MarkZone);
    assert_eq!(a.rounds_left(), 1, "marking a zone uses no round by itself");
    assert_eq!(a.on_zone_outcome(FailOutcome::TryAnotherZone), Step::FailOver);
    assert_eq!(a.rounds_left(), 1, "failing over uses no round");
    assert_eq!(a.on_failure(FailureKind::Zone), Step::MarkZone);
    assert_eq!(a.on_zone_outcome(FailOutcome::RoundExhausted), Step::NewRound);
    assert_eq!(a.rounds_left(), 0);
    assert_eq!(a.on_failure(FailureKind::Zone), Step::Final);
}

#[test]
fn a_zone_that_did_not_answer_is_the_zones_failure_and_never_repeated_in_place() {
    use crate::ports::BrokerError;
    let unreachable = BrokerError::zone_unreachable("member az1 did not answer in 30s");
    assert_eq!(FailureKind::of(&unreachable, Some("az1")), FailureKind::Zone);
    assert!(!repeats_in_place(&unreachable, Some("az1")), "repeating it would hang again: fail over");
    // Zoneless: nowhere else to go, so it is repeated as a transient failure is.
    assert_eq!(FailureKind::of(&unreachable, None), FailureKind::Independent);
    assert!(repeats_in_place(&unreachable, None));
    // The other kinds keep their rules.
    let transient = BrokerError::transient("reset");
    assert!(repeats_in_place(&transient, Some("az1")));
    assert_eq!(FailureKind::of(&transient, Some("az1")), FailureKind::Independent);
    assert!(!repeats_in_place(&BrokerError::zone_specific("capacity"), Some("az1")));
    assert_eq!(FailureKind::of(&BrokerError::throttled("slow"), Some("az1")), FailureKind::Throttled);
}

#[test]
fn independent_failure_uses_a_round() {
    let mut a = Attempts::new(2);
    assert_eq!(a.on_failure(FailureKind::Independent), Step::NewRound);
    assert_eq!(a.rounds_left(), 1);
    assert_eq!(a.on_failure(FailureKind::Independent), Step::NewRound);
    assert_eq!(a.rounds_left(), 0);
    assert_eq!(a.on_failure(FailureKind::Independent), Step::Final);
}

#[test]
fn an_eager_stop_runs_even_when_every_worker_is_busy() {
    let mut pool = PoolBook::new(1);
    pool.push(start("0"));
    assert!(pool.take_next().is_some());
    pool.push(Job::Stop(StopJob {
        instances: vec![InstanceId::new("i-9")],
        machines: Vec::new(),
        attempt: 0,
        eager: true,
    }));
    pool.push(stop("i-1"));
    assert!(matches!(pool.take_next(), Some(Job::Stop(StopJob { eager: true, .. }))), "the eager stop waited");
    assert!(pool.take_next().is_none(), "an ordinary stop jumped the limit too");
    assert_eq!(pool.in_flight(), 2);
}

/// A release is final: a release never waits for a free worker (a restart must not
/// find its decision undone), nor does an eager stop queued behind a plain one.
#[test]
fn pool_runs_releases_and_eager_stops_even_when_every_worker_is_busy() {
    let mut pool = PoolBook::new(1);
    pool.push(start("0"));
    assert_eq!(pool.take_next().map(|j| name(&j)).as_deref(), Some("start 0"));
    pool.push(stop("i-a"));
    pool.push(release("i-b"));
    pool.push(Job::Stop(StopJob {
        eager: true,
        ..StopJob { instances: vec![InstanceId::new("i-c")], machines: Vec::new(), attempt: 0, eager: false }
    }));
    assert_eq!(pool.take_next().map(|j| name(&j)).as_deref(), Some("release i-b"));
    assert_eq!(pool.take_next().map(|j| name(&j)).as_deref(), Some("stop i-c"));
    assert!(pool.take_next().is_none(), "the plain stop waits for a worker");
    assert_eq!(pool.in_flight(), 3);
    pool.finished();
    pool.finished();
    pool.finished();
    assert_eq!(pool.take_next().map(|j| name(&j)).as_deref(), Some("stop i-a"));
}

#[test]
fn an_outcome_names_the_parked_instance_its_start_gave_up() {
    let given = Some(GivenUp { instance: InstanceId::new("parked"), retired: MachineId::new("9") });
    let failed = JobOutcome::StartFailed {
        machine: MachineId::new("0"),
        error: WorkerError::Cloud(crate::ports::BrokerError::zone_independent("no")),
        retired: Some(MachineId::new("9")),
        orphan: None,
        given_up: None,
        zone: None,
    };
    match failed.with_given_up(given.clone()) {
        JobOutcome::StartFailed { given_up, retired, .. } => {
            assert_eq!(given_up, given);
            assert_eq!(retired, Some(MachineId::new("9")));
        }
        other => panic!("{other:?}"),
    }
    let abandoned = JobOutcome::StartAbandoned { machine: MachineId::new("0"), given_up: None };
    assert_eq!(abandoned.clone().with_given_up(None), abandoned);
}

#[test]
fn a_failed_start_carries_its_cause_and_prints_the_status_line() {
    use crate::model::ZoneError;
    use crate::ports::{BrokerError, BrokerErrorKind, ModelError};
    let cases = [
        (WorkerError::Cloud(BrokerError::zone_independent("quota exceeded")), "quota exceeded"),
        (WorkerError::Cloud(BrokerError::zone_specific("no capacity")), "no capacity"),
        (WorkerError::DeriveZones(BrokerError::transient("timeout")), "deriving availability zones: timeout"),
        (
            WorkerError::NoZone(ZoneError::NoSuitableZone(MachineId::new("3"))),
            "suitable availability zone for machine 3 not found",
        ),
        (
            WorkerError::Lookup(BrokerError::throttled("slow down")),
            "cannot tell whether the cloud made an instance for this start: throttled: slow down",
        ),
        (
            WorkerError::Record { instance: InstanceId::new("i-1"), source: ModelError::Other("db locked".into()) },
            "cannot record instance i-1: db locked",
        ),
        (
            WorkerError::Stopped { actor: "zone allocator", source: actix::MailboxError::Closed },
            "zone allocator unavailable: Mailbox has closed",
        ),
        (WorkerError::Unresolved, "internal: zone failure left unresolved"),
    ];
    for (error, text) in &cases {
        assert_eq!(error.to_string(), *text);
    }
    let kinds: Vec<Option<BrokerErrorKind>> = cases.iter().map(|(e, _)| e.kind()).collect();
    assert_eq!(
        kinds,
        [
            Some(BrokerErrorKind::ZoneIndependent),
            Some(BrokerErrorKind::ZoneSpecific),
            Some(BrokerErrorKind::Transient),
            None,
            Some(BrokerErrorKind::Throttled),
            None,
            None,
            None,
        ]
    );
    // The cause is kept as the source, not flattened into the text.
    let record = &cases[5].0;
    let source = std::error::Error::source(record).map(ToString::to_string);
    assert_eq!(source.as_deref(), Some("db locked"));
    assert_eq!(cases[0].0.broker_error(), Some(&BrokerError::zone_independent("quota exceeded")));
}

mod batching {
    use super::super::batch::{Answer, BatchBook, Reply, MAX_REPLAYS};
    use crate::model::{CloudInstance, Constraints, InstanceId, InstanceState, InstanceTags, MachineId};
    use crate::ports::{BrokerError, StartInstanceParams, StartedInstance};

    fn call(machine: &str, zone: &str, mem: Option<u64>) -> StartInstanceParams {
        StartInstanceParams {
            machine: MachineId::new(machine),
            zone: Some(zone.into()),
            constraints: Constraints { mem_mb: mem, ..Constraints::default() },
            placement: None,
            volumes: Vec::new(),
            nonce: format!("n-{machine}"),
            tags: InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None },
            extra_tags: Default::default(),
            client_token: format!("{machine}/n-{machine}/0"),
            distribution_group: Vec::new(),
            capacity: Default::default(),
            spot_max_price: None,
        }
    }

    fn started(id: &str, machine: &str) -> Result<StartedInstance, BrokerError> {
        Ok(StartedInstance {
            instance: CloudInstance {
                id: InstanceId::new(id),
                state: InstanceState::Running,
                zone: Some("az1".into()),
                tags: InstanceTags { model: Some("m".into()), machine: Some(MachineId::new(machine)), start: None },
                age: None,
                instance_type: None,
                capacity_type: None,
                image: None,
            },
            display_name: String::new(),
        })
    }

    /// The replies of a delivered answer, by the member's name.
    fn delivered(answer: Answer<&'static str>) -> Vec<(&'static str, Reply)> {
        match answer {
            Answer::Deliver(replies) => replies,
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    #[test]
    fn starts_of_one_zone_and_shape_share_a_call_up_to_the_size() {
        let mut book = BatchBook::new(2);
        let a = book.join(call("0", "az1", None), "0");
        let b = book.join(call("1", "az1", None), "1");
        let other_zone = book.join(call("2", "az2", None), "2");
        let other_shape = book.join(call("3", "az1", Some(4096)), "3");
        let full = book.join(call("4", "az1", None), "4");
        assert!(a.opened && !b.opened, "the second start of az1 joins the first's batch");
        assert_eq!(a.batch, b.batch);
        assert!(other_zone.opened && other_zone.batch != a.batch, "another zone is another call");
        assert!(other_shape.opened && other_shape.batch != a.batch, "another shape is another call");
        assert!(full.opened && full.batch != a.batch, "a full batch takes no more members");
        assert_eq!(book.open(), 4);

        let params = book.close(a.batch).expect("open batch");
        let machines: Vec<&str> = params.members.iter().map(|m| m.machine.as_str()).collect();
        assert_eq!(machines, ["0", "1"], "members in launch order: the order they joined");
        assert_eq!(params.client_token, "0/n-0/0+2", "one token: the first member's, and the size");
        assert_eq!(params.zone.as_deref(), Some("az1"));
        assert_eq!(params.members[1].tags.machine, Some(MachineId::new("1")), "tags per machine");
        assert_eq!((book.open(), book.in_flight()), (3, 1), "the intent is recorded before the call");
        // A closed batch takes no more members: a new start opens another.
        let late = book.join(call("5", "az1", None), "5");
        assert_eq!(late.batch, full.batch, "it joins the batch still open, not the closed one");
        assert!(book.close(a.batch).is_none(), "closed once");
    }

    /// A book with one batch of `n` machines (0, 1, ...) in az1, closed: the book and the batch.
    fn closed_in_az1(n: usize) -> (BatchBook<&'static str>, u64) {
        const IDS: [&str; 3] = ["0", "1", "2"];
        let mut book = BatchBook::new(10);
        let j = book.join(call(IDS[0], "az1", None), IDS[0]);
        for id in &IDS[1..n] {
            book.join(call(id, "az1", None), id);
        }
        book.close(j.batch);
        (book, j.batch)
    }

    #[test]
    fn a_partial_launch_fails_the_rest_zone_specifically() {
        let (mut book, batch) = closed_in_az1(3);
        // The cloud answered two members of three (a broker answering fewer entries than members).
        let replies = delivered(book.answered(batch, Ok(vec![started("i-1", "0"), started("i-2", "1")])));
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0].1.result, started("i-1", "0"));
        assert_eq!(replies[1].1.result, started("i-2", "1"));
        assert_eq!(replies[2].0, "2");
        let err = replies[2].1.result.clone().unwrap_err();
        assert_eq!(err, BrokerError::zone_specific("the cloud launched 2 of 3 instances of a batched start"));
        assert!(replies.iter().all(|(_, r)| !r.maybe_made), "a definite answer");
        assert_eq!(book.in_flight(), 0);
    }

    #[test]
    fn a_members_own_ambiguous_failure_tells_that_member_only_to_look() {
        let (mut book, batch) = closed_in_az1(3);
        // The call succeeded; member 1's instance was made but could not be tagged.
        let untagged = Err(BrokerError::transient("instance i-2 made but not tagged"));
        let answer = vec![started("i-1", "0"), untagged.clone(), Err(BrokerError::zone_specific("partial"))];
        let replies = delivered(book.answered(batch, Ok(answer)));
        let looks: Vec<bool> = replies.iter().map(|(_, r)| r.maybe_made).collect();
        assert_eq!(looks, [false, true, false], "only the member whose instance may exist looks for it");
        assert_eq!(replies[1].1.result, untagged);
    }

    #[test]
    fn an_ambiguous_failure_replays_the_same_intent_then_tells_members_to_look() {
        let mut book = BatchBook::new(10);
        let j = book.join(call("0", "az1", None), "0");
        book.join(call("1", "az1", None), "1");
        let first = book.close(j.batch).expect("open");
        for attempt in 0..MAX_REPLAYS {
            match book.answered(j.batch, Err(BrokerError::transient("reset"))) {
                Answer::Replay { attempt: a } => assert_eq!(a, attempt),
                other => panic!("expected a replay, got {other:?}"),
            }
            assert_eq!(book.replay(j.batch), Some(first.clone()), "same token, same members, same order");
        }
        // A throttled replay tells nothing: replayed again, not counted.
        assert!(matches!(book.answered(j.batch, Err(BrokerError::throttled("slow"))), Answer::Replay { attempt: 0 }));
        let replies = delivered(book.answered(j.batch, Err(BrokerError::transient("reset"))));
        assert!(replies.iter().all(|(_, r)| r.maybe_made && r.result == Err(BrokerError::transient("reset"))));
        assert!(matches!(book.answered(j.batch, Ok(Vec::new())), Answer::Unknown), "answered once");
    }

    #[test]
    fn a_zone_that_did_not_answer_is_not_replayed_and_every_member_looks() {
        let (mut book, batch) = closed_in_az1(2);
        let err = BrokerError::zone_unreachable("member az1 did not answer");
        let replies = delivered(book.answered(batch, Err(err.clone())));
        assert_eq!(replies.len(), 2, "answered at once, not replayed into the frozen zone");
        assert!(replies.iter().all(|(_, r)| r.maybe_made && r.result == Err(err.clone())));
        // On a zoneless cloud there is no other zone: replayed as a transient failure is.
        let j = book.join(StartInstanceParams { zone: None, ..call("2", "az1", None) }, "2");
        let zoneless = book.close(j.batch).expect("open");
        assert_eq!(zoneless.zone, None);
        assert!(matches!(book.answered(j.batch, Err(err)), Answer::Replay { attempt: 0 }));
    }

    #[test]
    fn a_replay_that_succeeds_delivers_what_the_first_call_made() {
        let mut book = BatchBook::new(10);
        let j = book.join(call("0", "az1", None), "0");
        book.close(j.batch);
        assert!(matches!(book.answered(j.batch, Err(BrokerError::transient("lost"))), Answer::Replay { .. }));
        let replies = delivered(book.answered(j.batch, Ok(vec![started("i-1", "0")])));
        assert_eq!(
            replies,
            vec![(
                "0",
                Reply { result: started("i-1", "0"), maybe_made: false, with: vec![MachineId::new("0")].into() }
            )]
        );
    }

    #[test]
    fn a_definite_failure_goes_to_every_member_and_is_not_replayed() {
        let (mut book, batch) = closed_in_az1(2);
        let replies = delivered(book.answered(batch, Err(BrokerError::throttled("RequestLimitExceeded"))));
        assert_eq!(replies.len(), 2);
        assert!(replies
            .iter()
            .all(|(_, r)| !r.maybe_made && r.result == Err(BrokerError::throttled("RequestLimitExceeded"))));
        // After an ambiguous failure, a definite refusal of the replay still leaves it unsure.
        let j = book.join(call("2", "az1", None), "2");
        book.close(j.batch);
        book.answered(j.batch, Err(BrokerError::transient("lost")));
        let replies = delivered(book.answered(j.batch, Err(BrokerError::zone_specific("no capacity"))));
        assert!(replies[0].1.maybe_made, "the first call may have made it: look before a new token");
    }
}

/// A start that may give its worker back: freed then ended, or ended before the pool heard it
/// freed, each counted once.
#[test]
fn a_start_giving_its_worker_back_is_counted_once_whichever_end_comes_first() {
    use std::cell::Cell;
    let mut pool = PoolBook::new(1);
    pool.push(start("0"));
    pool.push(start("1"));
    assert!(pool.take_next().is_some());
    let first = Cell::new(StartSlot::Held);
    assert!(pool.release_start(&first), "done with the cloud: its worker is freed");
    assert_eq!((pool.in_flight(), pool.recording()), (0, 1));
    assert!(pool.take_next().is_some(), "the next start takes the worker while the first records");
    assert!(!pool.release_start(&first), "freed once");
    pool.start_ended(Some(&first));
    assert_eq!((pool.in_flight(), pool.recording()), (1, 0));
    // Ended before its freeing was heard: its worker is freed by its end, and only then.
    let second = Cell::new(StartSlot::Held);
    pool.start_ended(Some(&second));
    assert!(!pool.release_start(&second));
    assert_eq!((pool.in_flight(), pool.recording()), (0, 0));
}

mod capacity {
    use super::super::state::{Attempts, CapacityPlan, CapacityStep, Step, WorkerError};
    use crate::model::{CapacityPreference, CapacityType, FailOutcome, ZoneRequest};
    use crate::ports::BrokerError;

    fn no_spot() -> BrokerError {
        BrokerError::zone_specific("InsufficientInstanceCapacity: no spot")
    }

    #[test]
    fn each_preference_asks_for_its_first_capacity_type() {
        assert_eq!(CapacityPlan::new(CapacityPreference::OnDemand).capacity(), CapacityType::OnDemand);
        assert_eq!(CapacityPlan::new(CapacityPreference::Spot).capacity(), CapacityType::Spot);
        assert_eq!(CapacityPlan::new(CapacityPreference::PreferSpot).capacity(), CapacityType::Spot);
    }

    #[test]
    fn spot_calls_have_a_shape_of_their_own_for_the_capacity_memory() {
        let base = ZoneRequest { shape: Some("arch=amd64".into()), ..ZoneRequest::default() };
        let mut plan = CapacityPlan::new(CapacityPreference::PreferSpot);
        assert_eq!(plan.request(&base).shape.as_deref(), Some("arch=amd64 capacity=spot"));
        plan.fall_back();
        assert_eq!(plan.request(&base), base, "on-demand keeps the shape it always had");
        assert_eq!(CapacityPlan::new(CapacityPreference::OnDemand).request(&base), base);
    }

    #[test]
    fn prefer_spot_tries_every_zone_then_goes_on_demand_using_no_round() {
        let mut plan = CapacityPlan::new(CapacityPreference::PreferSpot);
        let mut attempts = Attempts::new(0);
        assert_eq!(plan.on_failure(&no_spot(), Some("az1")), CapacityStep::MarkZone, "even with no round left");
        assert_eq!(plan.on_zone_outcome(FailOutcome::TryAnotherZone, &mut attempts), Step::FailOver);
        assert_eq!(plan.on_zone_outcome(FailOutcome::RoundExhausted, &mut attempts), Step::OnDemand);
        plan.fall_back();
        assert_eq!(plan.capacity(), CapacityType::OnDemand);
        assert_eq!(plan.on_failure(&no_spot(), Some("az1")), CapacityStep::Usual, "on-demand: the usual arithmetic");
        assert_eq!(attempts.rounds_left(), 0);
    }

    #[test]
    fn prefer_spot_goes_on_demand_at_once_on_a_definite_refusal_any_zone_would_share() {
        let plan = CapacityPlan::new(CapacityPreference::PreferSpot);
        assert_eq!(plan.on_failure(&BrokerError::no_spot(), Some("az1")), CapacityStep::OnDemand);
        // A zoneless cloud's capacity refusal is every zone's.
        assert_eq!(plan.on_failure(&no_spot(), None), CapacityStep::OnDemand);
        // Throttling and ambiguous failures are not spot's to judge.
        assert_eq!(plan.on_failure(&BrokerError::throttled("slow down"), Some("az1")), CapacityStep::Usual);
        assert_eq!(plan.on_failure(&BrokerError::transient("reset"), Some("az1")), CapacityStep::Usual);
        // A zone that did not answer is the zone's.
        assert_eq!(plan.on_failure(&BrokerError::zone_unreachable("frozen"), Some("az1")), CapacityStep::MarkZone);
    }

    #[test]
    fn spot_never_falls_back_and_ends_saying_why() {
        let plan = CapacityPlan::new(CapacityPreference::Spot);
        let mut attempts = Attempts::new(1);
        assert_eq!(plan.on_failure(&no_spot(), Some("az1")), CapacityStep::MarkZone);
        assert_eq!(plan.on_failure(&BrokerError::no_spot(), Some("az1")), CapacityStep::Usual, "uses a round");
        // Every zone refused: a round is used; with none left the failure is final.
        assert_eq!(plan.on_zone_outcome(FailOutcome::RoundExhausted, &mut attempts), Step::NewRound);
        assert_eq!(plan.on_zone_outcome(FailOutcome::RoundExhausted, &mut attempts), Step::Final);
        let err = plan.final_error(no_spot());
        assert!(matches!(err, WorkerError::NoSpotCapacity(_)));
        assert_eq!(err.to_string(), "no spot capacity in any allowed zone: InsufficientInstanceCapacity: no spot");
        // Only a refusal says so: an ambiguous last failure is the cloud's own.
        assert!(matches!(plan.final_error(BrokerError::transient("reset")), WorkerError::Cloud(_)));
    }

    #[test]
    fn on_demand_failures_are_never_spot_ones() {
        let plan = CapacityPlan::new(CapacityPreference::OnDemand);
        assert_eq!(plan.on_failure(&no_spot(), Some("az1")), CapacityStep::Usual);
        assert!(matches!(plan.final_error(no_spot()), WorkerError::Cloud(_)));
    }
}

#[test]
fn a_hand_overs_replacement_start_goes_ahead_of_other_starts() {
    let mut pool = PoolBook::new(1);
    pool.push(start("a"));
    pool.push(start("b"));
    let Job::Start(mut r) = start("r") else { unreachable!() };
    r.replaces = Some(InstanceId::new("i-1"));
    pool.push(Job::Start(r));
    pool.push(stop("i-9"));
    let order: Vec<String> = std::iter::from_fn(|| {
        let job = pool.take_next()?;
        pool.finished();
        Some(name(&job))
    })
    .collect();
    assert_eq!(order, ["stop i-9", "start r", "start a", "start b"], "stops first, then the replacement");

    // With every worker busy, a replacement still goes (ordinary starts wait).
    let mut pool = PoolBook::new(1);
    pool.push(start("a"));
    assert!(pool.take_next().is_some());
    pool.push(start("b"));
    assert!(pool.take_next().is_none(), "the pool is full");
    let Job::Start(mut r) = start("r") else { unreachable!() };
    r.replaces = Some(InstanceId::new("i-1"));
    pool.push(Job::Start(r));
    assert_eq!(pool.take_next().map(|j| name(&j)).as_deref(), Some("start r"));
    assert!(pool.take_next().is_none(), "b still waits");
}

/// The start procedure's plain run, driven by hand: every question answered here, in order,
/// no actix.
mod start_run {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::run::{StartAnswer, StartAsk, StartRun, StartSettings};
    use super::super::state::{JobOutcome, StartJob, WorkerError};
    use crate::config::{Backoff, RetryStrategy};
    use crate::model::{
        CloudInstance, FailOutcome, InstanceId, InstanceState, InstanceStatus, InstanceTags, Machine, MachineId,
        ProvisioningInfo, Reusable, ZoneError,
    };
    use crate::ports::{BrokerError, ModelError, StartInstanceParams, StartedInstance};

    const NONCE: &str = "host:n1";

    fn settings(count: u32) -> StartSettings {
        StartSettings {
            mutations: crate::config::Mutations::default(),
            retry: RetryStrategy { count, delay: Duration::from_secs(1), max_delay: Duration::from_secs(10) },
            backoff: Backoff::default(),
            supports_zones: true,
            claim: false,
            batched: false,
            spot_max_price: None,
            model_uuid: "uuid".into(),
        }
    }

    fn job() -> StartJob {
        StartJob {
            machine: Machine::pending("0"),
            info: Arc::new(ProvisioningInfo::default()),
            group: Vec::new(),
            adopt: None,
            replaces: None,
            trace: crate::trace::Carried::none(),
        }
    }

    fn instance(id: &str, state: InstanceState) -> CloudInstance {
        CloudInstance {
            id: InstanceId::new(id),
            state,
            zone: Some("az1".into()),
            tags: InstanceTags { model: Some("uuid".into()), machine: Some(MachineId::new("0")), start: None },
            age: None,
            instance_type: None,
            capacity_type: None,
            image: None,
        }
    }

    fn started(id: &str, state: InstanceState) -> StartAnswer {
        let instance = instance(id, state);
        StartAnswer::Called { result: Ok(StartedInstance { instance, display_name: String::new() }), maybe_made: false }
    }

    /// Answers `answer`, then every wait, status write and release the run asks next (each
    /// only done), up to its next other question.
    fn answer(run: &mut StartRun, answer: StartAnswer) -> StartAsk {
        let mut ask = run.answer(answer);
        while matches!(
            ask,
            StartAsk::Sleep(_)
                | StartAsk::SendInstanceStatus { .. }
                | StartAsk::SetInstanceStatus { .. }
                | StartAsk::ReleaseReservation
                | StartAsk::FreeWorker
        ) {
            ask = run.answer(StartAnswer::Done);
        }
        ask
    }

    /// A run up to its first cloud call, into `az1`, with every answer the usual one.
    fn first_call(settings: StartSettings) -> (StartRun, StartInstanceParams) {
        let (mut run, ask) = StartRun::new(job(), NONCE.into(), settings, 7);
        assert_eq!(ask, StartAsk::StillWanted);
        let ask = answer(&mut run, StartAnswer::Wanted(Ok(true)));
        assert_eq!(ask, StartAsk::DeriveZones);
        let ask = answer(&mut run, StartAnswer::Zones(Ok(Vec::new())));
        assert!(matches!(ask, StartAsk::ChooseZone(_)), "{ask:?}");
        match answer(&mut run, StartAnswer::Zone(Ok(Ok(Some("az1".into()))))) {
            StartAsk::Call(params) => (run, *params),
            other => panic!("expected the call, got {other:?}"),
        }
    }

    fn call_of(ask: StartAsk) -> StartInstanceParams {
        match ask {
            StartAsk::Call(params) => *params,
            other => panic!("expected a call, got {other:?}"),
        }
    }

    /// Answers the three writes of a failed start; its outcome.
    fn failed(run: &mut StartRun, ask: StartAsk) -> JobOutcome {
        assert_eq!(ask, StartAsk::ReleaseMachine);
        match run.answer(StartAnswer::Done) {
            StartAsk::SetInstanceStatus { status, .. } => assert_eq!(status, InstanceStatus::provisioning_error()),
            other => panic!("expected the instance status, got {other:?}"),
        }
        assert!(matches!(run.answer(StartAnswer::Done), StartAsk::SetMachineError(_)));
        match run.answer(StartAnswer::Done) {
            StartAsk::Finish(outcome) => outcome,
            other => panic!("expected the end, got {other:?}"),
        }
    }

    fn ambiguous() -> StartAnswer {
        StartAnswer::Called { result: Err(BrokerError::transient("connection reset")), maybe_made: true }
    }

    #[test]
    fn the_first_call_carries_the_zone_and_the_first_client_token() {
        let (_, params) = first_call(settings(2));
        assert_eq!(params.zone.as_deref(), Some("az1"));
        assert_eq!(params.client_token, format!("0/{NONCE}/0"));
        assert_eq!(params.tags.start.as_deref(), Some(NONCE));
    }

    #[test]
    fn an_ambiguous_failure_repeats_the_same_zone_and_client_token() {
        let (mut run, first) = first_call(settings(2));
        let ask = answer(&mut run, ambiguous());
        assert_eq!(ask, StartAsk::StillWanted, "a new round, after its status and its wait");
        let again = call_of(answer(&mut run, StartAnswer::Wanted(Ok(true))));
        assert_eq!((again.zone, again.client_token), (first.zone, first.client_token), "no new zone asked for");
    }

    #[test]
    fn after_a_zone_that_did_not_answer_the_next_call_looks_first_and_adopts_what_it_finds() {
        let (mut run, _) = first_call(settings(2));
        let unreachable = Err(BrokerError::zone_unreachable("az1 timed out"));
        let ask = answer(&mut run, StartAnswer::Called { result: unreachable, maybe_made: true });
        assert_eq!(ask, StartAsk::MarkZoneFailed { zone: "az1".into(), shape: Some("arch=amd64".into()) });
        let ask = answer(&mut run, StartAnswer::Marked(Ok(FailOutcome::TryAnotherZone)));
        assert_eq!(ask, StartAsk::StillWanted);
        let ask = answer(&mut run, StartAnswer::Wanted(Ok(true)));
        assert_eq!(ask, StartAsk::LookForOwn(NONCE.into()), "a lookup before a call with a new token");
        let found = instance("i-made", InstanceState::Running);
        let ask = answer(&mut run, StartAnswer::Found(Ok(vec![found])));
        let StartAsk::Record(info) = ask else { panic!("expected the record, got {ask:?}") };
        assert_eq!((info.instance.as_str(), info.nonce.as_str()), ("i-made", NONCE));
        match run.answer(StartAnswer::Recorded(Ok(()))) {
            StartAsk::Finish(JobOutcome::Started { instance, reserved, .. }) => {
                assert_eq!(instance.id, InstanceId::new("i-made"));
                assert!(!reserved, "an adopted instance's zone was not reserved for it");
            }
            other => panic!("expected the start, got {other:?}"),
        }
    }

    #[test]
    fn a_lookup_that_finds_nothing_lets_the_next_call_use_a_new_token() {
        let (mut run, _) = first_call(settings(2));
        let unreachable = Err(BrokerError::zone_unreachable("az1 timed out"));
        answer(&mut run, StartAnswer::Called { result: unreachable, maybe_made: true });
        answer(&mut run, StartAnswer::Marked(Ok(FailOutcome::TryAnotherZone)));
        answer(&mut run, StartAnswer::Wanted(Ok(true)));
        let ask = answer(&mut run, StartAnswer::Found(Ok(Vec::new())));
        assert!(matches!(ask, StartAsk::ChooseZone(_)), "{ask:?}");
        let params = call_of(answer(&mut run, StartAnswer::Zone(Ok(Ok(Some("az2".into()))))));
        assert_eq!((params.zone.as_deref(), params.client_token), (Some("az2"), format!("0/{NONCE}/1")));
        // Sure again: a definite failure next leads to no lookup.
        let definite = Err(BrokerError::zone_independent("quota"));
        let ask = answer(&mut run, StartAnswer::Called { result: definite, maybe_made: false });
        assert_eq!(ask, StartAsk::StillWanted);
        assert!(matches!(answer(&mut run, StartAnswer::Wanted(Ok(true))), StartAsk::ChooseZone(_)));
    }

    #[test]
    fn a_token_that_answers_a_terminated_instance_is_spent_for_a_new_one() {
        let (mut run, _) = first_call(settings(2));
        let ask = answer(&mut run, started("i-old", InstanceState::Terminated));
        assert!(matches!(ask, StartAsk::ChooseZone(_)), "no round, no lookup: {ask:?}");
        let params = call_of(answer(&mut run, StartAnswer::Zone(Ok(Ok(Some("az1".into()))))));
        assert_eq!(params.client_token, format!("0/{NONCE}/1"));
    }

    #[test]
    fn spent_tokens_are_skipped_three_times_at_most() {
        let (mut run, _) = first_call(settings(0));
        for _ in 0..3 {
            answer(&mut run, started("i-old", InstanceState::Terminated));
            call_of(answer(&mut run, StartAnswer::Zone(Ok(Ok(Some("az1".into()))))));
        }
        let ask = answer(&mut run, started("i-old", InstanceState::Terminated));
        match failed(&mut run, ask) {
            JobOutcome::StartFailed { error: WorkerError::Cloud(e), .. } => assert!(e.message().contains("i-old")),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn out_of_rounds_while_unsure_looks_before_giving_up() {
        let (mut run, _) = first_call(settings(0));
        let ask = answer(&mut run, ambiguous());
        assert_eq!(ask, StartAsk::LookForOwn(NONCE.into()));
        let ask = answer(&mut run, StartAnswer::Found(Ok(Vec::new())));
        match failed(&mut run, ask) {
            JobOutcome::StartFailed { error, zone, orphan, .. } => {
                assert_eq!(error, WorkerError::Cloud(BrokerError::transient("connection reset")));
                assert_eq!((zone.as_deref(), orphan), (Some("az1"), None));
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_lookup_is_tried_five_times_with_backoff_then_fails_the_start() {
        let (mut run, _) = first_call(settings(0));
        let mut ask = answer(&mut run, ambiguous());
        let mut sleeps = 0;
        for _ in 0..4 {
            assert_eq!(ask, StartAsk::LookForOwn(NONCE.into()));
            ask = run.answer(StartAnswer::Found(Err(BrokerError::throttled("slow down"))));
            assert!(matches!(ask, StartAsk::Sleep(_)), "{ask:?}");
            sleeps += 1;
            ask = run.answer(StartAnswer::Done);
        }
        assert_eq!(ask, StartAsk::LookForOwn(NONCE.into()));
        let ask = run.answer(StartAnswer::Found(Err(BrokerError::throttled("slow down"))));
        match failed(&mut run, ask) {
            JobOutcome::StartFailed { error: WorkerError::Lookup(_), .. } => assert_eq!(sleeps, 4),
            other => panic!("expected a lookup failure, got {other:?}"),
        }
    }

    #[test]
    fn a_machine_no_longer_wanted_is_abandoned() {
        let (mut run, _) = StartRun::new(job(), NONCE.into(), settings(2), 7);
        assert_eq!(run.answer(StartAnswer::Wanted(Ok(false))), StartAsk::ReleaseMachine);
        assert!(matches!(
            run.answer(StartAnswer::Done),
            StartAsk::Finish(JobOutcome::StartAbandoned { given_up: None, .. })
        ));
    }

    #[test]
    fn a_machine_no_longer_wanted_after_an_ambiguous_failure_is_looked_for_then_abandoned() {
        let (mut run, _) = first_call(settings(2));
        answer(&mut run, ambiguous());
        let ask = answer(&mut run, StartAnswer::Wanted(Ok(false)));
        assert_eq!(ask, StartAsk::LookForOwn(NONCE.into()));
        assert_eq!(answer(&mut run, StartAnswer::Found(Ok(Vec::new()))), StartAsk::ReleaseMachine);
        assert!(matches!(run.answer(StartAnswer::Done), StartAsk::Finish(JobOutcome::StartAbandoned { .. })));
    }

    #[test]
    fn a_batched_ambiguous_failure_is_not_repeated_and_the_next_call_looks_first() {
        let batched = StartSettings { batched: true, ..settings(2) };
        let (mut run, _) = first_call(batched);
        assert_eq!(run.answer(ambiguous()), StartAsk::ReleaseReservation, "the pool replayed it already");
        let ask = answer(&mut run, StartAnswer::Done);
        assert_eq!(ask, StartAsk::StillWanted);
        assert_eq!(answer(&mut run, StartAnswer::Wanted(Ok(true))), StartAsk::LookForOwn(NONCE.into()));
    }

    #[test]
    fn an_instance_never_recorded_is_the_failed_starts_orphan() {
        let (mut run, _) = first_call(settings(2));
        let mut ask = answer(&mut run, started("i-1", InstanceState::Running));
        for _ in 0..2 {
            assert!(matches!(ask, StartAsk::Record(_)), "{ask:?}");
            ask = answer(&mut run, StartAnswer::Recorded(Err(ModelError::Other("db locked".into()))));
        }
        let ask = run.answer(StartAnswer::Recorded(Err(ModelError::Other("db locked".into()))));
        assert_eq!(ask, StartAsk::ReleaseMachine);
        // The orphan's stop is decided before the machine's error is written: a retry of the
        // machine in error (which reads that error) finds the stop decided (issue 35).
        let ask = run.answer(StartAnswer::Done);
        assert_eq!(ask, StartAsk::OrphanStopping(InstanceId::new("i-1")));
        let outcome = match run.answer(StartAnswer::Done) {
            StartAsk::SetInstanceStatus { status, .. } => {
                assert_eq!(status, InstanceStatus::provisioning_error());
                assert!(matches!(run.answer(StartAnswer::Done), StartAsk::SetMachineError(_)));
                match run.answer(StartAnswer::Done) {
                    StartAsk::Finish(outcome) => outcome,
                    other => panic!("expected the end, got {other:?}"),
                }
            }
            other => panic!("expected the instance status, got {other:?}"),
        };
        match outcome {
            JobOutcome::StartFailed { error: WorkerError::Record { .. }, orphan, .. } => {
                assert_eq!(orphan, Some(InstanceId::new("i-1")))
            }
            other => panic!("expected a record failure, got {other:?}"),
        }
    }

    /// A record refused by the leader's fence (this provisioner no longer leads) is not
    /// retried, and its instance is no orphan: the next leader adopts it (issue 35's finding:
    /// a stale leader stopped the instance the new leader had adopted and recorded).
    #[test]
    fn a_fenced_record_leaves_the_instance_to_the_next_leader() {
        let (mut run, _) = first_call(settings(2));
        let ask = answer(&mut run, started("i-1", InstanceState::Running));
        assert!(matches!(ask, StartAsk::Record(_)), "{ask:?}");
        let fenced = ModelError::Fenced("the lease moved".into());
        assert_eq!(run.answer(StartAnswer::Recorded(Err(fenced))), StartAsk::ReleaseMachine, "not retried");
        let mut ask = run.answer(StartAnswer::Done);
        let outcome = loop {
            match ask {
                StartAsk::OrphanStopping(i) => panic!("{i} is not an orphan"),
                StartAsk::Finish(outcome) => break outcome,
                _ => ask = run.answer(StartAnswer::Done),
            }
        };
        match outcome {
            JobOutcome::StartFailed { error: WorkerError::Record { .. }, orphan, .. } => assert_eq!(orphan, None),
            other => panic!("expected a record failure, got {other:?}"),
        }
    }

    #[test]
    fn the_same_seed_and_answers_make_the_same_run() {
        let drive = |seed: u64| {
            let (mut run, mut ask) = StartRun::new(job(), NONCE.into(), settings(3), seed);
            let mut asks = vec![ask.clone()];
            for _ in 0..40 {
                let reply = match &ask {
                    StartAsk::StillWanted => StartAnswer::Wanted(Ok(true)),
                    StartAsk::DeriveZones => StartAnswer::Zones(Ok(Vec::new())),
                    StartAsk::ChooseZone(_) => StartAnswer::Zone(Ok(Ok(Some("az1".into())))),
                    StartAsk::Call(_) => {
                        StartAnswer::Called { result: Err(BrokerError::zone_independent("quota")), maybe_made: false }
                    }
                    StartAsk::Finish(_) => break,
                    _ => StartAnswer::Done,
                };
                ask = run.answer(reply);
                asks.push(ask.clone());
            }
            asks
        };
        assert_eq!(drive(11), drive(11));
        let waits = |asks: Vec<StartAsk>| asks.into_iter().filter(|a| matches!(a, StartAsk::Sleep(_))).count();
        assert!(waits(drive(11)) > 0, "rounds wait");
    }

    /// A run with machine reuse on, up to the harvest policy's answer: a parked instance `i-p`
    /// of dead machine `9`.
    fn claimed() -> StartRun {
        let (mut run, _) = StartRun::new(job(), NONCE.into(), StartSettings { claim: true, ..settings(2) }, 7);
        answer(&mut run, StartAnswer::Wanted(Ok(true)));
        let ask = answer(&mut run, StartAnswer::Zones(Ok(vec!["az1".into()])));
        assert!(matches!(ask, StartAsk::ClaimReusable { ref derived, .. } if derived == &["az1"]), "{ask:?}");
        let parked =
            Reusable { instance: InstanceId::new("i-p"), zone: Some("az1".into()), constraints: Default::default() };
        let ask = answer(&mut run, StartAnswer::Claimed(Ok(Some((MachineId::new("9"), parked)))));
        assert_eq!(ask, StartAsk::InstanceStateOf(InstanceId::new("i-p")));
        run
    }

    #[test]
    fn a_running_parked_instance_is_retagged_and_taken_over() {
        let mut run = claimed();
        let ask = answer(&mut run, StartAnswer::StateOf(Ok(Some(InstanceState::Running))));
        let StartAsk::Retag { instance, tags } = ask else { panic!("expected the retag, got {ask:?}") };
        assert_eq!((instance.as_str(), tags.start.as_deref()), ("i-p", Some(NONCE)));
        assert!(matches!(answer(&mut run, StartAnswer::Retagged(Ok(()))), StartAsk::Record(_)));
        match run.answer(StartAnswer::Recorded(Ok(()))) {
            StartAsk::Finish(JobOutcome::Started { instance, retired, reserved, given_up, .. }) => {
                assert_eq!(
                    (instance.id.as_str(), retired, reserved, given_up),
                    ("i-p", Some(MachineId::new("9")), false, None)
                );
            }
            other => panic!("expected the start, got {other:?}"),
        }
    }

    #[test]
    fn a_parked_instance_no_longer_running_is_given_up_however_the_start_ends() {
        let mut run = claimed();
        let ask = answer(&mut run, StartAnswer::StateOf(Ok(Some(InstanceState::Stopped))));
        assert!(matches!(ask, StartAsk::ChooseZone(_)), "the machine starts afresh: {ask:?}");
        let ask = answer(&mut run, StartAnswer::Zone(Ok(Err(ZoneError::NoSuitableZone(MachineId::new("0"))))));
        match failed(&mut run, ask) {
            JobOutcome::StartFailed { given_up: Some(given_up), retired, .. } => {
                assert_eq!((given_up.instance.as_str(), given_up.retired.as_str()), ("i-p", "9"));
                assert_eq!(retired, None, "a failure before any call retires nothing (as before)");
            }
            other => panic!("expected a failure naming the given-up instance, got {other:?}"),
        }
    }

    #[test]
    fn an_answer_to_another_question_ends_the_start_saying_so() {
        let (mut run, _) = StartRun::new(job(), NONCE.into(), settings(2), 7);
        let ask = run.answer(StartAnswer::Zones(Ok(Vec::new())));
        match failed(&mut run, ask) {
            JobOutcome::StartFailed { error: WorkerError::Unexpected { answer, .. }, .. } => {
                assert_eq!(answer, "Zones")
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
