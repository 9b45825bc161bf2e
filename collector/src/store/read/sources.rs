//! Source findings: the other end of KV transfers. A source (what a destination's failures name
//! it by: the remote NIXL engine, `|tp<rank>pp<rank>` for one vLLM worker) that sent wrong bytes,
//! through the destinations' own NICs, to two or more GPUs of the fleet is implicated: its GPU or
//! NIC, not theirs. Each destination that got wrong bytes from that source alone carries a
//! `remote` finding and is not marked for it; these rows name the source, fleet-wide.
//!
//! A source is named by the GPU/NIC pair its own node's agent attested when it announced itself
//! (`source_workers`, written only by that node): neither a destination nor the source's manifest
//! can place it on another node's GPU. A name no node announced, or one two nodes announced, is
//! shown by its name, unattested, with what its manifests claimed. A source whose own node
//! proves its pair clean (`ok`, proven by its own probes) is nobody's excuse: its destinations'
//! mismatches stay theirs, however many nodes report it.

use chrono::{DateTime, Utc};
use railguard_schema::SourceClaim;
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

/// Whether a source's own node attested where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Attestation {
    /// One node's agent announced the name, with the GPU the process holds and its NIC.
    Attested,
    /// No node's agent announced it (no railguard agent there, or a library that does not say).
    Unannounced,
    /// Two or more nodes announced it: nobody's word is taken.
    Disputed,
}

/// Where a source name resolves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SourceEnd {
    /// The name the destinations' failures give it.
    pub name: String,
    pub attestation: Attestation,
    /// The nodes that announced the name.
    pub announced_by: i64,
    /// Attested only: the node, its GPU (index and PCI address) and the NIC its transfers use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_bdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<String>,
    /// Attested only: the pod the source process works for, as its own node's agent named it
    /// when the worker announced itself. A name, never evidence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<railguard_schema::WorkloadPod>,
}

impl SourceEnd {
    /// The end `name` resolves to, from `railguard_source_end`'s columns.
    pub fn of(
        name: String,
        announced_by: i64,
        node: Option<String>,
        gpu: Option<i32>,
        gpu_bdf: Option<String>,
        nic: Option<String>,
    ) -> SourceEnd {
        if announced_by == 1 {
            SourceEnd {
                name,
                attestation: Attestation::Attested,
                announced_by,
                node,
                gpu: gpu.and_then(|g| u32::try_from(g).ok()),
                gpu_bdf,
                nic: nic.filter(|n| !n.is_empty()),
                pod: None,
            }
        } else {
            let attestation = if announced_by == 0 { Attestation::Unannounced } else { Attestation::Disputed };
            SourceEnd { name, attestation, announced_by, node: None, gpu: None, gpu_bdf: None, nic: None, pod: None }
        }
    }

    /// The end with its pod from `pods` (by worker and node, [`source_pods`]), where attested.
    pub fn with_pod(mut self, pods: &SourcePods) -> SourceEnd {
        if let (Attestation::Attested, Some(node)) = (self.attestation, &self.node) {
            self.pod = pods.get(&(self.name.clone(), node.clone())).cloned();
        }
        self
    }
}

/// Announced source workers' pods by (worker, node).
pub type SourcePods = std::collections::HashMap<(String, String), railguard_schema::WorkloadPod>;

/// The pods the announcements of the workers `names` named (a row whose pod no longer decodes is
/// left out: it was validated at ingest).
pub async fn source_pods(conn: &mut sqlx::PgConnection, names: &[String]) -> Result<SourcePods, sqlx::Error> {
    if names.is_empty() {
        return Ok(SourcePods::new());
    }
    let rows: Vec<(String, String, sqlx::types::Json<serde_json::Value>)> =
        sqlx::query_as("SELECT worker, node_id, pod FROM source_workers WHERE worker = ANY($1) AND pod IS NOT NULL")
            .bind(names)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows.into_iter().filter_map(|(w, n, p)| Some(((w, n), serde_json::from_value(p.0).ok()?))).collect())
}

/// A source in words: "node pre-a GPU3 (0000:1b:00.0) through mlx5_0, attested (prefill-7|tp0pp0)"
/// (with its pod where its agent named one: "…, attested (prefill-7|tp0pp0; pod serving/prefill-7,
/// container vllm)"),
/// "prefill-7 (unattested)", "prefill-7 (unattested: announced by 2 nodes)".
pub fn source_label(end: &SourceEnd) -> String {
    match end.attestation {
        Attestation::Attested => {
            let mut s = format!("node {}", end.node.as_deref().unwrap_or("?"));
            if let Some(g) = end.gpu {
                s.push_str(&format!(" GPU{g}"));
            }
            if let Some(b) = &end.gpu_bdf {
                s.push_str(&format!(" ({b})"));
            }
            match &end.nic {
                Some(n) => s.push_str(&format!(" through {n}")),
                None => s.push_str(" (its NIC unattributed)"),
            }
            match &end.pod {
                Some(p) => format!("{s}, attested ({}; {})", end.name, p.label()),
                None => format!("{s}, attested ({})", end.name),
            }
        }
        Attestation::Unannounced => format!("{} (unattested)", end.name),
        Attestation::Disputed => format!("{} (unattested: announced by {} nodes)", end.name, end.announced_by),
    }
}

/// One source's wrong bytes in a period, fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SourceFinding {
    /// The source as the destinations' failures name it (the first name, where several names
    /// resolve to one attested pair).
    pub source: String,
    /// Where it is: the pair its own node attested, or why that is not known.
    pub end: SourceEnd,
    /// Names resolving to this source (a restarted engine on the same GPU and NIC: more than one).
    pub names: i64,
    /// Unattested only: the source end its latest manifest claimed (the prefill side's own word).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<SourceClaim>,
    /// Always `remote`: the layer this finding implicates.
    pub layer: railguard_schema::Layer,
    /// Failed transfers from it (the failures the destinations listed; a report keeps at most
    /// 256), moved by the destinations' NICs.
    pub mismatches: i64,
    /// Distinct destination GPUs and their nodes.
    pub gpus: i64,
    pub nodes: i64,
    /// Of those GPUs, the ones that got wrong bytes from no other source (the ones its finding
    /// moves the blame off).
    pub exclusive_gpus: i64,
    /// Every one of them on a simulated device (the demo): nothing on hardware.
    pub simulated: bool,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    /// The finding in words.
    pub reason: String,
}

/// The sources that sent wrong bytes to two or more GPUs in `since..=until`, most GPUs first (at
/// most `limit`), each counted by its `source_key` (`inline_source_failures`). A failure whose
/// every bad block held whole blocks of another time or place (misplaced) is the engine's and not
/// counted; a source whose own node proves its pair clean (`end_proven_clean`) is not listed.
pub async fn source_findings(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<SourceFinding>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        source: String,
        names: i64,
        mismatches: i64,
        gpus: i64,
        nodes: i64,
        exclusive_gpus: i64,
        simulated: bool,
        first_at: DateTime<Utc>,
        last_at: DateTime<Utc>,
        end_node: Option<String>,
        end_gpu: Option<i32>,
        end_gpu_bdf: Option<String>,
        end_nic: Option<String>,
        announced_by: i64,
        claim: Option<sqlx::types::Json<serde_json::Value>>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "WITH f AS (
            SELECT * FROM inline_source_failures
            WHERE observed_at >= $1 AND observed_at <= $2 AND path IN ('nic_dma', 'simulated')
         ), dest AS (
            SELECT node_id, gpu_index, count(DISTINCT source_key) AS sources FROM f GROUP BY 1, 2
         )
         SELECT min(f.source) AS source, count(DISTINCT f.source) AS names, count(*)::bigint AS mismatches,
                count(DISTINCT (f.node_id, f.gpu_index)) AS gpus, count(DISTINCT f.node_id) AS nodes,
                count(DISTINCT (f.node_id, f.gpu_index)) FILTER (WHERE dest.sources = 1) AS exclusive_gpus,
                bool_and(f.simulated) AS simulated, min(f.at) AS first_at, max(f.at) AS last_at,
                min(f.end_node) AS end_node, min(f.end_gpu) AS end_gpu, min(f.end_gpu_bdf) AS end_gpu_bdf,
                min(f.end_nic) AS end_nic, max(f.announced_by) AS announced_by,
                (array_agg(f.claim ORDER BY f.at DESC) FILTER (WHERE f.claim IS NOT NULL))[1] AS claim
         FROM f JOIN dest USING (node_id, gpu_index)
         GROUP BY f.source_key
         HAVING count(DISTINCT (f.node_id, f.gpu_index)) >= 2 AND NOT bool_or(f.end_proven_clean)
         ORDER BY gpus DESC, mismatches DESC, f.source_key LIMIT $3",
    )
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let attested: Vec<String> = rows.iter().filter(|r| r.announced_by == 1).map(|r| r.source.clone()).collect();
    let pods = source_pods(&mut *pool.acquire().await?, &attested).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let end = SourceEnd::of(r.source.clone(), r.announced_by, r.end_node, r.end_gpu, r.end_gpu_bdf, r.end_nic)
                .with_pod(&pods);
            // A stored claim that no longer decodes is shown as none (it was validated at ingest).
            let claim = (end.attestation != Attestation::Attested)
                .then(|| r.claim.and_then(|c| serde_json::from_value::<SourceClaim>(c.0).ok()))
                .flatten();
            let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            let claimed = claim
                .as_ref()
                .map(|c| format!("; its manifests claim {} (the source's own word)", c.words()))
                .unwrap_or_default();
            let reason = format!(
                "{}: wrong bytes on {} of {}, through their own NICs ({} from no other source){}: the source's GPU or NIC is implicated, not theirs{claimed}",
                source_label(&end),
                plural(r.gpus, "GPU", "GPUs"),
                plural(r.nodes, "node", "nodes"),
                r.exclusive_gpus,
                if r.simulated { " (simulated)" } else { "" }
            );
            SourceFinding {
                source: r.source,
                end,
                names: r.names,
                claim,
                layer: railguard_schema::Layer::Remote,
                mismatches: r.mismatches,
                gpus: r.gpus,
                nodes: r.nodes,
                exclusive_gpus: r.exclusive_gpus,
                simulated: r.simulated,
                first_at: r.first_at,
                last_at: r.last_at,
                reason,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_named_by_its_attested_pair_or_as_unattested() {
        let end = SourceEnd::of(
            "prefill-7|tp0pp0".into(),
            1,
            Some("pre-a".into()),
            Some(3),
            Some("0000:1b:00.0".into()),
            Some("mlx5_0".into()),
        );
        assert_eq!(source_label(&end), "node pre-a GPU3 (0000:1b:00.0) through mlx5_0, attested (prefill-7|tp0pp0)");
        // Its pod, where its agent named one: a name in the words, nothing else changes.
        let pod = railguard_schema::WorkloadPod {
            namespace: "serving".into(),
            name: "prefill-7".into(),
            container: "vllm".into(),
            uid: String::new(),
            container_id: String::new(),
            source: railguard_schema::PodSource::Kubelet,
        };
        let pods = SourcePods::from([(("prefill-7|tp0pp0".to_owned(), "pre-a".to_owned()), pod.clone())]);
        let named = end.clone().with_pod(&pods);
        assert_eq!(
            source_label(&named),
            "node pre-a GPU3 (0000:1b:00.0) through mlx5_0, attested (prefill-7|tp0pp0; pod serving/prefill-7, container vllm)"
        );
        assert_eq!(SourceEnd { pod: None, ..named }, end);
        let elsewhere = SourcePods::from([(("prefill-7|tp0pp0".to_owned(), "pre-b".to_owned()), pod)]);
        assert_eq!(end.clone().with_pod(&elsewhere).pod, None, "another node's announcement names no pod here");
        let none = SourceEnd::of("prefill-7".into(), 0, None, None, None, None);
        assert_eq!(
            (none.attestation, source_label(&none).as_str()),
            (Attestation::Unannounced, "prefill-7 (unattested)")
        );
        // Two nodes announcing one name: neither's word is taken, whatever the columns say.
        let two = SourceEnd::of("prefill-7".into(), 2, Some("pre-a".into()), Some(3), None, Some("mlx5_0".into()));
        assert_eq!((two.attestation, two.node.as_deref()), (Attestation::Disputed, None));
        assert_eq!(two.clone().with_pod(&pods).pod, None, "a disputed name names no pod");
        assert_eq!(source_label(&two), "prefill-7 (unattested: announced by 2 nodes)");
    }
}
