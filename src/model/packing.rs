//! Packing the books' B-trees again as they grow.
//!
//! The books' per-machine maps fill in id order (machines are read, started and recorded
//! roughly in the order of their ids), and a B-tree filled at its right end keeps its nodes a
//! little over half full: std splits a full node in the middle, and the left half is never
//! touched again. Built whole from sorted entries (`collect`), a map packs its nodes full. A
//! [`Packing`] says when a map has grown enough since it was last built to be rebuilt whole:
//! each time it doubles, so the rebuilds cost a constant number of moves per entry
//! (amortised), and at any size at least half the entries sit in packed nodes.

/// Below this size a map is never rebuilt (a few nodes: nothing to gain).
const MIN_REPACK: usize = 4096;

/// When to rebuild a growing map whole: its size when it was last rebuilt.
#[derive(Debug, Clone, Copy, Default)]
pub struct Packing {
    packed_at: usize,
}

impl Packing {
    /// A map just built whole, `len` entries long.
    pub fn built(len: usize) -> Self {
        Self { packed_at: len }
    }

    /// Whether a map now `len` entries long is due to be rebuilt (it has doubled since the last
    /// rebuild, or since it shrank); if so, it counts as rebuilt.
    pub fn due(&mut self, len: usize) -> bool {
        self.packed_at = self.packed_at.min(len);
        if len >= MIN_REPACK && len >= self.packed_at.saturating_mul(2) {
            self.packed_at = len;
            true
        } else {
            false
        }
    }
}

/// Rebuilds a map or set whole from its own (sorted) entries: same contents, packed nodes.
pub fn repack<M>(map: &mut M)
where
    M: Default + IntoIterator + FromIterator<<M as IntoIterator>::Item>,
{
    *map = std::mem::take(map).into_iter().collect();
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_growing_map_is_due_each_time_it_doubles() {
        let mut p = Packing::default();
        let due: Vec<usize> = (1..=40_000).filter(|&n| p.due(n)).collect();
        assert_eq!(due, vec![4096, 8192, 16_384, 32_768]);
        // Shrunk, it counts from its new size.
        assert!(!p.due(5_000));
        assert!(!p.due(9_999));
        assert!(p.due(10_000));
    }

    #[test]
    fn a_repacked_map_keeps_its_entries_in_order() {
        let mut m: BTreeMap<u32, String> = (0..10_000u32).rev().map(|i| (i, i.to_string())).collect();
        m.remove(&17);
        let before: Vec<(u32, String)> = m.clone().into_iter().collect();
        repack(&mut m);
        assert_eq!(m.into_iter().collect::<Vec<_>>(), before);
    }
}
