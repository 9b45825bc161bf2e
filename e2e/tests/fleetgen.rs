//! fleetgen (the fleet load generator behind scripts/bench-fleet.sh), briefly: its simulated
//! nodes are all acknowledged by a real collector and the injected failure is detected.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use railguard_e2e::bin;

#[test]
fn fleetgen_loads_a_collector_and_its_injected_failure_is_detected() {
    let out = std::process::Command::new(bin("fleetgen"))
        .args(["--nodes", "30", "--duration-secs", "12", "--interval-secs", "2", "--fail", "fleet-00003:5"])
        .args(["--fail-after-secs", "3"])
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
}
