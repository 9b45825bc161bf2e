//! When each pair is probed: every pair of the node within one cycle, the workload's pair
//! (predicted or pinned) first and most often, under a bandwidth budget, with jitter, and
//! never the same NIC twice in a row when another NIC is waiting.

use std::time::Duration;

use super::Pair;
use railguard_schema::PairSelection;

#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// Every pair is probed at least once per cycle.
    pub cycle: Duration,
    /// Bytes per probe.
    pub probe_bytes: u64,
    /// Link rate of the slowest NIC, bits per second.
    pub link_bits_per_sec: u64,
    /// Share of the link probes may use on average (0.01 = 1 %).
    pub budget_fraction: f64,
    /// How many times per cycle the workload's pairs are probed.
    pub workload_repeats: usize,
    /// Random spread of each start time, as a share of the gap.
    pub jitter_fraction: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            cycle: Duration::from_secs(60),
            probe_bytes: 64 << 20,
            link_bits_per_sec: 400_000_000_000,
            budget_fraction: 0.01,
            workload_repeats: 4,
            jitter_fraction: 0.2,
        }
    }
}

/// One cycle's plan: which pair, and when (offset from the start of the cycle).
#[derive(Debug, Clone)]
pub struct Plan {
    pub slots: Vec<(Duration, Pair)>,
    /// Probe size after the budget was applied.
    pub probe_bytes: u64,
}

/// Orders pairs so that no NIC is probed twice in a row while another NIC has pairs waiting.
fn spread_over_nics(mut pairs: Vec<Pair>) -> Vec<Pair> {
    let mut out: Vec<Pair> = Vec::with_capacity(pairs.len());
    while !pairs.is_empty() {
        let last = out.last().map(|p| p.nic.clone());
        let idx = pairs.iter().position(|p| Some(&p.nic) != last.as_ref()).unwrap_or(0);
        out.push(pairs.remove(idx));
    }
    out
}

/// Plans one cycle over `pairs`. Workload pairs (selection Predicted or Pinned) lead and are
/// repeated; the probe size shrinks if the budget cannot carry the plan at full size.
pub fn plan(pairs: &[Pair], cfg: &ScheduleConfig) -> Plan {
    let workload: Vec<Pair> = pairs.iter().filter(|p| p.selection != PairSelection::Sweep).cloned().collect();
    let sweep: Vec<Pair> = pairs.iter().filter(|p| p.selection == PairSelection::Sweep).cloned().collect();
    let mut order: Vec<Pair> = Vec::new();
    // Workload pairs first, then the sweep interleaved with further rounds of workload pairs.
    order.extend(workload.iter().cloned());
    let rounds = cfg.workload_repeats.saturating_sub(1);
    let chunk = if rounds == 0 { sweep.len().max(1) } else { sweep.len().div_ceil(rounds).max(1) };
    let mut sweep_iter = sweep.chunks(chunk);
    for _ in 0..rounds {
        order.extend(sweep_iter.next().unwrap_or(&[]).iter().cloned());
        order.extend(workload.iter().cloned());
    }
    for rest in sweep_iter {
        order.extend(rest.iter().cloned());
    }
    let order = spread_over_nics(order);
    let n = order.len().max(1) as u64;
    // Budget: bytes per cycle ≤ fraction × link rate × cycle.
    let budget_bytes = (cfg.link_bits_per_sec as f64 / 8.0 * cfg.budget_fraction * cfg.cycle.as_secs_f64()) as u64;
    let probe_bytes = cfg.probe_bytes.min(budget_bytes / n).max(4096);
    let gap = cfg.cycle / n as u32;
    let slots = order
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let jitter = gap.mul_f64(cfg.jitter_fraction * rand::random::<f64>());
            (gap * i as u32 + jitter, p)
        })
        .collect();
    Plan { slots, probe_bytes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(gpus: u32, nics: u32, workload: &[(u32, u32)]) -> Vec<Pair> {
        let mut v = Vec::new();
        for g in 0..gpus {
            for n in 0..nics {
                let mut p = Pair::named(g, &format!("mlx5_{n}"));
                if workload.contains(&(g, n)) {
                    p.selection = PairSelection::Predicted;
                }
                v.push(p);
            }
        }
        v
    }

    #[test]
    fn every_pair_within_a_cycle_workload_first_and_most_often() {
        let all = pairs(8, 8, &(0..8).map(|g| (g, g)).collect::<Vec<_>>());
        let plan = plan(&all, &ScheduleConfig::default());
        let keys: std::collections::HashSet<String> = plan.slots.iter().map(|(_, p)| p.key()).collect();
        assert_eq!(keys.len(), 64, "every pair at least once");
        assert!(plan.slots.iter().all(|(t, _)| *t < Duration::from_secs(60)), "within the 60 s cycle");
        assert_eq!(plan.slots[0].1.selection, PairSelection::Predicted, "the workload's pairs lead");
        let count = |k: &str| plan.slots.iter().filter(|(_, p)| p.key() == k).count();
        assert_eq!(count("GPU3/mlx5_3"), 4);
        assert_eq!(count("GPU3/mlx5_4"), 1);
        // Start times rise (jitter stays inside each gap).
        assert!(plan.slots.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn bandwidth_budget_holds_and_no_nic_twice_in_a_row() {
        let all = pairs(8, 8, &[(0, 0)]);
        let cfg = ScheduleConfig { link_bits_per_sec: 100_000_000_000, ..Default::default() };
        let plan = plan(&all, &cfg);
        let total: u64 = plan.probe_bytes * plan.slots.len() as u64;
        let budget = 100e9 / 8.0 * 0.01 * 60.0;
        assert!((total as f64) <= budget, "{total} bytes per cycle over a {budget} budget");
        assert!(plan.slots.windows(2).all(|w| w[0].1.nic != w[1].1.nic));
    }
}
