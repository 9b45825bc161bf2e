//! Reading the evidence: the records stored a row each grouped in SQL, the summary sets read as
//! the arrays they are stored as, the pair-hour rollups for rolled hours, and the workload pairs'
//! latest verdicts ranked from both.

use super::{Class, Evidence, RecentVerdict, WindowEvidence, first_lane, trust};
use crate::store::evidence_rows;
use chrono::{DateTime, Utc};
use railguard_schema::{Diagnosis, ProbeVerdict};
use std::collections::HashMap;
use tokio_stream::StreamExt;

/// The workload NIC of each GPU, per node: the pairs whose latest verdicts are ranked.
pub(crate) type WorkloadPairs = HashMap<String, Vec<(i32, String)>>;

/// Where the workload pairs of a node are looked up: the pass's topologies, or what the cache
/// keeps them for.
pub(crate) trait Workloads: Sync {
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

pub(crate) fn is_workload(workload: &(dyn Workloads + Sync), node: &str, gpu: i32, nic: &str) -> bool {
    workload.of(node).is_some_and(|w| w.iter().any(|(g, n)| *g == gpu && n == nic))
}

/// Reads the evidence of `filter`'s nodes (every node when None) observed in (`since`, `now`].
pub(crate) async fn load(
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
pub(crate) async fn load_period(
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
pub(crate) async fn load_around(
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
pub(crate) type Hours = (DateTime<Utc>, DateTime<Utc>);

/// Adds the pair-hour rollups of the hours `[from, to)` to `ev`, as [`load_period`] reads them.
pub(crate) async fn read_rolled(
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
    let mut rows = evidence_rows::rollups(conn, from, to);
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
                    done.count_into(ev, o.key());
                }
                o.into_mut()
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(RolledRun::of(&row, key.clone())?),
        };
        run.add(&row)?;
    }
    for (node_id, run) in runs {
        run.count_into(ev, &node_id);
    }
    Ok(())
}

/// A run of a node's rolled-up rows that share one layout ([`load_period`]): the layout, and
/// each element's counts added up over the run.
pub(crate) struct RolledRun {
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

    /// Counts the run into `node`'s evidence: each element with a probe, as its rows would one
    /// by one (no diagnosis: not rolled up; injected probes are no evidence).
    fn count_into(self, ev: &mut WindowEvidence, node: &str) {
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
            let class = match trust::class_of_stored(path, Some(memory)) {
                Ok(c) => c,
                Err(why) => {
                    ev.damaged.note(node, || why);
                    continue;
                }
            };
            for (verdict, (probes, records)) in Self::VERDICTS.into_iter().zip(sum) {
                if *records > 0 {
                    ev.count(
                        node,
                        Evidence {
                            gpu,
                            nic,
                            class,
                            verdict,
                            diagnosis: Diagnosis::None,
                            probes: *probes,
                            records: *records,
                            transport,
                            first_lane: None,
                        },
                    );
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
pub(crate) async fn load_split(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    ranges: [(DateTime<Utc>, DateTime<Utc>); 2],
    split: DateTime<Utc>,
    workload: &(dyn Workloads + Sync),
    lean: bool,
    laps: &mut super::Laps<'_>,
) -> Result<(WindowEvidence, WindowEvidence), sqlx::Error> {
    let (mut ev, mut late) = (WindowEvidence::default(), WindowEvidence::default());

    read_grouped(conn, filter, ranges, split, (&mut ev, &mut late)).await?;
    laps.lap(super::Step::ProbeRows);

    read_recent(conn, filter, ranges, split, workload, (&mut ev, &mut late)).await?;
    laps.lap(super::Step::Recent);

    read_sets(conn, filter, ranges, split, workload, lean, (&mut ev, &mut late)).await?;
    laps.lap(super::Step::SummarySets);
    Ok((ev, late))
}

/// The records stored a row each, grouped in SQL by what the trust policy and the counts tell
/// apart, into `ev` (observed up to `split`) and `late` (after it).
async fn read_grouped(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    ranges: [(DateTime<Utc>, DateTime<Utc>); 2],
    split: DateTime<Utc>,
    (ev, late): (&mut WindowEvidence, &mut WindowEvidence),
) -> Result<(), sqlx::Error> {
    // Streamed: a rolling start's first minute is a row for each of every pair's first probes.
    let mut groups = evidence_rows::grouped(conn, filter, ranges, split);
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    while let Some(g) = groups.next().await {
        let g = g?;
        let part = if g.after { &mut *late } else { &mut *ev };
        let class = match trust::class_of_stored(&g.path, Some(&g.memory)) {
            Ok(c) => c,
            Err(why) => {
                part.damaged.note(&g.node_id, || why);
                continue;
            }
        };
        part.count(
            &g.node_id,
            Evidence {
                gpu: g.gpu_index,
                nic: &g.nic,
                class,
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
    Ok(())
}

/// The latest records stored a row each of every pair on a path that may verify it, kept for the
/// workload pairs, to be ranked with the sets' ([`read_sets`]); none to keep when no node has a
/// workload pair. Ten of each class of evidence (path, and GPU memory or not) a pair at most:
/// whichever classes prove its GPU (`crate::assess` keeps those), their latest ten are among
/// these, which is all the hysteresis reads.
async fn read_recent(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    ranges: [(DateTime<Utc>, DateTime<Utc>); 2],
    split: DateTime<Utc>,
    workload: &(dyn Workloads + Sync),
    (ev, late): (&mut WindowEvidence, &mut WindowEvidence),
) -> Result<(), sqlx::Error> {
    let per_class = i64::try_from(super::RECENT_VERDICTS).unwrap_or(10);
    let recent =
        if workload.none() { Vec::new() } else { evidence_rows::latest(conn, filter, ranges, per_class).await? };
    for r in recent {
        if is_workload(workload, &r.node_id, r.gpu_index, &r.nic) {
            let part = if r.observed_at > split { &mut *late } else { &mut *ev };
            let class = match trust::class_of_stored(&r.path, Some(&r.memory)) {
                Ok(c) => c,
                Err(why) => {
                    part.damaged.note(&r.node_id, || why);
                    continue;
                }
            };
            let v = RecentVerdict { at: r.observed_at, verdict: r.verdict, probes: r.probes, class };
            part.recent.entry((r.node_id, r.gpu_index)).or_default().push(v);
        }
    }
    Ok(())
}

/// Summary sets, a row of arrays each (every summary ok; the arrays are as long as each other,
/// which the table checks), added up here a set at a time as they stream in. `lean`: without
/// their memory, transports and lanes.
async fn read_sets(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    ranges: [(DateTime<Utc>, DateTime<Utc>); 2],
    split: DateTime<Utc>,
    workload: &(dyn Workloads + Sync),
    lean: bool,
    (ev, late): (&mut WindowEvidence, &mut WindowEvidence),
) -> Result<(), sqlx::Error> {
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    let mut sets = evidence_rows::sets(conn, filter, ranges, lean);
    while let Some(row) = sets.next().await {
        let (node_id, at, gpus, nics, paths, memories, injected, transports, lanes, probes) = row?;
        let wl = workload.of(&node_id);
        let part = if at > split { &mut *late } else { &mut *ev };
        let mut recent: Vec<(i32, i32, Class)> = Vec::new();
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
            let lane = lanes.get(i).and_then(|l| first_lane(&l.0));
            let transport = transports.get(i).map(String::as_str).unwrap_or_default();
            if n <= 0 {
                part.damaged.note(&node_id, || format!("a stored summary of GPU{gpu} stands for {n} probes"));
                continue;
            }
            let class = match trust::class_of_stored(path, memories.get(i).map(String::as_str)) {
                Ok(c) => c,
                Err(why) => {
                    part.damaged.note(&node_id, || why);
                    continue;
                }
            };
            part.count(
                &node_id,
                Evidence {
                    gpu,
                    nic,
                    class,
                    verdict: ProbeVerdict::Ok,
                    diagnosis: Diagnosis::None,
                    probes: u(i64::from(n)),
                    records: 1,
                    transport,
                    first_lane: lane.as_deref(),
                },
            );
            if class != Class::NoNic && wl.is_some_and(|w| w.iter().any(|(g, wn)| *g == gpu && wn == nic)) {
                recent.push((gpu, n, class));
            }
        }
        for (gpu, probes, class) in recent {
            let v = RecentVerdict { at, verdict: ProbeVerdict::Ok, probes, class };
            part.recent.entry((node_id.clone(), gpu)).or_default().push(v);
        }
    }
    Ok(())
}
