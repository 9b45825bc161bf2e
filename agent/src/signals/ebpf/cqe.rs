//! UCX's error CQEs: the 64-byte `struct mlx5_err_cqe` the uprobe copies, decoded at the offsets
//! of the mlx5 CQE layout (docs/how-railguard-decides.md, "The mlx5 error CQE"), deduplicated
//! (UCX reports each requester error twice) and turned into a signal.

use std::collections::{BTreeMap, HashSet, VecDeque};

use railguard_schema::{SignalEvent, SignalKind, SignalSource};

use super::events::UcxCqeEvent;
use crate::signals::kmsg::syndrome_name;

/// A decoded mlx5 error CQE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCqe {
    pub hw_err_synd: u8,
    pub hw_synd_type: u8,
    pub vendor_err_synd: u8,
    pub syndrome: u8,
    pub qpn: u32,
    pub opcode: u8,
    pub wqe_counter: u16,
    /// 13 requester error, 14 responder error.
    pub op_own: u8,
}

pub fn decode_cqe(c: &[u8; 64]) -> ErrorCqe {
    let sqo = u32::from_be_bytes([c[56], c[57], c[58], c[59]]);
    ErrorCqe {
        hw_err_synd: c[52],
        hw_synd_type: c[53] >> 4,
        vendor_err_synd: c[54],
        syndrome: c[55],
        qpn: sqo & 0x00ff_ffff,
        opcode: (sqo >> 24) as u8,
        wqe_counter: u16::from_be_bytes([c[60], c[61]]),
        op_own: c[63] >> 4,
    }
}

/// UCX reports each requester error twice (DEBUG, then the failure level): one event per
/// (pid, qpn, wqe_counter) within a short memory.
#[derive(Debug, Default)]
pub struct CqeDedup {
    seen: VecDeque<(u32, u32, u16)>,
    set: HashSet<(u32, u32, u16)>,
}

impl CqeDedup {
    pub fn first(&mut self, pid: u32, cqe: &ErrorCqe) -> bool {
        let key = (pid, cqe.qpn, cqe.wqe_counter);
        if !self.set.insert(key) {
            return false;
        }
        self.seen.push_back(key);
        if self.seen.len() > 4096
            && let Some(old) = self.seen.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

/// The signal for one error CQE of process `ev.pid`; `nic` when the process names its NIC.
pub fn ucx_signal(ev: &UcxCqeEvent, nic: Option<String>) -> SignalEvent {
    let c = decode_cqe(&ev.cqe);
    let side = match c.op_own {
        13 => "requester",
        14 => "responder",
        _ => "unknown",
    };
    let attrs = BTreeMap::from([
        ("pid".to_owned(), ev.pid.to_string()),
        ("log_level".to_owned(), ev.log_level.to_string()),
        ("syndrome".to_owned(), format!("0x{:x}", c.syndrome)),
        ("syndrome_name".to_owned(), syndrome_name(u32::from(c.syndrome)).to_owned()),
        ("vendor_syndrome".to_owned(), format!("0x{:x}", c.vendor_err_synd)),
        ("hw_syndrome".to_owned(), format!("0x{:x}", c.hw_err_synd)),
        ("hw_syndrome_type".to_owned(), c.hw_synd_type.to_string()),
        ("qpn".to_owned(), format!("0x{:x}", c.qpn)),
        ("opcode".to_owned(), format!("0x{:x}", c.opcode)),
        ("wqe_counter".to_owned(), c.wqe_counter.to_string()),
        ("side".to_owned(), side.to_owned()),
    ]);
    SignalEvent {
        source: SignalSource::EbpfUprobe,
        kind: SignalKind::UcxErrorCqe,
        bdf: None,
        gpu: None,
        nic: nic.unwrap_or_default(),
        summary: format!(
            "UCX error CQE in pid {}: {side} {} (syndrome 0x{:x}, vendor 0x{:x}) on QP 0x{:x}, wqe {}",
            ev.pid,
            syndrome_name(u32::from(c.syndrome)),
            c.syndrome,
            c.vendor_err_synd,
            c.qpn,
            c.wqe_counter
        ),
        attrs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_fields_at_the_documented_offsets() {
        let mut c = [0u8; 64];
        c[52] = 0x03;
        c[53] = 0x20;
        c[54] = 0x32;
        c[55] = 0x04;
        c[56..60].copy_from_slice(&((0x0d_u32 << 24) | 0x0002c8).to_be_bytes());
        c[60..62].copy_from_slice(&0x1234u16.to_be_bytes());
        c[63] = 13 << 4;
        let d = decode_cqe(&c);
        assert_eq!((d.syndrome, d.vendor_err_synd, d.hw_err_synd, d.hw_synd_type), (4, 0x32, 3, 2));
        assert_eq!((d.qpn, d.opcode, d.wqe_counter, d.op_own), (0x2c8, 0x0d, 0x1234, 13));
        let mut dd = CqeDedup::default();
        assert!(dd.first(7, &d));
        assert!(!dd.first(7, &d), "UCX's second report of the same error");
        let ev = UcxCqeEvent { kind: 100, pid: 7, tid: 7, log_level: 2, ktime_ns: 0, cqe: c, cookie: 0 };
        let s = ucx_signal(&ev, Some("mlx5_3".into()));
        assert_eq!(
            (s.nic.as_str(), s.attrs["side"].as_str(), s.attrs["qpn"].as_str()),
            ("mlx5_3", "requester", "0x2c8")
        );
    }
}
