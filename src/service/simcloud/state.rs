//! The plain cores of the simulated cloud's shared state (no actix): the per-type capacity
//! fail-over of one model's cloud. (An account's bucket is the engine's plain
//! [`TokenBucket`](crate::actors::limiter::TokenBucket).)

use std::time::Duration;

use crate::model::instance_types::{InstanceType, TypeAttempt, TypeFailover};

/// The per-type fail-over of one simulated cloud, over its `(type, zone)` pairs out of
/// capacity.
pub(crate) struct SimTypes {
    failover: TypeFailover,
    out_of_capacity: Vec<(String, String)>,
}

impl SimTypes {
    /// A fail-over remembering capacity failures for `memory`, with `out_of_capacity`
    /// (`[sim] out_of_capacity`) permanently out.
    pub(crate) fn new(memory: Duration, out_of_capacity: Vec<(String, String)>) -> Self {
        Self { failover: TypeFailover::new(memory), out_of_capacity }
    }

    /// The first of `candidates`, in the fail-over's order for start `token` in `zone`, that
    /// has capacity there (each that has none remembered as such); `Err` with the last type
    /// tried when none has.
    pub(crate) fn pick(
        &mut self,
        now: Duration,
        zone: Option<&str>,
        token: &str,
        candidates: &[InstanceType],
    ) -> Result<TypeAttempt, Option<String>> {
        let mut last = None;
        for attempt in self.failover.order(now, zone, token, candidates) {
            let out = self.out_of_capacity.iter().any(|(t, z)| *t == attempt.instance_type && Some(z.as_str()) == zone);
            if !out {
                return Ok(attempt);
            }
            self.failover.capacity_failed(now, &attempt.instance_type, zone);
            last = Some(attempt.instance_type);
        }
        Err(last)
    }
}
