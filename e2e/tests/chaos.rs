//! The chaos suite's short form (e2e/src/bin/chaos.rs): agents ship continuously through every
//! fault, and for each one every record produced is stored, or counted as dropped or set aside;
//! one of three collectors that split the assessment killed, the two left taking its parts; on a
//! Patroni cluster, through the primary's loss and a switchover, the API answering throughout.
#![allow(clippy::unwrap_used)]

use railguard_e2e::bin;

#[test]
fn every_record_is_accounted_for_through_every_fault() {
    let out = std::process::Command::new(bin("chaos")).arg("--short").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for fault in [
        "collector SIGKILLed",
        "Postgres restarted",
        "link cut",
        "spool filesystem full",
        "agent clock +5 h",
        "in-line flood",
        "API readers flood",
        "one of 3 collectors killed",
        "Postgres primary lost",
        "Patroni switchover",
    ] {
        let line = stdout.lines().find(|l| l.starts_with(fault)).unwrap_or_else(|| panic!("no {fault} line: {stdout}"));
        assert!(line.contains("  ok"), "{line}");
        let produced: u64 = line[fault.len()..].split_whitespace().next().unwrap().parse().unwrap();
        assert!(produced > 100, "the agents kept producing through {fault}: {line}");
    }
    let full = stdout.lines().find(|l| l.starts_with("spool filesystem full")).unwrap();
    let dropped: u64 = full.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(dropped > 0, "the full disk dropped records, and they were counted: {full}");
    for fault in ["Postgres primary lost", "Patroni switchover"] {
        let line = stdout.lines().find(|l| l.starts_with(fault)).unwrap();
        assert!(
            line.contains(" leads;") && line.contains(", 0 not)"),
            "a new primary, every API read answered: {line}"
        );
    }
    let share = stdout.lines().find(|l| l.starts_with("one of 3 collectors killed")).unwrap();
    assert!(share.contains("the two left held all 64 after"), "{share}");
    assert!(stdout.contains("held for every fault"), "{stdout}");
}
