//! One read of the fleet's pairs over a period ([`load`]): their evidence counted as a pass
//! counts it, across the storage tiers, joined to their nodes' facts and grouped for
//! [`super::explain`]. Each node's facts from its latest topology snapshot are kept between
//! reads ([`Facts`]), with the period caches the reads move on ([`crate::patterns::PeriodCache`],
//! [`crate::patterns::RolledCache`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::explain::{N, NONE, Pairs, Values, canonical};
use super::lean::TrustedPair;
use super::period::{PeriodReads, period_pairs};
use super::rolled::RolledReads;
use crate::store::read::patterns::{self, HostRow};

/// What a node's latest topology says of its pairs, as value ids of [`Facts`].
struct NodeFacts {
    snapshot: Uuid,
    node: u32,
    /// virtualized, hypervisor, viommu, gpudirect, driver ([`canonical`]).
    host: [u32; 5],
    /// Per GPU: its model (NONE when it has no name).
    gpus: Vec<(i32, u32)>,
    /// Per GPU and NIC: the path class.
    paths: Vec<(i32, u32, u32)>,
    /// Per GPU: the NIC its workload is predicted to use (NONE when none is).
    workload: Vec<(i32, u32)>,
}

#[derive(Default)]
struct Known {
    values: Values,
    nodes: HashMap<String, NodeFacts>,
    /// Snapshots read since this was made.
    fetched: u64,
}

/// Every node's facts from its latest topology snapshot, kept between reads of the patterns:
/// a snapshot changes when the node's hardware or configuration does, so a read fetches the
/// facts only of nodes whose latest snapshot it has not seen (all of them the first time), where
/// joining every pair to its node's snapshot, GPU and path in SQL would be most of a read's
/// cost at fleet scale (docs/scaling.md). About 1 KiB a node. With them, the evidence of the periods read
/// again and again (the dashboard's 15 minutes), kept between reads
/// ([`crate::patterns::PeriodCache`]): one read of such a period at a time, each moving it on
/// from the one before.
#[derive(Default)]
pub struct Facts {
    known: Mutex<Known>,
    periods: tokio::sync::Mutex<crate::patterns::PeriodCache>,
    /// The settled rolled-up hours of the periods with some (a day, a week), kept between reads
    /// ([`crate::patterns::RolledCache`]); a lock of its own, so that a day's read does not hold
    /// up the dashboard's 15 minutes.
    rolled: tokio::sync::Mutex<crate::patterns::RolledCache>,
    /// [`crate::patterns::PeriodCache::answered`] and [`crate::patterns::RolledCache::answered`] as
    /// of the latest read that went through each, for `/metrics` (which must not wait behind a
    /// read holding a cache).
    answered: Mutex<PeriodReads>,
    rolled_answered: Mutex<RolledReads>,
}

impl std::fmt::Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Facts").field("nodes", &self.len()).finish_non_exhaustive()
    }
}

/// Nodes whose facts one statement fetches.
const FACTS_CHUNK: usize = 2000;

/// What [`Facts::fetch`] reads: the snapshots' host facts ([`HostRow`]; the risks validated at
/// ingest, as the assessment reads them), their GPUs (node, index, name) and their GPU/NIC paths
/// (node, a, b, class).
type Fetched = (Vec<HostRow>, Vec<(String, i32, String)>, Vec<(String, String, String, String)>);

impl Facts {
    /// Nodes whose facts are kept.
    pub fn len(&self) -> usize {
        self.known.lock().map_or(0, |k| k.nodes.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Snapshots whose facts were read from the store since this was made.
    pub fn fetched(&self) -> u64 {
        self.known.lock().map_or(0, |k| k.fetched)
    }

    /// Of the period reads so far: those that moved a kept period on, those that read theirs
    /// whole, and the nodes read again in full for evidence stored late. Does not wait for a
    /// read under way (it counts once it is done).
    pub fn periods_answered(&self) -> PeriodReads {
        self.answered.lock().map(|a| *a).unwrap_or_default()
    }

    /// Of the reads of periods with rolled-up hours so far: those that moved a kept sum of
    /// settled hours on, those that made theirs from all of them, and the hours read from the
    /// rollups (kept or read each time). Does not wait for a read under way.
    pub fn rolled_answered(&self) -> RolledReads {
        self.rolled_answered.lock().map(|a| *a).unwrap_or_default()
    }

    /// The facts of `stale` (node, its latest snapshot), read from the store.
    async fn fetch(conn: &mut sqlx::PgConnection, stale: &[(String, Uuid)]) -> Result<Fetched, sqlx::Error> {
        let (mut hosts, mut gpus, mut paths) = (Vec::new(), Vec::new(), Vec::new());
        for chunk in stale.chunks(FACTS_CHUNK) {
            let nodes: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
            let snaps: Vec<Uuid> = chunk.iter().map(|(_, s)| *s).collect();
            hosts.extend(patterns::snapshot_hosts(conn, &nodes, &snaps).await?);
            gpus.extend(patterns::snapshot_gpus(conn, &nodes, &snaps).await?);
            paths.extend(patterns::snapshot_gpu_paths(conn, &nodes, &snaps).await?);
        }
        Ok((hosts, gpus, paths))
    }

    /// Files what [`Facts::fetch`] read.
    fn file(known: &mut Known, (hosts, gpus, paths): Fetched) {
        known.fetched += hosts.len() as u64;
        let v = &mut known.values;
        for (node, snapshot, virtualized, hypervisor, viommu, gpudirect, driver, Json(risks)) in hosts {
            // The first risk of each GPU; its predicted NIC (none: unknown).
            let mut workload: Vec<(i32, u32)> = Vec::new();
            for r in risks {
                if let Ok(gpu) = i32::try_from(r.gpu)
                    && !workload.iter().any(|(g, _)| *g == gpu)
                {
                    workload.push((gpu, r.predicted_nic.as_deref().map_or(NONE, |n| v.id(n))));
                }
            }
            let facts = NodeFacts {
                snapshot,
                node: v.id(&node),
                host: [
                    v.id(&virtualized),
                    v.id(&canonical("hypervisor", &hypervisor)),
                    v.id(&viommu),
                    v.id(&canonical("gpudirect", &gpudirect)),
                    v.id(&canonical("driver", &driver)),
                ],
                gpus: Vec::new(),
                paths: Vec::new(),
                workload,
            };
            known.nodes.insert(node, facts);
        }
        for (node, gpu, name) in gpus {
            let model = if name.is_empty() { NONE } else { known.values.id(&canonical("gpu_model", &name)) };
            if let Some(f) = known.nodes.get_mut(&node) {
                f.gpus.push((gpu, model));
            }
        }
        for (node, a, b, class) in paths {
            let Some(gpu) = a.strip_prefix("GPU").and_then(|g| g.parse::<i32>().ok()) else { continue };
            let (nic, class) = (known.values.id(&b), known.values.id(&class));
            if let Some(f) = known.nodes.get_mut(&node) {
                f.paths.push((gpu, nic, class));
            }
        }
    }
}

/// The longest run of whole hours inside (`since`, `until`] that the collector has rolled up
/// (`rollup_hours`), as [start, end).
async fn rolled_hours(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Option<(DateTime<Utc>, DateTime<Utc>)>, sqlx::Error> {
    let hour = chrono::TimeDelta::hours(1);
    // The first hour that starts after `since` (the period leaves `since` itself out), and the
    // end of the last that ends by `until`.
    let (first, end) = (crate::store::rollup::hour_of(since) + hour, crate::store::rollup::hour_of(until));
    if first >= end {
        return Ok(None);
    }
    let hours = patterns::rolled_hours(conn, first, end).await?;
    let mut best: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    let mut run: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    for h in hours {
        run = match run {
            Some((a, b)) if b == h => Some((a, h + hour)),
            _ => Some((h, h + hour)),
        };
        if let Some((a, b)) = run
            && best.is_none_or(|(x, y)| b - a > y - x)
        {
            best = Some((a, b));
        }
    }
    Ok(best)
}

/// Every pair with trusted evidence in `(since, until]` (probes, counted as an assessment pass
/// counts them, and in-line checks), with its facts from its node's latest topology, grouped;
/// the facts through `facts`, kept from earlier reads. Across the storage tiers: the longest run
/// of whole hours of the period that the collector has rolled up is read from the pair-hour
/// rollups (a day at 10,000 nodes is 240,000 node-hour rows there, 2.9 million summary sets in
/// the evidence; and the agents' summaries of ok probes are kept 7 days by default, the rollups
/// a year), the rest from the evidence itself.
///
/// A period of up to an hour or two is kept in `facts` between reads and moved on by the next
/// read of its length ([`crate::patterns::PeriodCache`]); that relies on `until` being no later
/// than the clock (the API clamps it): evidence observed inside the kept part and stored after
/// the read is then stored late, which marks its node to be read again.
pub async fn load(
    pool: &PgPool,
    facts: &Facts,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Pairs, sqlx::Error> {
    let rolled = rolled_hours(&mut *pool.acquire().await?, since, until).await?;
    // A period with no rolled hours in it (up to an hour or two) is kept between reads; reads of
    // kept periods take turns (each moves on from the one before it, which is what makes it
    // cheap), waiting before they take a connection.
    let mut periods = match rolled {
        None => Some(facts.periods.lock().await),
        Some(_) => None,
    };
    // A period with rolled hours keeps the sum of its settled ones; its reads take turns too, and
    // run in one snapshot (an hour's mark in `rollup_hours` and its rows as one).
    let mut kept_rolled = match rolled {
        Some(_) => Some(facts.rolled.lock().await),
        None => None,
    };
    let mut tx = pool.begin().await?;
    if rolled.is_some() {
        patterns::repeatable_read(&mut tx).await?;
    }
    let evidence =
        period_pairs(&mut tx, since, until, rolled, periods.as_deref_mut(), kept_rolled.as_deref_mut()).await?;
    // The workload's own transfers, verified in-line through the pair's NIC (or failed there:
    // a host copy, or whole blocks of another time or place, are the engine's, not the pair's).
    let inline = patterns::inline_pairs(&mut tx, since, until).await?;
    let mut inline: HashMap<(String, i32, String), bool> =
        inline.into_iter().map(|(node, gpu, nic, failed)| ((node, gpu, nic), failed)).collect();

    // The nodes' latest snapshots; the facts of those not known as they are now.
    let latest = patterns::latest_snapshots(&mut tx).await?;
    let stale: Vec<(String, Uuid)> = {
        let with_evidence: HashSet<&str> = evidence.nodes().chain(inline.keys().map(|k| k.0.as_str())).collect();
        let known = facts.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        latest
            .iter()
            .filter(|(n, s)| with_evidence.contains(n.as_str()) && known.nodes.get(n).is_none_or(|f| f.snapshot != *s))
            .cloned()
            .collect()
    };
    let fetched = Facts::fetch(&mut tx, &stale).await?;
    tx.commit().await?;

    let mut known = facts.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Facts::file(&mut known, fetched);
    // A node whose snapshots are gone is forgotten.
    let live: HashSet<&str> = latest.iter().map(|(n, _)| n.as_str()).collect();
    known.nodes.retain(|n, _| live.contains(n.as_str()));
    let snapshot: HashMap<&str, Uuid> = latest.iter().map(|(n, s)| (n.as_str(), *s)).collect();

    let Known { values, nodes, .. } = &mut *known;
    let (yes, no) = (values.id("yes"), values.id("no"));
    // A pair's attributes from its node's facts (those of the node's latest snapshot only: a
    // snapshot newer than this read's is the next read's).
    let mut attrs_of = |node: &str, gpu: i32, nic: &str| -> [u32; N] {
        let mut attrs = [NONE; N];
        let Some(f) = nodes.get(node).filter(|f| snapshot.get(node) == Some(&f.snapshot)) else {
            attrs[N - 1] = values.id(node);
            return attrs;
        };
        attrs[N - 1] = f.node;
        let nic_id = values.get(nic);
        attrs[0] = f.paths.iter().find(|(g, n, _)| *g == gpu && Some(*n) == nic_id).map_or(NONE, |(_, _, c)| *c);
        attrs[1..6].copy_from_slice(&f.host);
        attrs[6] = f.gpus.iter().find(|(g, _)| *g == gpu).map_or(NONE, |(_, m)| *m);
        attrs[7] = match f.workload.iter().find(|(g, _)| *g == gpu) {
            Some((_, w)) if *w != NONE => {
                if Some(*w) == nic_id {
                    yes
                } else {
                    no
                }
            }
            _ => NONE,
        };
        attrs
    };
    let mut out = Pairs::default();
    evidence.for_each_trusted(|TrustedPair { node, gpu, nic, failed, simulated }| {
        let checked = if inline.is_empty() {
            false
        } else {
            inline.remove(&(node.to_owned(), gpu, nic.to_owned())).unwrap_or(false)
        };
        out.add(attrs_of(node, gpu, nic), failed || checked, simulated);
    });
    // Pairs with in-line checks alone.
    for ((node, gpu, nic), failed) in inline {
        out.add(attrs_of(&node, gpu, &nic), failed, false);
    }
    out.names = values.names.clone();
    drop(known);
    if let (Some(p), Ok(mut a)) = (periods.as_deref(), facts.answered.lock()) {
        *a = p.answered();
    }
    if let (Some(r), Ok(mut a)) = (kept_rolled.as_deref(), facts.rolled_answered.lock()) {
        *a = r.answered();
    }
    Ok(out)
}
