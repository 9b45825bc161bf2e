//! Idle connections cannot lock the collector out: the collector binary, real Postgres, raw TCP
//! clients on loopback.
//!
//! - one address holds at most its share of each listener's connections; one more is closed at
//!   accept, while another address (127.0.0.2) is served;
//! - connections that move no byte are closed after the idle limit, and their address is served
//!   again: `/healthz` answers and an agent's batch is stored;
//! - /metrics counts what was refused and what was closed for silence.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use railguard_e2e::scripted::{send, topo_rec, topology};
use railguard_e2e::*;

/// Whether the collector closed `s` (end of stream or reset) rather than leaving it open.
fn closed(s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut b = [0u8; 1];
    let mut r = s;
    match r.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// A connection to the collector's `port` from the loopback address `from`.
fn connect_from(from: &str, port: u16) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
    sock.connect(&format!("127.0.0.1:{port}").parse::<SocketAddr>().unwrap().into()).unwrap();
    sock.into()
}

/// `GET /healthz` from `from` over a fresh connection: the status code, or None when the
/// connection was closed unanswered.
fn healthz(from: &str, port: u16) -> Option<u16> {
    let mut s = connect_from(from, port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut b = String::new();
    s.read_to_string(&mut b).ok()?;
    b.split_whitespace().nth(1)?.parse().ok()
}

fn metric(c: &CollectorProc, line: &str) -> u64 {
    let (_, m) = c.get("/metrics", None);
    m.lines().find_map(|l| l.strip_prefix(line)?.trim().parse().ok()).unwrap_or_else(|| panic!("no {line} in {m}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_cannot_lock_out_the_api_or_the_agents() {
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(
        &pg.url(),
        &[],
        &[
            "--http-max-connections-per-peer",
            "8",
            "--http-idle-secs",
            "2",
            "--grpc-max-connections-per-peer",
            "4",
            "--grpc-idle-secs",
            "2",
        ],
    );
    // The start-up check's connections close. The test's own reads (/metrics) come from
    // 127.0.0.1 and the collector may still hold one for a moment after its answer, so the HTTP
    // connections held below come from 127.0.0.3, which nothing else uses.
    wait::until("the start-up probes' connections to close", Duration::from_secs(30), || {
        let grpc = metric(&c, "railguard_connections_open{listener=\"grpc\"}");
        if grpc == 0 { Ok(()) } else { Err(grpc) }
    });
    // Each address takes its whole share of each listener.
    let http: Vec<TcpStream> = (0..8).map(|_| connect_from("127.0.0.3", c.http_port)).collect();
    let grpc: Vec<TcpStream> = (0..4).map(|_| connect_from("127.0.0.1", c.port)).collect();
    // One more from the same address is closed at accept, on both listeners.
    let more = connect_from("127.0.0.3", c.http_port);
    assert!(closed(&more), "a ninth HTTP connection from one address is closed");
    let more = connect_from("127.0.0.1", c.port);
    assert!(closed(&more), "a fifth gRPC connection from one address is closed");
    // Another address is served meanwhile.
    assert_eq!(healthz("127.0.0.2", c.http_port), Some(200));
    // The silent ones are closed once they have moved nothing for the idle limit.
    wait::until("the silent connections to be closed", Duration::from_secs(30), || {
        let open = http.iter().chain(&grpc).filter(|s| !closed(s)).count();
        if open == 0 { Ok(()) } else { Err(open) }
    });
    drop((http, grpc));
    // Their address is served again: the API, and an agent's batch.
    let code = wait::until("127.0.0.3 to be served again", Duration::from_secs(30), || {
        match healthz("127.0.0.3", c.http_port) {
            Some(200) => Ok(200),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(code, 200);
    send(&c, "node-a", vec![topo_rec(topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None))]).await;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM topology_snapshots WHERE node_id = 'node-a'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    // Counted.
    assert!(metric(&c, "railguard_connections_refused_total{listener=\"http\",why=\"per_peer\"}") >= 1);
    assert!(metric(&c, "railguard_connections_refused_total{listener=\"grpc\",why=\"per_peer\"}") >= 1);
    assert!(metric(&c, "railguard_connections_idle_closed_total{listener=\"http\"}") >= 8);
    assert!(metric(&c, "railguard_connections_idle_closed_total{listener=\"grpc\"}") >= 4);
}
