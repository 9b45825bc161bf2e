//! TLS for the agent link and the HTTP side: rustls with a certificate that is read again when
//! its files change (a renewed certificate — cert-manager's, say — takes effect at the next
//! handshake, without a restart), and, for mutual TLS on the agent link, client certificates
//! checked against a CA. The HTTP side speaks HTTP/1.1 over it ([`HttpsListener`]), so its
//! bearer token and /metrics never cross in clear.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::conns::{ConnLimits, ConnStats, Limited, accept};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;

/// The gRPC listener's TLS: its certificate chain and key (PEM), and optionally the CA whose
/// client certificates it requires (mutual TLS, a check before and beside the node's token).
#[derive(Debug, Clone)]
pub struct GrpcTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn load(cert: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not a PEM certificate chain", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{}: no certificate in it", cert.display());
    railguard_telemetry::secret::check(key)?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("{}: not a PEM private key", key.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).context("the private key's type")?;
    Ok(CertifiedKey::new(chain, signing))
}

/// Serves the certificate in `cert`/`key`, loading it again when either file's modification
/// time changes. A bad new pair is reported and the previous one kept.
#[derive(Debug)]
struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    /// (the files' modification times when last read, the certificate).
    current: Mutex<((Option<SystemTime>, Option<SystemTime>), Arc<CertifiedKey>)>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let stamps = (mtime(&self.cert), mtime(&self.key));
        let mut cur = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if stamps != cur.0 {
            cur.0 = stamps;
            match load(&self.cert, &self.key) {
                Ok(k) => {
                    tracing::info!(cert = %self.cert.display(), "agent link: certificate reloaded");
                    cur.1 = Arc::new(k);
                }
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "agent link: the changed certificate files do not load; keeping the previous certificate"
                ),
            }
        }
        Some(cur.1.clone())
    }
}

fn reloading(cert: &Path, key: &Path) -> anyhow::Result<ReloadingCert> {
    let first = load(cert, key)?;
    Ok(ReloadingCert {
        cert: cert.to_owned(),
        key: key.to_owned(),
        current: Mutex::new(((mtime(cert), mtime(key)), Arc::new(first))),
    })
}

/// The HTTP side's TLS: its certificate chain and key (PEM), read again when they change.
#[derive(Debug, Clone)]
pub struct HttpTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl HttpTls {
    /// The rustls configuration: HTTP/1.1, the reloading certificate, no client certificates.
    pub fn server_config(&self) -> anyhow::Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = reloading(&self.cert, &self.key)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The HTTP side's listener under TLS: handshakes run off the accept loop ([`incoming`]), and
/// axum serves each finished one.
pub struct HttpsListener {
    local: std::net::SocketAddr,
    streams: tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsStream<Limited<TcpStream>>>>,
}

impl HttpsListener {
    /// Over `listener`'s connections as `limits` admits them (counted in `stats`).
    pub fn new(
        listener: TcpListener,
        config: rustls::ServerConfig,
        limits: ConnLimits,
        stats: Arc<ConnStats>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(HttpsListener { local, streams: incoming(accept(listener, limits, stats, "HTTP"), config, "HTTP") })
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<Limited<TcpStream>>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use tokio_stream::StreamExt;
        loop {
            match self.streams.next().await {
                Some(Ok(s)) => {
                    let peer = s.get_ref().0.get_ref().peer_addr().unwrap_or(self.local);
                    return (s, peer);
                }
                Some(Err(e)) => tracing::warn!(error = %e, "an HTTPS connection failed"),
                // The accept loop ended: nothing more will come.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl GrpcTls {
    /// The rustls configuration: HTTP/2 only, the reloading certificate, client certificates
    /// required from `client_ca` when set.
    pub fn server_config(&self) -> anyhow::Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = reloading(&self.cert, &self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let first = client_verifier(ca, &provider)?;
                builder.with_client_cert_verifier(Arc::new(ReloadingClientCa {
                    ca: ca.clone(),
                    provider: provider.clone(),
                    current: Mutex::new((mtime(ca), first)),
                }))
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

fn client_verifier(
    ca: &Path,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))? {
        roots.add(c.with_context(|| format!("{}: not a PEM certificate", ca.display()))?)?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().context("the client CA")
}

/// Client certificates checked against the CA in `ca`, read again when the file changes (a
/// rotated client CA takes effect at the next handshake); a bad new file is reported and the
/// previous CA kept.
#[derive(Debug)]
struct ReloadingClientCa {
    ca: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: Mutex<(Option<SystemTime>, Arc<dyn ClientCertVerifier>)>,
}

impl ReloadingClientCa {
    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        let stamp = mtime(&self.ca);
        let mut cur = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if stamp != cur.0 {
            cur.0 = stamp;
            match client_verifier(&self.ca, &self.provider) {
                Ok(v) => {
                    tracing::info!(ca = %self.ca.display(), "agent link: client CA reloaded");
                    cur.1 = v;
                }
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "agent link: the changed client CA does not load; keeping the previous one"
                ),
            }
        }
        cur.1.clone()
    }
}

impl ClientCertVerifier for ReloadingClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the CA may change between handshakes (clients send the certificate they have).
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.verifier().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.verifier().supported_verify_schemes()
    }
}

/// Why a client certificate does not stand for a node.
#[derive(Debug, thiserror::Error)]
pub enum CertificateNodeError {
    #[error("the client certificate does not parse: {0}")]
    Unparsable(#[source] webpki::Error),
    #[error("node id {0:?} is not a DNS name, so no client certificate can name it")]
    NotADnsName(String),
    #[error("the client certificate does not name node {0:?} (subjectAltName DNS:{0})")]
    OtherNode(String),
}

/// The node a client certificate names: it must carry the node id as a DNS name in its
/// subjectAltName (`DNS:gpu-node-17`), so a certificate, like a token, lets a node write only
/// as itself.
pub fn certificate_names_node(cert: &CertificateDer<'_>, node: &str) -> Result<(), CertificateNodeError> {
    let ee = webpki::EndEntityCert::try_from(cert).map_err(CertificateNodeError::Unparsable)?;
    let name =
        rustls_pki_types::ServerName::try_from(node).map_err(|_| CertificateNodeError::NotADnsName(node.to_owned()))?;
    ee.verify_is_valid_for_subject_name(&name).map_err(|_| CertificateNodeError::OtherNode(node.to_owned()))
}

/// Takes the connections `accepted` admits ([`crate::conns::accept`]) and hands each finished
/// TLS handshake to the stream returned; handshakes run concurrently (one slow or hostile client
/// delays no one) and give up after 10 s. The loop ends when the returned stream is dropped.
pub fn incoming(
    mut accepted: tokio_stream::wrappers::ReceiverStream<Limited<TcpStream>>,
    config: rustls::ServerConfig,
    side: &'static str,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsStream<Limited<TcpStream>>>> {
    use tokio_stream::StreamExt;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                c = accepted.next() => match c {
                    Some(c) => c,
                    None => return,
                },
                () = tx.closed() => return,
            };
            let peer = tcp.get_ref().peer_addr().ok();
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let peer = peer.map(|p| p.to_string()).unwrap_or_default();
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => {
                        let _ = tx.send(Ok(s)).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, side, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, side, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
