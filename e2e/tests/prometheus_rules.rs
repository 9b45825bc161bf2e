//! The alert rules in deploy/prometheus/ pass `promtool check rules` and their unit tests
//! (`promtool test rules`, Debian's prometheus package); the live collector's /metrics passes
//! `promtool check metrics` (Prometheus naming conventions).
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use railguard_e2e::*;

fn promtool(args: &[&str], dir: &std::path::Path, stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus"));
    let (ok, out) = promtool(&["check", "rules", "railguard-alerts.yml"], dir, None);
    assert!(ok && out.contains("SUCCESS: 6 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "railguard-alerts.test.yml"], dir, None);
    assert!(ok && out.contains("SUCCESS"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_collectors_metrics_follow_prometheus_conventions() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    // Some of everything: a node with probes and signals, so every family has samples.
    let dir = tempfile::tempdir().unwrap();
    let (spool, token) = filled_spool(dir.path(), 200);
    let mut agent = agent_ship(&collector.url(), &spool, &token, 100);
    assert!(wait_exit(&mut agent, std::time::Duration::from_secs(60)).success());
    let (code, metrics) = collector.get("/metrics", None);
    assert_eq!(code, 200);
    assert!(metrics.contains("railguard_agent_clock_ahead_seconds{node=\"node-a\"}"), "{metrics}");
    let (ok, out) = promtool(&["check", "metrics"], dir.path(), Some(&metrics));
    assert!(ok, "promtool check metrics: {out}\n{metrics}");
}
