//! Queue pairs that fail, whoever owns them: the kernel's RDMA resource tracking (rdma netlink,
//! what `rdma resource show qp` prints) lists every QP with its device, port, number, state and
//! owning pid. An RC QP whose work completes with an error moves to the error state (ERR, or
//! SQE for a send-queue error), so polling the table catches the failures of every verbs
//! consumer — UCX, NIXL, NCCL, perftest — without a uprobe in any of them, and names the
//! device, the port and the process. The process's `CUDA_VISIBLE_DEVICES` names its GPU.
//!
//! The table shows a QP while it exists: one that fails and is destroyed between two polls
//! (100 ms apart in the agent) is missed here and left to the other sources (the UCX uprobe,
//! the kernel log).

use std::collections::{BTreeMap, HashMap};

use railguard_schema::{SignalEvent, SignalKind, SignalSource};

/// rdma netlink: the NLDEV client's QP dump (`RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_RES_QP_GET)`).
const NETLINK_RDMA: i32 = 20;
const RDMA_NL_NLDEV: u16 = 5;
const RDMA_NLDEV_CMD_GET: u16 = 1;
const RDMA_NLDEV_CMD_RES_QP_GET: u16 = 10;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
// enum rdma_nldev_attr (include/uapi/rdma/rdma_netlink.h).
const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_RES_QP: u16 = 19;
const ATTR_RES_QP_ENTRY: u16 = 20;
const ATTR_RES_LQPN: u16 = 21;
const ATTR_RES_TYPE: u16 = 26;
const ATTR_RES_STATE: u16 = 27;
const ATTR_RES_PID: u16 = 28;
const ATTR_RES_KERN_NAME: u16 = 29;

/// One QP as the kernel tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qp {
    pub device: String,
    pub port: Option<u32>,
    pub qpn: u32,
    /// `enum ib_qp_state`: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 4 SQD, 5 SQE, 6 ERR.
    pub state: u8,
    /// `enum ib_qp_type`: 2 RC, 3 UC, 4 UD, ...
    pub kind: Option<u8>,
    /// The owning process (user QPs); None for the kernel's own.
    pub pid: Option<u32>,
    /// The owning kernel module, for kernel QPs.
    pub kern_name: Option<String>,
}

pub fn state_name(s: u8) -> &'static str {
    match s {
        0 => "RESET",
        1 => "INIT",
        2 => "RTR",
        3 => "RTS",
        4 => "SQD",
        5 => "SQE",
        6 => "ERR",
        _ => "unknown",
    }
}

pub fn kind_name(t: u8) -> &'static str {
    match t {
        0 => "SMI",
        1 => "GSI",
        2 => "RC",
        3 => "UC",
        4 => "UD",
        8 => "XRC_INI",
        9 => "XRC_TGT",
        _ => "other",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QpTableError {
    #[error("rdma netlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("rdma netlink: the kernel answered error {0}")]
    Kernel(i32),
    #[error("rdma netlink: malformed reply ({0})")]
    Malformed(&'static str),
}

/// Netlink attributes of `b`: (type without flags, payload).
fn attrs(mut b: &[u8]) -> Result<Vec<(u16, &[u8])>, QpTableError> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return Err(QpTableError::Malformed("attribute length"));
        }
        out.push((ty, &b[4..len]));
        let aligned = (len + 3) & !3;
        b = &b[aligned.min(b.len())..];
    }
    Ok(out)
}

fn u32_of(p: &[u8]) -> Option<u32> {
    p.get(..4).map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
}

fn str_of(p: &[u8]) -> String {
    String::from_utf8_lossy(p.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
}

/// The netlink messages of one reply buffer: (type, body); `true` once NLMSG_DONE is seen. An
/// error (NLMSG_ERROR, or a DONE carrying a negative code) is the kernel's refusal.
fn messages(mut buf: &[u8]) -> Result<(Vec<(u16, &[u8])>, bool), QpTableError> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < 16 || len > buf.len() {
            return Err(QpTableError::Malformed("message length"));
        }
        let body = &buf[16..len];
        let code = body.get(..4).map_or(0, |v| i32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
        match ty {
            NLMSG_DONE if code < 0 => return Err(QpTableError::Kernel(code)),
            NLMSG_DONE => return Ok((out, true)),
            NLMSG_ERROR if code != 0 => return Err(QpTableError::Kernel(code)),
            NLMSG_ERROR => {}
            _ => out.push((ty, body)),
        }
        let aligned = (len + 3) & !3;
        buf = &buf[aligned.min(buf.len())..];
    }
    Ok((out, false))
}

/// The QPs of one RES_QP_GET message body (one device's table, or part of it).
fn qps_of(body: &[u8], out: &mut Vec<Qp>) -> Result<(), QpTableError> {
    let top = attrs(body)?;
    let device = top.iter().find(|(t, _)| *t == ATTR_DEV_NAME).map(|(_, p)| str_of(p)).unwrap_or_default();
    for (_, table) in top.iter().filter(|(t, _)| *t == ATTR_RES_QP) {
        for (_, entry) in attrs(table)?.into_iter().filter(|(t, _)| *t == ATTR_RES_QP_ENTRY) {
            let e = attrs(entry)?;
            let get = |want: u16| e.iter().find(|(t, _)| *t == want).map(|(_, p)| *p);
            let (Some(qpn), Some(state)) = (get(ATTR_RES_LQPN).and_then(u32_of), get(ATTR_RES_STATE)) else {
                continue;
            };
            out.push(Qp {
                device: device.clone(),
                port: get(ATTR_PORT_INDEX).and_then(u32_of),
                qpn,
                state: state.first().copied().unwrap_or(0),
                kind: get(ATTR_RES_TYPE).and_then(|p| p.first().copied()),
                pid: get(ATTR_RES_PID).and_then(u32_of),
                kern_name: get(ATTR_RES_KERN_NAME).map(str_of),
            });
        }
    }
    Ok(())
}

/// The QPs in one dump reply buffer (several netlink messages); `true` once the dump ended.
pub fn parse_reply(buf: &[u8], out: &mut Vec<Qp>) -> Result<bool, QpTableError> {
    let (msgs, done) = messages(buf)?;
    for (_, body) in msgs {
        qps_of(body, out)?;
    }
    Ok(done)
}

/// A netlink socket to the kernel's RDMA subsystem.
#[allow(unsafe_code)] // socket/send/recv on plain buffers
mod sock {
    use super::QpTableError;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    pub struct Sock(OwnedFd);

    impl Sock {
        pub fn open() -> Result<Sock, QpTableError> {
            // SAFETY: plain socket creation; the fd is owned below.
            let fd =
                unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, super::NETLINK_RDMA) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            // SAFETY: fd is a fresh socket nobody else owns.
            let s = Sock(unsafe { OwnedFd::from_raw_fd(fd) });
            let tv = libc::timeval { tv_sec: 2, tv_usec: 0 };
            // SAFETY: tv is a valid timeval for the duration of the call.
            unsafe {
                libc::setsockopt(
                    s.0.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    size_of::<libc::timeval>() as u32,
                )
            };
            Ok(s)
        }

        pub fn send(&self, msg: &[u8]) -> Result<(), QpTableError> {
            // SAFETY: msg is readable for its length; the default destination is the kernel.
            if unsafe { libc::send(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok(())
        }

        pub fn recv<'a>(&self, buf: &'a mut [u8]) -> Result<&'a [u8], QpTableError> {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok(&buf[..n as usize])
        }
    }
}

/// A dump request of `cmd`, with the attributes `attrs` (already framed).
fn request(seq: u32, cmd: u16, attrs: &[u8]) -> Vec<u8> {
    let len = 16 + attrs.len();
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&((RDMA_NL_NLDEV << 10) + cmd).to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&seq.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(attrs);
    req
}

/// Runs one dump, handing each message body to `f`.
fn run_dump(
    s: &sock::Sock,
    req: &[u8],
    f: &mut dyn FnMut(&[u8]) -> Result<(), QpTableError>,
) -> Result<(), QpTableError> {
    s.send(req)?;
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..100_000 {
        let got = s.recv(&mut buf)?;
        if got.is_empty() {
            return Ok(());
        }
        let (msgs, done) = messages(got)?;
        for (_, body) in msgs {
            f(body)?;
        }
        if done {
            return Ok(());
        }
    }
    Err(QpTableError::Malformed("no end to the dump"))
}

/// Every QP on this host: the devices (RDMA_NLDEV_CMD_GET), then each device's QP table.
pub fn dump() -> Result<Vec<Qp>, QpTableError> {
    let s = sock::Sock::open()?;
    let mut devices: Vec<u32> = Vec::new();
    run_dump(&s, &request(1, RDMA_NLDEV_CMD_GET, &[]), &mut |body| {
        if let Some(i) = attrs(body)?.iter().find(|(t, _)| *t == ATTR_DEV_INDEX).and_then(|(_, p)| u32_of(p)) {
            devices.push(i);
        }
        Ok(())
    })?;
    let mut out = Vec::new();
    for (n, dev) in devices.into_iter().enumerate() {
        let mut attr = Vec::with_capacity(8);
        attr.extend_from_slice(&8u16.to_ne_bytes());
        attr.extend_from_slice(&ATTR_DEV_INDEX.to_ne_bytes());
        attr.extend_from_slice(&dev.to_ne_bytes());
        run_dump(&s, &request(2 + n as u32, RDMA_NLDEV_CMD_RES_QP_GET, &attr), &mut |body| qps_of(body, &mut out))?;
    }
    Ok(out)
}

/// Follows the QP table: a QP seen entering ERR or SQE is reported once.
#[derive(Debug, Default)]
pub struct QpWatch {
    last: HashMap<(String, u32), u8>,
}

impl QpWatch {
    /// The QPs that entered an error state since the last reading. The first reading reports
    /// QPs already in error too (they failed before the agent looked).
    pub fn update(&mut self, now: &[Qp]) -> Vec<Qp> {
        let mut entered = Vec::new();
        let mut next = HashMap::with_capacity(now.len());
        for q in now {
            let key = (q.device.clone(), q.qpn);
            let was = self.last.get(&key).copied();
            let bad = matches!(q.state, 5 | 6);
            if bad && was.is_none_or(|w| !matches!(w, 5 | 6)) {
                entered.push(q.clone());
            }
            next.insert(key, q.state);
        }
        self.last = next;
        entered
    }
}

/// A signal for a QP in error, attributed to its device (the NIC) and, through `gpu_of`, to the
/// GPU its process uses.
pub fn signal(q: &Qp, gpu_of: &dyn Fn(u32) -> Option<u32>) -> SignalEvent {
    let mut attrs = BTreeMap::new();
    attrs.insert("qpn".to_owned(), q.qpn.to_string());
    attrs.insert("state".to_owned(), state_name(q.state).to_owned());
    if let Some(p) = q.port {
        attrs.insert("port".to_owned(), p.to_string());
    }
    if let Some(k) = q.kind {
        attrs.insert("qp_type".to_owned(), kind_name(k).to_owned());
    }
    if let Some(pid) = q.pid {
        attrs.insert("pid".to_owned(), pid.to_string());
    }
    let owner = match (&q.pid, &q.kern_name) {
        (Some(pid), _) => format!("pid {pid}"),
        (None, Some(k)) if !k.is_empty() => format!("kernel {k}"),
        _ => "unknown owner".to_owned(),
    };
    SignalEvent {
        source: SignalSource::RdmaNetlink,
        kind: SignalKind::QpError,
        bdf: None,
        gpu: q.pid.and_then(gpu_of),
        nic: q.device.clone(),
        summary: format!(
            "{} QP {:#x} on {}{} ({owner}) entered {}",
            q.kind.map_or("a", kind_name),
            q.qpn,
            q.device,
            q.port.map(|p| format!(" port {p}")).unwrap_or_default(),
            state_name(q.state)
        ),
        attrs,
    }
}

/// Names the device (and GPU) of a UCX error CQE that UCX's auto-selection left unnamed: the
/// CQE carries the QP number and the event the process, and the kernel's QP table maps
/// (pid, QP number) to the RDMA device and port. `tables` are the readings to search, newest
/// first (the QP may be gone from the newest).
pub fn attribute_cqe(s: &mut SignalEvent, tables: &[&[Qp]], gpu_of: &dyn Fn(u32) -> Option<u32>) {
    if s.kind != SignalKind::UcxErrorCqe {
        return;
    }
    let pid = s.attrs.get("pid").and_then(|p| p.parse::<u32>().ok());
    let qpn = s.attrs.get("qpn").and_then(|q| u32::from_str_radix(q.trim_start_matches("0x"), 16).ok());
    let (Some(pid), Some(qpn)) = (pid, qpn) else { return };
    if s.nic.is_empty()
        && let Some(q) = tables.iter().flat_map(|t| t.iter()).find(|q| q.pid == Some(pid) && q.qpn == qpn)
    {
        s.nic = q.device.clone();
        s.attrs.insert("nic_from".to_owned(), "the kernel's QP table (pid, QP number)".to_owned());
        if let Some(p) = q.port {
            s.attrs.insert("port".to_owned(), p.to_string());
        }
    }
    if s.gpu.is_none() {
        s.gpu = gpu_of(pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn msg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&[0; 10]);
        v.extend_from_slice(body);
        v
    }

    fn entry(qpn: u32, state: u8, pid: Option<u32>) -> Vec<u8> {
        let mut e = nla(ATTR_PORT_INDEX, &1u32.to_ne_bytes());
        e.extend(nla(ATTR_RES_LQPN, &qpn.to_ne_bytes()));
        e.extend(nla(ATTR_RES_TYPE, &[2]));
        e.extend(nla(ATTR_RES_STATE, &[state]));
        match pid {
            Some(p) => e.extend(nla(ATTR_RES_PID, &p.to_ne_bytes())),
            None => e.extend(nla(ATTR_RES_KERN_NAME, b"ib_core\0")),
        }
        nla(0x8000 | ATTR_RES_QP_ENTRY, &e) // nested flag set, as the kernel sends it
    }

    /// A dump as the kernel frames it: one message per device, a nested table of entries.
    fn reply() -> Vec<u8> {
        let mut top = nla(ATTR_DEV_INDEX, &0u32.to_ne_bytes());
        top.extend(nla(ATTR_DEV_NAME, b"rxe0\0"));
        let mut table = entry(0x11, 3, Some(4242));
        table.extend(entry(0x12, 6, Some(4243)));
        table.extend(entry(0x1, 3, None));
        top.extend(nla(0x8000 | ATTR_RES_QP, &table));
        let mut buf = msg((RDMA_NL_NLDEV << 10) + RDMA_NLDEV_CMD_RES_QP_GET, &top);
        buf.extend(msg(NLMSG_DONE, &[0; 4]));
        buf
    }

    #[test]
    fn reads_the_kernels_qp_table_and_reports_each_qp_entering_error_once() {
        let mut qps = Vec::new();
        assert!(parse_reply(&reply(), &mut qps).unwrap(), "NLMSG_DONE ends the dump");
        assert_eq!(qps.len(), 3);
        assert_eq!((qps[1].device.as_str(), qps[1].qpn, qps[1].state, qps[1].pid), ("rxe0", 0x12, 6, Some(4243)));
        assert_eq!((qps[2].pid, qps[2].kern_name.as_deref()), (None, Some("ib_core")));

        let mut w = QpWatch::default();
        let first = w.update(&qps);
        assert_eq!(first.iter().map(|q| q.qpn).collect::<Vec<_>>(), [0x12], "already in error at the first look");
        assert!(w.update(&qps).is_empty(), "said once");
        let mut later = qps.clone();
        later[0].state = 5; // RTS -> SQE
        assert_eq!(w.update(&later).iter().map(|q| q.qpn).collect::<Vec<_>>(), [0x11]);

        let s = signal(&later[0], &|pid| (pid == 4242).then_some(3));
        assert_eq!((s.kind, s.gpu, s.nic.as_str()), (SignalKind::QpError, Some(3), "rxe0"));
        assert_eq!(s.summary, "RC QP 0x11 on rxe0 port 1 (pid 4242) entered SQE");
        assert_eq!(s.attrs["state"], "SQE");
    }

    #[test]
    fn a_ucx_error_cqe_under_auto_selection_gets_its_device_from_the_qp_table() {
        let mut qps = Vec::new();
        parse_reply(&reply(), &mut qps).unwrap();
        let mut s = SignalEvent {
            source: SignalSource::EbpfUprobe,
            kind: SignalKind::UcxErrorCqe,
            bdf: None,
            gpu: None,
            nic: String::new(),
            summary: "UCX error CQE".into(),
            attrs: BTreeMap::from([("pid".to_owned(), "4243".to_owned()), ("qpn".to_owned(), "0x12".to_owned())]),
        };
        let older: Vec<Qp> = Vec::new();
        attribute_cqe(&mut s, &[&older, &qps], &|pid| (pid == 4243).then_some(5));
        assert_eq!((s.nic.as_str(), s.gpu, s.attrs.get("port").map(String::as_str)), ("rxe0", Some(5), Some("1")));
        // Another process's QP with the same number is not it.
        let mut other = s.clone();
        other.nic.clear();
        other.gpu = None;
        other.attrs.insert("pid".to_owned(), "9".to_owned());
        attribute_cqe(&mut other, &[&qps], &|_| None);
        assert_eq!((other.nic.as_str(), other.gpu), ("", None));
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let good = reply();
        for cut in [17, 20, 33, good.len() - 3] {
            let mut qps = Vec::new();
            let _ = parse_reply(&good[..cut], &mut qps); // any answer but a panic
        }
        let mut bad = good.clone();
        bad[0] = 0xff; // a message longer than the buffer
        assert!(matches!(parse_reply(&bad, &mut Vec::new()), Err(QpTableError::Malformed(_))));
        let err = msg(NLMSG_ERROR, &(-13i32).to_ne_bytes());
        assert!(matches!(parse_reply(&err, &mut Vec::new()), Err(QpTableError::Kernel(-13))));
        // A dump the kernel refuses ends with a DONE that carries the error.
        let done_err = msg(NLMSG_DONE, &(-22i32).to_ne_bytes());
        assert!(matches!(parse_reply(&done_err, &mut Vec::new()), Err(QpTableError::Kernel(-22))));
    }
}
