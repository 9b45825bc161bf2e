//! The window's probe evidence per GPU/NIC pair, for a pass (#15: a pass under 1 s at 10,000
//! nodes). Records stored a row each (full probes, the single summaries of older agents) are
//! grouped in SQL; summary sets are read as the rows of arrays they are stored as and added up
//! here, a set at a time as they stream in. Unnesting every set's summaries into rows and
//! grouping them in SQL took 1.1 s of a pass over 600 nodes on a 2-core machine, and ranking the
//! workload pairs' latest verdicts through the same unnest another 0.6 s; reading the sets as
//! arrays takes 0.09 s (docs/scaling.md).
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
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
}

/// One pair's evidence on one class of path.
#[derive(Default)]
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
    /// What carried the probes (only read where the class is not trusted).
    via: BTreeSet<String>,
}

impl ClassCounts {
    fn add(&mut self, verdict: ProbeVerdict, diagnosis: Diagnosis, cuda: bool, probes: u64, records: u64) {
        self.records += records;
        match verdict {
            ProbeVerdict::Ok => {
                self.ok += probes;
                if cuda {
                    self.ok_cuda += probes;
                }
            }
            ProbeVerdict::SilentCorruption => {
                self.silent_corruption += probes;
                self.count_diagnosis(diagnosis, records);
            }
            ProbeVerdict::ReportedFailure => self.reported_failure += probes,
            ProbeVerdict::Timeout => self.timeout += probes,
        }
    }

    fn count_diagnosis(&mut self, diagnosis: Diagnosis, records: u64) {
        match self.diagnoses.iter_mut().find(|(d, _)| *d == diagnosis) {
            Some((_, n)) => *n += records,
            None => self.diagnoses.push((diagnosis, records)),
        }
    }

    fn add_via(&mut self, via: &str) {
        if !self.via.contains(via) {
            self.via.insert(via.to_owned());
        }
    }

    /// Adds another class's counts to these.
    fn absorb(&mut self, other: ClassCounts) {
        self.records += other.records;
        self.ok += other.ok;
        self.silent_corruption += other.silent_corruption;
        self.reported_failure += other.reported_failure;
        self.timeout += other.timeout;
        self.ok_cuda += other.ok_cuda;
        for (d, n) in other.diagnoses {
            self.count_diagnosis(d, n);
        }
        self.via.extend(other.via);
    }

    fn bad(&self) -> u64 {
        self.silent_corruption + self.reported_failure + self.timeout
    }
}

#[derive(Default)]
struct PairAcc {
    by_class: [ClassCounts; 3],
}

#[derive(Default)]
struct NodeAcc {
    /// Every record of the node in the window ran on the simulated fabric (so far).
    all_simulated: bool,
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

impl NodeAcc {
    /// Counts `e` into its pair, and into the node's trust decision; for a path that may prove
    /// nothing, notes the transport that carried it.
    fn record(&mut self, e: Evidence<'_>) {
        let class = Class::of(e.path);
        self.all_simulated &= class == Class::Simulated;
        let counts = &mut self.pair(e.gpu, e.nic).by_class[class as usize];
        counts.add(e.verdict, e.diagnosis, class == Class::NicDma && e.memory == "cuda", e.probes, e.records);
        if class != Class::NicDma {
            counts.add_via(&via(e.transport, e.first_lane));
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
}

impl WindowEvidence {
    /// A node's evidence (a name per grouped row or set, not per summary).
    fn node(&mut self, node: String) -> &mut NodeAcc {
        self.nodes.entry(node).or_insert_with(|| NodeAcc { all_simulated: true, pairs: HashMap::new() })
    }

    /// Each pair's counts under the trust policy, in (node, GPU, NIC) order.
    pub fn into_pairs(self) -> Vec<(String, i32, PairCounts)> {
        let mut out = Vec::new();
        for (node, acc) in self.nodes {
            let trusted =
                |c: usize| c == Class::NicDma as usize || (c == Class::Simulated as usize && acc.all_simulated);
            let mut pairs: Vec<(i32, String, PairAcc)> = acc
                .pairs
                .into_iter()
                .flat_map(|(gpu, nics)| nics.into_iter().map(move |(nic, p)| (gpu, nic, p)))
                .collect();
            pairs.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (gpu, nic, p) in pairs {
                let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                let (mut proven, mut unproven) = (ClassCounts::default(), ClassCounts::default());
                let mut simulated = false;
                for (c, k) in p.by_class.into_iter().enumerate() {
                    if k.records == 0 {
                        continue;
                    }
                    if trusted(c) {
                        simulated |= c == Class::Simulated as usize;
                        proven.absorb(k);
                    } else {
                        unproven.absorb(k);
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
                    unproven_via: unproven.via.into_iter().collect(),
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

/// Reads the window's evidence of `filter`'s nodes (every node when None).
pub(super) async fn load(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    workload: &WorkloadPairs,
) -> Result<WindowEvidence, sqlx::Error> {
    let mut ev = WindowEvidence::default();

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
    }
    let groups: Vec<Group> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic, path, memory, verdict, diagnosis,
                -- what carried it, read only where the path proves nothing (see `via`)
                CASE WHEN path = 'nic_dma' THEN '' ELSE transport END AS transport,
                CASE WHEN path = 'nic_dma' THEN NULL ELSE lanes->>0 END AS first_lane,
                sum(probes)::bigint AS probes, count(*) AS records
         FROM probe_row_evidence
         WHERE observed_at > $2 AND observed_at <= $3 AND injected = 'none'
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    for g in groups {
        ev.node(g.node_id).record(Evidence {
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
        });
    }

    // The workload pairs' latest records stored a row each (ten per GPU at most: all the
    // hysteresis reads), to be ranked with the sets' below.
    let (wl_node, wl_gpu, wl_nic): (Vec<&str>, Vec<i32>, Vec<&str>) = {
        let pairs: Vec<(&str, i32, &str)> = workload
            .iter()
            .flat_map(|(node, gpus)| gpus.iter().map(move |(g, nic)| (node.as_str(), *g, nic.as_str())))
            .collect();
        (pairs.iter().map(|p| p.0).collect(), pairs.iter().map(|p| p.1).collect(), pairs.iter().map(|p| p.2).collect())
    };
    let recent: Vec<(String, i32, DateTime<Utc>, ProbeVerdict, i32)> = sqlx::query_as(
        "SELECT node_id, gpu_index, observed_at, verdict, probes FROM (
            SELECT e.node_id, e.gpu_index, e.observed_at, e.verdict, e.probes,
                   row_number() OVER (PARTITION BY e.node_id, e.gpu_index ORDER BY e.observed_at DESC) AS rn
            FROM probe_row_evidence e
            JOIN UNNEST($4::text[], $5::int[], $6::text[]) AS wl(node_id, gpu_index, nic)
              ON wl.node_id = e.node_id AND wl.gpu_index = e.gpu_index AND wl.nic = e.nic
            WHERE e.observed_at > $2 AND e.observed_at <= $3 AND ($1::text[] IS NULL OR e.node_id = ANY($1))
              AND e.injected = 'none' AND e.path IN ('nic_dma', 'simulated')
         ) r WHERE rn <= $7",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .bind(&wl_node)
    .bind(&wl_gpu)
    .bind(&wl_nic)
    .bind(i64::try_from(super::RECENT_VERDICTS).unwrap_or(10))
    .fetch_all(&mut *conn)
    .await?;
    for (node, gpu, at, verdict, probes) in recent {
        ev.recent.entry((node, gpu)).or_default().push((at, verdict, probes));
    }

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
        "SELECT node_id, observed_at, gpu_index, nic, path, memory, injected, transport, lanes, probes
         FROM probe_summary_sets
         WHERE observed_at > $2 AND observed_at <= $3 AND ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .fetch(&mut *conn);
    while let Some(row) = sets.next().await {
        let (node_id, at, gpus, nics, paths, memories, injected, transports, lanes, probes) = row?;
        let wl = workload.get(&node_id);
        let node = ev.node(node_id.clone());
        let mut recent: Vec<(i32, i32)> = Vec::new();
        for i in 0..gpus.len() {
            let (Some(&gpu), Some(nic), Some(path), Some(memory), Some(inj), Some(&n)) =
                (gpus.get(i), nics.get(i), paths.get(i), memories.get(i), injected.get(i), probes.get(i))
            else {
                continue;
            };
            if inj != "none" {
                continue;
            }
            let lane = lanes.get(i).and_then(|l| first_lane(&l.0));
            let transport = transports.get(i).map(String::as_str).unwrap_or_default();
            node.record(Evidence {
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
            });
            if Class::of(path) != Class::Other && wl.is_some_and(|w| w.iter().any(|(g, wn)| *g == gpu && wn == nic)) {
                recent.push((gpu, n));
            }
        }
        for (gpu, n) in recent {
            ev.recent.entry((node_id.clone(), gpu)).or_default().push((at, ProbeVerdict::Ok, n));
        }
    }
    Ok(ev)
}
