//! The benchmarks' scenarios, small, in the normal test run: correctness only, never a timing
//! assertion (the figures come from `provisioner bench`, see the README).

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
