//! Agent identity from Kubernetes: the agent pod's projected service-account token.
//!
//! With a static token file every agent pod must be given its own secret, and in practice a
//! DaemonSet mounts one secret holding all of them. Instead, the kubelet gives each agent pod a
//! short-lived token signed by the cluster, for audience `railguard`, bound to the pod and
//! naming the node it runs on (claim `kubernetes.io.node.name`, Kubernetes ≥ 1.30). The
//! collector checks the signature against the cluster's public keys (`kubectl get --raw
//! /openid/v1/jwks`, saved to a file), the issuer, audience, expiry and the service account,
//! and the node named in the token is the only node that agent may write as. No secret is
//! distributed, and a compromised node holds nothing that lets it write as another.
//!
//! The cluster rotates its signing keys. The key set comes from one of two places
//! ([`JwksSource`]):
//! - the API server's `/openid/v1/jwks`, fetched by [`crate::tasks::k8s_jwks`] at start, every
//!   few minutes, and soon after a token whose key the set does not hold (that token is refused
//!   this once; the agent's next try meets the new keys): nothing to refresh by hand;
//! - a file (a ConfigMap, or `kubectl get --raw /openid/v1/jwks` saved), read again when it
//!   changes: checked at most once a second, and at once for a token whose key the set does not
//!   hold.
//!
//! A fetched or changed set that does not load is reported and the keys held are kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use railguard_schema::NodeId;

#[derive(Debug, thiserror::Error)]
pub enum K8sConfigError {
    #[error("reading the service-account key set {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a JSON Web Key Set ({reason})", .path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: holds no usable signing key", path = .0.display())]
    NoKeys(PathBuf),
}

/// Where the cluster's key set (JWKS) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A file holding it as `/openid/v1/jwks` serves it, read again when it changes.
    File(PathBuf),
    /// The API server's `/openid/v1/jwks`, fetched with the collector's own Kubernetes identity.
    ApiServer,
}

/// What the collector requires of a service-account token.
#[derive(Debug, Clone)]
pub struct K8sTokenConfig {
    /// The cluster's key set (JWKS).
    pub jwks: JwksSource,
    /// The cluster's service-account issuer (`iss`), e.g. `https://kubernetes.default.svc`.
    pub issuer: String,
    /// The audience the DaemonSet requests in its projected token.
    pub audience: String,
    /// `namespace:name` of the agents' service account.
    pub service_account: String,
}

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// How often the key set file is looked at for a change, at most (besides a token whose key
/// the set does not hold).
const RECHECK: Duration = Duration::from_secs(1);

/// The key set file as last read: its modification time and length, and the keys it held.
struct Held {
    stamp: Option<(SystemTime, u64)>,
    checked: Option<Instant>,
    keys: Arc<Vec<Key>>,
}

/// Verifies agents' service-account tokens.
pub struct K8sTokens {
    /// The key set file, read again when it changes (None: keys given as text, or fetched).
    path: Option<PathBuf>,
    held: Mutex<Held>,
    /// Woken for a token whose key the set does not hold: the fetcher, where keys are fetched.
    wanted: tokio::sync::Notify,
    issuer: String,
    audience: String,
    subject: String,
}

impl std::fmt::Debug for K8sTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sTokens")
            .field("keys", &self.keys(false).len())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("subject", &self.subject)
            .finish()
    }
}

#[derive(serde::Deserialize)]
struct Claims {
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubeClaims>,
}

#[derive(serde::Deserialize)]
struct KubeClaims {
    node: Option<Named>,
}

#[derive(serde::Deserialize)]
struct Named {
    name: String,
}

impl K8sTokens {
    /// The verifier of `cfg`: its keys read from the file now and again whenever it changes;
    /// from the API server, none until [`K8sTokens::replace`] gives them (every token is refused
    /// until then).
    pub fn load(cfg: &K8sTokenConfig) -> Result<Self, K8sConfigError> {
        let JwksSource::File(path) = &cfg.jwks else { return Ok(Self::with_keys(Vec::new(), cfg)) };
        let stamp = stamp(path);
        let keys = read_keys(path)?;
        let mut tokens = Self::with_keys(keys, cfg);
        tokens.path = Some(path.clone());
        tokens.held.get_mut().unwrap_or_else(PoisonError::into_inner).stamp = stamp;
        Ok(tokens)
    }

    /// Holds the keys of `text` (a key set `origin` served) from now on; the keys held stay where
    /// it does not load. Returns how many keys it holds.
    pub fn replace(&self, text: &str, origin: &Path) -> Result<usize, K8sConfigError> {
        let keys = parse_keys(text, origin)?;
        let n = keys.len();
        self.held.lock().unwrap_or_else(PoisonError::into_inner).keys = Arc::new(keys);
        Ok(n)
    }

    /// Settles when a token came whose key the set does not hold.
    pub async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// The verifier of `cfg` with the keys of `text` (`path` names it in errors), never reread.
    pub fn parse(text: &str, path: &Path, cfg: &K8sTokenConfig) -> Result<Self, K8sConfigError> {
        Ok(Self::with_keys(parse_keys(text, path)?, cfg))
    }

    fn with_keys(keys: Vec<Key>, cfg: &K8sTokenConfig) -> Self {
        let (ns, name) = cfg.service_account.split_once(':').unwrap_or(("railguard", cfg.service_account.as_str()));
        K8sTokens {
            path: None,
            held: Mutex::new(Held { stamp: None, checked: None, keys: Arc::new(keys) }),
            wanted: tokio::sync::Notify::new(),
            issuer: cfg.issuer.clone(),
            audience: cfg.audience.clone(),
            subject: format!("system:serviceaccount:{ns}:{name}"),
        }
    }

    /// The keys held, read again first if the file changed (looked at no more than once every
    /// [`RECHECK`] unless `now`).
    fn keys(&self, now: bool) -> Arc<Vec<Key>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(path) = &self.path else { return held.keys.clone() };
        if !now && held.checked.is_some_and(|c| c.elapsed() < RECHECK) {
            return held.keys.clone();
        }
        held.checked = Some(Instant::now());
        let stamp = stamp(path);
        if stamp == held.stamp {
            return held.keys.clone();
        }
        held.stamp = stamp;
        match read_keys(path) {
            Ok(keys) => {
                tracing::info!(path = %path.display(), keys = keys.len(), "service-account key set reloaded");
                held.keys = Arc::new(keys);
            }
            Err(e) => tracing::error!(
                error = %e,
                "the changed service-account key set does not load; keeping the keys held"
            ),
        }
        held.keys.clone()
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn read_keys(path: &Path) -> Result<Vec<Key>, K8sConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| K8sConfigError::Io { path: path.to_owned(), source })?;
    parse_keys(&text, path)
}

/// The signing keys of a JSON Web Key Set: only the algorithms a cluster signs service-account
/// tokens with.
fn parse_keys(text: &str, path: &Path) -> Result<Vec<Key>, K8sConfigError> {
    let set: JwkSet =
        serde_json::from_str(text).map_err(|e| K8sConfigError::Parse { path: path.into(), reason: e.to_string() })?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => Algorithm::ES256,
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P384 => Algorithm::ES384,
            _ => continue,
        };
        let Ok(key) = DecodingKey::from_jwk(jwk) else { continue };
        keys.push(Key { kid: jwk.common.key_id.clone(), alg, key });
    }
    if keys.is_empty() {
        return Err(K8sConfigError::NoKeys(path.into()));
    }
    Ok(keys)
}

impl K8sTokens {
    /// Whether `token` has a JWT's shape (three base64url parts): only those are checked here.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3 && token.starts_with("eyJ")
    }

    /// The node the token's pod runs on, or why the token is refused. A token whose key the set
    /// does not hold makes the set be looked at again at once (the cluster may have rotated).
    pub fn verify(&self, token: &str) -> Result<NodeId, TokenRefused> {
        let keys = self.keys(false);
        match self.verify_with(&keys, token) {
            Err(TokenRefused::NoKey { .. }) if self.path.is_some() => {
                let fresh = self.keys(true);
                self.verify_with(&fresh, token)
            }
            Err(e @ TokenRefused::NoKey { .. }) => {
                self.wanted.notify_one();
                Err(e)
            }
            result => result,
        }
    }

    fn verify_with(&self, keys: &[Key], token: &str) -> Result<NodeId, TokenRefused> {
        let header = jsonwebtoken::decode_header(token).map_err(TokenRefused::Malformed)?;
        let candidates: Vec<&Key> =
            keys.iter().filter(|k| k.alg == header.alg && (header.kid.is_none() || k.kid == header.kid)).collect();
        if candidates.is_empty() {
            return Err(TokenRefused::NoKey { alg: header.alg, kid: header.kid });
        }
        let mut last = None;
        for k in candidates {
            let mut v = Validation::new(k.alg);
            v.set_issuer(&[&self.issuer]);
            v.set_audience(&[&self.audience]);
            v.sub = Some(self.subject.clone());
            v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            v.validate_nbf = true;
            v.leeway = 30;
            match jsonwebtoken::decode::<Claims>(token, &k.key, &v) {
                Ok(data) => {
                    let node = data.claims.kubernetes.and_then(|c| c.node).ok_or(TokenRefused::NoNode)?;
                    return NodeId::new(&node.name).map_err(TokenRefused::BadNodeName);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or(TokenRefused::NoKey { alg: header.alg, kid: None }, TokenRefused::Invalid))
    }
}

/// Why a service-account token is refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenRefused {
    #[error("malformed token: {0}")]
    Malformed(jsonwebtoken::errors::Error),
    #[error("no key for algorithm {alg:?} / key id {kid:?}")]
    NoKey { alg: Algorithm, kid: Option<String> },
    /// Signature, issuer, audience, subject or time checks failed (`.kind()` says which).
    #[error("token refused: {0}")]
    Invalid(jsonwebtoken::errors::Error),
    #[error("the token names no node (kubernetes.io.node): is it a pod-bound token from Kubernetes ≥ 1.30?")]
    NoNode,
    #[error("the token's node name: {0}")]
    BadNodeName(railguard_schema::record::NodeIdError),
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};

    pub const JWKS: &str = include_str!("../../tests/fixtures/k8s-sa-test-jwks.json");
    pub const KEY: &[u8] = include_bytes!("../../tests/fixtures/k8s-sa-test-key.pem");
    pub const OTHER_KEY: &[u8] = include_bytes!("../../tests/fixtures/k8s-sa-other-key.pem");

    pub fn cfg() -> K8sTokenConfig {
        K8sTokenConfig {
            jwks: JwksSource::File("jwks.json".into()),
            issuer: "https://kubernetes.default.svc".into(),
            audience: "railguard".into(),
            service_account: "railguard:agent".into(),
        }
    }

    pub const OTHER_JWKS: &str = include_str!("../../tests/fixtures/k8s-sa-other-jwks.json");

    /// A token as the kubelet would project it for the agent pod on `node`.
    pub fn token(node: Option<&str>, edit: impl FnOnce(&mut serde_json::Value), key: &[u8]) -> String {
        token_with_kid(node, edit, key, "test-key-1")
    }

    pub fn token_with_kid(
        node: Option<&str>,
        edit: impl FnOnce(&mut serde_json::Value),
        key: &[u8],
        kid: &str,
    ) -> String {
        let now = chrono::Utc::now().timestamp();
        let mut claims = serde_json::json!({
            "aud": ["railguard"], "exp": now + 3600, "iat": now, "nbf": now,
            "iss": "https://kubernetes.default.svc",
            "sub": "system:serviceaccount:railguard:agent",
            "kubernetes.io": {"namespace": "railguard", "pod": {"name": "agent-x", "uid": "1"},
                               "serviceaccount": {"name": "agent", "uid": "2"}}
        });
        if let Some(n) = node {
            claims["kubernetes.io"]["node"] = serde_json::json!({"name": n, "uid": "3"});
        }
        edit(&mut claims);
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some(kid.into());
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_rsa_pem(key).unwrap()).unwrap()
    }

    #[test]
    fn a_pod_bound_token_names_its_node() {
        let v = K8sTokens::parse(JWKS, Path::new("j"), &cfg()).unwrap();
        let t = token(Some("gpu-node-7"), |_| {}, KEY);
        assert!(K8sTokens::looks_like_jwt(&t));
        assert_eq!(v.verify(&t).unwrap().as_str(), "gpu-node-7");
    }

    #[test]
    fn forged_foreign_expired_and_unbound_tokens_are_refused() {
        let v = K8sTokens::parse(JWKS, Path::new("j"), &cfg()).unwrap();
        use jsonwebtoken::errors::ErrorKind as K;
        let invalid = |k: K| move |e: &TokenRefused| matches!(e, TokenRefused::Invalid(x) if *x.kind() == k);
        let cases: Vec<(String, Box<dyn Fn(&TokenRefused) -> bool>)> = vec![
            (token(Some("n"), |_| {}, OTHER_KEY), Box::new(invalid(K::InvalidSignature))),
            (token(Some("n"), |c| c["aud"] = serde_json::json!(["vault"]), KEY), Box::new(invalid(K::InvalidAudience))),
            (token(Some("n"), |c| c["iss"] = "https://evil".into(), KEY), Box::new(invalid(K::InvalidIssuer))),
            (
                token(Some("n"), |c| c["sub"] = "system:serviceaccount:default:default".into(), KEY),
                Box::new(invalid(K::InvalidSubject)),
            ),
            (
                token(Some("n"), |c| c["exp"] = (chrono::Utc::now().timestamp() - 3600).into(), KEY),
                Box::new(invalid(K::ExpiredSignature)),
            ),
            (token(None, |_| {}, KEY), Box::new(|e| matches!(e, TokenRefused::NoNode))),
            (token(Some("bad/node"), |_| {}, KEY), Box::new(|e| matches!(e, TokenRefused::BadNodeName(_)))),
            // Unsigned (`alg: none`), and HMAC with the public key as secret (algorithm confusion).
            ("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.".into(), Box::new(|e| matches!(e, TokenRefused::Malformed(_)))),
            (
                jsonwebtoken::encode(
                    &Header::new(Algorithm::HS256),
                    &serde_json::json!({"sub": "x"}),
                    &EncodingKey::from_secret(JWKS.as_bytes()),
                )
                .unwrap(),
                Box::new(|e| matches!(e, TokenRefused::NoKey { alg: Algorithm::HS256, .. })),
            ),
            ("eyJ.garbage.x".into(), Box::new(|e| matches!(e, TokenRefused::Malformed(_)))),
        ];
        for (t, want) in cases {
            let e = v.verify(&t).unwrap_err();
            assert!(want(&e), "unexpected refusal: {e:?}");
        }
        // gpu-node-8's claims under gpu-node-7's signature: a payload swapped after signing.
        let seven: Vec<String> = token(Some("gpu-node-7"), |_| {}, KEY).split('.').map(str::to_owned).collect();
        let eight: Vec<String> = token(Some("gpu-node-8"), |_| {}, KEY).split('.').map(str::to_owned).collect();
        let spliced = format!("{}.{}.{}", seven[0], eight[1], seven[2]);
        assert!(invalid(K::InvalidSignature)(&v.verify(&spliced).unwrap_err()));
    }

    /// Writes `text` as the key set file, dated `secs` after the epoch (a change is its date and
    /// length, so each write is dated apart).
    fn write_set(path: &Path, text: &str, secs: u64) {
        std::fs::write(path, text).unwrap();
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
    }

    #[test]
    fn a_rotated_key_set_is_read_again_and_a_bad_one_keeps_the_keys_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        write_set(&path, JWKS, 1_000);
        let v = K8sTokens::load(&K8sTokenConfig { jwks: JwksSource::File(path.clone()), ..cfg() }).unwrap();
        let old = token(Some("gpu-node-1"), |_| {}, KEY);
        let new = token_with_kid(Some("gpu-node-2"), |_| {}, OTHER_KEY, "test-key-2");
        assert_eq!(v.verify(&old).unwrap().as_str(), "gpu-node-1");
        assert!(matches!(v.verify(&new), Err(TokenRefused::NoKey { .. })));
        // The cluster adds its new key: a token signed with it is verified at once (its key was
        // unknown, so the set is looked at without waiting), the old key still holds.
        let both = serde_json::json!({"keys": [
            serde_json::from_str::<serde_json::Value>(JWKS).unwrap()["keys"][0],
            serde_json::from_str::<serde_json::Value>(OTHER_JWKS).unwrap()["keys"][0],
        ]});
        write_set(&path, &both.to_string(), 2_000);
        assert_eq!(v.verify(&new).unwrap().as_str(), "gpu-node-2");
        assert_eq!(v.verify(&old).unwrap().as_str(), "gpu-node-1");
        // A token of a key nobody holds makes the set be looked at at once, each time.
        let stranger = || token_with_kid(Some("x"), |_| {}, OTHER_KEY, "unknown");
        // A file that does not load (a half-written ConfigMap, say) keeps the keys held.
        write_set(&path, "{\"keys\": [", 3_000);
        assert!(matches!(v.verify(&stranger()), Err(TokenRefused::NoKey { .. })));
        assert_eq!(v.verify(&new).unwrap().as_str(), "gpu-node-2");
        assert_eq!(v.verify(&old).unwrap().as_str(), "gpu-node-1");
        // The old key retired: its tokens are refused once the set is looked at again.
        write_set(&path, OTHER_JWKS, 4_000);
        assert!(matches!(v.verify(&stranger()), Err(TokenRefused::NoKey { .. })));
        assert!(matches!(v.verify(&old), Err(TokenRefused::NoKey { .. })), "the retired key still verifies");
        assert_eq!(v.verify(&new).unwrap().as_str(), "gpu-node-2");
    }

    #[test]
    fn bad_key_sets_are_clear_errors() {
        let e = K8sTokens::parse("{", Path::new("j.json"), &cfg()).unwrap_err().to_string();
        assert!(e.starts_with("j.json: not a JSON Web Key Set"), "{e}");
        let e = K8sTokens::parse(r#"{"keys": []}"#, Path::new("j.json"), &cfg()).unwrap_err().to_string();
        assert!(e.contains("no usable signing key"), "{e}");
    }
}
