//! The benchmarks' scenarios, small, in the normal test run: correctness only, never a timing
//! assertion (the figures come from `provisioner bench`, see docs/performance.md).

use std::time::Duration;

use provisioner::sim::bench::{churn, throughput};

#[test]
fn throughput_scenario_provisions_everything_at_the_ideal_makespan() {
    let r = throughput(300, 16, 3, Duration::from_secs(30));
    assert_eq!(r.machines, 300);
    // ceil(300/16) = 19 rounds of 30 s: every worker busy all the time.
    assert_eq!(r.ideal_makespan_s, 570.0);
    assert_eq!(r.virtual_makespan_s, 570.0, "workers idled or starts were serialised");
    assert_eq!(r.efficiency, 1.0);
}

#[test]
fn zero_latency_throughput_finishes_at_time_zero() {
    let r = throughput(500, 100, 3, Duration::ZERO);
    assert_eq!(r.virtual_makespan_s, 0.0);
    assert_eq!(r.efficiency, 1.0);
}

#[test]
fn churn_lists_the_cloud_per_resync_not_per_event() {
    let r = churn(200, 400);
    assert_eq!(r.events, 400);
    // 400 changes 10 ms apart span 4 s of virtual time: no resync falls in it, and no change
    // caused a listing.
    assert_eq!(r.all_instances_calls, 0, "the cloud was listed per event");
}

/// Issue 17, point 1: batched starts against a cloud allowing 10 start calls at once, then 2
/// per second. Virtual time and call counts are deterministic: no wall-clock figure is checked.
#[test]
fn batched_starts_beat_the_one_call_per_machine_ideal_without_a_throttled_call() {
    use provisioner::config::rate_limits::BucketLimit;
    use provisioner::sim::bench::{starts, StartsBench};
    let bench = StartsBench {
        machines: 100,
        workers: 16,
        zones: 3,
        start_latency: Duration::ZERO,
        start_burst: 10,
        start_per_second: 2.0,
        batch_size: Some(100),
        client_limit: Some(BucketLimit::new(10, 2.0)),
    };
    let batched = starts(bench);
    assert_eq!(batched.throttled_calls, 0);
    assert!(batched.virtual_makespan_s <= 10.0, "{batched:?}");
    assert!(batched.start_calls < 100, "{batched:?}");
    let unbatched = starts(StartsBench { batch_size: None, ..bench });
    assert_eq!(unbatched.start_calls, 100, "one call per machine");
    assert_eq!(unbatched.unbatched_ideal_s, 45.0);
    assert!(unbatched.virtual_makespan_s >= 45.0, "{unbatched:?}");
    // A worker carries a batch: one call per zone carries them all, even with the client
    // limiter sized for EC2 rather than for this cloud.
    let ec2_sized = starts(StartsBench { client_limit: None, ..bench });
    assert_eq!((ec2_sized.start_calls, ec2_sized.throttled_calls), (3, 0), "{ec2_sized:?}");
}
