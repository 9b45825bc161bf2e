//! PCI devices from sysfs: where each sits in the PCIe tree, and what it is.

use std::path::PathBuf;

use railguard_schema::{Bdf, BdfParseError};

use super::sysroot::{SysError, SysRoot};

/// Why a PCI or RDMA device in sysfs could not be read (it is skipped with a warning).
#[derive(Debug, thiserror::Error)]
pub enum PciReadError {
    #[error("not a PCI address: {0}")]
    Name(BdfParseError),
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("{} is not under a PCI host bridge", .path.display())]
    NotUnderHostBridge { path: PathBuf },
    #[error("link points at {} rather than the device itself", .path.display())]
    WrongLink { path: PathBuf },
    #[error("{file} = {value:?} is not hex")]
    NotHex { file: &'static str, value: String },
    #[error("{file} 0x{value:x} is out of range")]
    OutOfRange { file: &'static str, value: u32 },
    #[error("{} is not a PCI device (soft RDMA devices are not probed)", .path.display())]
    NotPci { path: PathBuf },
}

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
    /// Why its files could not be read, for a device kept in its place anyway (one bound to the
    /// NVIDIA driver: a GPU whose `vendor` cannot be read is still a GPU, and numbering the GPUs
    /// without it would hand its index, and its history, to the next one).
    pub unreadable: Option<String>,
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

/// Reads every device under `bus/pci/devices`. Unreadable devices are skipped with a warning,
/// except one bound to the NVIDIA driver: kept as an unreadable GPU in its place.
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
            Err(why) => match unreadable_gpu(sys, &name, &why) {
                Some(d) => {
                    warnings.push(format!(
                        "GPU at {name} is unreadable ({why}); kept in its place so no other GPU takes its index"
                    ));
                    out.push(d);
                }
                None => warnings.push(format!("PCI device {name}: {why}")),
            },
        }
    }
    out.sort_by_key(|d| d.bdf);
    out
}

fn read_device(sys: &SysRoot, name: &str) -> Result<PciDevice, PciReadError> {
    let bdf: Bdf = name.parse().map_err(PciReadError::Name)?;
    let base = format!("bus/pci/devices/{name}");
    let path = sys.resolve(&base)?;
    let Some((root, chain)) = split_pci_path(&path) else {
        return Err(PciReadError::NotUnderHostBridge { path });
    };
    if chain.last() != Some(&bdf) {
        return Err(PciReadError::WrongLink { path });
    }
    let hex = |file: &'static str| -> Result<u32, PciReadError> {
        let value = sys.read(format!("{base}/{file}"))?;
        parse_hex(&value).ok_or(PciReadError::NotHex { file, value })
    };
    let id = |file: &'static str| -> Result<u16, PciReadError> {
        let value = hex(file)?;
        u16::try_from(value).map_err(|_| PciReadError::OutOfRange { file, value })
    };
    let vendor = id("vendor")?;
    let device = id("device")?;
    let class = hex("class")? >> 8;
    let numa_node = sys.read(format!("{base}/numa_node")).map(|s| parse_numa(&s)).unwrap_or(-1);
    Ok(PciDevice { bdf, vendor, device, class, numa_node, root, chain, unreadable: None })
}

/// A device whose files could not be read but that the NVIDIA driver holds (its `driver` link
/// names `nvidia`): a GPU, located in the tree, its model unknown.
fn unreadable_gpu(sys: &SysRoot, name: &str, why: &PciReadError) -> Option<PciDevice> {
    let bdf: Bdf = name.parse().ok()?;
    let base = format!("bus/pci/devices/{name}");
    let driver = sys.resolve(format!("{base}/driver")).ok()?;
    if driver.file_name().and_then(|n| n.to_str()) != Some("nvidia") {
        return None;
    }
    let (root, chain) = split_pci_path(&sys.resolve(&base).ok()?)?;
    let numa_node = sys.read(format!("{base}/numa_node")).map(|s| parse_numa(&s)).unwrap_or(-1);
    Some(PciDevice {
        bdf,
        vendor: VENDOR_NVIDIA,
        device: 0,
        class: CLASS_3D,
        numa_node,
        root,
        chain,
        unreadable: Some(why.to_string()),
    })
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
