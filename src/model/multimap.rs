//! A multimap kept as one ordered set of `(key, value)` pairs.
//!
//! The books index instances by the machine named in their tags. A map of sets spends a whole
//! B-tree node (a few hundred bytes) on every machine's one instance; one set of pairs spends
//! one entry. Lookups are a range scan from `(key, least value)`; iteration is in key, then
//! value, order, as everywhere else in the books.

use std::collections::BTreeSet;

use super::types::InstanceId;

/// A value with a least element: the lower bound of a key's range.
pub trait Least {
    /// The value that sorts before every other.
    fn least() -> Self;
}

impl Least for InstanceId {
    /// The empty id: ids order shortlex, so it sorts before every other.
    fn least() -> Self {
        InstanceId::new("")
    }
}

/// Keys to ordered sets of values, as one set of pairs.
#[derive(Debug, Clone)]
pub struct MultiMap<K, V> {
    pairs: BTreeSet<(K, V)>,
}

impl<K, V> Default for MultiMap<K, V> {
    fn default() -> Self {
        Self { pairs: BTreeSet::new() }
    }
}

impl<K: Ord + Clone, V: Ord + Clone + Least> MultiMap<K, V> {
    /// An empty multimap.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value under a key; false if it was there already.
    pub fn insert(&mut self, key: K, value: V) -> bool {
        self.pairs.insert((key, value))
    }

    /// Removes a value from under a key; false if it was not there.
    pub fn remove(&mut self, key: &K, value: &V) -> bool {
        self.pairs.remove(&(key.clone(), value.clone()))
    }

    /// The values under a key, in order.
    pub fn get<'a>(&'a self, key: &'a K) -> impl Iterator<Item = &'a V> + 'a {
        self.pairs.range((key.clone(), V::least())..).take_while(move |(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether any value is under a key.
    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).next().is_some()
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.pairs.clear();
    }

    /// How many pairs there are.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MachineId;

    #[test]
    fn values_are_found_under_their_key_only_and_in_order() {
        let mut m: MultiMap<MachineId, InstanceId> = MultiMap::new();
        let (one, two, ten) = (MachineId::new("1"), MachineId::new("2"), MachineId::new("10"));
        assert!(m.insert(two.clone(), InstanceId::new("i-9")));
        assert!(m.insert(two.clone(), InstanceId::new("i-10")));
        assert!(!m.insert(two.clone(), InstanceId::new("i-9")));
        assert!(m.insert(ten.clone(), InstanceId::new("i-1")));
        assert!(m.insert(one.clone(), InstanceId::new("")));
        fn under(m: &MultiMap<MachineId, InstanceId>, k: &MachineId) -> Vec<String> {
            m.get(k).map(|i| i.as_str().to_owned()).collect()
        }
        assert_eq!(under(&m, &two), ["i-9", "i-10"]);
        assert_eq!(under(&m, &ten), ["i-1"]);
        assert_eq!(under(&m, &one), [""]);
        assert!(!m.contains_key(&MachineId::new("3")));
        assert!(m.remove(&two, &InstanceId::new("i-9")));
        assert!(!m.remove(&two, &InstanceId::new("i-9")));
        assert_eq!(under(&m, &two), ["i-10"]);
        assert_eq!(m.len(), 3);
        m.clear();
        assert!(m.is_empty() && !m.contains_key(&two));
    }
}
