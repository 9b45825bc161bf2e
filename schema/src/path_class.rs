//! PCIe path classes, with `nvidia-smi topo -m`'s names and order (docs/how-railguard-decides.md §2).

use crate::macros::wire_enum;

wire_enum! {
    /// How two devices reach each other, best (closest) first. The derived `Ord` follows
    /// distance: `X < Nv < Pix < Pxb < Phb < Node < Sys`.
    pub enum PathClass: crate::wire::PathClass as "path class" {
        /// The device itself.
        X = X => "x",
        /// Connected by NVLink (GPU pairs only).
        Nv = Nv => "nv",
        /// At most one PCIe bridge: the same switch.
        Pix = Pix => "pix",
        /// Several PCIe bridges, no host bridge.
        Pxb = Pxb => "pxb",
        /// Through a PCIe host bridge (CPU root complex).
        Phb = Phb => "phb",
        /// Across host bridges within one NUMA node.
        Node = Node => "node",
        /// Across the inter-socket link.
        Sys = Sys => "sys",
    }
}

impl PathClass {
    /// The label `nvidia-smi topo -m` prints (`NV#` is printed with the link count by callers).
    pub fn label(self) -> &'static str {
        match self {
            PathClass::X => "X",
            PathClass::Nv => "NV",
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
        }
    }

    /// Parses nvidia-smi's label (`PIX`, `NV12`, ...).
    pub fn from_label(s: &str) -> Option<PathClass> {
        Some(match s {
            "X" => PathClass::X,
            "PIX" => PathClass::Pix,
            "PXB" => PathClass::Pxb,
            "PHB" => PathClass::Phb,
            "NODE" => PathClass::Node,
            "SYS" => PathClass::Sys,
            s if s.starts_with("NV") && s[2..].parse::<u32>().is_ok() => PathClass::Nv,
            _ => return None,
        })
    }

    /// True when the path stays below the CPU's host bridge: traffic goes peer to peer
    /// through PCIe switches and never reaches the IOMMU unless ACS redirects it (docs/how-railguard-decides.md §1).
    pub fn is_peer_to_peer_under_switch(self) -> bool {
        matches!(self, PathClass::Pix | PathClass::Pxb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_distance() {
        let mut v = vec![PathClass::Sys, PathClass::Pix, PathClass::Node, PathClass::X, PathClass::Phb, PathClass::Pxb];
        v.sort();
        assert_eq!(v, [PathClass::X, PathClass::Pix, PathClass::Pxb, PathClass::Phb, PathClass::Node, PathClass::Sys]);
    }

    #[test]
    fn labels_round_trip() {
        for c in PathClass::ALL {
            if *c != PathClass::Nv {
                assert_eq!(PathClass::from_label(c.label()), Some(*c));
            }
        }
        assert_eq!(PathClass::from_label("NV18"), Some(PathClass::Nv));
        assert_eq!(PathClass::from_label("NVX"), None);
    }
}
