//! The cluster's service-account key set, fetched from the API server (`/openid/v1/jwks`) for
//! [`crate::ingest::k8s::K8sTokens`] (`serve --k8s-jwks-from-api`): at start, every
//! [`EVERY`], and soon after a token names a key the set does not hold (at most once every
//! [`AT_MOST_EVERY`], so tokens naming unknown keys cannot make the collector flood the API
//! server). Every replica fetches for itself: no leader, nothing stored. A fetch that fails, or a
//! set that does not load, is said and the keys held are kept; until the first good fetch every
//! service-account token is refused (static credentials still work).
//!
//! The path is readable by every service account by default (the `system:service-account-issuer-
//! discovery` binding); the manifests grant it to the collector's too.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::ingest::k8s::K8sTokens;

/// How often the key set is fetched when nothing asks for it sooner.
pub const EVERY: Duration = Duration::from_secs(300);
/// The least time between two fetches.
pub const AT_MOST_EVERY: Duration = Duration::from_secs(5);
/// Where the API server serves the key set.
pub const PATH: &str = "/openid/v1/jwks";

/// Why a fetch of the key set failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {PATH}: {0}")]
    Request(#[from] kube::Error),
    #[error("GET {PATH}: {0}")]
    Build(#[from] axum::http::Error),
    #[error(transparent)]
    Keys(#[from] crate::ingest::k8s::K8sConfigError),
}

/// Fetches the key set once into `tokens`; how many keys it holds.
pub async fn fetch(client: &kube::Client, tokens: &K8sTokens) -> Result<usize, FetchError> {
    let req = axum::http::Request::get(PATH).body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(tokens.replace(&text, Path::new(PATH))?)
}

/// Keeps `tokens`' keys fetched until `shutdown` says stop.
pub async fn run_periodic(
    client: kube::Client,
    tokens: Arc<K8sTokens>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        match fetch(&client, &tokens).await {
            Ok(keys) => {
                if failing {
                    tracing::info!(keys, "the cluster's service-account key set is fetched again");
                }
                tracing::debug!(keys, "fetched the cluster's service-account key set");
                failing = false;
            }
            Err(e) => {
                // Said once per failing stretch, not at every try.
                if !failing {
                    tracing::error!(error = %e, "fetching the cluster's service-account key set failed; keeping the keys held");
                }
                failing = true;
            }
        }
        let pause = tokio::time::sleep(AT_MOST_EVERY);
        tokio::select! {
            _ = pause => {}
            _ = shutdown.changed() => return,
        }
        let wait = if failing { Duration::ZERO } else { EVERY.saturating_sub(AT_MOST_EVERY) };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tokens.wanted() => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;
    use crate::ingest::k8s::tests::{JWKS, KEY, OTHER_JWKS, OTHER_KEY, cfg, token_with_kid};
    use crate::ingest::k8s::{JwksSource, K8sTokenConfig, TokenRefused};

    /// An API server of the test's own serving `set` at /openid/v1/jwks (a 500 while it holds
    /// none); the paths asked for, in order.
    fn api_server(set: Arc<Mutex<Option<&'static str>>>) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let (svc, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                seen.lock().unwrap().push(req.uri().path().to_owned());
                let held = *set.lock().unwrap();
                let resp = match held {
                    Some(text) => http::Response::builder().body(kube::client::Body::from(text.as_bytes().to_vec())),
                    None => http::Response::builder().status(500).body(kube::client::Body::from(b"down".to_vec())),
                };
                send.send_response(resp.unwrap());
            }
        });
        (kube::Client::new(svc, "default"), asked)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_key_set_is_fetched_from_the_api_server_and_again_when_a_token_names_a_new_key() {
        let set = Arc::new(Mutex::new(None));
        let (client, asked) = api_server(set.clone());
        let tokens = Arc::new(K8sTokens::load(&K8sTokenConfig { jwks: JwksSource::ApiServer, ..cfg() }).unwrap());
        let one = token_with_kid(Some("gpu-node-1"), |_| {}, KEY, "test-key-1");
        let two = token_with_kid(Some("gpu-node-2"), |_| {}, OTHER_KEY, "test-key-2");
        // Nothing fetched yet: every token is refused, none is taken on trust.
        assert!(matches!(tokens.verify(&one), Err(TokenRefused::NoKey { .. })));

        // The API server down at first: said, kept trying; then it answers.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run_periodic(client, tokens.clone(), stop_rx));
        railguard_testkit::until_true_async("the first fetch tried", Duration::from_secs(30), async || {
            !asked.lock().unwrap().is_empty()
        })
        .await;
        assert!(matches!(tokens.verify(&one), Err(TokenRefused::NoKey { .. })), "a failed fetch gives no keys");
        *set.lock().unwrap() = Some(JWKS);
        railguard_testkit::until_true_async(
            "the set fetched once the API server answers",
            Duration::from_secs(30),
            async || tokens.verify(&one).is_ok(),
        )
        .await;
        assert_eq!(tokens.verify(&one).unwrap().as_str(), "gpu-node-1");
        assert!(asked.lock().unwrap().iter().all(|p| p == PATH), "{asked:?}");

        // The cluster rotates its key: a token of the new key is refused once, and the set is
        // fetched again at once (not after EVERY), so the agent's next try passes.
        *set.lock().unwrap() = Some(OTHER_JWKS);
        assert!(matches!(tokens.verify(&two), Err(TokenRefused::NoKey { .. })));
        railguard_testkit::until_true_async("the rotated set fetched", Duration::from_secs(30), async || {
            tokens.verify(&two).is_ok()
        })
        .await;
        assert!(matches!(tokens.verify(&one), Err(TokenRefused::NoKey { .. })), "the old key is gone with its set");

        // A set that does not load keeps the keys held.
        *set.lock().unwrap() = Some("{\"keys\": []}");
        let before = asked.lock().unwrap().len();
        assert!(tokens.verify(&one).is_err());
        railguard_testkit::until_true_async("the bad set fetched", Duration::from_secs(30), async || {
            asked.lock().unwrap().len() > before
        })
        .await;
        assert_eq!(tokens.verify(&two).unwrap().as_str(), "gpu-node-2");

        // Unknown keys cannot make it flood the API server: at most one fetch per AT_MOST_EVERY.
        let before = asked.lock().unwrap().len();
        let started = std::time::Instant::now();
        for _ in 0..200 {
            let _ = tokens.verify(&one);
            tokio::task::yield_now().await;
        }
        let fetched = asked.lock().unwrap().len() - before;
        let allowed = 1 + (started.elapsed().as_secs_f64() / AT_MOST_EVERY.as_secs_f64()).ceil() as usize;
        assert!(fetched <= allowed, "{fetched} fetches for 200 refused tokens in {:?}", started.elapsed());

        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }
}
