//! Evidence compaction at the edge (#15): every failed probe travels in full, the ok probes of
//! each pair as one summary per window.
//!
//! What keeps a summary honest:
//! - it counts only probes produced the same way (transport, memory, path, injected fault,
//!   simulation, selection, lanes): probes that differ are summarised apart;
//! - it never spans a failure of its pair: a failed probe closes the pair's open summaries
//!   before it is spooled, so the collector's order of evidence is the order it happened in;
//! - a pair's first ok probe, and its first [`RAW_AFTER_FAILURE`] ok probes after a failure or
//!   after its selection changes (a pin makes it the workload's pair), travel in full: a pair is
//!   verified as soon as it is first probed, and a GPU recovers as soon as it would with every
//!   probe in full (the collector's hysteresis counts consecutive oks on the workload's pair);
//! - probes with an injected fault are self-test history and always travel in full.
//!
//! A summary is held in memory until its window has passed (or the agent stops): a crash loses at
//! most one window of ok probes, never a failure.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use railguard_schema::{
    Bdf, DataPath, Injected, Memory, PairSelection, ProbeResult, ProbeSummary, ProbeVerdict, RecordBody, Transport,
};

/// Ok probes of a pair sent in full after one of its failures: as many as the collector's
/// rules look back over (a GPU stays `corrupting` while two of its workload pair's last five
/// verdicts are silent corruptions, and leaves it after three consecutive oks).
pub const RAW_AFTER_FAILURE: u32 = 5;

/// What a summary's probes share.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    gpu: u32,
    nic: String,
    transport: Transport,
    memory: Memory,
    path: DataPath,
    injected: Injected,
    simulated: bool,
    selection: PairSelection,
    lanes: Vec<String>,
}

#[derive(Debug)]
struct Open {
    gpu_bdf: Option<Bdf>,
    nic_bdf: Option<Bdf>,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    bytes: u64,
    durations: Vec<u64>,
}

/// Turns probe results into the records to spool.
#[derive(Debug)]
pub struct Compactor {
    window: Option<chrono::TimeDelta>,
    open: HashMap<Key, Open>,
    /// Per pair: ok probes still to send in full (a pair absent here has never been seen).
    raw_left: HashMap<(u32, String), u32>,
    /// Per pair: why it was last probed (sweep, predicted, pinned).
    selection: HashMap<(u32, String), PairSelection>,
}

impl Compactor {
    /// Summaries over `window`; `Duration::ZERO` sends every probe in full (raw mode).
    pub fn new(window: Duration) -> Self {
        let window = (!window.is_zero()).then(|| chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX));
        Compactor { window, open: HashMap::new(), raw_left: HashMap::new(), selection: HashMap::new() }
    }

    /// The records to spool now for a probe observed at `at`, in order.
    pub fn observe(&mut self, p: ProbeResult, at: DateTime<Utc>) -> Vec<RecordBody> {
        let Some(_) = self.window else { return vec![RecordBody::Probe(p)] };
        let pair = (p.gpu, p.nic.clone());
        if p.verdict != ProbeVerdict::Ok {
            let mut out = self.close_pair(p.gpu, &p.nic);
            if p.is_evidence() {
                self.raw_left.insert(pair, RAW_AFTER_FAILURE);
            }
            out.push(RecordBody::Probe(p));
            return out;
        }
        if !p.is_evidence() {
            return vec![RecordBody::Probe(p)];
        }
        // A pair that has just become the workload's (or stopped being it) proves itself afresh.
        if self.selection.insert(pair.clone(), p.selection).is_some_and(|s| s != p.selection) {
            self.raw_left.insert(pair.clone(), RAW_AFTER_FAILURE);
        }
        match self.raw_left.get_mut(&pair) {
            None => {
                self.raw_left.insert(pair, 0);
                return vec![RecordBody::Probe(p)];
            }
            Some(n) if *n > 0 => {
                *n -= 1;
                return vec![RecordBody::Probe(p)];
            }
            Some(_) => {}
        }
        let key = Key {
            gpu: p.gpu,
            nic: p.nic,
            transport: p.transport,
            memory: p.memory,
            path: p.path,
            injected: p.injected,
            simulated: p.simulated,
            selection: p.selection,
            lanes: p.lanes,
        };
        let open = self.open.entry(key).or_insert_with(|| Open {
            gpu_bdf: p.gpu_bdf,
            nic_bdf: p.nic_bdf,
            first_at: at,
            last_at: at,
            bytes: 0,
            durations: Vec::new(),
        });
        open.last_at = open.last_at.max(at);
        open.bytes = open.bytes.saturating_add(p.bytes);
        open.durations.push(p.duration_ns);
        Vec::new()
    }

    /// Summaries whose window has passed by `now`.
    pub fn due(&mut self, now: DateTime<Utc>) -> Vec<RecordBody> {
        let Some(window) = self.window else { return Vec::new() };
        self.take(|_, o| now.signed_duration_since(o.first_at) >= window)
    }

    /// Every open summary (the agent is stopping).
    pub fn drain(&mut self) -> Vec<RecordBody> {
        self.take(|_, _| true)
    }

    /// Ok probes held in open summaries.
    pub fn held(&self) -> usize {
        self.open.values().map(|o| o.durations.len()).sum()
    }

    fn close_pair(&mut self, gpu: u32, nic: &str) -> Vec<RecordBody> {
        self.take(|k, _| k.gpu == gpu && k.nic == nic)
    }

    fn take(&mut self, pick: impl Fn(&Key, &Open) -> bool) -> Vec<RecordBody> {
        let keys: Vec<Key> = self.open.iter().filter(|(k, o)| pick(k, o)).map(|(k, _)| k.clone()).collect();
        let mut out: Vec<ProbeSummary> =
            keys.into_iter().filter_map(|k| self.open.remove(&k).map(|o| summary(k, o))).collect();
        out.sort_by(|a, b| (a.first_at, a.gpu, &a.nic).cmp(&(b.first_at, b.gpu, &b.nic)));
        out.into_iter().map(RecordBody::Summary).collect()
    }
}

fn summary(k: Key, mut o: Open) -> ProbeSummary {
    o.durations.sort_unstable();
    let n = o.durations.len();
    ProbeSummary {
        gpu: k.gpu,
        gpu_bdf: o.gpu_bdf,
        nic: k.nic,
        nic_bdf: o.nic_bdf,
        transport: k.transport,
        memory: k.memory,
        path: k.path,
        injected: k.injected,
        simulated: k.simulated,
        selection: k.selection,
        lanes: k.lanes,
        probes: u32::try_from(n).unwrap_or(u32::MAX),
        bytes: o.bytes,
        duration_min_ns: o.durations.first().copied().unwrap_or(0),
        duration_median_ns: o.durations.get(n / 2).copied().unwrap_or(0),
        duration_max_ns: o.durations.last().copied().unwrap_or(0),
        first_at: o.first_at,
        last_at: o.last_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_schema::{Diagnosis, Reported};

    fn probe(gpu: u32, nic: &str, verdict: ProbeVerdict, duration_ns: u64) -> ProbeResult {
        ProbeResult {
            gpu,
            gpu_bdf: None,
            nic: nic.into(),
            nic_bdf: None,
            transport: Transport::Sim,
            bytes: 1 << 20,
            reported: Reported::Success,
            reported_detail: String::new(),
            verdict,
            diagnosis: if verdict == ProbeVerdict::Ok { Diagnosis::None } else { Diagnosis::Untouched },
            first_bad_offset: None,
            bad_chunks: 0,
            chunks: 16,
            duration_ns,
            selection: PairSelection::Predicted,
            simulated: true,
            bit_flips: 0,
            receiver_detail: String::new(),
            memory: Memory::Host,
            path: DataPath::Simulated,
            injected: Injected::None,
            lanes: vec![],
        }
    }

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn kinds(v: &[RecordBody]) -> Vec<&'static str> {
        v.iter().map(RecordBody::kind).collect()
    }

    #[test]
    fn raw_mode_sends_every_probe() {
        let mut c = Compactor::new(Duration::ZERO);
        for i in 0..5 {
            assert_eq!(kinds(&c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(i))), ["probe"]);
        }
        assert!(c.due(t(10_000)).is_empty() && c.drain().is_empty());
    }

    #[test]
    fn the_first_ok_travels_in_full_and_the_rest_as_one_summary_per_window() {
        let mut c = Compactor::new(Duration::from_secs(300));
        assert_eq!(kinds(&c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 5), t(0))), ["probe"]);
        for (i, d) in [(60, 30), (120, 10), (180, 20), (240, 40)] {
            assert!(c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, d), t(i)).is_empty());
        }
        assert_eq!(c.held(), 4);
        assert!(c.due(t(359)).is_empty(), "the window opened at 60 s");
        let out = c.due(t(360));
        let [RecordBody::Summary(s)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!((s.probes, s.bytes), (4, 4 << 20));
        assert_eq!((s.duration_min_ns, s.duration_median_ns, s.duration_max_ns), (10, 30, 40));
        assert_eq!((s.first_at, s.last_at), (t(60), t(240)));
        assert_eq!((s.path, s.simulated, s.selection), (DataPath::Simulated, true, PairSelection::Predicted));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn a_failure_closes_its_pairs_summary_first_and_the_next_oks_travel_in_full() {
        let mut c = Compactor::new(Duration::from_secs(300));
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(1));
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(2));
        // another pair's summary stays open
        c.observe(probe(4, "mlx5_4", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(4, "mlx5_4", ProbeVerdict::Ok, 1), t(1));
        let out = c.observe(probe(3, "mlx5_3", ProbeVerdict::SilentCorruption, 1), t(3));
        assert_eq!(kinds(&out), ["summary", "probe"], "the oks before the failure are stored before it");
        let RecordBody::Summary(s) = &out[0] else { unreachable!() };
        assert_eq!((s.gpu, s.probes, s.last_at), (3, 2, t(2)));
        for i in 0..RAW_AFTER_FAILURE {
            assert_eq!(kinds(&c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(4 + i64::from(i)))), ["probe"]);
        }
        assert!(c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(10)).is_empty());
        assert_eq!(c.held(), 2, "GPU4's summary and GPU3's new one");
        let out = c.drain();
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn a_pair_that_becomes_the_workloads_sends_its_next_oks_in_full() {
        let mut c = Compactor::new(Duration::from_secs(300));
        let sweep = |t_: i64, c: &mut Compactor| {
            c.observe(ProbeResult { selection: PairSelection::Sweep, ..probe(3, "mlx5_0", ProbeVerdict::Ok, 1) }, t(t_))
        };
        assert_eq!(kinds(&sweep(0, &mut c)), ["probe"]);
        assert!(sweep(1, &mut c).is_empty());
        // Pinned to mlx5_0: the GPU's recovery needs consecutive oks on it now, not in 5 minutes.
        let pinned = || ProbeResult { selection: PairSelection::Pinned, ..probe(3, "mlx5_0", ProbeVerdict::Ok, 1) };
        for i in 0..RAW_AFTER_FAILURE {
            assert_eq!(kinds(&c.observe(pinned(), t(2 + i64::from(i)))), ["probe"]);
        }
        assert!(c.observe(pinned(), t(10)).is_empty());
    }

    #[test]
    fn probes_produced_differently_are_summarised_apart_and_injected_ones_travel_in_full() {
        let mut c = Compactor::new(Duration::from_secs(60));
        c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(1));
        let cuda = ProbeResult { memory: Memory::Cuda, ..probe(0, "mlx5_0", ProbeVerdict::Ok, 1) };
        assert!(c.observe(cuda, t(2)).is_empty());
        let lanes = ProbeResult { lanes: vec!["tcp/lo".into()], ..probe(0, "mlx5_0", ProbeVerdict::Ok, 1) };
        assert!(c.observe(lanes, t(3)).is_empty());
        let injected = ProbeResult { injected: Injected::Drop, ..probe(0, "mlx5_0", ProbeVerdict::Ok, 1) };
        assert_eq!(kinds(&c.observe(injected, t(4))), ["probe"]);
        let failed_injected =
            ProbeResult { injected: Injected::Drop, ..probe(0, "mlx5_0", ProbeVerdict::SilentCorruption, 1) };
        // an injected failure closes the pair's summaries (order) but is no failure of the pair
        assert_eq!(kinds(&c.observe(failed_injected, t(5))), ["summary", "summary", "summary", "probe"]);
        assert!(
            c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(6)).is_empty(),
            "no raw oks after a self-test fault"
        );
        let out = c.due(t(66));
        let [RecordBody::Summary(s)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!(s.memory, Memory::Host);
    }
}
