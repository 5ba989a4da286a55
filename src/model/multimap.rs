//! A multimap whose keys mostly hold one value.
//!
//! The books index instances by the machine named in their tags: nearly every machine has
//! one. A map of sets spends a whole B-tree node (a few hundred bytes) on each machine's one
//! instance; here a key with one value holds it inline, and only a key with more gets a set.
//! Lookups are one map lookup; iteration is in key, then value, order, as everywhere else in
//! the books.

use std::collections::{BTreeMap, BTreeSet};

use super::packing::{repack, Packing};

/// One value inline, or several in order.
#[derive(Debug, Clone)]
enum Values<V> {
    One(V),
    Many(BTreeSet<V>),
}

impl<V: Ord + Clone> Values<V> {
    /// Adds a value; false if it was there already.
    fn add(&mut self, value: V) -> bool {
        match self {
            Values::One(v) if *v == value => false,
            Values::One(v) => {
                *self = Values::Many(BTreeSet::from([v.clone(), value]));
                true
            }
            Values::Many(set) => set.insert(value),
        }
    }
}

/// Keys to ordered sets of values.
#[derive(Debug, Clone)]
pub struct MultiMap<K, V> {
    map: BTreeMap<K, Values<V>>,
    len: usize,
    /// Keys come in id order: the map is rebuilt packed as it grows.
    packing: Packing,
}

impl<K, V> Default for MultiMap<K, V> {
    fn default() -> Self {
        Self { map: BTreeMap::new(), len: 0, packing: Packing::default() }
    }
}

impl<K: Ord + Clone, V: Ord + Clone> MultiMap<K, V> {
    /// An empty multimap.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value under a key; false if it was there already (one search: the entry is the
    /// place to insert at as well).
    pub fn insert(&mut self, key: K, value: V) -> bool {
        self.insert_seeing(key, value).0
    }

    /// [`MultiMap::insert`], answering also with the values the key held before (in order):
    /// one search where a look-up and then an insert take two.
    pub fn insert_seeing(&mut self, key: K, value: V) -> (bool, Vec<V>) {
        let (added, before) = match self.map.entry(key) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Values::One(value));
                if self.packing.due(self.map.len()) {
                    repack(&mut self.map);
                }
                (true, Vec::new())
            }
            std::collections::btree_map::Entry::Occupied(mut e) => {
                let before = match e.get() {
                    Values::One(v) => vec![v.clone()],
                    Values::Many(set) => set.iter().cloned().collect(),
                };
                (e.get_mut().add(value), before)
            }
        };
        self.len += usize::from(added);
        (added, before)
    }

    /// Removes a value from under a key; false if it was not there.
    pub fn remove(&mut self, key: &K, value: &V) -> bool {
        let (removed, now_empty) = match self.map.get_mut(key) {
            None => (false, false),
            Some(Values::One(v)) => (v == value, v == value),
            Some(Values::Many(set)) => {
                let removed = set.remove(value);
                (removed, set.is_empty())
            }
        };
        if now_empty {
            self.map.remove(key);
        }
        self.len -= usize::from(removed);
        removed
    }

    /// The values under a key, in order.
    pub fn get<'a>(&'a self, key: &K) -> impl Iterator<Item = &'a V> + 'a {
        let (one, many) = match self.map.get(key) {
            None => (None, None),
            Some(Values::One(v)) => (Some(v), None),
            Some(Values::Many(set)) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Whether any value is under a key.
    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }

    /// How many values there are, under all keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<K: Ord + Clone, V: Ord + Clone> FromIterator<(K, V)> for MultiMap<K, V> {
    /// Built whole: the pairs are sorted once and the map bulk-built (packed nodes).
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        let mut pairs: Vec<(K, V)> = pairs.into_iter().collect();
        pairs.sort_unstable();
        pairs.dedup();
        let len = pairs.len();
        let mut grouped: Vec<(K, Values<V>)> = Vec::with_capacity(len);
        for (k, v) in pairs {
            match grouped.last_mut() {
                Some((last, values)) if *last == k => {
                    values.add(v);
                }
                _ => grouped.push((k, Values::One(v))),
            }
        }
        let map: BTreeMap<K, Values<V>> = grouped.into_iter().collect();
        let packing = Packing::built(map.len());
        Self { map, len, packing }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{InstanceId, MachineId};

    #[test]
    fn values_are_found_under_their_key_only_and_in_order() {
        let mut m: MultiMap<MachineId, InstanceId> = MultiMap::new();
        let (one, two, ten) = (MachineId::new("1"), MachineId::new("2"), MachineId::new("10"));
        assert!(m.insert(two.clone(), InstanceId::new("i-9")));
        assert!(m.insert(two.clone(), InstanceId::new("i-10")));
        assert!(!m.insert(two.clone(), InstanceId::new("i-9")));
        assert!(m.insert(ten.clone(), InstanceId::new("i-1")));
        let (added, before) = m.insert_seeing(two.clone(), InstanceId::new("i-11"));
        assert!(added);
        assert_eq!(before, [InstanceId::new("i-9"), InstanceId::new("i-10")]);
        assert!(m.remove(&two, &InstanceId::new("i-11")));
        assert_eq!(m.insert_seeing(MachineId::new("4"), InstanceId::new("i-4")), (true, Vec::new()));
        assert!(m.remove(&MachineId::new("4"), &InstanceId::new("i-4")));
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

    #[test]
    fn built_whole_it_holds_what_insertion_would() {
        let pairs = [("2", "i-10"), ("1", "i-1"), ("2", "i-9"), ("2", "i-10"), ("3", "i-3"), ("2", "i-2")];
        let built: MultiMap<MachineId, InstanceId> =
            pairs.iter().map(|(m, i)| (MachineId::new(m), InstanceId::new(i))).collect();
        let mut inserted = MultiMap::new();
        for (m, i) in pairs {
            inserted.insert(MachineId::new(m), InstanceId::new(i));
        }
        for m in ["1", "2", "3", "4"] {
            let m = MachineId::new(m);
            assert!(built.get(&m).eq(inserted.get(&m)), "machine {m}");
        }
        assert_eq!(built.len(), 5);
        assert_eq!(inserted.len(), 5);
        let two: Vec<&str> = built.get(&MachineId::new("2")).map(InstanceId::as_str).collect();
        assert_eq!(two, ["i-2", "i-9", "i-10"]);
    }
}
