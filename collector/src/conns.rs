//! What a connection to the collector may hold: a slot among its listener's, and only while it
//! moves bytes.
//!
//! Each listener (the agents' gRPC port, the HTTP side) accepts through [`accept`]: a TCP
//! connection gets a slot keyed by its peer's address (`railguard_telemetry::slots`: at most
//! `max` at once, `per_peer` of them one address's, and a reserve only for addresses holding
//! none) before anything else happens, TLS handshakes included; one refused is closed at once and
//! counted. Every accepted connection is a [`Limited`] stream that closes itself once neither
//! side has moved a byte for `idle`, so a silent peer gives its slot (and its descriptor) back.
//!
//! Invariants: a slot is held exactly as long as the connection's stream exists; the accept loop
//! never waits on a peer (refusals are a drop, handshakes run elsewhere); the file-descriptor
//! limit is raised to its hard limit at start, and a hard limit below what the slots need is
//! said at start ([`raise_fd_limit`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use railguard_telemetry::slots::{Slot, SlotLimits, SlotRefused, Slots};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// A listener's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections at once.
    pub max: usize,
    /// Connections one peer address may hold.
    pub per_peer: usize,
    /// A connection that moves no byte either way for this long is closed.
    pub idle: Duration,
}

impl ConnLimits {
    /// Agents: one connection each (100,000 nodes fit), a few per address behind a NAT; an
    /// agent sends at least a heartbeat a minute, so five silent minutes is a dead peer.
    pub const GRPC_DEFAULT: ConnLimits = ConnLimits { max: 131_072, per_peer: 64, idle: Duration::from_secs(300) };
    /// People, Prometheus and Grafana: few. A read can take its retries' worth of time without
    /// a byte moving, so the idle limit is well above the longest.
    pub const HTTP_DEFAULT: ConnLimits = ConnLimits { max: 4096, per_peer: 256, idle: Duration::from_secs(120) };

    fn slots(self) -> SlotLimits {
        SlotLimits { max: self.max, per_key: self.per_peer, reserved_for_new: (self.max / 8).min(self.max - 1) }
    }
}

/// One listener's counts, for /metrics.
#[derive(Debug, Default)]
pub struct ConnStats {
    open: AtomicU64,
    refused_full: AtomicU64,
    refused_per_peer: AtomicU64,
    refused_reserved: AtomicU64,
    idle_closed: AtomicU64,
}

/// A snapshot of [`ConnStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnCounts {
    pub open: u64,
    pub refused_full: u64,
    pub refused_per_peer: u64,
    pub refused_reserved: u64,
    pub idle_closed: u64,
}

impl ConnStats {
    pub fn counts(&self) -> ConnCounts {
        ConnCounts {
            open: self.open.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            refused_per_peer: self.refused_per_peer.load(Ordering::Relaxed),
            refused_reserved: self.refused_reserved.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
        }
    }

    fn refused(&self, why: SlotRefused) {
        match why {
            SlotRefused::Full => &self.refused_full,
            SlotRefused::PerKeyFull => &self.refused_per_peer,
            SlotRefused::Reserved => &self.refused_reserved,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// Accepts on `listener` under `limits` until the receiver is dropped: each admitted connection
/// arrives as a [`Limited`] stream; refused ones are closed and counted in `stats`.
pub fn accept(
    listener: TcpListener,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    side: &'static str,
) -> tokio_stream::wrappers::ReceiverStream<Limited<TcpStream>> {
    let slots: Slots<IpAddr> = Slots::new(limits.slots());
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors, mostly: the slots are set below the limit, so this
                        // is another part of the process; wait for some to come back.
                        tracing::warn!(error = %e, side, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            match slots.take(&peer.ip()) {
                Ok(slot) => {
                    let _ = tcp.set_nodelay(true);
                    stats.open.fetch_add(1, Ordering::Relaxed);
                    let conn = Limited::new(tcp, slot, limits.idle, stats.clone());
                    if tx.send(conn).await.is_err() {
                        return;
                    }
                }
                Err(why) => {
                    stats.refused(why);
                    tracing::debug!(%peer, side, why = why.label(), "a connection refused: no slot for it");
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A connection holding its slot, closed after `idle` without a byte moved.
#[derive(Debug)]
pub struct Limited<T> {
    io: T,
    _slot: Slot<IpAddr>,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    stats: Arc<ConnStats>,
}

impl<T> Limited<T> {
    fn new(io: T, slot: Slot<IpAddr>, idle: Duration, stats: Arc<ConnStats>) -> Self {
        let now = Instant::now();
        Limited { io, _slot: slot, idle, last: now, timer: Box::pin(tokio::time::sleep_until(now + idle)), stats }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Called when the stream has nothing to give: ready with an error once it has been idle
    /// for its limit, else pending with the timer armed for the moment it would be.
    fn poll_idle<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        loop {
            let deadline = self.last + self.idle;
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if self.last.elapsed() >= self.idle => {
                    self.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no byte moved for {} s: connection closed", self.idle.as_secs()),
                    )));
                }
                Poll::Ready(()) => {}
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> Limited<T> {
    /// A write's outcome: bytes written count as activity; a write that cannot go on waits no
    /// longer than the idle limit (a peer that reads nothing holds the slot no longer than a
    /// silent one).
    fn written(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => self.poll_idle(cx),
            other => other,
        }
    }
}

impl<T> Drop for Limited<T> {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Limited<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => self.poll_idle(cx),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Limited<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.written(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.poll_idle(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.written(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The HTTP side's plaintext listener: admitted connections, for axum.
#[derive(Debug)]
pub struct PlainListener {
    local: SocketAddr,
    streams: tokio_stream::wrappers::ReceiverStream<Limited<TcpStream>>,
}

impl PlainListener {
    pub fn new(listener: TcpListener, limits: ConnLimits, stats: Arc<ConnStats>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(PlainListener { local, streams: accept(listener, limits, stats, "HTTP") })
    }
}

impl axum::serve::Listener for PlainListener {
    type Io = Limited<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use tokio_stream::StreamExt;
        match self.streams.next().await {
            Some(s) => {
                let peer = s.get_ref().peer_addr().unwrap_or(self.local);
                (s, peer)
            }
            // The accept loop ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Raises the soft limit on open files to the hard limit, and says so when even that is below
/// `needed` (what the listeners' slots can hold, plus the process's own files).
#[allow(unsafe_code)] // getrlimit/setrlimit on this process, with rlimit values we own
pub fn raise_fd_limit(needed: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid out pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: a valid rlimit, soft not above hard.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            lim = raised;
        }
    }
    if lim.rlim_cur < needed {
        tracing::warn!(
            open_files = lim.rlim_cur,
            needed,
            "the open-file limit is below what the connection limits allow: connections past it fail to be accepted \
             (raise LimitNOFILE / ulimit -n, or lower --grpc-max-connections and --http-max-connections)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn a_peer_gets_its_share_a_silent_one_is_closed_and_its_slot_comes_back() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stats = Arc::new(ConnStats::default());
        let limits = ConnLimits { max: 16, per_peer: 3, idle: Duration::from_millis(300) };
        let mut incoming = accept(l, limits, stats.clone(), "test");
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            served.push(incoming.next().await.unwrap());
        }
        // The fourth from the same address is closed at once.
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(fourth.read(&mut byte).await.unwrap(), 0, "refused: closed without a byte");
        assert_eq!(stats.counts().refused_per_peer, 1);
        // Another address (127.0.0.2 is loopback too) has its own share.
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let _other = other.connect(addr).await.unwrap();
        let _other_served = incoming.next().await.unwrap();
        assert_eq!(stats.counts().open, 4);
        // A connection that moves bytes stays; a silent one is closed after its idle limit.
        let mut talker = served.pop().unwrap();
        let mut talking = clients.pop().unwrap();
        let mut silent = served.pop().unwrap();
        let err = loop {
            talking.write_all(b"x").await.unwrap();
            talker.read_exact(&mut byte).await.unwrap();
            tokio::select! {
                r = silent.read(&mut byte) => break r.unwrap_err(),
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert_eq!(stats.counts().idle_closed, 1);
        // Dropping it gives the slot back: the address may connect again.
        drop(silent);
        let _again = TcpStream::connect(addr).await.unwrap();
        let _again_served = incoming.next().await.unwrap();
        assert_eq!(stats.counts().open, 4);
    }
}
