//! The assessment split by node across the collectors that share one Postgres: every node
//! belongs to one of [`PARTS`] parts by a hash of its id (`nodes.assess_part`, computed by
//! Postgres), and the live collectors ([`Member`]s) divide the parts among themselves by
//! [`assign`]: a rendezvous hash with bounded loads, the same answer on every collector that sees
//! the same members, no part to two members, every part to one, and no member more than one part
//! above another. Who holds a part is decided by its advisory lock
//! (`crate::tasks::share`); this file only says who should.

use std::collections::BTreeMap;

pub use crate::store::schedule::PARTS;

/// One part of the fleet's nodes (0 ≤ part < [`PARTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Part(i16);

impl Part {
    /// The part numbered `n`, if there is one.
    pub fn new(n: i16) -> Option<Part> {
        (0..PARTS).contains(&n).then_some(Part(n))
    }

    /// Every part, in order.
    pub fn all() -> impl Iterator<Item = Part> {
        (0..PARTS).map(Part)
    }

    /// Its number, as `nodes.assess_part` holds it.
    pub fn number(self) -> i16 {
        self.0
    }

    /// The numbers of `parts`, for a statement's `= ANY($n)`.
    pub fn numbers(parts: &[Part]) -> Vec<i16> {
        parts.iter().map(|p| p.0).collect()
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A collector taking part in the assessment, by the member slot it holds (an advisory lock of
/// its own, released with its connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member(pub i32);

/// A part's weight for a member: the higher, the more the part wants that member.
fn weight(part: Part, member: Member) -> u64 {
    // splitmix64 of the pair: every bit of both moves every bit of the weight.
    let mut z = ((part.0 as u16 as u64) << 32 | member.0 as u32 as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Which member assesses each part, among `members` (none: no part is assigned). In two rounds,
/// parts taken in order: each part goes to the member it weighs most that holds fewer than
/// ⌊parts ÷ members⌋; the parts left (fewer than the members) each to the member it weighs most
/// that has not taken one of them. The shares then differ by one at most, and a member that
/// leaves gives up its own parts and moves few others.
pub fn assign(members: &[Member]) -> BTreeMap<Part, Member> {
    let mut members = members.to_vec();
    members.sort_unstable();
    members.dedup();
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    let floor = PARTS as usize / members.len();
    let mut load: BTreeMap<Member, usize> = members.iter().map(|m| (*m, 0)).collect();
    let ranked = |part: Part| {
        let mut r = members.clone();
        r.sort_by_key(|m| (std::cmp::Reverse(weight(part, *m)), *m));
        r
    };
    let mut left = Vec::new();
    for part in Part::all() {
        match ranked(part).into_iter().find(|m| load.get(m).is_some_and(|l| *l < floor)) {
            Some(m) => {
                *load.entry(m).or_default() += 1;
                out.insert(part, m);
            }
            None => left.push(part),
        }
    }
    for part in left {
        if let Some(m) = ranked(part).into_iter().find(|m| load.get(m).is_some_and(|l| *l <= floor)) {
            *load.entry(m).or_default() += 1;
            out.insert(part, m);
        }
    }
    out
}

/// The parts `me` should assess among `members` (`me` among them or not: none if not).
pub fn share_of(me: Member, members: &[Member]) -> Vec<Part> {
    assign(members).into_iter().filter(|(_, m)| *m == me).map(|(p, _)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[i32]) -> Vec<Member> {
        ids.iter().map(|i| Member(*i)).collect()
    }

    #[test]
    fn every_part_goes_to_exactly_one_member_and_the_shares_differ_by_at_most_one() {
        for n in 1..=9 {
            let ms: Vec<Member> = (0..n).map(|i| Member(i * 7 + 3)).collect();
            let a = assign(&ms);
            assert_eq!(a.len(), PARTS as usize, "every part assigned ({n} members)");
            let shares: Vec<usize> = ms.iter().map(|m| share_of(*m, &ms).len()).collect();
            assert_eq!(shares.iter().sum::<usize>(), PARTS as usize, "no part twice ({n} members)");
            let (lo, hi) = (shares.iter().min().unwrap_or(&0), shares.iter().max().unwrap_or(&0));
            assert!(hi - lo <= 1, "{n} members: {shares:?}");
        }
        assert!(assign(&[]).is_empty());
        assert!(share_of(Member(5), &members(&[1, 2])).is_empty(), "not a member: no share");
    }

    #[test]
    fn every_collector_computes_the_same_assignment_whatever_order_it_lists_the_members_in() {
        assert_eq!(assign(&members(&[4, 1, 9])), assign(&members(&[9, 4, 1, 1])));
    }

    #[test]
    fn a_member_that_leaves_gives_up_its_parts_and_moves_few_others() {
        let three = assign(&members(&[0, 1, 2]));
        let two = assign(&members(&[0, 1]));
        let leaver = three.values().filter(|m| **m == Member(2)).count();
        let moved = Part::all().filter(|p| three[p] != Member(2) && three[p] != two[p]).count();
        assert!(leaver >= 21, "the leaver had its share: {leaver}");
        // A plain rendezvous hash would move none; the bound on loads moves a few so that the
        // two left stay balanced.
        assert!(moved <= PARTS as usize / 8, "{moved} parts of the survivors moved");
        // And one that joins takes a share from each.
        let four = assign(&members(&[0, 1, 2, 3]));
        assert_eq!(four.values().filter(|m| **m == Member(3)).count(), 16);
    }

    #[test]
    fn parts_are_numbered_as_postgres_numbers_them() {
        assert_eq!(Part::new(0).map(Part::number), Some(0));
        assert_eq!(Part::new(63).map(Part::number), Some(63));
        assert_eq!(Part::new(64), None);
        assert_eq!(Part::new(-1), None);
        assert_eq!(Part::all().count(), 64);
    }
}
