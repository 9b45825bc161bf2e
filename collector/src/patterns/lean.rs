//! The pattern finder's compact form of a node's evidence: per pair only what its trust
//! decision needs, so a fleet's period fits in memory between reads; and a period's pairs in
//! that form ([`LeanPeriod`]), whichever way they were read ([`super::period`],
//! [`super::rolled`]).

use crate::evidence::{Class, NodeAcc, WindowEvidence, step};
use std::collections::HashMap;

/// One pair's records and failed probes per [`Class`] of path: all the pattern finder's trust
/// decision needs ([`trusted_of`]), kept as counts so that evidence leaving
/// a period is taken away as it was added.
#[derive(Default, Clone, Copy)]
pub(crate) struct LeanPair {
    pub(crate) records: [u64; Class::ALL.len()],
    pub(crate) bad: [u64; Class::ALL.len()],
}

/// A node's pairs as the pattern finder keeps them between reads ([`PeriodCache`]): 48 bytes a
/// pair and its key, where [`NodeAcc`] keeps every count a pass needs.
#[derive(Default)]
pub(crate) struct LeanNode {
    pub(crate) not_simulated: u64,
    /// By (GPU, NIC as [`Nics`] numbers it).
    pub(crate) pairs: HashMap<(i32, u32), LeanPair>,
}

impl LeanNode {
    /// Adds `acc`'s evidence, or (`remove`: what left the period) takes it away, dropping the
    /// pairs left with no records.
    pub(crate) fn merge(&mut self, acc: &NodeAcc, nics: &mut Nics, remove: bool) {
        step(&mut self.not_simulated, acc.not_simulated, remove);
        for (gpu, list) in &acc.pairs {
            for (nic, p) in list {
                let mine = self.pairs.entry((*gpu, nics.id(nic))).or_default();
                for (c, k) in p.by_class.iter().enumerate() {
                    if let Some(k) = k {
                        step(&mut mine.records[c], k.records, remove);
                        step(&mut mine.bad[c], k.bad(), remove);
                    }
                }
            }
        }
        if remove {
            self.pairs.retain(|_, p| p.records.iter().any(|r| *r > 0));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// NIC names, numbered (a fleet has a few dozen).
#[derive(Default)]
pub(crate) struct Nics {
    pub(crate) ids: HashMap<String, u32>,
    pub(crate) names: Vec<String>,
}

impl Nics {
    pub(crate) fn id(&mut self, nic: &str) -> u32 {
        if let Some(id) = self.ids.get(nic) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(nic.to_owned());
        self.ids.insert(nic.to_owned(), id);
        id
    }

    pub(crate) fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// Nodes' evidence as the pattern finder counts it.
pub(crate) type LeanNodes = HashMap<String, LeanNode>;

pub(crate) fn lean(ev: WindowEvidence, nics: &mut Nics) -> LeanNodes {
    let mut out = LeanNodes::new();
    for (node, acc) in ev.nodes {
        let mut l = LeanNode::default();
        l.merge(&acc, nics, false);
        if !l.is_empty() {
            out.insert(node, l);
        }
    }
    out
}

/// Each pair of `kept` and `newest` together (the same node's evidence in two parts of a
/// period) with trusted evidence, as [`WindowEvidence::into_pairs`] decides trust over the
/// whole: its GPU and NIC, whether a trusted probe failed, and whether the trusted ones include
/// the simulated fabric's. In (GPU, NIC number) order.
pub(crate) fn trusted_of(
    kept: Option<&LeanNode>,
    newest: Option<&LeanNode>,
    nics: &Nics,
    mut f: impl FnMut(i32, &str, bool, bool),
) {
    let all_simulated = kept.map_or(0, |n| n.not_simulated) == 0 && newest.map_or(0, |n| n.not_simulated) == 0;
    let mut keys: Vec<(i32, u32)> = kept.iter().chain(newest.iter()).flat_map(|n| n.pairs.keys().copied()).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let (a, b) = (kept.and_then(|n| n.pairs.get(&key)), newest.and_then(|n| n.pairs.get(&key)));
        let (mut trusted, mut bad, mut simulated) = (false, false, false);
        for class in Class::ALL {
            let c = class as usize;
            let part = |p: Option<&LeanPair>| p.map_or((0, 0), |p| (p.records[c], p.bad[c]));
            let ((ra, ba), (rb, bb)) = (part(a), part(b));
            if (ra > 0 || rb > 0) && class.standing(all_simulated).is_trusted() {
                trusted = true;
                bad |= ba > 0 || bb > 0;
                simulated |= class == Class::Simulated;
            }
        }
        if trusted {
            f(key.0, nics.name(key.1), bad, simulated);
        }
    }
}

/// Moves kept nodes on: takes away what left the period (`gone`) and adds what entered it
/// (`added`).
pub(crate) fn move_on(nodes: &mut LeanNodes, gone: &WindowEvidence, added: &WindowEvidence, nics: &mut Nics) {
    for (node, acc) in &gone.nodes {
        if let Some(n) = nodes.get_mut(node) {
            n.merge(acc, nics, true);
        }
    }
    for (node, acc) in &added.nodes {
        nodes.entry(node.clone()).or_default().merge(acc, nics, false);
    }
}

/// Puts `item` last in `kept`, first dropping the one used least recently (`used`) when `kept`
/// holds `max` already.
pub(crate) fn keep_last<T>(kept: &mut Vec<T>, max: usize, used: impl Fn(&T) -> u64, item: T) {
    if kept.len() >= max
        && let Some(i) = kept.iter().enumerate().min_by_key(|(_, k)| used(k)).map(|(i, _)| i)
    {
        kept.swap_remove(i);
    }
    kept.push(item);
}

/// NIC names the kept periods number before they start over (a fleet has a few dozen).
pub(crate) const MAX_NICS: usize = 65_536;

/// A pair with trusted evidence in a period, as the pattern finder reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedPair<'a> {
    pub node: &'a str,
    pub gpu: i32,
    pub nic: &'a str,
    /// A trusted probe of the pair failed.
    pub failed: bool,
    /// The trusted probes include the simulated fabric's.
    pub simulated: bool,
}

/// A period's pairs as the pattern finder reads them: the kept part (through the cache, while
/// it is held) and the rest.
pub struct LeanPeriod<'a> {
    pub(crate) kept: Option<(&'a LeanNodes, &'a Nics)>,
    pub(crate) newest: LeanNodes,
    /// NIC numbers of `newest` when nothing is kept.
    pub(crate) nics: Nics,
}

impl LeanPeriod<'_> {
    /// The period read whole, nothing kept.
    pub(crate) fn of(ev: WindowEvidence) -> LeanPeriod<'static> {
        let mut nics = Nics::default();
        let newest = lean(ev, &mut nics);
        LeanPeriod { kept: None, newest, nics }
    }

    /// The nodes with evidence (a node may show twice: kept and newest).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.kept.into_iter().flat_map(|(k, _)| k.keys()).chain(self.newest.keys()).map(String::as_str)
    }

    /// Each pair with trusted evidence, node by node in name order (the pairs
    /// [`WindowEvidence::into_pairs`] of the period read whole counts as proven).
    pub fn for_each_trusted(&self, mut f: impl FnMut(TrustedPair<'_>)) {
        let mut names: Vec<&str> = self.nodes().collect();
        names.sort_unstable();
        names.dedup();
        let nics = self.kept.map_or(&self.nics, |(_, n)| n);
        for node in names {
            let kept = self.kept.and_then(|(k, _)| k.get(node));
            trusted_of(kept, self.newest.get(node), nics, |gpu, nic, failed, simulated| {
                f(TrustedPair { node, gpu, nic, failed, simulated })
            });
        }
    }
}
