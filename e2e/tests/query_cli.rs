//! `railguard-collector query --collector URL`: the fleet read through the collector's API from
//! another directory with no database access, in every output format; unknown nodes,
//! unreachable collectors and missing tokens are errors that name what they were about.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::{Command, Output};

use railguard_e2e::scripted::*;
use railguard_e2e::*;
use serde_json::Value;

/// Runs `railguard-collector query ARGS` in an empty directory with no database in reach.
fn query(args: &[&str]) -> (Output, tempfile::TempDir) {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(bin("railguard-collector"))
        .arg("query")
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RAILGUARD_DATA_DIR")
        .env_remove("RAILGUARD_API_TOKEN_FILE")
        .env_remove("COLUMNS")
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    (out, elsewhere)
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn query_reads_the_collectors_api_from_anywhere() {
    let pg = TestPg::start().await;
    let c = scripted_fleet(&pg).await;
    let url = format!("http://127.0.0.1:{}", c.http_port);

    // The same rows as the API, wherever the command runs; nothing created where it ran.
    let (out, dir) = query(&["gpus", "--node", "seed-auto", "--collector", &url, "-o", "json"]);
    let rows: Value = serde_json::from_str(&ok(&out)).unwrap();
    let api = json(&c, "/api/v1/nodes/seed-auto");
    assert_eq!(rows, api["gpus"], "the API's rows");
    assert_eq!(rows.as_array().unwrap().len(), 8);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created where it ran");

    // YAML: the same rows (a YAML parser reads back what the JSON said).
    let (out, _d) = query(&["gpus", "--node", "seed-auto", "--collector", &url, "-o", "yaml"]);
    let yaml = ok(&out);
    let py = Command::new("python3")
        .args(["-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin.as_ref().unwrap().write_all(yaml.as_bytes()).unwrap();
    let back = py.wait_with_output().unwrap();
    assert!(back.status.success(), "{yaml}");
    assert_eq!(serde_json::from_slice::<Value>(&back.stdout).unwrap(), rows, "{yaml}");

    // The table: the main columns; wide: every column.
    let (out, _d) = query(&["gpus", "--status", "corrupting", "--collector", &url]);
    let table = ok(&out);
    assert_eq!(table.lines().count(), 1 + 9, "{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["node", "gpu", "status", "verification", "workload_nic", "recommendation", "changed_at", "reasons"],
        "{table}"
    );
    // It fits a terminal of 120 columns: the reasons cut at a word, said so.
    assert!(table.lines().all(|l| l.chars().count() <= 120), "{table}");
    assert!(table.lines().skip(1).all(|l| l.ends_with('…')), "the reasons are cut: {table}");
    let (out, _d) = query(&["gpus", "--status", "corrupting", "--collector", &url, "-o", "wide"]);
    let wide = ok(&out);
    // Wide: the table's columns first, in order, then every other; an object's fields as columns;
    // nothing cut.
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&header[..3], ["node", "gpu", "status"], "{wide}");
    assert!(header.contains(&"pin_verified") && header.contains(&"assessed_at"), "{wide}");
    assert!(header.iter().any(|h| h.starts_with("pin.")), "the pin's fields are columns: {wide}");
    assert!(!wide.contains('…'), "{wide}");

    // Nodes, with their counts as columns; failures; a GPU's history.
    let (out, _d) = query(&["nodes", "--collector", &url, "-o", "json"]);
    let nodes: Value = serde_json::from_str(&ok(&out)).unwrap();
    let auto = nodes.as_array().unwrap().iter().find(|n| n["node"] == "seed-auto").unwrap();
    assert_eq!((&auto["corrupting"], &auto["worst"]), (&Value::from(8), &Value::from("corrupting")), "{auto}");
    let (out, _d) = query(&["nodes", "--status", "corrupting", "--collector", &url]);
    let text = ok(&out);
    assert_eq!(text.lines().count(), 1 + 2, "the two seed nodes: {text}");
    let (out, _d) = query(&["failures", "--since", "1d", "--collector", &url, "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&ok(&out)).unwrap().as_array().unwrap().len(), 17);
    let (out, _d) = query(&["history", "seed-auto", "3", "--since", "1d", "--collector", &url, "-o", "json"]);
    let hourly: Value = serde_json::from_str(&ok(&out)).unwrap();
    let bad: i64 = hourly
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["nic"] == "mlx5_3")
        .map(|b| b["silent_corruption"].as_i64().unwrap())
        .sum();
    assert_eq!(bad, 4, "{hourly}");

    // An unknown node: exit 2, the node and the URL named.
    for args in [&["gpus", "--node", "nope"][..], &["history", "nope", "0"][..]] {
        let mut a = args.to_vec();
        a.extend(["--collector", &url]);
        let (out, _d) = query(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("nope") && err.contains(&url), "{err}");
    }
    // A GPU the node does not have: exit 2 and which, never an empty history.
    let (out, _d) = query(&["history", "seed-auto", "12", "--collector", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no GPU12 on node \"seed-auto\""), "{err}");
    // A bad status is refused before any request.
    let (out, _d) = query(&["gpus", "--status", "broken", "--collector", &url]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("broken"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_and_a_missing_token_are_named() {
    // Nothing listens on a port just freed.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let (out, _d) = query(&["gpus", "--collector", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("cannot reach the collector at {url}/api/v1/gpus")), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "refused at once, not after a timeout");
    assert!(err.contains("nothing listens there"), "the likely mistake named: {err}");
    let (out, _d) = query(&["gpus", "--collector", "127.0.0.1:7701"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an http:// or https:// URL"), "{out:?}");

    // A collector that requires its API token: without it a clear refusal, with it the rows.
    let pg = TestPg::start().await;
    let d = tempfile::tempdir().unwrap();
    let tok = d.path().join("api-token");
    write_secret(&tok, "api-secret-0123456789\n");
    let c = CollectorProc::start_with(&pg.url(), &[], &["--api-token-file", tok.to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{}", c.http_port);
    let (out, _d) = query(&["nodes", "--collector", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused the request (401): give --token-file"), "{err}");
    let (out, _d) = query(&["nodes", "--collector", &url, "--token-file", tok.to_str().unwrap(), "-o", "json"]);
    assert_eq!(ok(&out).trim(), "[]");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("api-secret"), "the token is never printed");
    // The likely mistakes, named: the agents' gRPC port for the API's, https:// to a plain listener.
    let grpc = format!("http://127.0.0.1:{}", c.port);
    let (out, _d) = query(&["nodes", "--collector", &grpc]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("that is an HTTP/2 listener, likely the agents' gRPC port"), "{err}");
    let tls = format!("https://127.0.0.1:{}", c.http_port);
    let (out, _d) = query(&["nodes", "--collector", &tls]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("it does not speak TLS there: give http://"), "{err}");
}

/// A hostile or broken server: escape sequences in its rows and errors reach the terminal as
/// text; an error text is bounded; an answer over the limit is refused, not read whole; a URL's
/// password is never echoed.
#[test]
fn a_hostile_server_cannot_drive_the_terminal() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Answers, in the order the commands below ask.
    let rows = r#"{"nodes":[{"node":"n\u001b]0;pwned\u0007\u009b2J","gpus":8,"worst":"\u202egnp.exe"}]}"#.to_owned();
    let error = format!(r#"{{"error":"\u001b[2J{}"}}"#, "x".repeat(5000));
    let answers: Vec<(u16, String)> = vec![
        (200, rows.clone()),
        (200, rows.clone()),
        (200, rows),
        (500, error),
        (200, format!("[\"{}\"]", "y".repeat(17 << 20))),
    ];
    let server = std::thread::spawn(move || {
        for (status, body) in answers {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        }
    });
    let url = format!("http://127.0.0.1:{port}");
    let raw = |b: &[u8]| b.iter().any(|&c| c == 0x1b || c == 0x07) || String::from_utf8_lossy(b).contains('\u{9b}');
    for format in ["table", "json", "yaml"] {
        let (out, _d) = query(&["nodes", "--collector", &url, "-o", format]);
        let text = ok(&out);
        assert!(!raw(out.stdout.as_slice()) && !text.contains('\u{202e}'), "{format}: {text:?}");
        if format == "json" {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v[0]["node"], "n\u{1b}]0;pwned\u{7}\u{9b}2J", "the same value, escaped");
        }
    }
    let (out, _d) = query(&["nodes", "--collector", &url]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!raw(&out.stderr) && err.contains("HTTP 500") && err.contains("\\u{1b}[2J"), "{err}");
    assert!(err.len() < 1500, "the error text is bounded: {} bytes", err.len());
    let (out, _d) = query(&["nodes", "--collector", &url]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("answered more than 16 MiB"), "{err}");
    server.join().unwrap();
    // Credentials in the URL: refused, and never echoed.
    let (out, _d) = query(&["nodes", "--collector", "http://admin:s3cret@127.0.0.1:9/"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("carries credentials") && !err.contains("s3cret"), "{err}");
}
