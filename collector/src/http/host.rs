//! Which `Host` the HTTP side answers: a defence against DNS rebinding.
//!
//! A web page an operator's browser loads can make a name of its own resolve to the
//! collector's address and then read the API as if it were its own origin; its requests carry
//! that foreign name in `Host`. Rebinding needs a name, so:
//! - an IP literal (`10.0.0.7:7701`, `[::1]:7701`) and `localhost` are always answered: what
//!   Prometheus scraping pod IPs, kubelet probes and a local shell send;
//! - any other name only when listed (`serve --http-allowed-host`, e.g. the Service's DNS name);
//!   `*` answers every name (the check off);
//! - a request without `Host` (HTTP/1.0) is answered: browsers always send it.
//!
//! Anything else is refused with 421 Misdirected Request, saying which flag would allow it.
//! Names are compared without their port and case-insensitively.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The names the HTTP side answers besides IP literals and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Only IP literals and `localhost`.
    #[default]
    AddressesOnly,
    /// Those, and these names (lower case, without port).
    Names(Vec<String>),
    /// Every name (`*`).
    Any,
}

impl AllowedHosts {
    /// From `--http-allowed-host` values (`*` anywhere: every name).
    pub fn from_flags(values: &[String]) -> AllowedHosts {
        if values.iter().any(|v| v.trim() == "*") {
            return AllowedHosts::Any;
        }
        let names: Vec<String> =
            values.iter().map(|v| strip_port(v.trim()).to_ascii_lowercase()).filter(|v| !v.is_empty()).collect();
        if names.is_empty() { AllowedHosts::AddressesOnly } else { AllowedHosts::Names(names) }
    }

    /// Whether a request with `Host: host` is answered.
    pub fn allows(&self, host: &str) -> bool {
        let name = strip_port(host.trim());
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        match self {
            AllowedHosts::Any => true,
            AllowedHosts::AddressesOnly => false,
            AllowedHosts::Names(n) => n.iter().any(|a| a.eq_ignore_ascii_case(name)),
        }
    }
}

/// `name:port` → `name`; `[v6]:port` → `[v6]`; a bare IPv6 literal stays whole. Anything after a
/// bracketed literal but a port (`[::1]evil.example`) keeps the whole, which no rule allows.
fn strip_port(host: &str) -> &str {
    if let Some(end) = host.find(']') {
        let rest = &host[end + 1..];
        let port_only = rest.is_empty()
            || rest.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        return if port_only { &host[..=end] } else { host };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Every name a request says it is for: each `Host` header, and the target's authority (HTTP/2's
/// `:authority`, an absolute-form HTTP/1.1 target). A header that is not text names nothing
/// allowed.
fn names_of(req: &Request) -> Vec<String> {
    let mut out: Vec<String> =
        req.headers().get_all(header::HOST).iter().map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned()).collect();
    if let Some(a) = req.uri().authority() {
        out.push(a.as_str().to_owned());
    }
    out
}

pub async fn check_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let refuse = |status: StatusCode, error: String| {
        (status, [(header::CONTENT_TYPE, "application/json")], serde_json::json!({ "error": error }).to_string())
            .into_response()
    };
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return refuse(StatusCode::BAD_REQUEST, "more than one Host header".to_owned());
    }
    if let Some(h) = names_of(&req).into_iter().find(|h| !state.allowed_hosts.allows(h)) {
        let shown: String = h.chars().filter(|c| !c.is_control()).take(100).collect();
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            format!("this collector does not answer for Host {shown:?}; allow the name with --http-allowed-host"),
        );
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_localhost_always_names_only_when_listed() {
        let none = AllowedHosts::from_flags(&[]);
        for h in ["127.0.0.1:7701", "10.0.0.7", "[::1]:7701", "[fe80::1]", "::1", "localhost:7701", "LOCALHOST"] {
            assert!(none.allows(h), "{h}");
        }
        for h in [
            "evil.example:7701",
            "collector.railguard.svc",
            "127.0.0.1.evil.example",
            "localhost.evil",
            "[::1]evil.example",
            "[::1]:evil",
            "[::1]:",
        ] {
            assert!(!none.allows(h), "{h}");
        }
        let listed = AllowedHosts::from_flags(&["Collector.Railguard.svc:7701".into()]);
        assert!(listed.allows("collector.railguard.svc"));
        assert!(listed.allows("COLLECTOR.railguard.svc:443"));
        assert!(!listed.allows("evil.example"));
        assert!(AllowedHosts::from_flags(&["a".into(), "*".into()]).allows("evil.example"));
    }
}
