//! The window's probe evidence per GPU/NIC pair, for a pass. Records stored a row each (full
//! probes, the single summaries of older agents) are grouped in SQL; summary sets are read as
//! the rows of arrays they are stored as and added up here, a set at a time as they stream in:
//! unnesting every set's summaries into rows and grouping them in SQL, or ranking the workload
//! pairs' latest verdicts through the same unnest, costs an order of magnitude more of a pass
//! (figures and how to reproduce them: docs/scaling.md).
//!
//! The result is what this query over every record and summary (`probe_evidence`) defines, and
//! what `e2e/tests/window_evidence.rs` checks it against on random evidence:
//!
//! ```sql
//! WITH w AS (SELECT * FROM probe_evidence WHERE <in the window> AND injected = 'none'),
//!      sim AS (SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id),
//!      t AS (SELECT w.*, railguard_trusted(w.path, sim.all_simulated) AS trusted FROM w JOIN sim USING (node_id))
//! SELECT node_id, gpu_index, nic, <sum(probes) of the trusted per verdict>, <of the trusted ok with
//!        nic_dma and cuda>, mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (<trusted corruption>),
//!        bool_or(trusted AND path = 'simulated'), <sum(probes) of the untrusted ok, and not ok>,
//!        array_agg(DISTINCT <transport, over its first lane>) FILTER (WHERE NOT trusted)
//! FROM t GROUP BY node_id, gpu_index, nic
//! ```
//!
//! The trust policy is `railguard_trusted` (migration 0016): a probe verifies its pair only if the
//! pair's NIC moved the bytes, or it ran on the simulated fabric of a node whose whole fabric (in
//! the window) is simulated. Injected faults are not evidence at all.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use railguard_schema::{Diagnosis, ProbeVerdict};
use sqlx::types::Json;
use tokio_stream::StreamExt;

use super::{InlineCounts, PairCounts};

/// A GPU's latest verdicts on its workload pair, with their time, newest first once sorted.
pub(super) type Recent = Vec<(DateTime<Utc>, ProbeVerdict, i32)>;

/// What a pair's probes proved, by the path that carried them: the trust policy decides per
/// node which paths count, once every record of the node is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    NicDma = 0,
    Simulated = 1,
    /// Host copies and anything else: never trusted.
    Other = 2,
}

impl Class {
    fn of(path: &str) -> Class {
        match path {
            "nic_dma" => Class::NicDma,
            "simulated" => Class::Simulated,
            _ => Class::Other,
        }
    }

    /// The trust policy per class index (`PairAcc::by_class`): the pair's NIC's DMA always; the
    /// simulated fabric on a node whose evidence is all simulated.
    fn trusted(class: usize, all_simulated: bool) -> bool {
        class == Class::NicDma as usize || (class == Class::Simulated as usize && all_simulated)
    }
}

/// Adds `n` to `v`, or takes it away (evidence leaving the window; never below zero).
fn step(v: &mut u64, n: u64, remove: bool) {
    *v = if remove { v.saturating_sub(n) } else { v.saturating_add(n) };
}

/// One pair's evidence on one class of path. Every part is a count, so evidence that leaves
/// a kept period is taken away exactly as it was added ([`PeriodCache`]).
#[derive(Default, Clone)]
struct ClassCounts {
    records: u64,
    ok: u64,
    silent_corruption: u64,
    reported_failure: u64,
    timeout: u64,
    /// Ok probes the pair's NIC moved in GPU memory at both ends (`nic_dma`, `cuda`).
    ok_cuda: u64,
    /// Records of silent corruption per diagnosis (the mode counts records, as SQL's does).
    diagnoses: Vec<(Diagnosis, u64)>,
    /// What carried the probes, with its records (only read where the class is not trusted; a
    /// pair has one or two).
    via: Vec<(String, u64)>,
}

impl ClassCounts {
    fn add(&mut self, verdict: ProbeVerdict, diagnosis: Diagnosis, cuda: bool, probes: u64, records: u64) {
        step(&mut self.records, records, false);
        match verdict {
            ProbeVerdict::Ok => {
                step(&mut self.ok, probes, false);
                if cuda {
                    step(&mut self.ok_cuda, probes, false);
                }
            }
            ProbeVerdict::SilentCorruption => {
                step(&mut self.silent_corruption, probes, false);
                self.count_diagnosis(diagnosis, records, false);
            }
            ProbeVerdict::ReportedFailure => step(&mut self.reported_failure, probes, false),
            ProbeVerdict::Timeout => step(&mut self.timeout, probes, false),
        }
    }

    fn count_diagnosis(&mut self, diagnosis: Diagnosis, records: u64, remove: bool) {
        match self.diagnoses.iter().position(|(d, _)| *d == diagnosis) {
            Some(i) => {
                step(&mut self.diagnoses[i].1, records, remove);
                if self.diagnoses[i].1 == 0 {
                    self.diagnoses.swap_remove(i);
                }
            }
            None if !remove => self.diagnoses.push((diagnosis, records)),
            None => {}
        }
    }

    fn count_via(&mut self, via: &str, records: u64, remove: bool) {
        match self.via.iter().position(|(v, _)| v == via) {
            Some(i) => {
                step(&mut self.via[i].1, records, remove);
                if self.via[i].1 == 0 {
                    self.via.swap_remove(i);
                }
            }
            None if !remove => self.via.push((via.to_owned(), records)),
            None => {}
        }
    }

    /// Adds another class's counts to these, or (`remove`) takes them away.
    fn merge(&mut self, other: &ClassCounts, remove: bool) {
        step(&mut self.records, other.records, remove);
        step(&mut self.ok, other.ok, remove);
        step(&mut self.silent_corruption, other.silent_corruption, remove);
        step(&mut self.reported_failure, other.reported_failure, remove);
        step(&mut self.timeout, other.timeout, remove);
        step(&mut self.ok_cuda, other.ok_cuda, remove);
        for (d, n) in &other.diagnoses {
            self.count_diagnosis(*d, *n, remove);
        }
        for (v, n) in &other.via {
            self.count_via(v, *n, remove);
        }
    }

    fn bad(&self) -> u64 {
        self.silent_corruption.saturating_add(self.reported_failure).saturating_add(self.timeout)
    }
}

/// A pair's evidence by [`Class`] of path (a pair has one or two; the window kept between
/// passes holds one of these for every pair of the fleet).
#[derive(Default, Clone)]
struct PairAcc {
    by_class: [Option<Box<ClassCounts>>; 3],
}

impl PairAcc {
    fn is_empty(&self) -> bool {
        self.by_class.iter().flatten().all(|c| c.records == 0)
    }

    fn class(&mut self, class: usize) -> &mut ClassCounts {
        self.by_class[class].get_or_insert_with(Box::default)
    }
}

#[derive(Default, Clone)]
struct NodeAcc {
    /// Records of the node in the window that did not run on the simulated fabric (none: the
    /// node's fabric is all simulated, and its simulated probes are trusted).
    not_simulated: u64,
    /// Per GPU, its NICs' evidence (a GPU has a few NICs: found by a look along them, with no
    /// allocation for a pair already seen).
    pairs: HashMap<i32, Vec<(String, PairAcc)>>,
}

/// Records of one pair with one provenance and outcome: a grouped row, or one summary of a set.
struct Evidence<'a> {
    gpu: i32,
    nic: &'a str,
    path: &'a str,
    memory: &'a str,
    verdict: ProbeVerdict,
    diagnosis: Diagnosis,
    /// The probes the records stand for, and the records.
    probes: u64,
    records: u64,
    transport: &'a str,
    first_lane: Option<&'a str>,
}

impl Evidence<'_> {
    /// Why this stored row is one ingest could never have accepted, if it is.
    fn out_of_bounds(&self) -> Option<String> {
        if super::stored_gpu(self.gpu).is_none() {
            return Some(format!("a stored probe row names GPU index {}", self.gpu));
        }
        // A grouped row stands for many records; each stands for at most a summary's bound.
        let max = u64::from(railguard_schema::limits::MAX_SUMMARY_PROBES).saturating_mul(self.records.max(1));
        if self.probes > max {
            return Some(format!(
                "a stored probe row of GPU{} stands for {} probes in {} record(s)",
                self.gpu, self.probes, self.records
            ));
        }
        None
    }
}

impl NodeAcc {
    /// Counts `e` into its pair, and into the node's trust decision; for a path that may prove
    /// nothing, notes the transport that carried it.
    fn record(&mut self, e: Evidence<'_>) {
        let class = Class::of(e.path);
        if class != Class::Simulated {
            step(&mut self.not_simulated, e.records, false);
        }
        let counts = self.pair(e.gpu, e.nic).class(class as usize);
        let cuda = class == Class::NicDma && e.memory == "cuda";
        counts.add(e.verdict, e.diagnosis, cuda, e.probes, e.records);
        if class != Class::NicDma {
            counts.count_via(&via(e.transport, e.first_lane), e.records, false);
        }
    }

    fn pair(&mut self, gpu: i32, nic: &str) -> &mut PairAcc {
        let nics = self.pairs.entry(gpu).or_default();
        let i = match nics.iter().position(|(n, _)| n == nic) {
            Some(i) => i,
            None => {
                nics.push((nic.to_owned(), PairAcc::default()));
                nics.len() - 1
            }
        };
        &mut nics[i].1
    }
}

/// Each pair's evidence in the window, and the candidates for each workload pair's latest
/// verdicts.
#[derive(Default)]
pub(super) struct WindowEvidence {
    nodes: BTreeMap<String, NodeAcc>,
    /// Per (node, GPU): the workload pair's records (time, verdict, probes), in no order.
    pub recent: HashMap<(String, i32), Recent>,
    /// Nodes with a stored row that ingest could never have accepted (a GPU index out of range,
    /// a summary's probe count out of bounds), with the first such row in words: the row is not
    /// counted, and the node is not assessed on the rest ([`super::Damage`]).
    pub damaged: super::Damage,
}

impl WindowEvidence {
    /// A node's evidence (a name per grouped row or set, not per summary).
    fn node(&mut self, node: String) -> &mut NodeAcc {
        self.nodes.entry(node).or_default()
    }

    /// Counts `e` into `node`'s evidence, or, where the row is outside what ingest accepts,
    /// notes the node damaged instead.
    fn count(&mut self, node: &str, e: Evidence<'_>) {
        match e.out_of_bounds() {
            Some(why) => self.damaged.note(node, || why),
            None => match self.nodes.get_mut(node) {
                Some(acc) => acc.record(e),
                None => self.node(node.to_owned()).record(e),
            },
        }
    }

    /// Each pair's counts under the trust policy, in (node, GPU, NIC) order.
    pub fn into_pairs(self) -> Vec<(String, i32, PairCounts)> {
        let mut out = Vec::new();
        for (node, acc) in self.nodes {
            let all_simulated = acc.not_simulated == 0;
            let mut pairs: Vec<(i32, String, PairAcc)> = acc
                .pairs
                .into_iter()
                .flat_map(|(gpu, nics)| nics.into_iter().map(move |(nic, p)| (gpu, nic, p)))
                .filter(|(_, _, p)| !p.is_empty())
                .collect();
            pairs.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (gpu, nic, p) in pairs {
                let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                let (mut proven, mut unproven) = (ClassCounts::default(), ClassCounts::default());
                let mut simulated = false;
                for (c, k) in p.by_class.into_iter().enumerate() {
                    let Some(k) = k.filter(|k| k.records > 0) else { continue };
                    let k = *k;
                    if Class::trusted(c, all_simulated) {
                        simulated |= c == Class::Simulated as usize;
                        proven.merge(&k, false);
                    } else {
                        unproven.merge(&k, false);
                    }
                }
                let counts = PairCounts {
                    nic,
                    ok: n(proven.ok),
                    silent_corruption: n(proven.silent_corruption),
                    reported_failure: n(proven.reported_failure),
                    timeout: n(proven.timeout),
                    ok_gpu_memory: n(proven.ok_cuda),
                    // SQL's mode(): the most frequent, the first in the column's (text) order on a tie.
                    diagnosis: proven
                        .diagnoses
                        .into_iter()
                        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.as_str().cmp(a.0.as_str())))
                        .map(|(d, _)| d),
                    simulated,
                    unproven_ok: n(unproven.ok),
                    unproven_bad: n(unproven.bad()),
                    unproven_via: {
                        let mut via: Vec<String> = unproven.via.into_iter().map(|(v, _)| v).collect();
                        via.sort_unstable();
                        via
                    },
                    inline: InlineCounts::default(),
                };
                out.push((node.clone(), gpu, counts));
            }
        }
        out
    }
}

/// What carried a probe, for "unproven … via X": its transport, over its first lane if it
/// reported any (`ucx over tcp/lo`).
fn via<'a>(transport: &'a str, first_lane: Option<&str>) -> Cow<'a, str> {
    match first_lane {
        Some(lane) => Cow::Owned(format!("{transport} over {lane}")),
        None => Cow::Borrowed(transport),
    }
}

/// A record's first lane, as SQL's `lanes->>0` reads it (lanes are stored as a JSON array of
/// strings; anything else in the array as its JSON text).
fn first_lane(lanes: &serde_json::Value) -> Option<Cow<'_, str>> {
    match lanes.as_array()?.first()? {
        serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
        other => Some(Cow::Owned(other.to_string())),
    }
}

/// The workload NIC of each GPU, per node: the pairs whose latest verdicts are ranked.
pub(super) type WorkloadPairs = HashMap<String, Vec<(i32, String)>>;

/// Where the workload pairs of a node are looked up: the pass's topologies, or what the cache
/// keeps them for.
pub(super) trait Workloads: Sync {
    fn of(&self, node: &str) -> Option<&[(i32, String)]>;

    /// No node has a workload pair: no latest verdicts to read (the pattern finder's reads).
    fn none(&self) -> bool {
        false
    }
}

impl Workloads for WorkloadPairs {
    fn of(&self, node: &str) -> Option<&[(i32, String)]> {
        self.get(node).map(Vec::as_slice)
    }

    fn none(&self) -> bool {
        self.is_empty()
    }
}

fn is_workload(workload: &(dyn Workloads + Sync), node: &str, gpu: i32, nic: &str) -> bool {
    workload.of(node).is_some_and(|w| w.iter().any(|(g, n)| *g == gpu && n == nic))
}

/// Reads the evidence of `filter`'s nodes (every node when None) observed in (`since`, `now`].
pub(super) async fn load(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    workload: &(dyn Workloads + Sync),
    laps: &mut super::Laps<'_>,
) -> Result<WindowEvidence, sqlx::Error> {
    Ok(load_split(conn, filter, [(since, now), (now, now)], now, workload, false, laps).await?.0)
}

/// Every node's evidence observed in (`since`, `until`] across the storage tiers, for the
/// pattern finder: the whole hours `[rolled.0, rolled.1)` (hours the collector has rolled up,
/// inside the period) from the pair-hour rollups, the rest of the period from the evidence
/// itself. A rolled-up hour counts its pair's probes per provenance as the evidence did, with no
/// diagnosis of its failures and no lanes (neither is rolled up); evidence that reached the
/// store after its hour's last roll-up is not in it. No workload pairs' latest verdicts.
pub(super) async fn load_period(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    rolled: Option<Hours>,
    laps: &mut super::Laps<'_>,
) -> Result<WindowEvidence, sqlx::Error> {
    let none = WorkloadPairs::new();
    let Some((from, to)) = rolled.filter(|(f, t)| since <= *f && f < t && *t <= until) else {
        return Ok(load_split(conn, &None, [(since, until), (until, until)], until, &none, true, laps).await?.0);
    };
    let mut ev = load_around(conn, since, until, (from, to), laps).await?;
    read_rolled(conn, (from, to), &mut ev).await?;
    laps.lap(super::Step::SummarySets);
    Ok(ev)
}

/// The evidence of (`since`, `until`] outside the rolled hours `[from, to)` in it: (a, b] ranges
/// up to the instant before `from`, and from `to` on.
async fn load_around(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    (from, to): Hours,
    laps: &mut super::Laps<'_>,
) -> Result<WindowEvidence, sqlx::Error> {
    let tick = chrono::TimeDelta::microseconds(1);
    let none = WorkloadPairs::new();
    Ok(load_split(conn, &None, [(since, from - tick), (to - tick, until)], until, &none, true, laps).await?.0)
}

/// Whole hours, [start, end).
pub(super) type Hours = (DateTime<Utc>, DateTime<Utc>);

/// Adds the pair-hour rollups of the hours `[from, to)` to `ev`, as [`load_period`] reads them.
async fn read_rolled(
    conn: &mut sqlx::PgConnection,
    (from, to): Hours,
    ev: &mut WindowEvidence,
) -> Result<(), sqlx::Error> {
    if from >= to {
        return Ok(());
    }
    // A node's rows of the rolled hours mostly share one layout (its pairs and their
    // provenance, six arrays): rows with the layout of the node's row before are compared as
    // they came (binary) and only their counts decoded and added up per element; a layout is
    // decoded, and what was added up counted into the node, once per run of rows that share
    // it. The same counts as a row at a time (each element's probes summed, its records the
    // rows that had any), at 10,000 nodes a day's 240,000 rows of 64 elements instead of 15
    // million element-by-element records.
    let mut rows = sqlx::query(
        "SELECT node_id, gpu_index, nic, path, memory, injected, transport, ok, silent_corruption, reported_failure, timeout
         FROM probe_rollup_sets WHERE hour >= $1 AND hour < $2
         UNION ALL
         SELECT node_id, ARRAY[gpu_index], ARRAY[nic], ARRAY[path], ARRAY[memory], ARRAY[injected], ARRAY[transport],
                ARRAY[ok], ARRAY[silent_corruption], ARRAY[reported_failure], ARRAY[timeout]
         FROM probe_rollups WHERE hour >= $1 AND hour < $2",
    )
    .bind(from)
    .bind(to)
    .fetch(&mut *conn);
    let mut runs: HashMap<String, RolledRun> = HashMap::new();
    let mut key = Vec::new();
    while let Some(row) = rows.next().await {
        let row = row?;
        let node_id: String = sqlx::Row::try_get(&row, 0)?;
        RolledRun::layout_of(&row, &mut key)?;
        let run = match runs.entry(node_id) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                if o.get().layout != key {
                    let done = o.insert(RolledRun::of(&row, key.clone())?);
                    done.count_into(ev.node(o.key().clone()));
                }
                o.into_mut()
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(RolledRun::of(&row, key.clone())?),
        };
        run.add(&row)?;
    }
    for (node_id, run) in runs {
        run.count_into(ev.node(node_id));
    }
    Ok(())
}

/// A run of a node's rolled-up rows that share one layout ([`load_period`]): the layout, and
/// each element's counts added up over the run.
struct RolledRun {
    /// The six layout columns as they came (binary), each after its length.
    layout: Vec<u8>,
    gpus: Vec<i32>,
    nics: Vec<String>,
    paths: Vec<String>,
    memories: Vec<String>,
    injected: Vec<String>,
    transports: Vec<String>,
    /// Per element and verdict (ok, silent corruption, reported failure, timeout): the probes,
    /// and the rows that had any.
    sums: Vec<[(u64, u64); 4]>,
}

impl RolledRun {
    const VERDICTS: [ProbeVerdict; 4] =
        [ProbeVerdict::Ok, ProbeVerdict::SilentCorruption, ProbeVerdict::ReportedFailure, ProbeVerdict::Timeout];

    /// `row`'s layout columns (1 to 6) as they came, into `key`.
    fn layout_of(row: &sqlx::postgres::PgRow, key: &mut Vec<u8>) -> Result<(), sqlx::Error> {
        use sqlx::{Row, ValueRef};
        key.clear();
        for i in 1..=6 {
            let raw = row.try_get_raw(i)?;
            let bytes = if raw.is_null() { &[][..] } else { raw.as_bytes().map_err(sqlx::Error::Decode)? };
            key.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            key.extend_from_slice(bytes);
        }
        Ok(())
    }

    fn of(row: &sqlx::postgres::PgRow, layout: Vec<u8>) -> Result<RolledRun, sqlx::Error> {
        use sqlx::Row;
        let gpus: Vec<i32> = row.try_get(1)?;
        let sums = vec![[(0, 0); 4]; gpus.len()];
        Ok(RolledRun {
            layout,
            gpus,
            nics: row.try_get(2)?,
            paths: row.try_get(3)?,
            memories: row.try_get(4)?,
            injected: row.try_get(5)?,
            transports: row.try_get(6)?,
            sums,
        })
    }

    /// Adds `row`'s counts (columns 7 to 10), element by element.
    fn add(&mut self, row: &sqlx::postgres::PgRow) -> Result<(), sqlx::Error> {
        use sqlx::Row;
        for (v, col) in [7, 8, 9, 10].into_iter().enumerate() {
            let counts: Vec<i64> = row.try_get(col)?;
            for (sum, n) in self.sums.iter_mut().zip(counts) {
                let n = u64::try_from(n).unwrap_or(0);
                if n > 0 {
                    sum[v].0 = sum[v].0.saturating_add(n);
                    sum[v].1 = sum[v].1.saturating_add(1);
                }
            }
        }
        Ok(())
    }

    /// Counts the run into its node: each element with a probe, as its rows would one by one
    /// (no diagnosis: not rolled up; injected probes are no evidence).
    fn count_into(self, node: &mut NodeAcc) {
        for (i, sum) in self.sums.iter().enumerate() {
            let (Some(&gpu), Some(nic), Some(path), Some(memory), Some(inj), Some(transport)) = (
                self.gpus.get(i),
                self.nics.get(i),
                self.paths.get(i),
                self.memories.get(i),
                self.injected.get(i),
                self.transports.get(i),
            ) else {
                continue;
            };
            if inj != "none" {
                continue;
            }
            for (verdict, (probes, records)) in Self::VERDICTS.into_iter().zip(sum) {
                if *records > 0 {
                    node.record(Evidence {
                        gpu,
                        nic,
                        path,
                        memory,
                        verdict,
                        diagnosis: Diagnosis::None,
                        probes: *probes,
                        records: *records,
                        transport,
                        first_lane: None,
                    });
                }
            }
        }
    }
}

/// [`load`] of the evidence observed in either of two ranges (`(a, b]`; an empty one is
/// `(t, t]`), in one read: what was observed up to `split`, and what after. Among the workload
/// pairs' latest records, those of the later part are complete (its newest ten); the earlier
/// part's are complete only where the later part has fewer than ten, which is all a ranking of
/// the two together needs. `lean` (the pattern finder's read): the summary sets without their
/// memory, transports and lanes, so no GPU-memory counts and no transports of unproven probes
/// from them (the trust decision and the verdicts are the same).
async fn load_split(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    ranges: [(DateTime<Utc>, DateTime<Utc>); 2],
    split: DateTime<Utc>,
    workload: &(dyn Workloads + Sync),
    lean: bool,
    laps: &mut super::Laps<'_>,
) -> Result<(WindowEvidence, WindowEvidence), sqlx::Error> {
    let (mut ev, mut late) = (WindowEvidence::default(), WindowEvidence::default());

    // Records stored a row each, grouped by what the trust policy and the counts tell apart.
    #[derive(sqlx::FromRow)]
    struct Group {
        node_id: String,
        gpu_index: i32,
        nic: String,
        path: String,
        memory: String,
        verdict: ProbeVerdict,
        diagnosis: Diagnosis,
        transport: String,
        first_lane: Option<String>,
        probes: i64,
        records: i64,
        after: bool,
    }
    let [(a0, b0), (a1, b1)] = ranges;
    // Streamed: a rolling start's first minute is a row for each of every pair's first probes.
    let mut groups = sqlx::query_as::<_, Group>(
        "SELECT node_id, gpu_index, nic, path, memory, verdict, diagnosis,
                -- what carried it, read only where the path proves nothing (see `via`)
                CASE WHEN path = 'nic_dma' THEN '' ELSE transport END AS transport,
                CASE WHEN path = 'nic_dma' THEN NULL ELSE lanes->>0 END AS first_lane,
                sum(probes)::bigint AS probes, count(*) AS records, observed_at > $6 AS after
         FROM probe_row_evidence
         WHERE ((observed_at > $2 AND observed_at <= $3) OR (observed_at > $4 AND observed_at <= $5))
           AND injected = 'none' AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 12",
    )
    .bind(filter)
    .bind(a0)
    .bind(b0)
    .bind(a1)
    .bind(b1)
    .bind(split)
    .fetch(&mut *conn);
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    while let Some(g) = groups.next().await {
        let g = g?;
        let part = if g.after { &mut late } else { &mut ev };
        part.count(
            &g.node_id,
            Evidence {
                gpu: g.gpu_index,
                nic: &g.nic,
                path: &g.path,
                memory: &g.memory,
                verdict: g.verdict,
                diagnosis: g.diagnosis,
                probes: u(g.probes),
                records: u(g.records),
                transport: &g.transport,
                first_lane: g.first_lane.as_deref(),
            },
        );
    }
    drop(groups);
    laps.lap(super::Step::ProbeRows);

    // The latest records stored a row each of every pair on a path that may verify it (ten a
    // pair at most: all the hysteresis reads), kept for the workload pairs, to be ranked with
    // the sets' below (none to keep when no node has a workload pair).
    let recent: Vec<(String, i32, String, DateTime<Utc>, ProbeVerdict, i32)> = if workload.none() {
        Vec::new()
    } else {
        sqlx::query_as(
            "SELECT node_id, gpu_index, nic, observed_at, verdict, probes FROM (
            SELECT e.node_id, e.gpu_index, e.nic, e.observed_at, e.verdict, e.probes,
                   row_number() OVER (PARTITION BY e.node_id, e.gpu_index, e.nic ORDER BY e.observed_at DESC) AS rn
            FROM probe_row_evidence e
            WHERE ((e.observed_at > $2 AND e.observed_at <= $3) OR (e.observed_at > $4 AND e.observed_at <= $5))
              AND ($1::text[] IS NULL OR e.node_id = ANY($1))
              AND e.injected = 'none' AND e.path IN ('nic_dma', 'simulated')
         ) r WHERE rn <= $6",
        )
        .bind(filter)
        .bind(a0)
        .bind(b0)
        .bind(a1)
        .bind(b1)
        .bind(i64::try_from(super::RECENT_VERDICTS).unwrap_or(10))
        .fetch_all(&mut *conn)
        .await?
    };
    for (node, gpu, nic, at, verdict, probes) in recent {
        if is_workload(workload, &node, gpu, &nic) {
            let part = if at > split { &mut late } else { &mut ev };
            part.recent.entry((node, gpu)).or_default().push((at, verdict, probes));
        }
    }
    laps.lap(super::Step::Recent);

    // Summary sets, a row of arrays each (every summary ok; the arrays are as long as each
    // other, which the table checks).
    type SetRow = (
        String,
        DateTime<Utc>,
        Vec<i32>,
        Vec<String>,
        Vec<String>,
        Vec<String>,
        Vec<String>,
        Vec<String>,
        Vec<Json<serde_json::Value>>,
        Vec<i32>,
    );
    let mut sets = sqlx::query_as::<_, SetRow>(
        "SELECT node_id, observed_at, gpu_index, nic, path,
                CASE WHEN $6 THEN '{}' ELSE memory END, injected,
                CASE WHEN $6 THEN '{}' ELSE transport END, CASE WHEN $6 THEN '{}' ELSE lanes END, probes
         FROM probe_summary_sets
         WHERE ((observed_at > $2 AND observed_at <= $3) OR (observed_at > $4 AND observed_at <= $5))
           AND ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(filter)
    .bind(a0)
    .bind(b0)
    .bind(a1)
    .bind(b1)
    .bind(lean)
    .fetch(&mut *conn);
    while let Some(row) = sets.next().await {
        let (node_id, at, gpus, nics, paths, memories, injected, transports, lanes, probes) = row?;
        let wl = workload.of(&node_id);
        let part = if at > split { &mut late } else { &mut ev };
        let mut recent: Vec<(i32, i32)> = Vec::new();
        for i in 0..gpus.len() {
            let (Some(&gpu), Some(nic), Some(path), Some(inj), Some(&n)) =
                (gpus.get(i), nics.get(i), paths.get(i), injected.get(i), probes.get(i))
            else {
                continue;
            };
            if inj != "none" {
                continue;
            }
            // Not read for a lean read (empty arrays): no GPU-memory count, no transport.
            let memory = memories.get(i).map(String::as_str).unwrap_or_default();
            let lane = lanes.get(i).and_then(|l| first_lane(&l.0));
            let transport = transports.get(i).map(String::as_str).unwrap_or_default();
            if n <= 0 {
                part.damaged.note(&node_id, || format!("a stored summary of GPU{gpu} stands for {n} probes"));
                continue;
            }
            part.count(
                &node_id,
                Evidence {
                    gpu,
                    nic,
                    path,
                    memory,
                    verdict: ProbeVerdict::Ok,
                    diagnosis: Diagnosis::None,
                    probes: u(i64::from(n)),
                    records: 1,
                    transport,
                    first_lane: lane.as_deref(),
                },
            );
            if Class::of(path) != Class::Other && wl.is_some_and(|w| w.iter().any(|(g, wn)| *g == gpu && wn == nic)) {
                recent.push((gpu, n));
            }
        }
        for (gpu, n) in recent {
            part.recent.entry((node_id.clone(), gpu)).or_default().push((at, ProbeVerdict::Ok, n));
        }
    }
    laps.lap(super::Step::SummarySets);
    Ok((ev, late))
}

/// One pair's records and failed probes per [`Class`] of path: all the pattern finder's trust
/// decision needs ([`trusted_of`]), kept as counts so that evidence leaving
/// a period is taken away as it was added.
#[derive(Default, Clone, Copy)]
struct LeanPair {
    records: [u64; 3],
    bad: [u64; 3],
}

/// A node's pairs as the pattern finder keeps them between reads ([`PeriodCache`]): 48 bytes a
/// pair and its key, where [`NodeAcc`] keeps every count a pass needs.
#[derive(Default)]
pub(super) struct LeanNode {
    not_simulated: u64,
    /// By (GPU, NIC as [`Nics`] numbers it).
    pairs: HashMap<(i32, u32), LeanPair>,
}

impl LeanNode {
    /// Adds `acc`'s evidence, or (`remove`: what left the period) takes it away, dropping the
    /// pairs left with no records.
    fn merge(&mut self, acc: &NodeAcc, nics: &mut Nics, remove: bool) {
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

    fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// NIC names, numbered (a fleet has a few dozen).
#[derive(Default)]
pub(super) struct Nics {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Nics {
    fn id(&mut self, nic: &str) -> u32 {
        if let Some(id) = self.ids.get(nic) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(nic.to_owned());
        self.ids.insert(nic.to_owned(), id);
        id
    }

    fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// Nodes' evidence as the pattern finder counts it.
pub(super) type LeanNodes = HashMap<String, LeanNode>;

fn lean(ev: WindowEvidence, nics: &mut Nics) -> LeanNodes {
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
fn trusted_of(
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
        for c in 0..3 {
            let part = |p: Option<&LeanPair>| p.map_or((0, 0), |p| (p.records[c], p.bad[c]));
            let ((ra, ba), (rb, bb)) = (part(a), part(b));
            if (ra > 0 || rb > 0) && Class::trusted(c, all_simulated) {
                trusted = true;
                bad |= ba > 0 || bb > 0;
                simulated |= c == Class::Simulated as usize;
            }
        }
        if trusted {
            f(key.0, nics.name(key.1), bad, simulated);
        }
    }
}

/// Moves kept nodes on: takes away what left the period (`gone`) and adds what entered it
/// (`added`).
fn move_on(nodes: &mut LeanNodes, gone: &WindowEvidence, added: &WindowEvidence, nics: &mut Nics) {
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
fn keep_last<T>(kept: &mut Vec<T>, max: usize, used: impl Fn(&T) -> u64, item: T) {
    if kept.len() >= max
        && let Some(i) = kept.iter().enumerate().min_by_key(|(_, k)| used(k)).map(|(i, _)| i)
    {
        kept.swap_remove(i);
    }
    kept.push(item);
}

/// How many relative periods the pattern finder keeps (the dashboard's, the API's default, and
/// two more); the one read least recently goes first.
pub const KEPT_PERIODS: usize = 4;

/// NIC names the kept periods number before they start over (a fleet has a few dozen).
const MAX_NICS: usize = 65_536;

/// Nodes marked late this long before the read that sealed a period are read again in full: an
/// ingest transaction that began before that read and committed after it marked its node at its
/// own start.
const LATE_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// The pattern finder's periods kept between reads (`/api/v1/patterns` at fleet scale): each period of a given length (`since=15m` read
/// again a minute later is (`since`, `until`] a minute on) holds every node's evidence observed in
/// (`since`, `seal`] of its latest read, [`SEAL_AFTER`] before its end; a read moves that range
/// by the evidence that left it and became old enough to keep (two slices as long as the time
/// between reads), reads the newest [`SEAL_AFTER`] again, and reads in full the nodes ingest
/// marked late since (`nodes.late_stored_at`, migration 0028). A period that does not move
/// forward from the kept one is read whole and kept in its place. What it yields is what the
/// period read whole yields; `e2e/tests/window_evidence.rs` checks it read after read.
/// Memory: 48 bytes and a hash slot a pair (at 10,000 nodes of 64 pairs, ~40 MB a period).
#[derive(Default)]
pub struct PeriodCache {
    periods: Vec<KeptPeriod>,
    nics: Nics,
    /// Reads so far that moved a kept period, and that read theirs whole.
    moved: u64,
    whole: u64,
    /// Nodes read again in full for late evidence.
    late: u64,
    clock: u64,
}

struct KeptPeriod {
    length: chrono::TimeDelta,
    /// (`since`, `seal`] of the latest read.
    range: (DateTime<Utc>, DateTime<Utc>),
    /// The database's clock at the latest read's start.
    read_at: DateTime<Utc>,
    nodes: LeanNodes,
    used: u64,
}

impl PeriodCache {
    /// Reads that moved a kept period, reads of a whole period, and nodes read again for late
    /// evidence, so far.
    pub fn answered(&self) -> (u64, u64, u64) {
        (self.moved, self.whole, self.late)
    }

    /// The periods it keeps.
    pub fn len(&self) -> usize {
        self.periods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.periods.is_empty()
    }
}

/// A period's pairs as the pattern finder reads them: the kept part (through the cache, while
/// it is held) and the rest.
pub struct LeanPeriod<'a> {
    kept: Option<(&'a LeanNodes, &'a Nics)>,
    newest: LeanNodes,
    /// NIC numbers of `newest` when nothing is kept.
    nics: Nics,
}

impl LeanPeriod<'_> {
    /// The period read whole, nothing kept.
    pub(super) fn of(ev: WindowEvidence) -> LeanPeriod<'static> {
        let mut nics = Nics::default();
        let newest = lean(ev, &mut nics);
        LeanPeriod { kept: None, newest, nics }
    }

    /// The nodes with evidence (a node may show twice: kept and newest).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.kept.into_iter().flat_map(|(k, _)| k.keys()).chain(self.newest.keys()).map(String::as_str)
    }

    /// Each pair with trusted evidence, node by node in name order: its node, GPU and NIC,
    /// whether any trusted probe failed, and whether the trusted ones include the simulated
    /// fabric's (the pairs [`WindowEvidence::into_pairs`] of the period read whole counts as proven).
    pub fn for_each_trusted(&self, mut f: impl FnMut(&str, i32, &str, bool, bool)) {
        let mut names: Vec<&str> = self.nodes().collect();
        names.sort_unstable();
        names.dedup();
        let nics = self.kept.map_or(&self.nics, |(_, n)| n);
        for node in names {
            let kept = self.kept.and_then(|(k, _)| k.get(node));
            trusted_of(kept, self.newest.get(node), nics, |gpu, nic, bad, sim| f(node, gpu, nic, bad, sim));
        }
    }
}

/// [`load_period`] of (`since`, `until`] with no rolled hours in it, through `cache`.
pub(super) async fn load_period_cached<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    cache: &'a mut PeriodCache,
    laps: &mut super::Laps<'_>,
) -> Result<LeanPeriod<'a>, sqlx::Error> {
    let none = WorkloadPairs::new();
    let seal = chrono::TimeDelta::from_std(SEAL_AFTER).ok().and_then(|d| until.checked_sub_signed(d));
    let Some(seal) = seal.filter(|s| *s > since) else {
        // Shorter than what is read each time anyway: nothing to keep.
        let (ev, _) = load_split(conn, &None, [(since, until), (until, until)], until, &none, true, laps).await?;
        return Ok(LeanPeriod::of(ev));
    };
    let read_at: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *conn).await?;
    if cache.nics.names.len() > MAX_NICS {
        // NIC names come from the agents; names that left every period are never forgotten
        // one by one, so past a bound everything kept is: the next reads are whole.
        cache.periods.clear();
        cache.nics = Nics::default();
    }
    cache.clock += 1;
    let length = until - since;
    // Out of the cache while it moves: a read that fails leaves nothing half moved behind.
    let kept = cache.periods.iter().position(|p| p.length == length).map(|i| cache.periods.swap_remove(i));
    let movable = kept.filter(|k| {
        let (from, kept_seal) = k.range;
        since >= from && seal >= kept_seal && since <= kept_seal
    });
    let (period, newest) = match movable {
        Some(mut k) => {
            let (from, kept_seal) = k.range;
            let late: Vec<String> = sqlx::query_scalar("SELECT node_id FROM nodes WHERE late_stored_at > $1")
                .bind(k.read_at - LATE_MARGIN)
                .fetch_all(&mut *conn)
                .await?;
            // What left the period and what became old enough to keep, split where the kept
            // part ended (what left ends before it), through the BRIN indexes on `observed_at`
            // (as the assessment's slices).
            sqlx::query("SET LOCAL enable_indexscan = off").execute(&mut *conn).await?;
            let (gone, added) =
                load_split(conn, &None, [(from, since), (kept_seal, seal)], kept_seal, &none, true, laps).await?;
            sqlx::query("SET LOCAL enable_indexscan = on").execute(&mut *conn).await?;
            move_on(&mut k.nodes, &gone, &added, &mut cache.nics);
            if !late.is_empty() {
                cache.late += late.len() as u64;
                let filter = Some(late.clone());
                let (again, _) =
                    load_split(conn, &filter, [(since, seal), (seal, seal)], seal, &none, true, laps).await?;
                for node in &late {
                    k.nodes.remove(node);
                }
                k.nodes.extend(lean(again, &mut cache.nics));
            }
            k.nodes.retain(|_, n| !n.is_empty());
            let (newest, _) =
                load_split(conn, &None, [(seal, until), (until, until)], until, &none, true, laps).await?;
            cache.moved += 1;
            (KeptPeriod { range: (since, seal), read_at, used: cache.clock, ..k }, newest)
        }
        None => {
            // The whole period, split at the seal: what is kept and the newest.
            let (sealed, newest) =
                load_split(conn, &None, [(since, seal), (seal, until)], seal, &none, true, laps).await?;
            cache.whole += 1;
            let nodes = lean(sealed, &mut cache.nics);
            (KeptPeriod { length, range: (since, seal), read_at, nodes, used: cache.clock }, newest)
        }
    };
    keep_last(&mut cache.periods, KEPT_PERIODS, |p| p.used, period);
    let newest = lean(newest, &mut cache.nics);
    let PeriodCache { periods, nics, .. } = cache;
    let kept = periods.last().map(|p| (&p.nodes, &*nics));
    Ok(LeanPeriod { kept, newest, nics: Nics::default() })
}

/// How many lengths of periods with rolled-up hours in them the pattern finder keeps (a day and
/// a week, say); the one read least recently goes first.
pub const KEPT_ROLLED: usize = 2;

/// The pattern finder's rolled-up hours kept between reads (`/api/v1/patterns?since=1d` at
/// fleet scale, where reading every node-hour row again is most of a read's cost). A rolled-up hour's rows change only when it is rolled again, and `rollup_hours.rolled_at`
/// says when that happened; the leader's hourly pass rolls again only the newest
/// [`REROLL_HOURS`](crate::store::rollup::REROLL_HOURS) + 1 hours. So each period length read
/// through it keeps the sum of its settled hours (those older than the ones a pass may roll
/// again), each hour's `rolled_at` beside it; the next read of the length takes away the hours
/// that left (read again: the same rows, as their `rolled_at` shows) and adds those that
/// entered, and reads the unsettled hours and the rest of the period (the evidence itself) each
/// time. A kept hour rolled again since (a backfill, `rollup_hours` rewritten) or gone (retention)
/// makes the next read whole. The reads run in one snapshot (repeatable read), so an hour's
/// mark and its rows agree. What it yields is what the period read whole yields;
/// `e2e/tests/window_evidence.rs` checks it read after read, across hours that leave, enter and
/// are rolled again. Memory: as a [`PeriodCache`] period (48 bytes a pair, ~40 MB a length at
/// 10,000 nodes of 64 pairs).
#[derive(Default)]
pub struct RolledCache {
    kept: Vec<KeptRolled>,
    nics: Nics,
    /// Reads that moved a kept sum, reads that made theirs from all its settled hours, and hours
    /// read from the rollups (kept or read each time), so far.
    moved: u64,
    whole: u64,
    hours_read: u64,
    clock: u64,
}

struct KeptRolled {
    length: chrono::TimeDelta,
    /// The hours added up in `nodes` (one run, in order), each with its `rollup_hours.rolled_at`
    /// as read.
    hours: BTreeMap<DateTime<Utc>, DateTime<Utc>>,
    nodes: LeanNodes,
    used: u64,
}

impl KeptRolled {
    fn span(&self) -> Option<Hours> {
        Some((*self.hours.keys().next()?, *self.hours.keys().next_back()? + chrono::TimeDelta::hours(1)))
    }
}

impl RolledCache {
    /// Reads that moved a kept sum of rolled hours, reads that made theirs whole, and hours read
    /// from the rollups, so far.
    pub fn answered(&self) -> (u64, u64, u64) {
        (self.moved, self.whole, self.hours_read)
    }

    /// The lengths it keeps.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// Whole hours in `a` and not in `b` (up to two runs).
fn hours_minus((a0, a1): Hours, (b0, b1): Hours) -> impl Iterator<Item = Hours> {
    [(a0, a1.min(b0)), (a0.max(b1), a1)].into_iter().filter(|(s, e)| s < e)
}

fn hours_in((s, e): Hours) -> u64 {
    u64::try_from((e - s).num_hours()).unwrap_or(0)
}

/// [`load_period`] of (`since`, `until`] with the rolled hours `rolled` in it, through `cache`.
/// The caller runs it in a repeatable-read transaction (its marks and rows one snapshot).
pub(super) async fn load_period_rolled_cached<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    (from, to): Hours,
    cache: &'a mut RolledCache,
    laps: &mut super::Laps<'_>,
) -> Result<LeanPeriod<'a>, sqlx::Error> {
    let hour = chrono::TimeDelta::hours(1);
    if cache.nics.names.len() > MAX_NICS {
        cache.kept.clear();
        cache.nics = Nics::default();
    }
    cache.clock += 1;
    let length = until - since;
    // Out of the cache while it moves: a read that fails leaves nothing half moved behind.
    let kept = cache.kept.iter().position(|k| k.length == length).map(|i| cache.kept.swap_remove(i));
    // The marks of the period's rolled hours and of the kept ones, as this snapshot has them.
    let (lo, hi) = kept.as_ref().and_then(KeptRolled::span).map_or((from, to), |(a, b)| (a.min(from), b.max(to)));
    let marks: BTreeMap<DateTime<Utc>, DateTime<Utc>> =
        sqlx::query_as("SELECT hour, rolled_at FROM rollup_hours WHERE hour >= $1 AND hour < $2")
            .bind(lo)
            .bind(hi)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
    let newest: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT max(hour) FROM rollup_hours").fetch_one(&mut *conn).await?;
    // The hours the leader's next pass may roll again are read each time; those before are kept.
    let reroll = chrono::TimeDelta::hours(crate::store::rollup::REROLL_HOURS);
    let settled_end = newest.map_or(from, |n| n - reroll).clamp(from, to);
    let mut marked = from;
    while marked < to && marks.contains_key(&marked) {
        marked += hour;
    }
    if marked < to || settled_end == from {
        // Not one run of rolled hours in this snapshot any more (retention raced the read), or
        // nothing settled in it: read as it is, nothing kept.
        if let Some(k) = kept {
            cache.kept.push(k);
        }
        cache.hours_read += hours_in((from, to));
        let ev = load_period(conn, since, until, Some((from, to)), laps).await?;
        return Ok(LeanPeriod::of(ev));
    }
    let settled = (from, settled_end);
    // The rest of the period from the evidence.
    let mut rest = load_around(conn, since, until, (from, to), laps).await?;
    // A kept sum moves if every hour in it is still as it was rolled, and moving it reads fewer
    // hours than the settled ones.
    let movable = kept.filter(|k| {
        let Some(span) = k.span() else { return false };
        let unchanged = k.hours.iter().all(|(h, at)| marks.get(h) == Some(at));
        let cost: u64 = hours_minus(span, settled).chain(hours_minus(settled, span)).map(hours_in).sum();
        unchanged && cost < hours_in(settled)
    });
    let hours: BTreeMap<DateTime<Utc>, DateTime<Utc>> =
        marks.range(from..settled_end).map(|(h, at)| (*h, *at)).collect();
    let period = match movable {
        Some(mut k) => {
            let span = k.span().unwrap_or(settled);
            let (mut gone, mut added) = (WindowEvidence::default(), WindowEvidence::default());
            for r in hours_minus(span, settled) {
                read_rolled(conn, r, &mut gone).await?;
                cache.hours_read += hours_in(r);
            }
            for r in hours_minus(settled, span) {
                read_rolled(conn, r, &mut added).await?;
                cache.hours_read += hours_in(r);
            }
            move_on(&mut k.nodes, &gone, &added, &mut cache.nics);
            k.nodes.retain(|_, n| !n.is_empty());
            cache.moved += 1;
            KeptRolled { hours, used: cache.clock, ..k }
        }
        None => {
            let mut ev = WindowEvidence::default();
            read_rolled(conn, settled, &mut ev).await?;
            cache.hours_read += hours_in(settled);
            cache.whole += 1;
            KeptRolled { length, hours, nodes: lean(ev, &mut cache.nics), used: cache.clock }
        }
    };
    // The hours a pass may still roll again: read each time.
    read_rolled(conn, (settled_end, to), &mut rest).await?;
    cache.hours_read += hours_in((settled_end, to));
    laps.lap(super::Step::SummarySets);
    keep_last(&mut cache.kept, KEPT_ROLLED, |k| k.used, period);
    let newest = lean(rest, &mut cache.nics);
    let RolledCache { kept, nics, .. } = cache;
    let kept = kept.last().map(|k| (&k.nodes, &*nics));
    Ok(LeanPeriod { kept, newest, nics: Nics::default() })
}

/// Evidence stored this long after it was observed marks its node's `late_stored_at`
/// (ingest, migration 0028): the pattern finder's kept periods read such a node again.
pub const LATE_AFTER: std::time::Duration = std::time::Duration::from_secs(90);

/// The pattern finder's kept periods keep evidence observed up to this long before a read's end;
/// what is newer is read again by each read (it may still be on its way). 30 s past
/// [`LATE_AFTER`]: evidence older than this that arrives after the read is always marked late,
/// with up to 30 s between the collector's and the database's clocks. A summary set is dated by
/// its newest probe and travels when its window closes, up to a batch interval later:
/// [`LATE_AFTER`] leaves room for that.
pub const SEAL_AFTER: std::time::Duration = std::time::Duration::from_secs(120);
