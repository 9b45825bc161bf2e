//! Kernel log lines → typed events (docs/how-railguard-decides.md §5): Intel DMAR faults, AMD-Vi
//! IO_PAGE_FAULT (all three forms, the continuation line alone included), NVIDIA Xid (with and
//! without MIG ids), mlx5 error CQEs (mlx5_core's one-line form, mlx5_ib's `WC error` form, and
//! its older two-line form joined by [`LineParser`]), mlx5_core health and recovery lines, PCIe
//! AER (source ids with `.` or `:` before the function). Unknown or malformed lines are simply
//! not events; nothing here panics on any input.

use std::collections::BTreeMap;

use railguard_schema::{Bdf, SignalKind};

/// One `/dev/kmsg` record: `prio,seq,timestamp_us,flags[,...];message` (+ ` KEY=value` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord {
    pub priority: u8,
    pub seq: u64,
    pub timestamp_us: u64,
    pub message: String,
}

/// Parses one record as read from /dev/kmsg (one `read` returns one record).
pub fn parse_record(raw: &str) -> Option<KmsgRecord> {
    let (header, rest) = raw.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.trim().parse().ok()?;
    let seq: u64 = fields.next()?.trim().parse().ok()?;
    let ts: u64 = fields.next()?.trim().parse().ok()?;
    let message = rest.lines().next().unwrap_or("").to_owned();
    Some(KmsgRecord { priority: (prio & 7) as u8, seq, timestamp_us: ts, message })
}

/// A kernel event, before it is attributed to a GPU or NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelEvent {
    pub kind: SignalKind,
    /// The PCI address the line names (domain resolved by the caller when the line has none).
    pub bdf: Option<Bdf>,
    /// An RDMA device name the line names (`mlx5_0`).
    pub rdma_dev: Option<String>,
    pub attrs: BTreeMap<String, String>,
    pub summary: String,
}

impl KernelEvent {
    /// An event of `kind` from `line`, placed at the first full PCI address the line prints (a
    /// driver's `0000:3b:00.0:` prefix) and the RDMA device it names, if any.
    fn from_line(kind: SignalKind, line: &str, attrs: BTreeMap<String, String>, summary: String) -> KernelEvent {
        let rdma_dev = rdma_dev(line);
        let bdf = first_full_bdf(line).or_else(|| rdma_dev.as_deref().and_then(pci_named_rdma_dev));
        KernelEvent { kind, bdf, rdma_dev, attrs, summary }
    }
}

/// Resolves a PCI address printed without its domain against the node's devices.
pub trait DomainResolver {
    fn resolve(&self, bus: u8, device: u8, function: u8) -> Bdf;
}

/// Domain 0 always (single-domain machines, tests).
#[derive(Debug)]
pub struct DomainZero;

impl DomainResolver for DomainZero {
    fn resolve(&self, bus: u8, device: u8, function: u8) -> Bdf {
        Bdf::new(0, bus, device, function)
    }
}

/// Known devices: a `bb:dd.f` matching exactly one of them takes its domain.
#[derive(Debug, Default)]
pub struct KnownDevices(pub Vec<Bdf>);

impl DomainResolver for KnownDevices {
    fn resolve(&self, bus: u8, device: u8, function: u8) -> Bdf {
        let hits: Vec<&Bdf> =
            self.0.iter().filter(|b| (b.bus, b.device, b.function) == (bus, device, function)).collect();
        match hits.as_slice() {
            [one] => **one,
            _ => Bdf::new(0, bus, device, function),
        }
    }
}

/// Text between `start` and the next `end` after it.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let i = s.find(start)? + start.len();
    let j = s[i..].find(end)? + i;
    Some(&s[i..j])
}

/// `key=value` pairs separated by spaces (AMD-Vi event fields).
fn kv_fields(s: &str) -> BTreeMap<String, String> {
    s.split_whitespace()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_end_matches(',').to_owned()))
        .collect()
}

/// The first full PCI address (`dddd:bb:dd.f`) in a line, e.g. a driver's `0000:28:00.0:` prefix.
fn first_full_bdf(s: &str) -> Option<Bdf> {
    s.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '(' || c == ')' || c == ',')
        .map(|t| t.trim_end_matches(':'))
        .filter(|t| t.len() >= 12 && t.matches(':').count() == 2 && t.contains('.'))
        .find_map(|t| t.parse().ok())
}

/// `bus:dev.fn` without a domain, resolved against the node's devices; some kernels print the
/// parts with a `0x` prefix (`0x3b:0x00.0`).
fn short_bdf(s: &str, domains: &dyn DomainResolver) -> Option<Bdf> {
    let plain = s.replace("0x", "").replace("0X", "");
    let b = Bdf::parse_with_domain(&plain, 0).ok()?;
    Some(domains.resolve(b.bus, b.device, b.function))
}

/// `mlx5_ib_warn`/`mlx5_ib_dbg` print `func:line:(pid N): `; the pid, when there.
fn ib_pid(s: &str) -> Option<String> {
    let pid = between(s, "(pid ", ")")?;
    pid.chars().all(|c| c.is_ascii_digit()).then(|| pid.to_owned())
}

/// An AER source id: `0000:00:03.0`, or `0000:00:03:0` as some kernels print it.
fn aer_source(s: &str, domains: &dyn DomainResolver) -> Option<Bdf> {
    let s = s.trim();
    let normalised = match s.rsplit_once(':') {
        Some((head, func)) if s.matches(':').count() == 3 && !s.contains('.') => format!("{head}.{func}"),
        _ => s.to_owned(),
    };
    normalised.parse::<Bdf>().ok().or_else(|| short_bdf(&normalised, domains))
}

/// mlx5_core's health and recovery lines (`drivers/net/ethernet/mellanox/mlx5/core/health.c`),
/// by what they report.
const MLX5_HEALTH: [(&str, &str); 7] = [
    ("health compromised", "health_compromised"),
    ("Fatal error", "fatal_error"),
    ("starting health recovery flow", "recovery_started"),
    ("health recovery flow aborted", "recovery_aborted"),
    ("handling bad device", "bad_device"),
    ("Driver is in error state", "driver_error_state"),
    ("crdump", "crdump"),
];

/// The RDMA device a line names: `mlx5_<n>`, or a name rdma-core's udev rules give by PCI
/// address (`rocep59s0f1`, `ibp94s0f0`, [`pci_named_rdma_dev`]).
fn rdma_dev(s: &str) -> Option<String> {
    s.split(|c: char| c.is_whitespace() || c == ':' || c == ',')
        .find(|t| {
            (t.starts_with("mlx5_") && t[5..].chars().all(|c| c.is_ascii_digit()) && t.len() > 5)
                || pci_named_rdma_dev(t).is_some()
        })
        .map(str::to_owned)
}

/// The PCI address an RDMA device name spells, where rdma-core's udev rules named it by its
/// address (`NAME_PCI`): `roce` or `ib`, then `P<domain>` when not 0, `p<bus>s<slot>`, and
/// `f<function>`, every number in decimal. `rocep59s0f1` is 0000:3b:00.1.
pub fn pci_named_rdma_dev(name: &str) -> Option<Bdf> {
    let rest = name.strip_prefix("roce").or_else(|| name.strip_prefix("ib"))?;
    let (domain, rest) = match rest.strip_prefix('P') {
        Some(r) => {
            let end = r.find('p')?;
            (r[..end].parse::<u32>().ok()?, &r[end..])
        }
        None => (0, rest),
    };
    let rest = rest.strip_prefix('p')?;
    let (bus, rest) = rest.split_once('s')?;
    let (slot, func) = match rest.split_once('f') {
        Some((s, f)) => (s, Some(f)),
        None => (rest, None),
    };
    let num =
        |t: &str| (!t.is_empty() && t.chars().all(|c| c.is_ascii_digit())).then(|| t.parse::<u32>().ok()).flatten();
    let (bus, slot) = (u8::try_from(num(bus)?).ok()?, num(slot)?);
    let func = match func {
        Some(f) => num(f)?,
        None => 0,
    };
    (slot < 32 && func < 8).then(|| Bdf::new(domain, bus, slot as u8, func as u8))
}

/// mlx5 CQE syndromes (docs/how-railguard-decides.md §5).
pub fn syndrome_name(s: u32) -> &'static str {
    match s {
        0x01 => "local length error",
        0x02 => "local QP operation error",
        0x04 => "local protection error",
        0x05 => "work request flushed",
        0x06 => "memory window bind error",
        0x10 => "bad response",
        0x11 => "local access error",
        0x12 => "remote invalid request",
        0x13 => "remote access error",
        0x14 => "remote operation error",
        0x15 => "transport retry counter exceeded",
        0x16 => "RNR retry counter exceeded",
        0x22 => "remote aborted",
        _ => "unknown syndrome",
    }
}

fn hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// Parses one kernel log message. None: not a line railguard reads.
///
/// One function on purpose: the line shapes are tried in the order that keeps a specific shape
/// from being read as a general one (an mlx5 CQE line before an AER line naming the same device),
/// and that order reads best as one list.
pub fn parse_line(line: &str, domains: &dyn DomainResolver) -> Option<KernelEvent> {
    let line = line.trim_end();
    let mut attrs = BTreeMap::new();
    let summary: String = line.chars().take(300).collect();

    // NVIDIA: `NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.`
    // MIG: `NVRM: Xid (PCI:0000:91:00 GPU-I:01 GPU-CI:00): 31, ...`
    if let Some(rest) = line.split_once("NVRM: Xid (").map(|x| x.1) {
        let (inside, after) = rest.split_once("):")?;
        let mut parts = inside.split_whitespace();
        let pci = parts.next()?.strip_prefix("PCI:")?;
        for p in parts {
            if let Some((k, v)) = p.split_once(':') {
                attrs.insert(k.to_lowercase().replace('-', "_"), v.to_owned());
            }
        }
        let bdf = Bdf::parse_with_domain(pci, 0).ok()?;
        let mut rest = after.trim().splitn(2, ',');
        let xid: u32 = rest.next()?.trim().parse().ok()?;
        attrs.insert("xid".into(), xid.to_string());
        if let Some(tail) = rest.next() {
            if let Some(pid) = between(tail, "pid=", ",") {
                attrs.insert("pid".into(), pid.trim_matches('\'').to_owned());
            }
            if let Some(name) = between(tail, "name=", ",") {
                attrs.insert("process".into(), name.to_owned());
            }
            let text = tail.rsplit(", ").next().unwrap_or("").trim();
            attrs.insert("text".into(), text.chars().take(200).collect());
        }
        return Some(KernelEvent { kind: SignalKind::GpuXid, bdf: Some(bdf), rdma_dev: None, attrs, summary });
    }

    // Intel: `DMAR: [DMA Read NO_PASID] Request device [00:02.0] fault addr 0x0 [fault reason 0x06] PTE Read access is not set`
    if line.contains("DMAR:") && line.contains("Request device [") {
        let dev = between(line, "Request device [", "]")?;
        let bdf = short_bdf(dev, domains)?;
        if let Some(access) = between(line, "DMAR: [", "]") {
            attrs.insert("access".into(), access.to_owned());
        }
        if let Some(addr) = between(line, "fault addr ", " ").or_else(|| line.split("fault addr ").nth(1)) {
            attrs.insert("address".into(), addr.trim().to_owned());
        }
        if let Some(reason) = between(line, "[fault reason ", "]") {
            attrs.insert("reason".into(), reason.to_owned());
            if let Some(text) = line.split(&format!("[fault reason {reason}]")).nth(1) {
                attrs.insert("reason_text".into(), text.trim().to_owned());
            }
        }
        return Some(KernelEvent { kind: SignalKind::DmarFault, bdf: Some(bdf), rdma_dev: None, attrs, summary });
    }

    // AMD: `<drv> 0000:28:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0035 address=0x7fffff00000 flags=0x0000]`
    //  or: `AMD-Vi: Event logged [IO_PAGE_FAULT device=07:00.0 domain=0x0035 address=... flags=...]`
    //  or the event alone, printed as a continuation of an `AMD-Vi: Event logged [` record:
    //      `IO_PAGE_FAULT device=07:00.0 domain=0x0035 address=... flags=...]`
    let continuation = line.trim_start().starts_with("IO_PAGE_FAULT device=");
    if line.contains("AMD-Vi: Event logged [IO_PAGE_FAULT") || continuation {
        let body = line.split_once("IO_PAGE_FAULT")?.1;
        let fields = kv_fields(body.split(']').next().unwrap_or(body));
        let bdf = match fields.get("device") {
            Some(d) => short_bdf(d, domains),
            None => first_full_bdf(line.split("AMD-Vi:").next().unwrap_or("")),
        }?;
        attrs.extend(fields.into_iter().filter(|(k, _)| k != "device"));
        return Some(KernelEvent {
            kind: SignalKind::AmdViPageFault,
            bdf: Some(bdf),
            rdma_dev: rdma_dev(line),
            attrs,
            summary,
        });
    }

    // mlx5: `... Error cqe on cqn 0x%x, ci 0x%x, qn 0x%x, opcode 0x%x, syndrome 0x%x, vendor syndrome 0x%x`
    if let Some(rest) = line.split_once("Error cqe on cqn ").map(|x| x.1) {
        // `key 0xVALUE` parts; anything after a value (a trailing note) is ignored.
        let mut vals = BTreeMap::new();
        for (i, part) in rest.split(", ").enumerate() {
            let words: Vec<&str> = part.split_whitespace().collect();
            let at = words.iter().position(|w| w.starts_with("0x"))?;
            let key = if i == 0 { "cqn".to_owned() } else { words[..at].join("_") };
            if key.is_empty() {
                return None;
            }
            vals.insert(key, hex(words[at])?);
        }
        let syndrome = *vals.get("syndrome")?;
        for (k, v) in &vals {
            attrs.insert(k.clone(), format!("0x{v:x}"));
        }
        attrs.insert("syndrome_name".into(), syndrome_name(syndrome).into());
        return Some(KernelEvent::from_line(SignalKind::Mlx5ErrorCqe, line, attrs, summary));
    }

    // mlx5_ib (5.x+): `infiniband mlx5_0: mlx5_handle_error_cqe:333:(pid 4242): WC error: 10, Message: remote access error`
    if let Some(rest) = line.split_once("WC error: ").map(|x| x.1) {
        let (status, message) = rest.split_once(',').unwrap_or((rest, ""));
        let status: u32 = status.trim().parse().ok()?;
        attrs.insert("wc_status".into(), status.to_string());
        attrs.insert("wc_status_name".into(), crate::probe::transport::verbs::wc_status_name(status).into());
        if let Some((_, m)) = message.split_once(':') {
            attrs.insert("message".into(), m.trim().to_owned());
        }
        if let Some(pid) = ib_pid(line) {
            attrs.insert("pid".into(), pid);
        }
        return Some(KernelEvent::from_line(SignalKind::Mlx5ErrorCqe, line, attrs, summary));
    }

    // mlx5_core health: `mlx5_core 0000:08:00.0: mlx5_health_check:812:(pid 0): Fatal error 1 detected`
    if line.contains("mlx5_core")
        && let Some((_, event)) = MLX5_HEALTH.iter().find(|(needle, _)| line.contains(needle))
    {
        attrs.insert("event".into(), (*event).to_owned());
        return Some(KernelEvent::from_line(SignalKind::NicHealthReport, line, attrs, summary));
    }

    // AER, the device's own line: `mlx5_core 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, type=...`
    if let Some((head, tail)) = line.split_once("AER: PCIe Bus Error: ") {
        let bdf = first_full_bdf(head)?;
        let severity = between(tail, "severity=", ", type").or_else(|| between(tail, "severity=", ","))?;
        attrs.insert("severity".into(), severity.trim().to_owned());
        if let Some(t) = between(tail, "type=", ",") {
            attrs.insert("type".into(), t.trim().to_owned());
        }
        return Some(KernelEvent { kind: SignalKind::PcieAer, bdf: Some(bdf), rdma_dev: None, attrs, summary });
    }

    // AER: `pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0` (or `0000:01:00:0`)
    if let Some((head, tail)) = line.split_once("AER: ") {
        let (what, dev) = tail.rsplit_once(" received: ").or_else(|| tail.split_once(": "))?;
        let bdf = aer_source(dev, domains)?;
        attrs.insert("severity".into(), what.replace(" error", "").trim().to_owned());
        if let Some(port) = first_full_bdf(head) {
            attrs.insert("port".into(), port.to_string());
        }
        return Some(KernelEvent { kind: SignalKind::PcieAer, bdf: Some(bdf), rdma_dev: None, attrs, summary });
    }
    None
}

/// The older mlx5_ib form prints an error CQE in two records (`mlx5_poll_one`):
/// `… Requestor error cqe on cqn 0x3f:` then `… syndrome 0x4, vendor syndrome 0x51`. The parser
/// keeps the first per device and emits one event when the second arrives (a first line whose
/// second never comes is emitted on its own when the device's next first line arrives).
#[derive(Debug, Default)]
pub struct LineParser {
    pending: BTreeMap<String, KernelEvent>,
}

impl LineParser {
    /// One record's message: an event, or None (not a line railguard reads, or the first half
    /// of a two-line report).
    pub fn parse(&mut self, line: &str, domains: &dyn DomainResolver) -> Option<KernelEvent> {
        let dev = rdma_dev(line).unwrap_or_default();
        if let Some(rest) = line.split_once(" error cqe on cqn ").map(|x| x.1) {
            let side = if line.contains("Requestor error cqe") { "requester" } else { "responder" };
            let cqn = hex(rest.trim().trim_end_matches(':'))?;
            let attrs =
                BTreeMap::from([("side".to_owned(), side.to_owned()), ("cqn".to_owned(), format!("0x{cqn:x}"))]);
            let summary = line.trim_end().chars().take(300).collect();
            let first = KernelEvent::from_line(SignalKind::Mlx5ErrorCqe, line, attrs, summary);
            return self.pending.insert(dev, first);
        }
        if line.contains("vendor syndrome ") && !line.contains("Error cqe on cqn") {
            let syndrome = hex(between(line, "syndrome ", ",")?)?;
            let vendor = hex(line.rsplit("vendor syndrome ").next()?.split_whitespace().next()?)?;
            let mut ev = self.pending.remove(&dev).unwrap_or_else(|| {
                KernelEvent::from_line(SignalKind::Mlx5ErrorCqe, line, BTreeMap::new(), String::new())
            });
            ev.attrs.insert("syndrome".into(), format!("0x{syndrome:x}"));
            ev.attrs.insert("syndrome_name".into(), syndrome_name(syndrome).into());
            ev.attrs.insert("vendor_syndrome".into(), format!("0x{vendor:x}"));
            ev.summary = format!("{} {}", ev.summary, line.trim()).trim().chars().take(300).collect();
            return Some(ev);
        }
        parse_line(line, domains)
    }
}

#[cfg(test)]
mod tests;
