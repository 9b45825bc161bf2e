//! This collector's share of the split assessment, on a connection of its own: it holds a member
//! slot (a session-level advisory lock, so the live collectors are the slots held), computes the
//! parts it should assess among the live members ([`crate::assess::parts::assign`]) and holds
//! each part's lock while it assesses it. A collector that dies loses its connection, its slot
//! and its parts' locks at once; the others see one member fewer at their next check and take
//! its parts. Two collectors that briefly disagree on the members never assess one part
//! together: a part is assessed only under its lock.

use std::collections::BTreeSet;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::assess::parts::{Member, Part, share_of};
use crate::store::locks::{self, ASSESSMENT_MEMBER, ASSESSMENT_PART};

/// The most collectors that take part at once; one past it assesses nothing (and says so).
pub const MAX_MEMBERS: i32 = 256;

/// What a check found: the parts held now, and which of them were taken by this check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShareCheck {
    pub held: Vec<Part>,
    pub taken: Vec<Part>,
    /// The live members seen (this one among them); 0 when the check failed.
    pub members: usize,
}

/// This collector's member slot and parts.
#[derive(Debug)]
pub struct Share {
    pool: PgPool,
    conn: Option<PoolConnection<Postgres>>,
    member: Option<Member>,
    held: BTreeSet<Part>,
}

#[derive(Debug, thiserror::Error)]
enum ShareError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("all {MAX_MEMBERS} member slots of the assessment are held by other collectors")]
    NoSlot,
}

impl Share {
    pub fn new(pool: PgPool) -> Self {
        Share { pool, conn: None, member: None, held: BTreeSet::new() }
    }

    /// Keeps this collector's slot (taking one if it has none), gives up the parts no longer its
    /// own and takes those it should hold that nobody holds. On any failure it holds nothing
    /// (its connection closed, so Postgres releases every lock it held) and says so.
    pub async fn check(&mut self) -> ShareCheck {
        match self.try_check().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "checking this collector's share of the assessment failed; holding no part");
                self.drop_all();
                ShareCheck::default()
            }
        }
    }

    async fn try_check(&mut self) -> Result<ShareCheck, ShareError> {
        if let Some(mut c) = self.conn.take() {
            match locks::answers(&mut c).await {
                Ok(()) => self.conn = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "lost the assessment share's connection; its parts are released");
                    self.drop_all();
                }
            }
        }
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let mut c = self.pool.acquire().await?;
                // Closed, never returned to the pool: no lock may outlive its holder.
                c.close_on_drop();
                c
            }
        };
        let checked = self.check_on(&mut conn).await;
        self.conn = Some(conn);
        checked
    }

    async fn check_on(&mut self, conn: &mut PgConnection) -> Result<ShareCheck, ShareError> {
        let me = match self.member {
            Some(m) => m,
            None => {
                let mut slot = None;
                for s in 0..MAX_MEMBERS {
                    if locks::try_lock_in(conn, ASSESSMENT_MEMBER, s).await? {
                        slot = Some(Member(s));
                        break;
                    }
                }
                let m = slot.ok_or(ShareError::NoSlot)?;
                tracing::info!(member = m.0, "this collector takes part in the assessment");
                self.member = Some(m);
                m
            }
        };
        let members: Vec<Member> = locks::held_in(conn, ASSESSMENT_MEMBER).await?.into_iter().map(Member).collect();
        let wanted: BTreeSet<Part> = share_of(me, &members).into_iter().collect();
        let key = |p: &Part| i32::from(p.number());
        let leaving: Vec<Part> = self.held.difference(&wanted).copied().collect();
        if !leaving.is_empty() {
            locks::unlock_each_in(conn, ASSESSMENT_PART, &leaving.iter().map(key).collect::<Vec<_>>()).await?;
            for p in &leaving {
                self.held.remove(p);
            }
        }
        let missing: Vec<i32> = wanted.difference(&self.held).map(key).collect();
        // A part held by a collector that has not yet seen the new members is taken at a later
        // check.
        let taken: Vec<Part> = if missing.is_empty() {
            Vec::new()
        } else {
            locks::try_lock_each_in(conn, ASSESSMENT_PART, &missing)
                .await?
                .into_iter()
                .filter_map(|k| Part::new(i16::try_from(k).ok()?))
                .collect()
        };
        self.held.extend(taken.iter().copied());
        if !taken.is_empty() {
            tracing::info!(
                member = me.0,
                members = members.len(),
                parts = self.held.len(),
                taken = taken.len(),
                "took parts of the assessment"
            );
        }
        Ok(ShareCheck { held: self.held.iter().copied().collect(), taken, members: members.len() })
    }

    fn drop_all(&mut self) {
        self.conn = None;
        self.member = None;
        self.held.clear();
    }

    /// Gives every part and the slot up now (shutdown), so the others need not wait for the
    /// connection to die.
    pub async fn release(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = locks::unlock_all(&mut c).await;
        }
        self.drop_all();
    }
}
