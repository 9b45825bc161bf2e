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

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

/// The attributes, in order of preference when two explanations are equally good (general
/// first: a whole path class before one node).
pub const ATTRIBUTES: &[&str] =
    &["path", "virtualized", "hypervisor", "viommu", "gpudirect", "driver", "gpu_model", "workload_pair", "node"];

/// One pair and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairFacts {
    pub node: String,
    pub gpu: i32,
    pub nic: String,
    pub failed: bool,
    /// Its trusted evidence came from the simulated fabric (no hardware).
    pub simulated: bool,
    /// Attribute → value (missing: unknown, never matched).
    pub attrs: BTreeMap<&'static str, String>,
}

/// The explanation.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Factor {
    /// The one line.
    pub summary: String,
    /// The attributes that explain the failures, as `attribute=value`.
    pub attributes: Vec<String>,
    /// Failing pairs in the fleet, and how many share the attributes.
    pub failing: usize,
    pub covered: usize,
    /// Pairs that share the attributes, and how many of them fail.
    pub matched: usize,
    pub matched_failing: usize,
    /// What the pairs that differ in one attribute show ("no PIX pair on bare metal fails (24 probed)").
    pub contrast: Vec<String>,
    /// Of the covered failing pairs, those whose evidence is the simulated fabric's: the
    /// summary says so.
    pub simulated: usize,
    /// `high`: covers every failure, ≥ 90 % of the matching pairs fail, and healthy pairs that
    /// differ exist; `medium`: covers most; `low`: few failures or a weak split.
    pub confidence: String,
}

fn phrase(attr: &str, v: &str) -> String {
    match (attr, v) {
        ("path", v) => format!("{} pairs", v.to_uppercase()),
        ("virtualized", "yes") => "in VMs".into(),
        ("virtualized", "no") => "on bare metal".into(),
        ("virtualized", _) => "where virtualization is unknown".into(),
        ("hypervisor", "") => "without a hypervisor".into(),
        ("hypervisor", v) => format!("in {} guests", v.to_uppercase()),
        ("viommu", "yes") => "with vIOMMU".into(),
        ("viommu", "no") => "without vIOMMU".into(),
        ("viommu", _) => "where the vIOMMU is unknown".into(),
        ("gpudirect", v) => format!("with GPUDirect via {v}"),
        ("driver", "") => "without an NVIDIA driver reported".into(),
        ("driver", v) => format!("on driver {v}"),
        ("gpu_model", v) => format!("on {v} GPUs"),
        ("workload_pair", "yes") => "used by the workload".into(),
        ("workload_pair", _) => "not used by the workload".into(),
        ("node", v) => format!("on node {v}"),
        (a, v) => format!("with {a} {v}"),
    }
}

/// "PIX pairs in KVM guests without vIOMMU": the subject from `path`, qualifiers after
/// (`one`: "PIX pair …").
fn describe_as(conj: &[(&str, &str)], one: bool) -> String {
    let s = if one { "" } else { "s" };
    let subject = conj
        .iter()
        .find(|(a, _)| *a == "path")
        .map(|(_, v)| format!("{} pair{s}", v.to_uppercase()))
        .unwrap_or_else(|| format!("pair{s}"));
    // A hypervisor named says "in VMs" already.
    let has_hv = conj.iter().any(|(a, v)| *a == "hypervisor" && !v.is_empty());
    let quals: Vec<String> = conj
        .iter()
        .filter(|(a, v)| *a != "path" && !(has_hv && *a == "virtualized" && *v == "yes"))
        .map(|(a, v)| phrase(a, v))
        .collect();
    if quals.is_empty() { subject } else { format!("{subject} {}", quals.join(" ")) }
}

fn describe(conj: &[(&str, &str)]) -> String {
    describe_as(conj, false)
}

fn matches(p: &PairFacts, conj: &[(&str, &str)]) -> bool {
    conj.iter().all(|(a, v)| p.attrs.get(a).is_some_and(|x| x == v))
}

/// The best explanation of the failing pairs, if any pair fails.
pub fn explain(pairs: &[PairFacts]) -> Option<Factor> {
    let failing: Vec<&PairFacts> = pairs.iter().filter(|p| p.failed).collect();
    if failing.is_empty() {
        return None;
    }
    // Candidates: every combination of up to three attributes, with the values some failing
    // pair has on them.
    let mut best: Option<(Vec<(&str, &str)>, (usize, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>, usize))> =
        None;
    let n = ATTRIBUTES.len();
    let mut combos: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for i in 0..n {
        for j in i + 1..n {
            combos.push(vec![i, j]);
            for k in j + 1..n {
                combos.push(vec![i, j, k]);
            }
        }
    }
    for combo in &combos {
        let attrs: Vec<&str> = combo.iter().map(|i| ATTRIBUTES[*i]).collect();
        let values: BTreeSet<Vec<&str>> = failing
            .iter()
            .filter_map(|p| attrs.iter().map(|a| p.attrs.get(a).map(String::as_str)).collect::<Option<Vec<&str>>>())
            .collect();
        for vals in values {
            let conj: Vec<(&str, &str)> = attrs.iter().copied().zip(vals.iter().copied()).collect();
            let covered = failing.iter().filter(|p| matches(p, &conj)).count();
            let matched = pairs.iter().filter(|p| matches(p, &conj)).count();
            // Score: how well the set of matching pairs and the set of failing pairs coincide
            // (Dice: 2·both / (failing + matching), per mille), then fewer attributes, then more
            // general ones, then more failures covered. Covering every failure with an attribute
            // the whole fleet shares scores low; so does a precise set that misses most failures.
            let dice = 2000 * covered / (failing.len() + matched).max(1);
            let generality: usize = combo.iter().sum();
            let score = (dice, std::cmp::Reverse(conj.len()), std::cmp::Reverse(generality), covered);
            if best.as_ref().is_none_or(|(_, s)| score > *s) {
                best = Some((conj, score));
            }
        }
    }
    let (conj, _) = best?;
    let covered: Vec<&PairFacts> = failing.iter().copied().filter(|p| matches(p, &conj)).collect();
    let matched: Vec<&PairFacts> = pairs.iter().filter(|p| matches(p, &conj)).collect();
    // Context: in VMs, the hypervisor and vIOMMU every matching pair shares (said, not needed to
    // explain: what a VM's IOMMU does is the question in the first place).
    let mut said: Vec<(&str, &str)> = conj.clone();
    let uniform = |a: &str| -> Option<&str> {
        let first = matched.first()?.attrs.get(a)?;
        matched.iter().all(|p| p.attrs.get(a) == Some(first)).then_some(first.as_str())
    };
    if uniform("virtualized") == Some("yes") {
        for a in ["hypervisor", "viommu"] {
            if let Some(v) = uniform(a).filter(|v| !v.is_empty())
                && !conj.iter().any(|(c, _)| *c == a)
            {
                said.push((a, v));
            }
        }
    }
    said.sort_by_key(|(a, _)| ATTRIBUTES.iter().position(|x| x == a));
    let all = covered.len() == failing.len();
    let mut summary = format!(
        "{} {} failing pair{} {} {}",
        if all { "all" } else { "" },
        if all { failing.len().to_string() } else { format!("{} of {}", covered.len(), failing.len()) },
        if failing.len() == 1 { "" } else { "s" },
        if failing.len() == 1 && all { "is" } else { "are" },
        describe(&said)
    )
    .trim()
    .to_owned();
    if matched.len() > covered.len() {
        summary.push_str(&format!(" ({} of {} such pairs fail)", covered.len(), matched.len()));
    }
    // Contrast: drop one attribute at a time; the pairs that match the rest but differ there.
    let mut contrast = Vec::new();
    // The environment first ("no PIX pair on bare metal fails"), then the path.
    for (i, (attr, val)) in conj.iter().enumerate().rev() {
        let rest: Vec<(&str, &str)> = conj.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, c)| *c).collect();
        let others: Vec<&PairFacts> =
            pairs.iter().filter(|p| matches(p, &rest) && p.attrs.get(attr).is_some_and(|v| v != val)).collect();
        if others.is_empty() {
            continue;
        }
        let bad = others.iter().filter(|p| p.failed).count();
        let values: BTreeSet<&str> = others.iter().filter_map(|p| p.attrs.get(attr).map(String::as_str)).collect();
        let (one, many) = match values.iter().next() {
            Some(v) if values.len() == 1 => {
                let mut c = rest.clone();
                c.push((attr, v));
                c.sort_by_key(|(a, _)| ATTRIBUTES.iter().position(|x| x == a));
                (describe_as(&c, true), describe_as(&c, false))
            }
            _ if *attr == "path" => {
                let up = val.to_uppercase();
                (format!("non-{up} {}", describe_as(&rest, true)), format!("non-{up} {}", describe_as(&rest, false)))
            }
            _ => (
                format!("{} with another {attr}", describe_as(&rest, true)),
                format!("{} with another {attr}", describe_as(&rest, false)),
            ),
        };
        contrast.push(match bad {
            0 => format!("no {one} fails ({} probed)", others.len()),
            1 => format!("1 of {} {many} fails", others.len()),
            b => format!("{b} of {} {many} fail", others.len()),
        });
    }
    let simulated = covered.iter().filter(|p| p.simulated).count();
    if simulated > 0 {
        summary = format!(
            "[simulated fabric{}] {summary}",
            if simulated < covered.len() { format!(": {simulated} of these pairs") } else { String::new() }
        );
    }
    if !contrast.is_empty() {
        summary.push_str("; ");
        summary.push_str(&contrast.join("; "));
    }
    let precision = covered.len() as f64 / matched.len().max(1) as f64;
    let healthy_contrast = contrast.iter().any(|c| c.starts_with("no "));
    let confidence = if failing.len() < 2 {
        "low"
    } else if all && precision >= 0.9 && healthy_contrast {
        "high"
    } else if covered.len() * 2 > failing.len() && precision >= 0.5 {
        "medium"
    } else {
        "low"
    };
    Some(Factor {
        summary,
        attributes: conj.iter().map(|(a, v)| format!("{a}={v}")).collect(),
        failing: failing.len(),
        covered: covered.len(),
        matched: matched.len(),
        matched_failing: covered.len(),
        contrast,
        simulated,
        confidence: confidence.to_owned(),
    })
}

/// Every pair with trusted evidence in `(since, until]`, with its facts from its node's latest
/// topology.
pub async fn load(pool: &PgPool, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<Vec<PairFacts>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        node_id: String,
        gpu_index: i32,
        nic: String,
        failed: bool,
        simulated: bool,
        class: Option<String>,
        virtualized: Option<String>,
        hypervisor: Option<String>,
        viommu: Option<String>,
        gpudirect: Option<String>,
        driver_version: Option<String>,
        gpu_model: Option<String>,
        workload_pair: Option<bool>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "WITH w AS (
            SELECT node_id, gpu_index, nic, verdict, path FROM probe_evidence
            WHERE observed_at > $1 AND observed_at <= $2 AND injected = 'none'
         ), sim AS (
            SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id
         ), probes AS (
            SELECT w.node_id, w.gpu_index, w.nic, bool_or(w.verdict <> 'ok') AS failed, bool_or(w.path = 'simulated') AS simulated
            FROM w JOIN sim USING (node_id)
            WHERE railguard_trusted(w.path, sim.all_simulated)
            GROUP BY 1, 2, 3
         ), inline AS (
            SELECT node_id, gpu_index, nic, sum(transfers_mismatch) > 0 AS failed, false AS simulated
            FROM inline_reports
            WHERE observed_at > $1 AND observed_at <= $2 AND gpu_index IS NOT NULL AND nic <> ''
              AND (transfers_mismatch > 0 OR path = 'nic_dma')
            GROUP BY 1, 2, 3
         ), pairs AS (
            SELECT node_id, gpu_index, nic, bool_or(failed) AS failed, bool_or(simulated) AS simulated
            FROM (SELECT * FROM probes UNION ALL SELECT * FROM inline) x GROUP BY 1, 2, 3
         ), snap AS (
            SELECT * FROM latest_topology
         )
         SELECT p.node_id, p.gpu_index, p.nic, p.failed, p.simulated, tp.class, s.virtualized, s.hypervisor, s.viommu,
                s.gpudirect, s.driver_version, tg.name AS gpu_model,
                (SELECT r->>'predicted_nic' = p.nic FROM jsonb_array_elements(s.risks) r
                 WHERE (r->>'gpu')::int = p.gpu_index LIMIT 1) AS workload_pair
         FROM pairs p
         LEFT JOIN snap s ON s.node_id = p.node_id
         LEFT JOIN topology_paths tp ON tp.node_id = s.node_id AND tp.snapshot_id = s.record_id AND tp.a = 'GPU' || p.gpu_index AND tp.b = p.nic
         LEFT JOIN topology_gpus tg ON tg.node_id = s.node_id AND tg.snapshot_id = s.record_id AND tg.gpu_index = p.gpu_index
         ORDER BY 1, 2, 3",
    )
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut attrs = BTreeMap::new();
            let mut put = |k: &'static str, v: Option<String>| {
                if let Some(v) = v {
                    attrs.insert(k, v);
                }
            };
            put("path", r.class);
            put("virtualized", r.virtualized);
            put("hypervisor", r.hypervisor.map(|h| h.to_lowercase()));
            put("viommu", r.viommu);
            put("gpudirect", r.gpudirect);
            put("driver", r.driver_version);
            put("gpu_model", r.gpu_model.filter(|m| !m.is_empty()));
            put("workload_pair", r.workload_pair.map(|w| if w { "yes" } else { "no" }.to_owned()));
            put("node", Some(r.node_id.clone()));
            PairFacts { node: r.node_id, gpu: r.gpu_index, nic: r.nic, failed: r.failed, simulated: r.simulated, attrs }
        })
        .collect())
}

#[cfg(test)]
mod tests;
