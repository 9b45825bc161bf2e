//! The pattern finder's rolled-up hours kept between reads (`since=1d`): the settled hours'
//! sum kept, the hours a roll-up may still change read each time.

use super::lean::{LeanNodes, LeanPeriod, MAX_NICS, Nics, keep_last, lean, move_on};

use crate::evidence::{Hours, WindowEvidence, load_around, load_period, read_rolled};
use crate::store::read::patterns;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

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
    pub(crate) kept: Vec<KeptRolled>,
    pub(crate) nics: Nics,
    /// Reads that moved a kept sum, reads that made theirs from all its settled hours, and hours
    /// read from the rollups (kept or read each time), so far.
    pub(crate) moved: u64,
    pub(crate) whole: u64,
    pub(crate) hours_read: u64,
    pub(crate) clock: u64,
}

pub(crate) struct KeptRolled {
    pub(crate) length: chrono::TimeDelta,
    /// The hours added up in `nodes` (one run, in order), each with its `rollup_hours.rolled_at`
    /// as read.
    pub(crate) hours: BTreeMap<DateTime<Utc>, DateTime<Utc>>,
    pub(crate) nodes: LeanNodes,
    pub(crate) used: u64,
}

impl KeptRolled {
    pub(crate) fn span(&self) -> Option<Hours> {
        Some((*self.hours.keys().next()?, *self.hours.keys().next_back()? + chrono::TimeDelta::hours(1)))
    }
}

/// How a [`RolledCache`]'s reads were answered, so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolledReads {
    /// Reads that moved a kept sum of settled hours on.
    pub moved: u64,
    /// Reads that made theirs from all its settled hours.
    pub whole: u64,
    /// Hours read from the rollups (kept or read each time).
    pub hours_read: u64,
}

impl RolledCache {
    /// How the reads so far were answered.
    pub fn answered(&self) -> RolledReads {
        RolledReads { moved: self.moved, whole: self.whole, hours_read: self.hours_read }
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
pub(crate) fn hours_minus((a0, a1): Hours, (b0, b1): Hours) -> impl Iterator<Item = Hours> {
    [(a0, a1.min(b0)), (a0.max(b1), a1)].into_iter().filter(|(s, e)| s < e)
}

pub(crate) fn hours_in((s, e): Hours) -> u64 {
    u64::try_from((e - s).num_hours()).unwrap_or(0)
}

/// [`load_period`] of (`since`, `until`] with the rolled hours `rolled` in it, through `cache`.
/// The caller runs it in a repeatable-read transaction (its marks and rows one snapshot).
pub(crate) async fn load_period_rolled_cached<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    (from, to): Hours,
    cache: &'a mut RolledCache,
    laps: &mut crate::steps::Laps<'_>,
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
        patterns::rollup_marks(conn, lo, hi).await?.into_iter().collect();
    let newest = patterns::newest_rolled_hour(conn).await?;
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
    laps.lap(crate::steps::Step::SummarySets);
    keep_last(&mut cache.kept, KEPT_ROLLED, |k| k.used, period);
    let newest = lean(rest, &mut cache.nics);
    let RolledCache { kept, nics, .. } = cache;
    let kept = kept.last().map(|k| (&k.nodes, &*nics));
    Ok(LeanPeriod { kept, newest, nics: Nics::default() })
}
