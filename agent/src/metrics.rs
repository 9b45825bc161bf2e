//! The agent's own Prometheus endpoint (`--metrics-listen`, off by default): what only the node
//! sees, as counters a Prometheus scraping the DaemonSet's pods turns into rates. Labels are
//! bounded (direction × the node's GPUs).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct AgentMetrics {
    /// (direction, GPU or "none") → bytes NIXL processes moved, from their telemetry rings.
    nixl_bytes: Mutex<BTreeMap<(&'static str, String), u64>>,
}

pub fn global() -> &'static AgentMetrics {
    static M: OnceLock<AgentMetrics> = OnceLock::new();
    M.get_or_init(AgentMetrics::default)
}

impl AgentMetrics {
    pub fn add_nixl_bytes(&self, direction: &'static str, gpu: &str, n: u64) {
        let mut m = self.nixl_bytes.lock().unwrap_or_else(PoisonError::into_inner);
        let e = m.entry((direction, gpu.to_owned())).or_default();
        *e = e.saturating_add(n);
    }

    /// The exposition text (Prometheus text format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP railguard_agent_nixl_bytes_total Bytes the NIXL processes on this node transferred, from their telemetry rings, by direction and the GPU the process uses (none: not one GPU).\n# TYPE railguard_agent_nixl_bytes_total counter\n",
        );
        for ((dir, gpu), n) in self.nixl_bytes.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            out.push_str(&format!("railguard_agent_nixl_bytes_total{{direction=\"{dir}\",gpu=\"{gpu}\"}} {n}\n"));
        }
        out
    }
}

/// Serves `GET /metrics` on `addr` from a thread of its own (one request at a time, 2 s
/// timeouts: a scraper, not the public). Anything else gets 404.
pub fn serve(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
            // The request head (at most 2 KiB; a scraper sends a few lines).
            let mut buf = [0u8; 2048];
            let mut n = 0;
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf[n..]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k,
                }
            }
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("");
            let (status, ctype, body) =
                if req.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
                    ("200 OK", "text/plain; version=0.0.4", global().render())
                } else {
                    ("404 Not Found", "text/plain", "only GET /metrics here\n".to_owned())
                };
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            // Close our side first and let the client's side end, so it reads the whole answer.
            let _ = c.shutdown(std::net::Shutdown::Write);
            let _ = c.read(&mut buf);
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_and_are_served() {
        let m = AgentMetrics::default();
        m.add_nixl_bytes("tx", "4", 10);
        m.add_nixl_bytes("tx", "4", 5);
        m.add_nixl_bytes("rx", "none", 7);
        let t = m.render();
        assert!(t.contains("railguard_agent_nixl_bytes_total{direction=\"tx\",gpu=\"4\"} 15\n"), "{t}");
        assert!(t.contains("railguard_agent_nixl_bytes_total{direction=\"rx\",gpu=\"none\"} 7\n"), "{t}");
        let addr = serve("127.0.0.1:0".parse().unwrap()).unwrap();
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).unwrap();
            r
        };
        assert!(
            get("/metrics").starts_with("HTTP/1.1 200 OK")
                && get("/metrics").contains("# TYPE railguard_agent_nixl_bytes_total counter")
        );
        assert!(get("/other").starts_with("HTTP/1.1 404"));
    }
}
