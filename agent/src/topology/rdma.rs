//! RDMA devices (`class/infiniband`), their ports and network interfaces.

use railguard_schema::{Bdf, Nic, NicPort};

use super::pci::{PciReadError, parse_numa, split_pci_path};
use super::sysroot::SysRoot;

/// An RDMA device located in the PCIe tree.
#[derive(Debug, Clone)]
pub struct RdmaDevice {
    pub nic: Nic,
    pub root: String,
    pub chain: Vec<Bdf>,
}

/// Parses a port `state` file: `4: ACTIVE` → `ACTIVE`.
pub fn parse_port_state(s: &str) -> String {
    let s = s.trim();
    s.split_once(':').map(|(_, name)| name.trim()).unwrap_or(s).to_owned()
}

pub fn enumerate(sys: &SysRoot, warnings: &mut Vec<String>) -> Vec<RdmaDevice> {
    let Ok(names) = sys.list("class/infiniband") else {
        return Vec::new(); // no RDMA stack loaded: not a warning
    };
    let mut out = Vec::new();
    for name in names {
        match read_device(sys, &name) {
            Ok(d) => out.push(d),
            Err(why) => warnings.push(format!("RDMA device {name}: {why}")),
        }
    }
    out.sort_by(|a, b| natural_cmp(&a.nic.name, &b.nic.name));
    out
}

fn read_device(sys: &SysRoot, name: &str) -> Result<RdmaDevice, PciReadError> {
    let base = format!("class/infiniband/{name}");
    let dev = sys.resolve(format!("{base}/device"))?;
    let Some((root, chain)) = split_pci_path(&dev) else {
        return Err(PciReadError::NotPci { path: dev });
    };
    let Some(bdf) = chain.last().copied() else {
        return Err(PciReadError::NotPci { path: dev });
    };
    let numa_node = sys.read(format!("{base}/device/numa_node")).map(|s| parse_numa(&s)).unwrap_or(-1);
    let mut ports = Vec::new();
    for p in sys.list(format!("{base}/ports")).unwrap_or_default() {
        let Ok(port) = p.parse::<u32>() else { continue };
        let field = |f: &str| sys.read(format!("{base}/ports/{p}/{f}")).unwrap_or_default();
        ports.push(NicPort {
            port,
            state: parse_port_state(&field("state")),
            link_layer: field("link_layer"),
            rate: field("rate"),
        });
    }
    ports.sort_by_key(|p| p.port);
    let netdevs = sys.list(format!("{base}/device/net")).unwrap_or_default();
    Ok(RdmaDevice { nic: Nic { name: name.to_owned(), bdf, numa_node, ports, netdevs }, root, chain })
}

/// `mlx5_2 < mlx5_10`: names compared with their digit runs as numbers.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(s: &str) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut text = String::new();
        let mut num = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                num.push(c);
            } else {
                if !num.is_empty() {
                    out.push((std::mem::take(&mut text), num.parse().unwrap_or(u64::MAX)));
                    num.clear();
                }
                text.push(c);
            }
        }
        out.push((text, num.parse().unwrap_or(0)));
        out
    }
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_state_and_natural_order() {
        assert_eq!(parse_port_state("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(parse_port_state("DOWN"), "DOWN");
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "ibp0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["ibp0", "mlx5_1", "mlx5_2", "mlx5_10"]);
    }
}
