//! The collector's JSON API as the CLI reads it (`query --collector URL`): one GET per
//! question, over HTTP or HTTPS, with the API's bearer token when it needs one.
//!
//! Every failure names the URL it was about and says what to do: an unreachable collector, a
//! refused token, a node the collector does not know (the API's 404 words), a timeout. The
//! token is sent, never printed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (the API pages what could be larger).
pub const MAX_BODY: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    #[error("--collector {0:?} is not an http:// or https:// URL")]
    BadUrl(String),
    #[error("--collector {0:?} carries credentials (user:password@): give the API token with --token-file")]
    Userinfo(String),
    #[error("the collector at {url} answered more than {} MiB", MAX_BODY >> 20)]
    TooLarge { url: String },
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no certificate in it could be used ({reason})")]
    Ca { path: PathBuf, reason: String },
    #[error("cannot reach the collector at {url}: {reason}{hint}")]
    Unreachable { url: String, reason: String, hint: &'static str },
    #[error("the collector at {url} did not answer within {} s", TIMEOUT.as_secs())]
    Timeout { url: String },
    #[error("the collector at {url} refused the request (401): give --token-file with its API token")]
    Unauthorized { url: String },
    #[error("{url}: {message}")]
    NotFound { url: String, message: String },
    #[error("{url}: HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    #[error("{url}: the answer is not JSON ({reason})")]
    NotJson { url: String, reason: String },
}

/// A client for one collector's API.
pub struct ApiClient {
    base: String,
    token: Option<String>,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl ApiClient {
    /// `base`: the collector's HTTP address (`http://host:7701`); `token_file`: the API token;
    /// `ca_file`: the CA (PEM) of an HTTPS collector with a private CA (else the system's roots).
    pub fn new(base: &str, token_file: Option<&Path>, ca_file: Option<&Path>) -> Result<ApiClient, ApiClientError> {
        // The URL as errors show it: never its userinfo, never a raw control character.
        let shown = super::terminal::redacted_url(base);
        let rest = base
            .strip_prefix("https://")
            .or_else(|| base.strip_prefix("http://"))
            .filter(|r| !r.is_empty() && !r.starts_with('/'))
            .ok_or_else(|| ApiClientError::BadUrl(shown.clone()))?;
        if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ApiClientError::BadUrl(shown));
        }
        if rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())].contains('@') {
            return Err(ApiClientError::Userinfo(shown));
        }
        let token = token_file
            .map(|p| {
                std::fs::read_to_string(p)
                    .map(|t| t.trim().to_owned())
                    .map_err(|source| ApiClientError::File { path: p.to_owned(), source })
            })
            .transpose()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match ca_file {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                let pem =
                    std::fs::read(path).map_err(|source| ApiClientError::File { path: path.to_owned(), source })?;
                let ca = |reason: String| ApiClientError::Ca { path: path.to_owned(), reason };
                for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
                    let cert: rustls_pki_types::CertificateDer<'static> = cert.map_err(|e| ca(e.to_string()))?;
                    roots.add(cert).map_err(|e| ca(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(ca("no PEM certificate".into()));
                }
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ca(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                builder.with_tls_config(config)
            }
            None => builder.with_provider_and_native_roots(provider).map_err(|e| ApiClientError::Unreachable {
                url: base.to_owned(),
                reason: format!("no system CA certificates ({e}); give --ca-file"),
                hint: "",
            })?,
        };
        let https = builder.https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(ApiClient { base: base.trim_end_matches('/').to_owned(), token, client })
    }

    /// GETs `path` (from `/api/v1/...`, its query already encoded) and decodes the JSON.
    pub async fn get(&self, path: &str) -> Result<serde_json::Value, ApiClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = hyper::Request::get(&url).header("accept", "application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Empty::new()).map_err(|_| ApiClientError::BadUrl(url.clone()))?;
        let answer = async {
            let resp = match self.client.request(req).await {
                Ok(resp) => resp,
                Err(e) => {
                    let reason = error_chain(&e);
                    let hint = match self.listener().await {
                        Some(kind) => kind.hint(),
                        None => hint(&url, &reason),
                    };
                    return Err(ApiClientError::Unreachable { url: url.clone(), reason, hint });
                }
            };
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY).collect().await.map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ApiClientError::TooLarge { url: url.clone() }
                } else {
                    let reason = error_chain(&*e);
                    ApiClientError::Unreachable { hint: hint(&url, &reason), url: url.clone(), reason }
                }
            })?;
            Ok::<_, ApiClientError>((status, body.to_bytes()))
        };
        let (status, body) =
            tokio::time::timeout(TIMEOUT, answer).await.map_err(|_| ApiClientError::Timeout { url: url.clone() })??;
        // The server's words, bounded and shown as text.
        let message = || {
            let text = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&body[..body.len().min(4 * super::terminal::MAX_MESSAGE)]).into_owned()
                });
            super::terminal::bounded(&text, super::terminal::MAX_MESSAGE)
        };
        match status.as_u16() {
            200 => serde_json::from_slice(&body).map_err(|e| ApiClientError::NotJson { url, reason: e.to_string() }),
            401 => Err(ApiClientError::Unauthorized { url }),
            404 => Err(ApiClientError::NotFound { url, message: message() }),
            s => Err(ApiClientError::Status { url, status: s, message: message() }),
        }
    }
}

/// What a plain `http://` address answers an HTTP/1.1 request with, when it is not HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listener {
    /// An HTTP/2-only server (the agents' gRPC listener): it opens with a SETTINGS frame.
    Http2,
    /// A TLS server: it answers plaintext with a TLS alert record.
    Tls,
}

impl Listener {
    fn hint(self) -> &'static str {
        match self {
            Listener::Http2 => {
                "\n  (that is an HTTP/2 listener, likely the agents' gRPC port: the API is on the collector's \
                 --http-listen port, 7701 by default)"
            }
            Listener::Tls => "\n  (it speaks TLS there: give https:// and --ca-file)",
        }
    }

    /// From the first bytes a server sent.
    fn of(first: &[u8]) -> Option<Listener> {
        match first {
            // A frame header: 3 bytes of length, then type 4 (SETTINGS) or 7 (GOAWAY).
            [_, _, _, 4 | 7, ..] if !first.starts_with(b"HTTP/") => Some(Listener::Http2),
            // A TLS record of type 21 (alert), version 3.x.
            [21, 3, ..] => Some(Listener::Tls),
            _ => None,
        }
    }
}

impl ApiClient {
    /// For a plain `http://` collector address: sends an HTTP/1.1 request on a connection of its
    /// own and reads what comes back first (within a second), to tell an HTTP/2-only or TLS
    /// listener from an HTTP one.
    async fn listener(&self) -> Option<Listener> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let authority = self.base.strip_prefix("http://")?.split(['/', '?', '#']).next()?.to_owned();
        let probe = async {
            let mut conn = tokio::net::TcpStream::connect(&authority).await.ok()?;
            let request = format!("GET /healthz HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
            conn.write_all(request.as_bytes()).await.ok()?;
            let mut first = [0u8; 16];
            let n = conn.read(&mut first).await.ok()?;
            Listener::of(&first[..n])
        };
        tokio::time::timeout(Duration::from_secs(1), probe).await.ok().flatten()
    }
}

/// The likely mistake behind a failed request, in words: the agents' gRPC port given for the
/// API's, TLS spoken to a plain listener or plain HTTP to a TLS one, nothing listening.
fn hint(url: &str, reason: &str) -> &'static str {
    let r = reason.to_ascii_lowercase();
    if r.contains("invalidcontenttype") || r.contains("corrupt message") || r.contains("wrong version number") {
        "\n  (it does not speak TLS there: give http:// instead of https://)"
    } else if r.contains("unexpected message")
        || r.contains("connection was not ready")
        || r.contains("http2")
        || r.contains("frame")
    {
        // An HTTP/2-only server (the agents' gRPC listener) answers an HTTP/1.1 request with a
        // frame and a close, which reads as one of these, depending on timing.
        "\n  (is that the agents' gRPC port? the API is on the collector's --http-listen port, 7701 by default)"
    } else if url.starts_with("http://")
        && (r.contains("connection closed before message completed") || r.contains("connection reset"))
    {
        "\n  (if the collector serves HTTPS there, give https:// and --ca-file)"
    } else if r.contains("connection refused") {
        "\n  (nothing listens there: is the collector running, and is that its --http-listen port?)"
    } else {
        ""
    }
}

/// An error with its causes, one after another ("connection refused" is a cause, several deep).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cur = c.source();
    }
    s
}

/// Percent-encodes a query value or path segment (everything but unreserved characters).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_told_by_its_first_bytes() {
        // An HTTP/2 server's SETTINGS (length 18) and GOAWAY frames; a TLS alert record.
        assert_eq!(Listener::of(&[0, 0, 18, 4, 0, 0, 0, 0, 0]), Some(Listener::Http2));
        assert_eq!(Listener::of(&[0, 0, 8, 7, 0, 0, 0, 0, 0]), Some(Listener::Http2));
        assert_eq!(Listener::of(&[21, 3, 3, 0, 2, 2, 50]), Some(Listener::Tls));
        // HTTP/1.1 and anything else: not told apart here.
        assert_eq!(Listener::of(b"HTTP/1.1 400 Bad Request"), None);
        assert_eq!(Listener::of(b""), None);
        assert_eq!(Listener::of(b"SSH-2.0"), None);
    }
}
