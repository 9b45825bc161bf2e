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
    /// Why → in-line results (or messages, connections) the endpoint refused.
    inline_refused: Mutex<BTreeMap<InlineRefusal, u64>>,
}

/// Why the in-line endpoint refused something (the `why` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum InlineRefusal {
    /// A message or result that does not validate.
    Invalid,
    /// Results for a GPU the sending process does not hold open.
    UnbackedGpu,
    /// Over the sender's results or reports rate.
    RateLimited,
    /// The spool's share for in-line reports is full.
    SpoolShareFull,
    /// A connection closed for having sent no complete line in time.
    IdleTimeout,
    /// A connection turned away: every slot was taken.
    TooManyConnections,
}

impl InlineRefusal {
    pub const ALL: [InlineRefusal; 6] = [
        InlineRefusal::Invalid,
        InlineRefusal::UnbackedGpu,
        InlineRefusal::RateLimited,
        InlineRefusal::SpoolShareFull,
        InlineRefusal::IdleTimeout,
        InlineRefusal::TooManyConnections,
    ];

    pub fn label(self) -> &'static str {
        match self {
            InlineRefusal::Invalid => "invalid",
            InlineRefusal::UnbackedGpu => "unbacked_gpu",
            InlineRefusal::RateLimited => "rate_limited",
            InlineRefusal::SpoolShareFull => "spool_share_full",
            InlineRefusal::IdleTimeout => "idle_timeout",
            InlineRefusal::TooManyConnections => "too_many_connections",
        }
    }
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

    pub fn add_inline_refused(&self, why: InlineRefusal, n: u64) {
        if n == 0 {
            return;
        }
        let mut m = self.inline_refused.lock().unwrap_or_else(PoisonError::into_inner);
        let e = m.entry(why).or_default();
        *e = e.saturating_add(n);
    }

    /// In-line refusals so far for `why`.
    pub fn inline_refused(&self, why: InlineRefusal) -> u64 {
        self.inline_refused.lock().unwrap_or_else(PoisonError::into_inner).get(&why).copied().unwrap_or(0)
    }

    /// The exposition text (Prometheus text format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP railguard_agent_nixl_bytes_total Bytes the NIXL processes on this node transferred, from their telemetry rings, by direction and the GPU the process uses (none: not one GPU).\n# TYPE railguard_agent_nixl_bytes_total counter\n",
        );
        for ((dir, gpu), n) in self.nixl_bytes.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            out.push_str(&format!("railguard_agent_nixl_bytes_total{{direction=\"{dir}\",gpu=\"{gpu}\"}} {n}\n"));
        }
        out.push_str(
            "# HELP railguard_agent_inline_refused_total What the in-line endpoint refused, by why: invalid input, results for a GPU the sender does not hold open, over the sender's rate, no spool room for in-line reports (results); idle or surplus connections.\n# TYPE railguard_agent_inline_refused_total counter\n",
        );
        for why in InlineRefusal::ALL {
            out.push_str(&format!(
                "railguard_agent_inline_refused_total{{why=\"{}\"}} {}\n",
                why.label(),
                self.inline_refused(why)
            ));
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
