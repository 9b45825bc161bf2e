//! The dashboard's address as people reach it: what the links in alerts point at.
//!
//! The collector listens on one address and is reached on another (an ingress, a Service name, a
//! port-forward), so the address is configured (`serve --dashboard-url`) and otherwise derived
//! from the listener: its scheme, its IP and port, or the host's name where it listens on every
//! address. It is published as a label of `railguard_collector_info`, where the alert rules read
//! it (Prometheus' `query` template function), so an alert links straight to its GPU's page.
//!
//! The runbooks' base address is a value of the same kind (`serve --runbook-url`, published
//! beside it: the rules link each alert to its section under it), defaulting to this
//! repository's `docs/` ([`DashboardUrl::runbooks_default`]).
//!
//! A value is an `http` or `https` URL of printable ASCII without quotes, angle brackets,
//! backslashes or spaces, ending in `/`: it lands in a metric label and in Alertmanager's
//! templates, where any of those would break out of the value.

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardUrl(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DashboardUrlError {
    #[error("the dashboard URL must start with http:// or https:// (got {0:?})")]
    Scheme(String),
    #[error("the dashboard URL names no host (got {0:?})")]
    NoHost(String),
    #[error("the dashboard URL may hold printable ASCII only, without quotes, <, >, \\ or spaces (got {0:?})")]
    Character(String),
}

impl DashboardUrl {
    /// Parses a configured URL; a missing final `/` is added.
    pub fn parse(s: &str) -> Result<DashboardUrl, DashboardUrlError> {
        let rest = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
            .ok_or_else(|| DashboardUrlError::Scheme(s.to_owned()))?;
        if !s.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'<' | b'>' | b'\\' | b'`')) {
            return Err(DashboardUrlError::Character(s.to_owned()));
        }
        if rest.is_empty() || rest.starts_with('/') {
            return Err(DashboardUrlError::NoHost(s.to_owned()));
        }
        let mut url = s.to_owned();
        if !url.ends_with('/') {
            url.push('/');
        }
        Ok(DashboardUrl(url))
    }

    /// Where the runbooks are when no one says: this repository's `docs/` on its main branch.
    pub fn runbooks_default() -> DashboardUrl {
        DashboardUrl(concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/").to_owned())
    }

    /// The listener's own address: `hostname` stands in for an unspecified IP (`0.0.0.0`, `::`).
    pub fn of_listener(local: SocketAddr, tls: bool, hostname: Option<&str>) -> DashboardUrl {
        let scheme = if tls { "https" } else { "http" };
        let host = match (local.ip().is_unspecified(), hostname) {
            (true, Some(h)) if DashboardUrl::parse(&format!("http://{h}/")).is_ok() => h.to_owned(),
            _ => match local {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            },
        };
        DashboardUrl(format!("{scheme}://{host}:{}/", local.port()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DashboardUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_url_is_checked_and_ends_in_a_slash() {
        assert_eq!(
            DashboardUrl::parse("https://railguard.example/ui").unwrap().as_str(),
            "https://railguard.example/ui/"
        );
        assert_eq!(DashboardUrl::parse("http://10.0.0.1:7701/").unwrap().as_str(), "http://10.0.0.1:7701/");
        for bad in ["railguard.example", "ftp://x/", "javascript:alert(1)"] {
            assert!(matches!(DashboardUrl::parse(bad), Err(DashboardUrlError::Scheme(_))), "{bad}");
        }
        for bad in ["http://x/\"}", "http://x/<script>", "http://a b/", "http://x/\n"] {
            assert!(matches!(DashboardUrl::parse(bad), Err(DashboardUrlError::Character(_))), "{bad}");
        }
        assert!(matches!(DashboardUrl::parse("https://"), Err(DashboardUrlError::NoHost(_))));
        assert!(matches!(DashboardUrl::parse("http:///x"), Err(DashboardUrlError::NoHost(_))));
    }

    #[test]
    fn the_listener_gives_the_default() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            DashboardUrl::of_listener(at("127.0.0.1:7701"), false, Some("h")).as_str(),
            "http://127.0.0.1:7701/"
        );
        assert_eq!(
            DashboardUrl::of_listener(at("0.0.0.0:7701"), true, Some("gpu-ctl-1")).as_str(),
            "https://gpu-ctl-1:7701/"
        );
        assert_eq!(DashboardUrl::of_listener(at("[::]:7701"), false, None).as_str(), "http://[::]:7701/");
        // A host name that would not make a URL is not used.
        assert_eq!(DashboardUrl::of_listener(at("0.0.0.0:80"), false, Some("bad name")).as_str(), "http://0.0.0.0:80/");
    }
}
