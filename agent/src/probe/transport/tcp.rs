//! Plain TCP over loopback: works everywhere. It proves the engine and the receiver's check
//! end to end; it does not exercise a GPU/NIC path (that is what `ucx` and `verbs` are for).
//!
//! Each transfer is `[u64 LE length][payload]` on a connected socket pair; the receiver reads
//! into the destination buffer on its own thread. A broken or timed-out transfer reconnects.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use railguard_schema::{Reported, Transport};

use super::{FailureMode, ProbeTransport, Sabotage, TransferReport, TransportError};

#[derive(Debug)]
pub struct TcpLoopback {
    /// None only between a peer-reset self-test and the reconnect that follows it.
    tx: Option<TcpStream>,
    rx: TcpStream,
}

/// Aborts `s` with a TCP reset: SO_LINGER {on, 0 s}, then the close sends RST instead of FIN.
#[allow(unsafe_code)] // one setsockopt on a socket we own; std has no stable set_linger
fn reset(s: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: the fd is open (we own `s`), and the option value is a valid `struct linger` of
    // the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

fn connect() -> std::io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tx = TcpStream::connect(listener.local_addr()?)?;
    let (rx, _) = listener.accept()?;
    tx.set_nodelay(true)?;
    Ok((tx, rx))
}

impl TcpLoopback {
    pub fn new() -> Result<Self, TransportError> {
        let (tx, rx) = connect().map_err(|source| TransportError::Io { transport: "tcp", source })?;
        Ok(TcpLoopback { tx: Some(tx), rx })
    }

    fn reconnect(&mut self) {
        if let Ok((tx, rx)) = connect() {
            self.tx = Some(tx);
            self.rx = rx;
        }
    }
}

fn receive(rx: &mut TcpStream, dst: &mut [u8], deadline: Instant) -> Result<(), TransferReport> {
    let mut read_exact = |buf: &mut [u8]| -> Result<(), TransferReport> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransferReport::nothing(format!("receiver timed out after {got} of {} bytes", buf.len())));
            }
            let _ = rx.set_read_timeout(Some(left));
            match rx.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(TransferReport::error(format!("connection closed after {got} of {} bytes", buf.len())));
                }
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(TransferReport::nothing(format!(
                        "receiver timed out after {got} of {} bytes",
                        buf.len()
                    )));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TransferReport::error(format!("receive failed: {e}"))),
            }
        }
        Ok(())
    };
    let mut header = [0u8; 8];
    read_exact(&mut header)?;
    let len = u64::from_le_bytes(header);
    if len != dst.len() as u64 {
        return Err(TransferReport::error(format!("sender announced {len} bytes, receiver expected {}", dst.len())));
    }
    read_exact(dst)
}

impl ProbeTransport for TcpLoopback {
    fn kind(&self) -> Transport {
        Transport::Tcp
    }

    fn transfer(
        &mut self,
        _nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let deadline = Instant::now() + timeout;
        let Ok(mut rx) = self.rx.try_clone() else {
            return TransferReport::error("cannot clone the receiving socket");
        };
        if self.tx.is_none() {
            self.reconnect();
        }
        let Some(mut tx) = self.tx.take() else {
            return TransferReport::error("cannot reconnect the sending socket");
        };
        let report = std::thread::scope(|s| {
            let receiver = s.spawn(move || receive(&mut rx, dst, deadline));
            let half = &src[..src.len() / 2];
            let sent = tx.write_all(&(src.len() as u64).to_le_bytes()).and_then(|_| match sabotage {
                Sabotage::None => tx.write_all(src),
                Sabotage::Truncate => tx.write_all(half).and_then(|_| tx.shutdown(Shutdown::Write)),
                Sabotage::Stall => Ok(()),
                Sabotage::PeerReset => tx.write_all(half),
            });
            if sabotage == Sabotage::PeerReset {
                // The sending end aborts mid-transfer: the receiver must see the reset.
                reset(tx);
            } else {
                self.tx = Some(tx);
            }
            let received = receiver.join().unwrap_or_else(|_| Err(TransferReport::error("receiver thread panicked")));
            match (sent, received) {
                (Ok(()), Ok(())) => TransferReport::success(),
                (_, Err(r)) => r,
                (Err(e), Ok(())) => TransferReport::error(format!("send failed: {e}")),
            }
        });
        if report.reported != railguard_schema::Reported::Success {
            self.reconnect(); // the stream is out of step now
        }
        report
    }

    /// Real failures of a TCP connection mid-transfer.
    fn failure_modes(&self) -> &'static [FailureMode] {
        const MODES: [FailureMode; 3] = [
            // The sender writes half and closes: the receiver sees the stream end early.
            FailureMode { name: "short_write", sabotage: Sabotage::Truncate, reported: Reported::Error },
            // The sender's socket is reset (RST) after half: the receiver's read fails.
            FailureMode { name: "peer_reset", sabotage: Sabotage::PeerReset, reported: Reported::Error },
            // The sender sends nothing after the header: the receiver times out.
            FailureMode { name: "stall", sabotage: Sabotage::Stall, reported: Reported::Nothing },
        ];
        &MODES
    }
}
