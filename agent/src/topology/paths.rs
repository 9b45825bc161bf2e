//! Path classes between two devices, as `nvidia-smi topo -m` reports them (docs/how-railguard-decides.md §2).

use railguard_schema::{Bdf, PathClass};

/// Where a device sits: its host bridge, PCI chain and NUMA node.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    pub root: &'a str,
    pub chain: &'a [Bdf],
    pub numa: i32,
}

/// The class of the path between `a` and `b`.
///
/// Same host bridge: bridges below the deepest common ancestor are counted on both sides; a
/// PCIe switch shows as two functions (upstream + downstream port), so, as NCCL does, two
/// components make one hop: one switch is PIX, more is PXB; no common bridge at all means the
/// path goes up to the host bridge (PHB). Different host bridges: NODE on the same NUMA node,
/// SYS across sockets (an unknown node, -1, is taken as the same node).
pub fn classify(a: Place<'_>, b: Place<'_>) -> PathClass {
    if a.root == b.root && a.chain == b.chain {
        return PathClass::X;
    }
    if a.root != b.root {
        return if a.numa >= 0 && b.numa >= 0 && a.numa != b.numa { PathClass::Sys } else { PathClass::Node };
    }
    // Two functions of one device (a dual-function NIC) share everything but the function.
    let (ea, eb) = (a.chain.last(), b.chain.last());
    let same_device = match (ea, eb) {
        (Some(x), Some(y)) => {
            (x.domain, x.bus, x.device) == (y.domain, y.bus, y.device) && a.chain.len() == b.chain.len()
        }
        _ => false,
    };
    if same_device && a.chain[..a.chain.len() - 1] == b.chain[..b.chain.len() - 1] {
        return PathClass::Pix;
    }
    let common = a.chain.iter().zip(b.chain.iter()).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return PathClass::Phb;
    }
    // Bridges strictly between the common ancestor and each endpoint.
    let below = |c: &[Bdf]| c.len().saturating_sub(common + 1);
    let bridges = below(a.chain) + below(b.chain);
    if bridges <= 2 { PathClass::Pix } else { PathClass::Pxb }
}

/// UCX's distance rank (src/ucs/sys/topo/base/topo.c): a common parent under a switch is best,
/// PIX and PXB tie; then the host bridge; then across host bridges.
pub fn ucx_rank(c: PathClass) -> u8 {
    match c {
        PathClass::X | PathClass::Nv | PathClass::Pix | PathClass::Pxb => 0,
        PathClass::Phb => 1,
        PathClass::Node => 2,
        PathClass::Sys => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    #[test]
    fn classes_follow_the_tree() {
        let rp = b("0000:00:01.0");
        let su = b("0000:01:00.0");
        let (d1, d2) = (b("0000:02:00.0"), b("0000:02:01.0"));
        let gpu = [rp, su, d1, b("0000:03:00.0")];
        let nic = [rp, su, d2, b("0000:04:00.0")];
        let p = |chain: &'static [Bdf]| Place { root: "pci0000:00", chain, numa: 0 };
        let gpu: &'static [Bdf] = Box::leak(Box::new(gpu));
        let nic: &'static [Bdf] = Box::leak(Box::new(nic));
        assert_eq!(classify(p(gpu), p(gpu)), PathClass::X);
        assert_eq!(classify(p(gpu), p(nic)), PathClass::Pix);
        // A second switch level below d1.
        let deep: &'static [Bdf] =
            Box::leak(Box::new([rp, su, d1, b("0000:05:00.0"), b("0000:06:00.0"), b("0000:07:00.0")]));
        assert_eq!(classify(p(deep), p(nic)), PathClass::Pxb);
        // Another root port of the same host bridge.
        let other: &'static [Bdf] = Box::leak(Box::new([b("0000:00:02.0"), b("0000:08:00.0")]));
        assert_eq!(classify(p(gpu), p(other)), PathClass::Phb);
        let far = |numa| Place { root: "pci0000:80", chain: other, numa };
        assert_eq!(classify(p(gpu), far(0)), PathClass::Node);
        assert_eq!(classify(p(gpu), far(1)), PathClass::Sys);
        assert_eq!(classify(p(gpu), far(-1)), PathClass::Node);
        // Two functions of one NIC.
        let f0: &'static [Bdf] = Box::leak(Box::new([rp, su, d2, b("0000:04:00.0")]));
        let f1: &'static [Bdf] = Box::leak(Box::new([rp, su, d2, b("0000:04:00.1")]));
        assert_eq!(classify(p(f0), p(f1)), PathClass::Pix);
    }
}
