//! The API keeps the promises of its OpenAPI document: schemathesis (installed by
//! scripts/setup.sh) generates requests from the document the collector serves, on a fleet where
//! every kind of row exists, and runs all its checks (status codes, content types, response
//! schemas, acceptance of valid and rejection of invalid input, stateful links).
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;

use railguard_e2e::scripted::*;
use railguard_e2e::*;

fn schemathesis() -> std::path::PathBuf {
    let st = setup_env("schemathesis").join("bin/st");
    assert!(st.exists(), "{} missing: run scripts/setup.sh", st.display());
    st
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_driven_fuzzer_finds_nothing_against_the_live_api() {
    let st = schemathesis();
    let pg = TestPg::start().await;
    let c = scripted_fleet(&pg).await;
    let url = format!("http://127.0.0.1:{}/api/v1/openapi.json", c.http_port);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .arg("300")
            .arg(&st)
            .args(["run", &url, "--checks", "all", "--max-examples", "100", "--no-color"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "schemathesis found something:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("No issues found"), "{text}");
    // It really ran every operation the document has.
    let doc = json(&c, "/api/v1/openapi.json");
    let ops: usize = doc["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
    assert!(ops >= 11, "{doc}");
    assert!(text.contains(&format!("Selected: {ops}/{ops}")) && text.contains(&format!("Tested: {ops}")), "{text}");
}
