//! Readers of the collector's HTTP API under load: each reader reads every route the dashboard
//! and the CLI read, one after another with no pause (a closed loop, the worst a client can do
//! without a token's limit), on a fresh connection each, and counts what it was answered.
//!
//! The answers are kept by route: how many of each status (a 503 is the read cap turning a
//! reader away, which is the collector protecting its writers, not a failure), how many never
//! came (refused connections, timeouts), and the time of each answered read.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one read may take before it counts as never answered.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The routes a reader reads in turn, for a fleet whose nodes are `nodes` (the first few are
/// read node by node).
pub fn routes(nodes: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(&str, String)> = vec![
        ("info", "/api/v1/info".into()),
        ("fleet", "/api/v1/fleet".into()),
        ("fleet?limit=100", "/api/v1/fleet?limit=100".into()),
        ("grid", "/api/v1/grid".into()),
        ("grid?limit=250", "/api/v1/grid?limit=250".into()),
        ("gpus", "/api/v1/gpus".into()),
        ("failures?since=1d", "/api/v1/failures?since=1d".into()),
        ("engines?since=1d", "/api/v1/engines?since=1d".into()),
        ("sources?since=1d", "/api/v1/sources?since=1d".into()),
        ("patterns?since=15m", "/api/v1/patterns?since=15m".into()),
        ("fleet/series?since=1d", "/api/v1/fleet/series?since=1d".into()),
        ("fleet/series?since=30d", "/api/v1/fleet/series?since=30d".into()),
        ("metrics", "/metrics".into()),
        ("dashboard", "/".into()),
    ];
    for (k, n) in nodes.iter().take(8).enumerate() {
        out.push(("node", format!("/api/v1/nodes/{n}")));
        out.push(("node/nics/series?since=1d", format!("/api/v1/nodes/{n}/nics/series?since=1d")));
        out.push(("gpu", format!("/api/v1/nodes/{n}/gpus/{}", k % 8)));
        out.push(("gpu/history?since=30d", format!("/api/v1/nodes/{n}/gpus/{}/history?since=30d", k % 8)));
    }
    out.into_iter().map(|(r, p)| (r.to_owned(), p)).collect()
}

/// What one route answered.
#[derive(Default, Clone)]
pub struct RouteTally {
    /// Answers by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Reads that got no answer: connection refused or reset, or past the read timeout.
    pub unanswered: u64,
    /// Milliseconds of each read answered 200.
    pub ok_ms: Vec<f64>,
}

/// Every route's tally, shared by the readers.
#[derive(Default)]
pub struct ReadTallies(Mutex<BTreeMap<String, RouteTally>>);

/// All routes' reads together.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadTotals {
    pub reads: u64,
    pub ok: u64,
    /// Answered 503: the read cap turning a reader away.
    pub busy: u64,
    /// Answered a server error other than 503.
    pub failed: u64,
    pub unanswered: u64,
}

impl ReadTallies {
    fn add(&self, route: &str, answer: Option<u16>, ms: f64) {
        let Ok(mut t) = self.0.lock() else { return };
        let e = t.entry(route.to_owned()).or_default();
        match answer {
            Some(code) => {
                *e.by_status.entry(code).or_default() += 1;
                if code == 200 {
                    e.ok_ms.push(ms);
                }
            }
            None => e.unanswered += 1,
        }
    }

    /// The tallies so far, by route.
    pub fn snapshot(&self) -> BTreeMap<String, RouteTally> {
        self.0.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// The reads of every route together.
    pub fn totals(&self) -> ReadTotals {
        let mut out = ReadTotals::default();
        for t in self.snapshot().values() {
            for (code, n) in &t.by_status {
                out.reads += n;
                match code {
                    200 => out.ok += n,
                    503 => out.busy += n,
                    c if *c >= 500 => out.failed += n,
                    _ => {}
                }
            }
            out.reads += t.unanswered;
            out.unanswered += t.unanswered;
        }
        out
    }

    /// The totals, then one line a route: reads, answers by status, unanswered, p50/p99 of the
    /// 200s.
    pub fn report(&self) -> Vec<String> {
        let t = self.totals();
        let mut lines = vec![format!(
            "readers: {} reads, {} answered 200, {} answered 503 (the read cap), {} other statuses, {} unanswered",
            t.reads,
            t.ok,
            t.busy,
            t.reads - t.ok - t.busy - t.unanswered,
            t.unanswered
        )];
        for (route, t) in self.snapshot() {
            let mut ms = t.ok_ms.clone();
            ms.sort_by(f64::total_cmp);
            let q = |f: f64| {
                ms.get(((ms.len() as f64 * f).ceil() as usize).saturating_sub(1).min(ms.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(f64::NAN)
            };
            let answered: u64 = t.by_status.values().sum();
            let statuses: Vec<String> = t.by_status.iter().map(|(c, n)| format!("{n}×{c}")).collect();
            lines.push(format!(
                "  {route}: {} reads ({}; {} unanswered); 200s p50 {:.1} ms, p99 {:.1} ms",
                answered + t.unanswered,
                statuses.join(", "),
                t.unanswered,
                q(0.5),
                q(0.99)
            ));
        }
        lines
    }
}

/// `n` readers of `routes` on `port` until `end`, each starting at its own place in the list,
/// all counting into `tallies`.
pub fn spawn(
    n: usize,
    port: u16,
    routes: &Arc<Vec<(String, String)>>,
    end: Instant,
    tallies: &Arc<ReadTallies>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|r| {
            let (routes, tallies) = (routes.clone(), tallies.clone());
            tokio::spawn(async move { read_until(port, &routes, r * 7, end, &tallies).await })
        })
        .collect()
}

/// One reader: reads `routes` in turn from `first` on, until `end`.
pub async fn read_until(port: u16, routes: &[(String, String)], first: usize, end: Instant, tallies: &ReadTallies) {
    let mut k = first;
    while Instant::now() < end && !routes.is_empty() {
        let (route, path) = &routes[k % routes.len()];
        k += 1;
        let t = Instant::now();
        let answer = tokio::time::timeout(READ_TIMEOUT, get_status(port, path)).await.ok().flatten();
        tallies.add(route, answer, t.elapsed().as_secs_f64() * 1000.0);
        if answer.is_none() {
            // A refused connection answers at once: do not spin on it.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// GET `path` on a fresh connection, the whole body read; the status, or None when no
/// well-formed answer came.
async fn get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await.ok()?;
    let head = body.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(head).ok()?.split_whitespace().nth(1)?.parse().ok()
}
