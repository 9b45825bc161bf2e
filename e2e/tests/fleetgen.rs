//! fleetgen (the fleet load generator behind scripts/bench-fleet.sh), briefly: its simulated
//! nodes are all acknowledged by a real collector, the injected failure is detected and a burst
//! of failure records is stored whole.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use railguard_e2e::bin;

#[test]
fn fleetgen_loads_a_collector_and_its_injected_failure_is_detected() {
    let out = std::process::Command::new(bin("fleetgen"))
        .args(["--nodes", "30", "--duration-secs", "12", "--interval-secs", "2", "--fail", "fleet-00003:5"])
        .args(["--fail-after-secs", "3", "--day-reads", "2"])
        .args(["--burst-nodes", "3", "--burst-records-per-sec", "60", "--burst-secs", "4", "--burst-after-secs", "4"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let total = text.lines().find(|l| l.starts_with("total:")).unwrap_or_else(|| panic!("{text}"));
    assert!(total.ends_with(" 0 errors"), "{total}");
    let (offered, acked) = {
        let n: Vec<f64> = total.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        (n[0], n[1])
    };
    assert!(offered > 0.0 && (offered - acked).abs() < 1.0, "every record acknowledged: {total}");
    assert!(text.contains("fleet-00003 GPU5 corrupting"), "{text}");
    // The burst: three nodes failing every pair, 60 failure records a second for 4 s, every one
    // acknowledged stored.
    let burst = text
        .lines()
        .find_map(|l| l.strip_prefix("burst: ")?.split_once(" failure records acknowledged, "))
        .unwrap_or_else(|| panic!("{text}"));
    let acked: u64 = burst.0.parse().unwrap();
    assert!(acked >= 120, "{text}");
    assert_eq!(burst.1, format!("{acked} stored: none lost"), "{text}");
    // The day reads over the run's rollups copied into the 24 hours before this one (fewer if the
    // run crossed an hour, which then has its own): every node's 64 pairs, the failing one among them.
    let copied: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("day reads: ")?.split(" node-hour rows copied").next()?.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(copied > 0 && copied.is_multiple_of(30) && copied <= 24 * 30, "{copied}");
    let read = text
        .lines()
        .find(|l| l.starts_with("day reads: ") && l.contains(" pairs, "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(read.starts_with("day reads: 1920 pairs, "), "{read}");
    assert!(!read.contains(", 0 failing"), "{read}");
    assert!(text.contains("GET /api/v1/patterns?since=1d each read in order (ms): "), "{text}");
    // The second read moved the first one's kept sum of settled hours on (none left or entered
    // unless an hour passed between them) and read only the hours a pass may roll again.
    let kept = text
        .lines()
        .find_map(|l| l.strip_prefix("day reads' kept rolled hours (whole run): "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(kept.starts_with("1 moved a kept sum on, 1 read all their settled hours; "), "{kept}");
}
