//! Agent credentials: one bearer token per node, bound to that node's id.
//!
//! The credentials file has one `NODE_ID TOKEN` pair per line (`#` comments and blank lines
//! ignored). TOKEN is either the plain token or `sha256:<64 hex digits>` of it, so the file on
//! the collector need not hold secrets. Lookups go by the SHA-256 of the presented token; the
//! node a token belongs to is the only node it may write as.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use railguard_schema::{NodeId, NodeIdError};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use super::k8s::K8sTokens;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("the credentials file")]
    Secret(#[from] railguard_telemetry::secret::SecretError),
    #[error("{path}:{line}: {reason}")]
    Line { path: PathBuf, line: usize, reason: String },
    #[error("{path}:{line}: {source}")]
    NodeId {
        path: PathBuf,
        line: usize,
        #[source]
        source: NodeIdError,
    },
}

type Digest32 = [u8; 32];

/// Token digests → node ids; and, where configured, Kubernetes service-account tokens
/// (see [`super::k8s`]) whose node claim is the node.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    by_digest: HashMap<Digest32, NodeId>,
    k8s: Option<std::sync::Arc<K8sTokens>>,
}

/// Inserted into a request's extensions by [`Credentials::authenticate`].
#[derive(Debug, Clone)]
pub struct AuthenticatedNode(pub NodeId);

/// Minimum length of a plain token: shorter ones are guessable.
const MIN_TOKEN_LEN: usize = 16;

pub fn token_digest(token: &str) -> Digest32 {
    Sha256::digest(token.as_bytes()).into()
}

fn hex_digest(s: &str) -> Option<Digest32> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Credentials {
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let text = railguard_telemetry::secret::read_text(path)?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, CredentialsError> {
        let mut creds = Credentials::default();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| CredentialsError::Line { path: path.into(), line: line_no, reason: reason.into() };
            let mut parts = line.split_whitespace();
            let (Some(node), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("expected `NODE_ID TOKEN`"));
            };
            let node = NodeId::new(node).map_err(|source| CredentialsError::NodeId {
                path: path.into(),
                line: line_no,
                source,
            })?;
            let digest = match token.strip_prefix("sha256:") {
                Some(hex) => hex_digest(hex).ok_or_else(|| bad("sha256: must be followed by 64 hex digits"))?,
                None if token.len() < MIN_TOKEN_LEN => {
                    return Err(bad("token shorter than 16 characters"));
                }
                None => token_digest(token),
            };
            if creds.by_digest.insert(digest, node).is_some() {
                return Err(bad("the same token is given to two nodes; each node needs its own"));
            }
        }
        Ok(creds)
    }

    /// Also accept agents' projected service-account tokens.
    pub fn with_k8s(mut self, k8s: std::sync::Arc<K8sTokens>) -> Self {
        self.k8s = Some(k8s);
        self
    }

    pub fn insert(&mut self, node: NodeId, token: &str) {
        self.by_digest.insert(token_digest(token), node);
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// No agent could authenticate: no static token and no Kubernetes identities.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty() && self.k8s.is_none()
    }

    /// A tonic interceptor body: rejects calls without a known bearer token and tags the
    /// request with the node the token belongs to.
    #[allow(clippy::result_large_err)] // tonic's interceptor signature
    pub fn authenticate<T>(&self, mut req: Request<T>) -> Result<Request<T>, Status> {
        let header = req
            .metadata()
            .get("authorization")
            .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>` metadata"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization metadata must be `Bearer <token>`"))?;
        let token = token.trim();
        let node = match (&self.k8s, self.by_digest.get(&token_digest(token))) {
            (_, Some(node)) => node.clone(),
            (Some(k8s), None) if K8sTokens::looks_like_jwt(token) => {
                k8s.verify(token).map_err(|e| Status::unauthenticated(format!("service-account token: {e}")))?
            }
            _ => return Err(Status::unauthenticated("unknown agent token")),
        };
        // Mutual TLS: the client certificate is a second identity, and must be the same node.
        if let Some(certs) = req.peer_certs()
            && let Some(leaf) = certs.first()
        {
            crate::tls::certificate_names_node(leaf, node.as_str())
                .map_err(|e| Status::permission_denied(e.to_string()))?;
        }
        req.extensions_mut().insert(AuthenticatedNode(node));
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TOKEN: &str = "0123456789abcdef-node-a";

    fn creds() -> Credentials {
        let hashed: String = token_digest("another-long-token-b").iter().map(|b| format!("{b:02x}")).collect();
        Credentials::parse(&format!("# fleet\nnode-a {TOKEN}\n\nnode-b sha256:{hashed}\n"), Path::new("t")).unwrap()
    }

    fn req(auth: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
    }

    #[test]
    fn known_tokens_map_to_their_node() {
        let c = creds();
        assert_eq!(c.len(), 2);
        let r = c.authenticate(req(Some(&format!("Bearer {TOKEN}")))).unwrap();
        assert_eq!(r.extensions().get::<AuthenticatedNode>().unwrap().0.as_str(), "node-a");
        let r = c.authenticate(req(Some("Bearer another-long-token-b"))).unwrap();
        assert_eq!(r.extensions().get::<AuthenticatedNode>().unwrap().0.as_str(), "node-b");
    }

    #[test]
    fn unknown_missing_or_malformed_tokens_are_rejected() {
        let c = creds();
        for r in [req(None), req(Some("Bearer nope")), req(Some(TOKEN)), req(Some("Basic abc"))] {
            assert_eq!(c.authenticate(r).unwrap_err().code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn bad_files_say_which_line() {
        for (text, want) in [
            ("node-a short", "shorter than 16"),
            ("node-a", "expected"),
            ("node/a 0123456789abcdef0", "character outside"),
            ("node-a sha256:xyz", "64 hex"),
            ("a 0123456789abcdef0\nb 0123456789abcdef0", "two nodes"),
        ] {
            let e = Credentials::parse(text, Path::new("creds")).unwrap_err().to_string();
            assert!(e.contains(want) && e.starts_with("creds:"), "{text:?} → {e}");
        }
    }
}
