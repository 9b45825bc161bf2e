//! Evidence compaction at the edge: the agent binary on the simulated seed fabric
//! sends failed probes in full and each pair's ok probes as one summary per window; the
//! collector stores both, assesses them as the probes they stand for, and shows them.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::ffi::OsStr;
use std::time::Duration;

use railguard_e2e::*;

const GPU3_FAILS: &str =
    r#"{"faults": [{"gpu": 3, "nic": "mlx5_3", "kind": "dma_read_rejected", "reported": "success"}]}"#;

/// `$select FROM` every summary of every set (one row each, with the columns of a set's
/// elements) `$rest`.
macro_rules! summaries {
    ($select:literal $(, $rest:literal)?) => {
        concat!(
            $select,
            " FROM (SELECT s.observed_at, m.* FROM probe_summary_sets s,
                unnest(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated, s.selection,
                       s.probes, s.bytes, s.duration_min_ns, s.duration_median_ns, s.duration_max_ns,
                       s.first_before_us, s.last_before_us)
                AS m(gpu_index, nic, transport, memory, path, injected, simulated, selection, probes, bytes,
                     duration_min_ns, duration_median_ns, duration_max_ns, first_before_us, last_before_us)
             ) AS summaries ",
            $($rest)?
        )
    };
}

async fn scalar(pg: &TestPg, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&pg.pool).await.unwrap()
}

async fn gpu(collector: &CollectorProc, g: u32) -> serde_json::Value {
    let (code, body) = collector.get(&format!("/api/v1/nodes/node-a/gpus/{g}"), None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn wait_until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait::until_async(what, within, async || if f().await { Ok(()) } else { Err("not yet") }).await
}

#[tokio::test(flavor = "multi_thread")]
async fn ok_probes_travel_as_summaries_failures_in_full_and_verdicts_hold() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--assess-every-secs", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, GPU3_FAILS).unwrap();
    let args: [&OsStr; 10] = [
        "--fabric".as_ref(),
        "sim".as_ref(),
        "--faults".as_ref(),
        faults.as_os_str(),
        "--probe-cycle-secs".as_ref(),
        "2".as_ref(),
        "--probe-bytes".as_ref(),
        "256K".as_ref(),
        "--probe-summary-secs".as_ref(),
        "3".as_ref(),
    ];
    let mut agent = seed_agent(&collector, dir.path(), &[&args[..], &["--no-signals".as_ref()]].concat());

    // Every pair but the failing one gets summaries; GPU3 is corrupting, GPU0's pair verified.
    wait_until("summaries of the 63 healthy pairs", Duration::from_secs(60), || async {
        scalar(&pg, summaries!("SELECT count(DISTINCT (gpu_index, nic))")).await >= 63
    })
    .await;
    wait_until("GPU3 corrupting", Duration::from_secs(30), || async {
        gpu(&collector, 3).await["status"]["status"] == "corrupting"
    })
    .await;
    let g0 = gpu(&collector, 0).await;
    // The seed's structure alone makes every GPU at_risk (PIX in a guest without a vIOMMU).
    assert_eq!(g0["status"]["status"], "at_risk", "{g0}");
    assert_eq!(g0["status"]["verification"], "simulated", "{g0}");

    // Failures never summarised; a healthy pair's only full ok probe is its first.
    assert_eq!(scalar(&pg, summaries!("SELECT count(*)", "WHERE gpu_index = 3 AND nic = 'mlx5_3'")).await, 0);
    // The pairs' windows end together: a set carries the node's pairs, one row for all of them
    let widest: Option<i32> = sqlx::query_scalar("SELECT max(cardinality(gpu_index)) FROM probe_summary_sets")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(widest.unwrap_or(0) >= 60, "a set holds the healthy pairs' summaries ({widest:?})");
    let most_full_oks: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM probe_results WHERE verdict = 'ok' GROUP BY gpu_index, nic) x",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(most_full_oks, 1, "every later ok probe of a healthy pair travels in a summary");
    let failures: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM probe_results WHERE gpu_index = 3 AND nic = 'mlx5_3' AND verdict = 'silent_corruption'",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert!(failures >= 2, "each failure in full, the first one confirmed at once ({failures})");
    // The summaries keep their probes' provenance and add up.
    let (odd, probes, bytes): (i64, i64, i64) = sqlx::query_as(summaries!(
        "SELECT count(*) FILTER (WHERE NOT simulated OR path <> 'simulated' OR transport <> 'sim' OR memory <> 'host'
                                    OR injected <> 'none' OR bytes <> probes::bigint * 262144
                                    OR first_before_us < last_before_us OR last_before_us < 0
                                    OR duration_min_ns > duration_median_ns OR duration_median_ns > duration_max_ns),
                sum(probes)::bigint, sum(bytes)::bigint"
    ))
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(odd, 0, "every summary says what produced its probes");
    assert_eq!(bytes, probes * 262_144);
    // The evidence view shows each summary of a set as a row dated by its set, with its own times.
    let (summary_rows, out_of_order): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE NOT (first_at <= last_at AND last_at <= observed_at))
         FROM probe_evidence WHERE summary",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert!(summary_rows >= 63 && out_of_order == 0, "{summary_rows} summary rows, {out_of_order} out of order");
    let predicted: Option<i32> = sqlx::query_scalar(summaries!(
        "SELECT max(probes)",
        "WHERE gpu_index = 0 AND nic = 'mlx5_0' AND selection = 'predicted'"
    ))
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert!(predicted.unwrap_or(0) >= 2, "the workload pair's probes are summarised ({predicted:?})");

    // The GPU's history shows the summaries as what they are, and the window counts them.
    let (code, body) = collector.get("/api/v1/nodes/node-a/gpus/0/history?since=1h", None);
    assert_eq!(code, 200, "{body}");
    let h: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = h["probes"].as_array().unwrap();
    let summary = rows.iter().find(|p| p["summary"] == true).expect("a summary row");
    assert!(summary["probes"].as_i64().unwrap() >= 1 && summary["verdict"] == "ok", "{summary}");
    assert!(rows.iter().any(|p| p["summary"] == false && p["probes"] == 1), "the first probe in full");
    let counted: i64 = g0["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["nic"] == "mlx5_0")
        .map(|p| p["window"]["ok"].as_i64().unwrap())
        .unwrap();
    assert!(counted > 2, "the pair's window counts the probes its summaries stand for ({counted})");

    // The fault goes: GPU3 recovers as fast as with every probe in full (its next five ok
    // probes travel in full), then its oks are summarised again.
    std::fs::write(&faults, r#"{"faults": []}"#).unwrap();
    wait_until("GPU3 back to its structural risk", Duration::from_secs(60), || async {
        gpu(&collector, 3).await["status"]["status"] == "at_risk"
    })
    .await;
    wait_until("GPU3's pair summarised again", Duration::from_secs(30), || async {
        scalar(&pg, summaries!("SELECT count(*)", "WHERE gpu_index = 3 AND nic = 'mlx5_3'")).await > 0
    })
    .await;
    let full_after: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM probe_results WHERE gpu_index = 3 AND nic = 'mlx5_3' AND verdict = 'ok'
           AND observed_at > (SELECT max(observed_at) FROM probe_results WHERE gpu_index = 3 AND verdict <> 'ok')",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(full_after, 5, "five ok probes in full after the failure, then summaries");
    let _ = agent.0.kill();
    let _ = agent.0.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_mode_sends_every_probe_in_full() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let args: [&OsStr; 9] = [
        "--fabric".as_ref(),
        "sim".as_ref(),
        "--probe-cycle-secs".as_ref(),
        "1".as_ref(),
        "--probe-bytes".as_ref(),
        "64K".as_ref(),
        "--probe-summary-secs".as_ref(),
        "0".as_ref(),
        "--no-signals".as_ref(),
    ];
    let mut agent = seed_agent(&collector, dir.path(), &args);
    wait_until("three cycles of full probes", Duration::from_secs(60), || async {
        pg.count("probe_results").await >= 3 * 88
    })
    .await;
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    assert_eq!(pg.count("probe_summary_sets").await, 0);
}
