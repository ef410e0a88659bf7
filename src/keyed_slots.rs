//! Slots counted by key (a tenant's subscriptions, a provider's batch steps): how
//! many of a key's are taken, and a guard that gives its slot back when dropped,
//! however its holder ends (a panic, an abort, a closed connection).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The slots taken, by key; a key with none taken is not kept.
#[derive(Debug)]
pub struct KeyedSlots<K>(Arc<Mutex<HashMap<K, usize>>>);

impl<K> Clone for KeyedSlots<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> Default for KeyedSlots<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K: Eq + Hash + Clone> KeyedSlots<K> {
    /// The slots of `key` taken now.
    pub fn taken(&self, key: &K) -> usize {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// The slots taken now, of every key.
    pub fn total(&self) -> usize {
        self.lock().values().sum()
    }

    /// One more slot of `key`, unless it has `limit` taken already.
    pub fn try_take(&self, key: &K, limit: usize) -> Option<KeyedSlot<K>> {
        let mut taken = self.lock();
        let count = taken.get(key).copied().unwrap_or(0);
        if count >= limit {
            return None;
        }
        taken.insert(key.clone(), count + 1);
        Some(KeyedSlot {
            slots: self.clone(),
            key: key.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, usize>> {
        // A count is never left half-updated: a poisoned lock's map is still right.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One taken slot of its key, given back when dropped.
#[derive(Debug)]
pub struct KeyedSlot<K: Eq + Hash + Clone> {
    slots: KeyedSlots<K>,
    key: K,
}

impl<K: Eq + Hash + Clone> Drop for KeyedSlot<K> {
    fn drop(&mut self) {
        let mut taken = self.slots.lock();
        if let Some(count) = taken.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                taken.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_takes_up_to_its_limit_and_a_dropped_slot_is_given_back() {
        let slots = KeyedSlots::default();
        let first = slots.try_take(&"a", 2).unwrap();
        let _second = slots.try_take(&"a", 2).unwrap();
        assert!(slots.try_take(&"a", 2).is_none(), "a's limit is reached");
        let _other = slots.try_take(&"b", 2).unwrap();
        assert_eq!((slots.taken(&"a"), slots.total()), (2, 3));
        drop(first);
        assert_eq!(slots.taken(&"a"), 1);
        assert!(slots.try_take(&"a", 2).is_some());
    }

    #[test]
    fn a_key_with_nothing_taken_is_forgotten() {
        let slots = KeyedSlots::default();
        drop(slots.try_take(&7, 1).unwrap());
        assert!(slots.0.lock().unwrap().is_empty());
    }
}
