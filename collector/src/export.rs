//! Analysis and export with polars (the collector only: the agent never links it).
//!
//! `export` writes probe, signal and status-change history as Parquet or CSV; `report` computes
//! failure rates per GPU and per pair, and the patterns across nodes that point at a cause:
//! the same GPU index or NIC failing on many nodes (configuration, hypervisor) versus one node
//! failing alone (that host).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use polars::prelude::*;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::store::read;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("polars: {0}")]
    Polars(#[from] PolarsError),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Parquet,
    Csv,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

fn micros(ts: &[DateTime<Utc>]) -> Vec<i64> {
    ts.iter().map(|t| t.timestamp_micros()).collect()
}

fn datetime(name: &str, ts: &[DateTime<Utc>]) -> PolarsResult<Column> {
    Column::new(name.into(), micros(ts)).cast(&DataType::Datetime(TimeUnit::Microseconds, None))
}

/// Probe results between `since` and `until` as a DataFrame, with their provenance (path,
/// memory, injected fault): full probes and the agents' summaries of ok probes (`probes` > 1).
pub async fn probes(pool: &PgPool, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<DataFrame, ExportError> {
    let rows = read::export_probes(pool, since, until).await?;
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.observed_at).collect();
    Ok(DataFrame::new_infer_height(vec![
        Column::new("node_id".into(), rows.iter().map(|r| r.node_id.as_str()).collect::<Vec<_>>()),
        datetime("observed_at", &at)?,
        Column::new("gpu_index".into(), rows.iter().map(|r| r.gpu_index).collect::<Vec<_>>()),
        Column::new("nic".into(), rows.iter().map(|r| r.nic.as_str()).collect::<Vec<_>>()),
        Column::new("transport".into(), rows.iter().map(|r| r.transport.as_str()).collect::<Vec<_>>()),
        Column::new("reported".into(), rows.iter().map(|r| r.reported.as_str()).collect::<Vec<_>>()),
        Column::new("verdict".into(), rows.iter().map(|r| r.verdict.as_str()).collect::<Vec<_>>()),
        Column::new("diagnosis".into(), rows.iter().map(|r| r.diagnosis.as_str()).collect::<Vec<_>>()),
        Column::new("bytes".into(), rows.iter().map(|r| r.bytes).collect::<Vec<_>>()),
        Column::new("bad_chunks".into(), rows.iter().map(|r| r.bad_chunks).collect::<Vec<_>>()),
        Column::new("chunks".into(), rows.iter().map(|r| r.chunks).collect::<Vec<_>>()),
        Column::new("simulated".into(), rows.iter().map(|r| r.simulated).collect::<Vec<_>>()),
        Column::new("path".into(), rows.iter().map(|r| r.path.as_str()).collect::<Vec<_>>()),
        Column::new("memory".into(), rows.iter().map(|r| r.memory.as_str()).collect::<Vec<_>>()),
        Column::new("injected".into(), rows.iter().map(|r| r.injected.as_str()).collect::<Vec<_>>()),
        // 1 for a probe stored in full; an agent's summary of ok probes stands for this many.
        Column::new("probes".into(), rows.iter().map(|r| r.probes).collect::<Vec<_>>()),
    ])?)
}

async fn signals(pool: &PgPool, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<DataFrame, ExportError> {
    let rows = read::export_signals(pool, since, until).await?;
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.observed_at).collect();
    Ok(DataFrame::new_infer_height(vec![
        Column::new("node_id".into(), rows.iter().map(|r| r.node_id.as_str()).collect::<Vec<_>>()),
        datetime("observed_at", &at)?,
        Column::new("source".into(), rows.iter().map(|r| r.source.as_str()).collect::<Vec<_>>()),
        Column::new("kind".into(), rows.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>()),
        Column::new("bdf".into(), rows.iter().map(|r| r.bdf.as_deref()).collect::<Vec<_>>()),
        Column::new("gpu_index".into(), rows.iter().map(|r| r.gpu_index).collect::<Vec<_>>()),
        Column::new("nic".into(), rows.iter().map(|r| r.nic.as_str()).collect::<Vec<_>>()),
        Column::new("summary".into(), rows.iter().map(|r| r.summary.as_str()).collect::<Vec<_>>()),
    ])?)
}

async fn status_changes(pool: &PgPool, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<DataFrame, ExportError> {
    let rows = read::export_status_changes(pool, since, until).await?;
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.at).collect();
    Ok(DataFrame::new_infer_height(vec![
        Column::new("node_id".into(), rows.iter().map(|r| r.node_id.as_str()).collect::<Vec<_>>()),
        Column::new("gpu_index".into(), rows.iter().map(|r| r.gpu_index).collect::<Vec<_>>()),
        datetime("at", &at)?,
        Column::new("from_status".into(), rows.iter().map(|r| r.from_status.as_deref()).collect::<Vec<_>>()),
        Column::new("to_status".into(), rows.iter().map(|r| r.to_status.as_str()).collect::<Vec<_>>()),
        Column::new("reason".into(), rows.iter().map(|r| r.reason.as_deref()).collect::<Vec<_>>()),
    ])?)
}

fn write(df: &mut DataFrame, dir: &Path, name: &str, format: Format) -> Result<(PathBuf, usize), ExportError> {
    let path = dir.join(format!("{name}.{}", format.ext()));
    let io = |source| ExportError::Io { path: path.clone(), source };
    let file = std::fs::File::create(&path).map_err(io)?;
    match format {
        Format::Parquet => {
            ParquetWriter::new(file).finish(df)?;
        }
        Format::Csv => CsvWriter::new(file).include_header(true).finish(df)?,
    }
    Ok((path, df.height()))
}

/// Writes `probes`, `signals` and `status_changes` files into `dir`; returns (path, rows).
pub async fn export(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    format: Format,
    dir: &Path,
) -> Result<Vec<(PathBuf, usize)>, ExportError> {
    std::fs::create_dir_all(dir).map_err(|source| ExportError::Io { path: dir.to_path_buf(), source })?;
    Ok(vec![
        write(&mut probes(pool, since, until).await?, dir, "probes", format)?,
        write(&mut signals(pool, since, until).await?, dir, "signals", format)?,
        write(&mut status_changes(pool, since, until).await?, dir, "status_changes", format)?,
    ])
}

fn rows(df: &DataFrame) -> Result<Vec<Value>, ExportError> {
    let mut out = vec![serde_json::Map::new(); df.height()];
    for c in df.columns() {
        let s = c.as_materialized_series();
        for (i, row) in out.iter_mut().enumerate() {
            let v = match s.get(i)? {
                AnyValue::Null => Value::Null,
                AnyValue::String(v) => json!(v),
                AnyValue::Boolean(v) => json!(v),
                AnyValue::Int32(v) => json!(v),
                AnyValue::Int64(v) => json!(v),
                AnyValue::UInt32(v) => json!(v),
                AnyValue::UInt64(v) => json!(v),
                AnyValue::Float64(v) => json!((v * 1000.0).round() / 1000.0),
                other => json!(other.to_string()),
            };
            row.insert(c.name().to_string(), v);
        }
    }
    Ok(out.into_iter().map(Value::Object).collect())
}

/// Failure rates per GPU and per pair, and patterns across nodes.
pub fn report(probes: &DataFrame) -> Result<Value, ExportError> {
    // Injected faults are self-test history, not evidence: the report leaves them out.
    let probes = &probes.clone().lazy().filter(col("injected").eq(lit("none"))).collect()?;
    let failed = col("verdict").neq(lit("ok"));
    let rate = (col("failures").cast(DataType::Float64) / col("probes").cast(DataType::Float64)).alias("failure_rate");
    let desc = SortMultipleOptions::default().with_order_descending_multi([true, false, false]);
    let per_pair = probes
        .clone()
        .lazy()
        .group_by([col("node_id"), col("gpu_index"), col("nic")])
        .agg([
            len().cast(DataType::Int64).alias("probes"),
            failed.clone().sum().cast(DataType::Int64).alias("failures"),
            // Said on every row: evidence from the simulated fabric is not evidence of hardware.
            col("simulated").any(true).alias("simulated"),
        ])
        .with_column(rate.clone())
        .filter(col("failures").gt(lit(0)))
        .sort(["failures", "node_id", "nic"], desc.clone())
        .collect()?;
    let per_gpu = probes
        .clone()
        .lazy()
        .group_by([col("node_id"), col("gpu_index")])
        .agg([
            len().cast(DataType::Int64).alias("probes"),
            failed.sum().cast(DataType::Int64).alias("failures"),
            col("simulated").any(true).alias("simulated"),
        ])
        .with_column(rate)
        .filter(col("failures").gt(lit(0)))
        .sort(["failures", "node_id", "gpu_index"], desc)
        .collect()?;
    // Patterns: pairs failing at least half their probes, counted across nodes.
    let nodes_total = probes.column("node_id")?.n_unique()? as i64;
    let bad_pairs = per_pair.clone().lazy().filter(col("failure_rate").gt_eq(lit(0.5)));
    let by_gpu_index = bad_pairs
        .clone()
        .group_by([col("gpu_index")])
        .agg([col("node_id").n_unique().cast(DataType::Int64).alias("nodes")])
        .sort(["nodes"], SortMultipleOptions::default().with_order_descending(true))
        .collect()?;
    let by_nic = bad_pairs
        .clone()
        .group_by([col("nic")])
        .agg([col("node_id").n_unique().cast(DataType::Int64).alias("nodes")])
        .sort(["nodes"], SortMultipleOptions::default().with_order_descending(true))
        .collect()?;
    let failing_nodes = bad_pairs.select([col("node_id").n_unique().cast(DataType::Int64).alias("n")]).collect()?;
    let failing_nodes = failing_nodes.column("n")?.i64()?.get(0).unwrap_or(0);

    let mut patterns = Vec::new();
    for (what, df, key) in [("GPU index", &by_gpu_index, "gpu_index"), ("NIC", &by_nic, "nic")] {
        for r in rows(df)? {
            let nodes = r["nodes"].as_i64().unwrap_or(0);
            if nodes >= 2 {
                let k = &r[key];
                let k = k.as_str().map(str::to_owned).unwrap_or_else(|| k.to_string());
                patterns.push(json!({
                    "kind": "across_nodes",
                    "what": what, "value": k, "nodes": nodes, "nodes_total": nodes_total,
                    "meaning": format!("{what} {k} fails verification on {nodes} of {nodes_total} nodes: look at configuration or the hypervisor (e.g. the NIC auto-selection or ACS/ATS settings of the image), not one host"),
                }));
            }
        }
    }
    if failing_nodes == 1 {
        let node = rows(&per_gpu)?.first().and_then(|r| r["node_id"].as_str().map(str::to_owned)).unwrap_or_default();
        patterns.push(json!({
            "kind": "single_node",
            "node": node,
            "meaning": format!("only {node} fails verification among {nodes_total} nodes: look at that host (hardware, firmware, its PCIe topology)"),
        }));
    }
    Ok(json!({
        "nodes": nodes_total,
        "probes": probes.height(),
        "per_gpu": rows(&per_gpu)?,
        "per_pair": rows(&per_pair)?,
        "patterns": patterns,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(rows: &[(&str, i32, &str, &str)]) -> DataFrame {
        frame_injected(rows, "none")
    }

    fn frame_injected(rows: &[(&str, i32, &str, &str)], injected: &str) -> DataFrame {
        DataFrame::new_infer_height(vec![
            Column::new("node_id".into(), rows.iter().map(|r| r.0).collect::<Vec<_>>()),
            Column::new("gpu_index".into(), rows.iter().map(|r| r.1).collect::<Vec<_>>()),
            Column::new("nic".into(), rows.iter().map(|r| r.2).collect::<Vec<_>>()),
            Column::new("verdict".into(), rows.iter().map(|r| r.3).collect::<Vec<_>>()),
            Column::new("simulated".into(), rows.iter().map(|_| false).collect::<Vec<_>>()),
            Column::new("injected".into(), rows.iter().map(|_| injected).collect::<Vec<_>>()),
        ])
        .unwrap()
    }

    #[test]
    fn injected_faults_are_not_in_the_report() {
        let healthy: Vec<_> = (0..4).map(|_| ("a", 0, "mlx5_0", "ok")).collect();
        let selftest: Vec<_> = (0..4).map(|_| ("a", 0, "mlx5_0", "silent_corruption")).collect();
        let mut df = frame(&healthy);
        df.vstack_mut(&frame_injected(&selftest, "bitflip")).unwrap();
        let r = report(&df).unwrap();
        assert_eq!(r["per_pair"].as_array().unwrap().len(), 0, "{r}");
        assert_eq!(r["probes"], 4, "only evidence is counted: {r}");
    }

    #[test]
    fn one_node_failing_alone_points_at_that_host() {
        let mut rows = Vec::new();
        for node in ["a", "b", "c"] {
            for _ in 0..4 {
                rows.push((node, 0, "mlx5_0", if node == "b" { "silent_corruption" } else { "ok" }));
                rows.push((node, 1, "mlx5_1", "ok"));
            }
        }
        let r = report(&frame(&rows)).unwrap();
        assert_eq!(r["nodes"], 3);
        assert_eq!(r["per_gpu"].as_array().unwrap().len(), 1);
        assert_eq!(r["per_gpu"][0]["node_id"], "b");
        assert_eq!(r["per_gpu"][0]["failure_rate"], 1.0);
        let p = r["patterns"].as_array().unwrap();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0]["kind"], "single_node");
        assert!(p[0]["meaning"].as_str().unwrap().contains("look at that host"));
    }

    #[test]
    fn the_same_gpu_index_failing_on_many_nodes_points_at_configuration() {
        let mut rows = Vec::new();
        for node in ["a", "b", "c", "d"] {
            for _ in 0..3 {
                rows.push((node, 3, "mlx5_3", "silent_corruption"));
                rows.push((node, 2, "mlx5_2", "ok"));
            }
        }
        rows.push(("a", 2, "mlx5_2", "timeout")); // one transient: no pattern
        let r = report(&frame(&rows)).unwrap();
        let p = r["patterns"].as_array().unwrap();
        assert!(p.iter().any(|x| x["what"] == "GPU index" && x["value"] == "3" && x["nodes"] == 4), "{p:?}");
        assert!(p.iter().any(|x| x["what"] == "NIC" && x["value"] == "mlx5_3"), "{p:?}");
        assert!(!p.iter().any(|x| x["kind"] == "single_node"));
        assert_eq!(r["per_pair"][0]["failures"], 3);
    }
}
