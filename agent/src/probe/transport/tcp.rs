//! Plain TCP over loopback: works everywhere. It proves the engine and the receiver's check
//! end to end; it does not exercise a GPU/NIC path (that is what `ucx` and `verbs` are for).
//!
//! Each transfer is `[u64 LE length][payload]` on a connected socket pair; the receiver reads
//! into the destination buffer on its own thread. A broken or timed-out transfer reconnects.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use railguard_schema::Transport;

use super::{ProbeTransport, Sabotage, TransferReport, TransportError};

#[derive(Debug)]
pub struct TcpLoopback {
    tx: TcpStream,
    rx: TcpStream,
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
        Ok(TcpLoopback { tx, rx })
    }

    fn reconnect(&mut self) {
        if let Ok((tx, rx)) = connect() {
            self.tx = tx;
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
        let report = std::thread::scope(|s| {
            let receiver = s.spawn(move || receive(&mut rx, dst, deadline));
            let mut tx = &self.tx;
            let sent = tx.write_all(&(src.len() as u64).to_le_bytes()).and_then(|_| match sabotage {
                Sabotage::None => tx.write_all(src),
                Sabotage::Truncate => {
                    tx.write_all(&src[..src.len() / 2])?;
                    tx.shutdown(Shutdown::Write)
                }
                Sabotage::Stall => Ok(()),
            });
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

    fn supports_sabotage(&self) -> bool {
        true
    }
}
