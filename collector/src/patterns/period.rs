//! The pattern finder's relative periods kept between reads (`since=15m` read again a minute
//! later moves by a minute's evidence, not a period's).

use super::lean::{LeanNodes, LeanPeriod, MAX_NICS, Nics, keep_last, lean, move_on};
use super::rolled::{RolledCache, load_period_rolled_cached};
use crate::evidence::{WorkloadPairs, load_period, load_split};
use crate::steps::Laps;
use crate::store::read::patterns;

use chrono::{DateTime, Utc};

/// How many relative periods the pattern finder keeps (the dashboard's, the API's default, and
/// two more); the one read least recently goes first.
pub const KEPT_PERIODS: usize = 4;

/// Nodes marked late this long before the read that sealed a period are read again in full: an
/// ingest transaction that began before that read and committed after it marked its node at its
/// own start.
pub(crate) const LATE_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

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
    pub(crate) periods: Vec<KeptPeriod>,
    pub(crate) nics: Nics,
    /// Reads so far that moved a kept period, and that read theirs whole.
    pub(crate) moved: u64,
    pub(crate) whole: u64,
    /// Nodes read again in full for late evidence.
    pub(crate) late: u64,
    pub(crate) clock: u64,
}

pub(crate) struct KeptPeriod {
    pub(crate) length: chrono::TimeDelta,
    /// (`since`, `seal`] of the latest read.
    pub(crate) range: (DateTime<Utc>, DateTime<Utc>),
    /// The database's clock at the latest read's start.
    pub(crate) read_at: DateTime<Utc>,
    pub(crate) nodes: LeanNodes,
    pub(crate) used: u64,
}

/// How a [`PeriodCache`]'s reads were answered, so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodReads {
    /// Reads that moved a kept period on.
    pub moved: u64,
    /// Reads of a whole period (nothing kept of its length, or it did not move forward).
    pub whole: u64,
    /// Nodes read again in full for evidence stored late.
    pub late_nodes: u64,
}

impl PeriodCache {
    /// How the reads so far were answered.
    pub fn answered(&self) -> PeriodReads {
        PeriodReads { moved: self.moved, whole: self.whole, late_nodes: self.late }
    }

    /// The periods it keeps.
    pub fn len(&self) -> usize {
        self.periods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.periods.is_empty()
    }
}

/// [`load_period`] of (`since`, `until`] with no rolled hours in it, through `cache`.
pub(crate) async fn load_period_cached<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    cache: &'a mut PeriodCache,
    laps: &mut Laps<'_>,
) -> Result<LeanPeriod<'a>, sqlx::Error> {
    let none = WorkloadPairs::new();
    let seal = chrono::TimeDelta::from_std(SEAL_AFTER).ok().and_then(|d| until.checked_sub_signed(d));
    let Some(seal) = seal.filter(|s| *s > since) else {
        // Shorter than what is read each time anyway: nothing to keep.
        let (ev, _) = load_split(conn, &None, [(since, until), (until, until)], until, &none, true, laps).await?;
        return Ok(LeanPeriod::of(ev));
    };
    let read_at = patterns::now(conn).await?;
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
            let late = patterns::late_nodes(conn, k.read_at - LATE_MARGIN).await?;
            // What left the period and what became old enough to keep, split where the kept
            // part ended (what left ends before it), through the BRIN indexes on `observed_at`
            // (as the assessment's slices).
            patterns::index_scans(conn, false).await?;
            let (gone, added) =
                load_split(conn, &None, [(from, since), (kept_seal, seal)], kept_seal, &none, true, laps).await?;
            patterns::index_scans(conn, true).await?;
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

/// Every pair's probe evidence observed in (`since`, `until`], counted as a pass counts it
/// under the trust policy (no in-line counts): the pattern finder's pairs. The
/// whole hours `rolled` (rolled up, inside the period) are read from the pair-hour rollups
/// ([`load_period`]), through `kept_rolled` when given (the settled hours' sum kept from
/// the reads before, [`RolledCache`]; run in a repeatable-read transaction); a period without
/// any is read through `kept` when given, kept from the reads before ([`PeriodCache`]).
pub(crate) async fn period_pairs<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    rolled: Option<(DateTime<Utc>, DateTime<Utc>)>,
    kept: Option<&'a mut PeriodCache>,
    kept_rolled: Option<&'a mut RolledCache>,
) -> Result<PeriodPairs<'a>, sqlx::Error> {
    let mut steps = crate::steps::Steps::default();
    let mut laps = Laps::new(&mut steps);
    match (rolled, kept, kept_rolled) {
        (None, Some(cache), _) => load_period_cached(conn, since, until, cache, &mut laps).await,
        (Some(hours), _, Some(cache)) => load_period_rolled_cached(conn, since, until, hours, cache, &mut laps).await,
        _ => Ok(LeanPeriod::of(load_period(conn, since, until, rolled, &mut laps).await?)),
    }
}

/// What [`period_pairs`] read: [`PeriodPairs::nodes`], [`PeriodPairs::for_each_trusted`].
pub(crate) type PeriodPairs<'a> = LeanPeriod<'a>;

/// The pattern finder's kept periods keep evidence observed up to this long before a read's end;
/// what is newer is read again by each read (it may still be on its way). 30 s past
/// [`LATE_AFTER`]: evidence older than this that arrives after the read is always marked late,
/// with up to 30 s between the collector's and the database's clocks. A summary set is dated by
/// its newest probe and travels when its window closes, up to a batch interval later:
/// [`LATE_AFTER`] leaves room for that.
pub const SEAL_AFTER: std::time::Duration = std::time::Duration::from_secs(120);
