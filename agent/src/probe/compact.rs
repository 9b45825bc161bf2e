//! Evidence compaction at the edge: every failed probe travels in full, the ok probes of
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
//!
//! Windows are aligned: every pair's window ends at the same boundaries (a multiple of the window
//! after the node's own phase, so a fleet's nodes do not all send at once), and the summaries
//! closed together travel as one [`ProbeSummarySet`] record — the collector stores one row per
//! node and window instead of one per pair. A pair's first window is shorter (it opens at its
//! first summarised probe and ends at the next boundary).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use railguard_schema::{
    Bdf, DataPath, Injected, Memory, PairSelection, ProbeResult, ProbeSummary, ProbeSummarySet, ProbeVerdict,
    RecordBody, Transport,
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
    /// The boundary that ends its window.
    closes_at: DateTime<Utc>,
    bytes: u64,
    durations: Vec<u64>,
}

/// Turns probe results into the records to spool.
#[derive(Debug)]
pub struct Compactor {
    window: Option<chrono::TimeDelta>,
    /// Boundaries fall at `phase + k × window` (nanoseconds since the Unix epoch).
    phase_ns: i64,
    open: HashMap<Key, Open>,
    /// Per pair: ok probes still to send in full (a pair absent here has never been seen).
    raw_left: HashMap<(u32, String), u32>,
    /// Per pair: why it was last probed (sweep, predicted, pinned).
    selection: HashMap<(u32, String), PairSelection>,
}

impl Compactor {
    /// Summaries over `window`, whose boundaries fall `phase` after each multiple of `window`
    /// since the Unix epoch (the phase is taken modulo the window); `Duration::ZERO` sends every
    /// probe in full (raw mode).
    pub fn new(window: Duration, phase: Duration) -> Self {
        let window = (!window.is_zero()).then(|| chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX));
        let phase_ns = match window.and_then(|w| w.num_nanoseconds()) {
            Some(w) if w > 0 => i64::try_from(phase.as_nanos() % w.unsigned_abs() as u128).unwrap_or(0),
            _ => 0,
        };
        Compactor { window, phase_ns, open: HashMap::new(), raw_left: HashMap::new(), selection: HashMap::new() }
    }

    /// A node's phase: its name hashed (FNV-1a) into the window, stable across restarts, so
    /// the nodes of a fleet spread their summary sets over the window instead of all sending
    /// at the boundary.
    pub fn phase_for(node: &str, window: Duration) -> Duration {
        let h = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        let w = window.as_millis().max(1);
        Duration::from_millis(u64::try_from(u128::from(h) % w).unwrap_or(0))
    }

    /// The first boundary after `at`.
    fn boundary_after(&self, at: DateTime<Utc>, window: chrono::TimeDelta) -> DateTime<Utc> {
        let (Some(t), Some(w)) = (at.timestamp_nanos_opt(), window.num_nanoseconds()) else {
            return at + window;
        };
        if w <= 0 {
            return at;
        }
        let k = (t - self.phase_ns).div_euclid(w) + 1;
        k.checked_mul(w)
            .and_then(|b| b.checked_add(self.phase_ns))
            .map(DateTime::from_timestamp_nanos)
            .unwrap_or(at + window)
    }

    /// The records to spool now for a probe observed at `at`, in order.
    pub fn observe(&mut self, p: ProbeResult, at: DateTime<Utc>) -> Vec<RecordBody> {
        let Some(window) = self.window else { return vec![RecordBody::Probe(p)] };
        // A summary never outlives its window, even when `due` was not called in time: the first
        // probe after a boundary closes every window that ended there, as one set.
        let mut out = self.due(at);
        let pair = (p.gpu, p.nic.clone());
        if p.verdict != ProbeVerdict::Ok {
            out.extend(self.close_pair(p.gpu, &p.nic));
            if p.is_evidence() {
                self.raw_left.insert(pair, RAW_AFTER_FAILURE);
            }
            out.push(RecordBody::Probe(p));
            return out;
        }
        if !p.is_evidence() {
            out.push(RecordBody::Probe(p));
            return out;
        }
        // A pair that has just become the workload's (or stopped being it) proves itself afresh.
        if self.selection.insert(pair.clone(), p.selection).is_some_and(|s| s != p.selection) {
            self.raw_left.insert(pair.clone(), RAW_AFTER_FAILURE);
        }
        match self.raw_left.get_mut(&pair) {
            None => {
                self.raw_left.insert(pair, 0);
                out.push(RecordBody::Probe(p));
                return out;
            }
            Some(n) if *n > 0 => {
                *n -= 1;
                out.push(RecordBody::Probe(p));
                return out;
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
        let closes_at = self.boundary_after(at, window);
        let open = self.open.entry(key).or_insert_with(|| Open {
            gpu_bdf: p.gpu_bdf,
            nic_bdf: p.nic_bdf,
            first_at: at,
            last_at: at,
            closes_at,
            bytes: 0,
            durations: Vec::new(),
        });
        open.last_at = open.last_at.max(at);
        open.bytes = open.bytes.saturating_add(p.bytes);
        open.durations.push(p.duration_ns);
        out
    }

    /// Summaries whose window has ended by `now`, one set per window.
    pub fn due(&mut self, now: DateTime<Utc>) -> Vec<RecordBody> {
        self.take(|_, o| now >= o.closes_at)
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

    /// The picked summaries as one set per window (none: no record), split if a set would be
    /// larger than one may be (more than 1,024 pairs and provenances on a node).
    fn take(&mut self, pick: impl Fn(&Key, &Open) -> bool) -> Vec<RecordBody> {
        let keys: Vec<Key> = self.open.iter().filter(|(k, o)| pick(k, o)).map(|(k, _)| k.clone()).collect();
        // One set per window: a set spans at most its window, however late it is taken.
        let mut windows: BTreeMap<DateTime<Utc>, Vec<ProbeSummary>> = BTreeMap::new();
        for k in keys {
            if let Some(o) = self.open.remove(&k) {
                windows.entry(o.closes_at).or_default().push(summary(k, o));
            }
        }
        let mut out = Vec::new();
        for mut summaries in windows.into_values() {
            summaries.sort_by(|a, b| (a.first_at, a.gpu, &a.nic).cmp(&(b.first_at, b.gpu, &b.nic)));
            out.extend(
                summaries
                    .chunks(ProbeSummarySet::MAX_SUMMARIES)
                    .map(|c| RecordBody::Summaries(ProbeSummarySet { summaries: c.to_vec() })),
            );
        }
        out
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

    /// A compactor whose window boundaries fall on t(0), t(w), t(2w), ...
    fn aligned(window_secs: u64) -> Compactor {
        Compactor::new(Duration::from_secs(window_secs), Duration::from_secs(1_700_000_000 % window_secs))
    }

    /// The one set in `out`.
    fn one_set(out: &[RecordBody]) -> &[ProbeSummary] {
        let [RecordBody::Summaries(set)] = out else { panic!("{out:?}") };
        &set.summaries
    }

    #[test]
    fn raw_mode_sends_every_probe() {
        let mut c = Compactor::new(Duration::ZERO, Duration::ZERO);
        for i in 0..5 {
            assert_eq!(kinds(&c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(i))), ["probe"]);
        }
        assert!(c.due(t(10_000)).is_empty() && c.drain().is_empty());
    }

    #[test]
    fn the_first_ok_travels_in_full_and_the_rest_as_one_summary_per_window() {
        let mut c = aligned(300);
        assert_eq!(kinds(&c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 5), t(0))), ["probe"]);
        for (i, d) in [(60, 30), (120, 10), (180, 20), (240, 40)] {
            assert!(c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, d), t(i)).is_empty());
        }
        assert_eq!(c.held(), 4);
        assert!(c.due(t(299)).is_empty(), "the window ends at the boundary, 300 s");
        let out = c.due(t(300));
        let [s] = one_set(&out) else { panic!("{out:?}") };
        assert_eq!((s.probes, s.bytes), (4, 4 << 20));
        assert_eq!((s.duration_min_ns, s.duration_median_ns, s.duration_max_ns), (10, 30, 40));
        assert_eq!((s.first_at, s.last_at), (t(60), t(240)));
        assert_eq!((s.path, s.simulated, s.selection), (DataPath::Simulated, true, PairSelection::Predicted));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn a_failure_closes_its_pairs_summary_first_and_the_next_oks_travel_in_full() {
        let mut c = aligned(300);
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(1));
        c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(2));
        // another pair's summary stays open
        c.observe(probe(4, "mlx5_4", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(4, "mlx5_4", ProbeVerdict::Ok, 1), t(1));
        let out = c.observe(probe(3, "mlx5_3", ProbeVerdict::SilentCorruption, 1), t(3));
        assert_eq!(kinds(&out), ["summaries", "probe"], "the oks before the failure are stored before it");
        let [s] = one_set(&out[..1]) else { panic!("{out:?}") };
        assert_eq!((s.gpu, s.probes, s.last_at), (3, 2, t(2)));
        for i in 0..RAW_AFTER_FAILURE {
            assert_eq!(kinds(&c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(4 + i64::from(i)))), ["probe"]);
        }
        assert!(c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(10)).is_empty());
        assert_eq!(c.held(), 2, "GPU4's summary and GPU3's new one");
        let out = c.drain();
        assert_eq!(one_set(&out).len(), 2, "both end at the same boundary: one set");
    }

    #[test]
    fn a_pair_that_becomes_the_workloads_sends_its_next_oks_in_full() {
        let mut c = aligned(300);
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
        let mut c = aligned(60);
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
        let out = c.observe(failed_injected, t(5));
        assert_eq!(kinds(&out), ["summaries", "probe"]);
        assert_eq!(one_set(&out[..1]).len(), 3, "host, cuda and tcp/lo apart");
        assert!(
            c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(6)).is_empty(),
            "no raw oks after a self-test fault"
        );
        let out = c.due(t(66));
        let [s] = one_set(&out) else { panic!("{out:?}") };
        assert_eq!(s.memory, Memory::Host);
    }

    #[test]
    fn pairs_whose_windows_end_together_travel_as_one_set() {
        let mut c = aligned(300);
        for (gpu, at) in [(0, 10), (1, 100), (2, 290)] {
            let nic = format!("mlx5_{gpu}");
            c.observe(probe(gpu, &nic, ProbeVerdict::Ok, 1), t(at - 5)); // the first, in full
            assert!(c.observe(probe(gpu, &nic, ProbeVerdict::Ok, 1), t(at)).is_empty());
        }
        assert!(c.due(t(299)).is_empty());
        let out = c.due(t(300));
        let set = one_set(&out);
        assert_eq!(set.iter().map(|s| s.gpu).collect::<Vec<_>>(), [0, 1, 2], "one set, ordered by first probe");
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn a_summary_never_outlives_its_window_and_a_late_take_gives_one_set_per_window() {
        use chrono::TimeDelta;
        let mut c = aligned(60);
        c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(1, "mlx5_1", ProbeVerdict::Ok, 1), t(0));
        assert!(c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(10)).is_empty());
        assert!(c.observe(probe(1, "mlx5_1", ProbeVerdict::Ok, 1), t(10)).is_empty());
        // `due` was not called at 60 s: the next probe after the boundary (GPU0's) closes every
        // window that ended there, GPU1's too, as one set, before it is summarised afresh.
        let out = c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(70));
        let set = one_set(&out);
        assert_eq!(set.iter().map(|s| (s.gpu, s.last_at)).collect::<Vec<_>>(), [(0, t(10)), (1, t(10))]);
        assert!(c.observe(probe(1, "mlx5_1", ProbeVerdict::Ok, 1), t(75)).is_empty());
        // GPU0, 1 and 2's windows end at 120 s; GPU3's first probe after it, even one that
        // travels in full (its first), closes them as one set before it.
        c.observe(probe(2, "mlx5_2", ProbeVerdict::Ok, 1), t(99));
        assert!(c.observe(probe(2, "mlx5_2", ProbeVerdict::Ok, 1), t(100)).is_empty());
        let out = c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(124));
        assert_eq!(kinds(&out), ["summaries", "probe"]);
        assert_eq!(one_set(&out[..1]).iter().map(|s| s.gpu).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(c.observe(probe(3, "mlx5_3", ProbeVerdict::Ok, 1), t(125)).is_empty());
        assert!(c.due(t(130)).is_empty());
        assert_eq!(c.held(), 1, "GPU3's window is still open");
        // Windows that ended at different boundaries are different sets (a set spans one window).
        let mut c = aligned(60);
        c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(10));
        c.observe(probe(1, "mlx5_1", ProbeVerdict::Ok, 1), t(0));
        c.observe(probe(1, "mlx5_1", ProbeVerdict::Ok, 1), t(10));
        let mut d = Compactor { open: HashMap::new(), ..aligned(60) };
        std::mem::swap(&mut c.open, &mut d.open);
        // GPU1's summary moved a window later by hand: what a late take meets after a stall.
        for (k, o) in d.open.drain() {
            let shift = if k.gpu == 1 { TimeDelta::seconds(60) } else { TimeDelta::zero() };
            c.open.insert(k, Open { closes_at: o.closes_at + shift, ..o });
        }
        let out = c.drain();
        assert_eq!(kinds(&out), ["summaries", "summaries"]);
        assert_eq!((one_set(&out[..1])[0].gpu, one_set(&out[1..])[0].gpu), (0, 1));
    }

    #[test]
    fn a_window_with_more_summaries_than_a_set_holds_travels_as_several_sets() {
        let mut c = aligned(300);
        let n = ProbeSummarySet::MAX_SUMMARIES + 76;
        for i in 0..n {
            let nic = format!("nic{i}");
            c.observe(probe(0, &nic, ProbeVerdict::Ok, 1), t(1)); // the first, in full
            assert!(c.observe(probe(0, &nic, ProbeVerdict::Ok, 1), t(2)).is_empty());
        }
        let out = c.due(t(300));
        let sizes: Vec<usize> = out
            .iter()
            .map(|r| match r {
                RecordBody::Summaries(s) => s.summaries.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sizes, [ProbeSummarySet::MAX_SUMMARIES, 76]);
    }

    #[test]
    fn nodes_spread_their_boundaries_over_the_window() {
        let w = Duration::from_secs(300);
        let phases: std::collections::BTreeSet<Duration> =
            (0..50).map(|i| Compactor::phase_for(&format!("gpu-node-{i:03}"), w)).collect();
        assert!(phases.len() > 45, "{} distinct phases of 50", phases.len());
        assert!(phases.iter().all(|p| *p < w));
        assert_eq!(Compactor::phase_for("a", w), Compactor::phase_for("a", w), "stable");
        // A phase beyond the window is taken modulo it: the same boundaries.
        let mut a = Compactor::new(w, Duration::from_secs(10));
        let mut b = Compactor::new(w, Duration::from_secs(310));
        for c in [&mut a, &mut b] {
            c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(0));
            c.observe(probe(0, "mlx5_0", ProbeVerdict::Ok, 1), t(1));
        }
        assert_eq!(a.open.values().next().unwrap().closes_at, b.open.values().next().unwrap().closes_at);
    }
}
