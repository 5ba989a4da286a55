//! A seeded random-number generator whose state is part of what it equals and hashes to.
//!
//! The plain cores draw their tie-breaks (the zone allocator) and jitter (the coordinator's
//! backoff) from one. `rand`'s `StdRng` is neither `Hash` nor shows its state in `Debug`: a
//! model checker that tells two cores' states apart by their hash (`sim::mc`, issue 35) would
//! take two cores whose next draws differ for the same. `SeededRng` hashes, compares and prints
//! as its next draw: equal generators (same seed, same draws so far) agree, and two that differ
//! differ there with overwhelming likelihood.

use std::fmt;
use std::hash::{Hash, Hasher};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// A `StdRng` seeded from a `u64`, that hashes and prints as its next draw.
#[derive(Clone, PartialEq, Eq)]
pub struct SeededRng(StdRng);

impl SeededRng {
    /// A generator seeded from `seed` (the same seed, the same draws).
    pub fn seed_from_u64(seed: u64) -> Self {
        Self(StdRng::seed_from_u64(seed))
    }

    /// The draw the generator would make next, without making it.
    pub fn peek(&self) -> u64 {
        self.0.clone().next_u64()
    }
}

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.0.fill_bytes(dst)
    }
}

impl fmt::Debug for SeededRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SeededRng(next {:#x})", self.peek())
    }
}

impl Hash for SeededRng {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.peek());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn equal_generators_hash_alike_and_a_draw_tells_them_apart() {
        let (mut a, b) = (SeededRng::seed_from_u64(7), SeededRng::seed_from_u64(7));
        assert_eq!(a, b);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let first = a.peek();
        assert_eq!(a.next_u64(), first, "peek does not draw");
        assert_ne!(a, b);
        assert_ne!(format!("{a:?}"), format!("{b:?}"));
        let _: u32 = a.random_range(0..10);
    }
}
