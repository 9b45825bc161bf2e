//! Connection slots a service shares among the peers that connect to it: at most `max` at once,
//! at most `per_key` of them one peer's, and the last `reserved_for_new` only for a peer holding
//! none, so peers that take every slot they may still leave room for a new one. A [`Slot`] is
//! given back when dropped.
//!
//! What a key is belongs to the service: the agent's in-line endpoint keys by uid and control
//! group, the collector's listeners by peer address.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// How slots are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    pub max: usize,
    pub per_key: usize,
    pub reserved_for_new: usize,
}

/// Why a slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRefused {
    /// Every slot is taken.
    Full,
    /// The peer holds its `per_key` slots.
    PerKeyFull,
    /// Only the reserve is left, and the peer already holds a slot.
    Reserved,
}

impl SlotRefused {
    /// For a metric label.
    pub fn label(self) -> &'static str {
        match self {
            SlotRefused::Full => "full",
            SlotRefused::PerKeyFull => "per_peer",
            SlotRefused::Reserved => "reserved",
        }
    }
}

#[derive(Debug)]
struct Held<K> {
    total: usize,
    per: HashMap<K, usize>,
}

/// One service's slots.
#[derive(Debug)]
pub struct Slots<K> {
    limits: SlotLimits,
    held: Arc<Mutex<Held<K>>>,
}

impl<K> Clone for Slots<K> {
    fn clone(&self) -> Self {
        Slots { limits: self.limits, held: self.held.clone() }
    }
}

/// One connection's slot.
#[derive(Debug)]
pub struct Slot<K: Hash + Eq> {
    held: Arc<Mutex<Held<K>>>,
    key: Option<K>,
}

impl<K: Hash + Eq + Clone> Slots<K> {
    pub fn new(limits: SlotLimits) -> Self {
        Slots { limits, held: Arc::new(Mutex::new(Held { total: 0, per: HashMap::new() })) }
    }

    pub fn limits(&self) -> SlotLimits {
        self.limits
    }

    /// A slot for `key`, or why not.
    pub fn take(&self, key: &K) -> Result<Slot<K>, SlotRefused> {
        let l = self.limits;
        let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = h.per.get(key).copied().unwrap_or(0);
        if h.total >= l.max {
            return Err(SlotRefused::Full);
        }
        if mine >= l.per_key {
            return Err(SlotRefused::PerKeyFull);
        }
        if mine > 0 && h.total >= l.max.saturating_sub(l.reserved_for_new) {
            return Err(SlotRefused::Reserved);
        }
        h.total += 1;
        *h.per.entry(key.clone()).or_insert(0) += 1;
        Ok(Slot { held: self.held.clone(), key: Some(key.clone()) })
    }

    /// Slots held now.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).total
    }
}

impl<K: Hash + Eq> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        h.total = h.total.saturating_sub(1);
        if let Some(key) = self.key.take()
            && let Some(n) = h.per.get_mut(&key)
        {
            *n -= 1;
            if *n == 0 {
                h.per.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: SlotLimits = SlotLimits { max: 64, per_key: 8, reserved_for_new: 16 };

    #[test]
    fn one_peer_takes_at_most_its_share_and_new_peers_keep_theirs() {
        let slots = Slots::new(L);
        let mut held: Vec<Slot<String>> = (0..8).map(|_| slots.take(&"a".to_owned()).unwrap()).collect();
        assert_eq!(slots.take(&"a".to_owned()).unwrap_err(), SlotRefused::PerKeyFull);
        assert!(slots.take(&"b".to_owned()).is_ok(), "another peer has its own share");
        held.clear();
        // Hostile peers fill every slot they may: 6 of 8 = 48, then only new peers get in.
        let hostile: Vec<Slot<String>> =
            (0..6).flat_map(|p| (0..8).map(move |_| format!("h{p}"))).map(|k| slots.take(&k).unwrap()).collect();
        assert_eq!(slots.held(), 48);
        let first = slots.take(&"new-0".to_owned()).unwrap();
        assert_eq!(slots.take(&"new-0".to_owned()).unwrap_err(), SlotRefused::Reserved, "one each in the reserve");
        let mut newcomers: Vec<Slot<String>> = (1..16).map(|i| slots.take(&format!("new-{i}")).unwrap()).collect();
        assert_eq!(slots.held(), 64);
        assert_eq!(slots.take(&"late".to_owned()).unwrap_err(), SlotRefused::Full);
        // Slots come back when connections end.
        newcomers.pop();
        drop(first);
        assert_eq!(slots.held(), 62);
        assert!(slots.take(&"late".to_owned()).is_ok());
        drop((hostile, newcomers));
        assert_eq!(slots.held(), 0);
    }
}
