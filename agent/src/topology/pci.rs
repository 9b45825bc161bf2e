//! PCI devices from sysfs: where each sits in the PCIe tree, and what it is.

use railguard_schema::Bdf;

use super::sysroot::SysRoot;

/// PCI class codes (the `class` file: 0xCCSSPP).
pub const CLASS_BRIDGE_PCI: u32 = 0x0604;
pub const CLASS_VGA: u32 = 0x0300;
pub const CLASS_3D: u32 = 0x0302;
pub const VENDOR_NVIDIA: u16 = 0x10de;

/// One PCI function, located in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    pub bdf: Bdf,
    pub vendor: u16,
    pub device: u16,
    /// Class and subclass (upper 16 bits of the 24-bit class code).
    pub class: u32,
    /// -1 when the platform does not say.
    pub numa_node: i32,
    /// The host bridge it hangs under (`pci0000:00`), as sysfs names it.
    pub root: String,
    /// PCI functions from the root port down to and including this device.
    pub chain: Vec<Bdf>,
}

impl PciDevice {
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor == VENDOR_NVIDIA && matches!(self.class, CLASS_VGA | CLASS_3D)
    }
    pub fn is_bridge(&self) -> bool {
        self.class == CLASS_BRIDGE_PCI
    }
}

/// Parses a sysfs hex value such as `0x10de` or `0x030200`.
pub fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().strip_prefix("0x").unwrap_or(s.trim()), 16).ok()
}

/// Parses `numa_node`: -1 (unknown) and garbage both read as -1.
pub fn parse_numa(s: &str) -> i32 {
    s.trim().parse::<i32>().ok().filter(|n| (-1..=4096).contains(n)).unwrap_or(-1)
}

/// Splits a resolved device path (`devices/pci0000:00/0000:00:01.0/0000:01:00.0`) into the
/// host bridge name and the chain of PCI functions below it. None if it is not a PCI path.
pub fn split_pci_path(path: &std::path::Path) -> Option<(String, Vec<Bdf>)> {
    let mut parts = path.iter().filter_map(|c| c.to_str());
    let mut root = None;
    for p in parts.by_ref() {
        if p.starts_with("pci") && p.len() > 3 && p[3..].contains(':') {
            root = Some(p.to_owned());
            break;
        }
    }
    let root = root?;
    let chain: Vec<Bdf> = parts.map_while(|p| p.parse().ok()).collect();
    if chain.is_empty() { None } else { Some((root, chain)) }
}

/// Reads every device under `bus/pci/devices`. Unreadable devices are skipped with a warning.
pub fn enumerate(sys: &SysRoot, warnings: &mut Vec<String>) -> Vec<PciDevice> {
    let names = match sys.list("bus/pci/devices") {
        Ok(n) => n,
        Err(e) => {
            warnings.push(format!("no PCI devices readable: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for name in names {
        match read_device(sys, &name) {
            Ok(d) => out.push(d),
            Err(why) => warnings.push(format!("PCI device {name}: {why}")),
        }
    }
    out.sort_by_key(|d| d.bdf);
    out
}

fn read_device(sys: &SysRoot, name: &str) -> Result<PciDevice, String> {
    let bdf: Bdf = name.parse().map_err(|e| format!("{e}"))?;
    let base = format!("bus/pci/devices/{name}");
    let path = sys.resolve(&base).map_err(|e| e.to_string())?;
    let (root, chain) =
        split_pci_path(&path).ok_or_else(|| format!("{} is not under a PCI host bridge", path.display()))?;
    if chain.last() != Some(&bdf) {
        return Err(format!("link points at {} rather than the device itself", path.display()));
    }
    let hex = |f: &str| -> Result<u32, String> {
        let v = sys.read(format!("{base}/{f}")).map_err(|e| e.to_string())?;
        parse_hex(&v).ok_or_else(|| format!("{f} = {v:?} is not hex"))
    };
    let vendor = u16::try_from(hex("vendor")?).map_err(|_| "vendor id out of range".to_owned())?;
    let device = u16::try_from(hex("device")?).map_err(|_| "device id out of range".to_owned())?;
    let class = hex("class")? >> 8;
    let numa_node = sys.read(format!("{base}/numa_node")).map(|s| parse_numa(&s)).unwrap_or(-1);
    Ok(PciDevice { bdf, vendor, device, class, numa_node, root, chain })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values_and_paths() {
        assert_eq!(parse_hex("0x030200\n"), Some(0x030200));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_numa("-1"), -1);
        assert_eq!(parse_numa("1\n"), 1);
        assert_eq!(parse_numa("banana"), -1);
        let (root, chain) = split_pci_path(std::path::Path::new(
            "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0",
        ))
        .unwrap();
        assert_eq!(root, "pci0000:00");
        assert_eq!(chain.len(), 4);
        assert!(split_pci_path(std::path::Path::new("devices/virtual/net/lo")).is_none());
    }
}
