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

#[cfg(test)]
mod tests {
    use super::*;

    /// A type out of capacity in the zone is passed over (and remembered: tried last next
    /// time); every candidate out there is the last one tried.
    #[test]
    fn a_pick_passes_over_the_types_out_of_capacity_in_the_zone() {
        let out = vec![("t3.large".to_owned(), "az1".to_owned())];
        let mut types = SimTypes::new(Duration::from_secs(60), out);
        let candidates = [InstanceType::named("t3.large"), InstanceType::named("m5.large")];
        let now = Duration::from_secs(1);
        let az1 = types.pick(now, Some("az1"), "0/n/1", &candidates).unwrap();
        assert_eq!((az1.instance_type.as_str(), az1.client_token.as_str()), ("m5.large", "0/n/1/m5.large"));
        let az2 = types.pick(now, Some("az2"), "0/n/2", &candidates).unwrap();
        assert_eq!((az2.instance_type.as_str(), az2.client_token.as_str()), ("t3.large", "0/n/2"));
        // Remembered: the next start in az1 tries m5.large first, under its own token.
        let next = types.pick(now, Some("az1"), "1/n/1", &candidates).unwrap();
        assert_eq!((next.instance_type.as_str(), next.client_token.as_str()), ("m5.large", "1/n/1/m5.large"));
        let only = [InstanceType::named("t3.large")];
        assert_eq!(types.pick(now, Some("az1"), "2/n/1", &only), Err(Some("t3.large".to_owned())));
        assert_eq!(types.pick(now, Some("az1"), "3/n/1", &[]), Err(None));
    }
}
