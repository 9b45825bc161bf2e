//! Fleet patterns: the one line that explains many failing GPU/NIC pairs.
//!
//! Every pair with trusted evidence in the window (probes that exercised its NIC or the
//! simulated fabric of an all-simulated node; in-line checks) is failing (any failure or in-line
//! mismatch) or healthy, and carries what it is: its path class, the node's virtualization,
//! hypervisor, vIOMMU, GPUDirect mode and NVIDIA driver, the GPU model, whether it is the
//! workload's pair, and the node itself. [`explain`] looks for the smallest conjunction of
//! those attributes whose matching pairs coincide best with the failing ones (most failures
//! covered, fewest healthy pairs sharing it),
//! and says it with counts, a contrast (the pairs that differ in one attribute, and how they
//! fare) and a confidence.
//!
//! Invariants (one node cannot dictate the fleet's pattern):
//! - One node's weight is bounded: its failing pairs weigh at most 8 pairs together and its
//!   healthy pairs at most 64 ([`node_weights`]), so a node reporting 40 failing pairs of its own
//!   making weighs as much as a seed node with 8, and the pattern many nodes share wins. The
//!   sentence still counts pairs, as they are.
//! - No node's free text reaches the sentence: hypervisor, GPUDirect mode, driver version and
//!   GPU model are read into a fixed vocabulary or a grammar ([`canonical`]) before they are
//!   grouped on, and anything else is "unrecognised".
//!
//! At fleet scale (10,000 nodes, some 600,000 pairs in 15 minutes) the pairs are counted as an
//! assessment pass counts them (`assess::window`: rows grouped in SQL, summary sets added up
//! here), each joined to its node's facts kept between reads ([`Facts`]), and grouped by what
//! they are ([`Pairs`]: a few groups a node), which is what [`explain`] looks at.

//!
//! Rooms: [`explain`] (pure: the attributes, their grouping and the explanation), [`facts`]
//! (one read of a period's pairs, with each node's facts kept between reads), [`lean`] (the
//! compact form a period's evidence is kept in), [`period`] and [`rolled`] (the periods kept
//! between reads, without and with rolled-up hours).

mod explain;
mod facts;
mod lean;
mod period;
mod rolled;

pub use explain::{
    ATTRIBUTES, Factor, GPUDIRECT_MODES, HYPERVISORS, NODE_FAILING_CAP, NODE_HEALTHY_CAP, PAIR_WEIGHT, PairFacts,
    Pairs, UNRECOGNISED, Weight, canonical, explain, node_weights,
};
pub use facts::Facts;
pub use facts::load;
pub use lean::{LeanPeriod, TrustedPair};
pub use period::{KEPT_PERIODS, PeriodCache, PeriodReads, SEAL_AFTER};
pub use rolled::{KEPT_ROLLED, RolledCache, RolledReads};
