//! PCI addresses (`domain:bus:device.function`).

use std::fmt;
use std::str::FromStr;

/// A PCI address, always carried with its domain. Displayed as `0000:91:00.0`, the form
/// sysfs uses for device names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bdf {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PCI address {input:?}: {reason}")]
pub struct BdfParseError {
    pub input: String,
    pub reason: &'static str,
}

impl Bdf {
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        Bdf { domain, bus, device, function }
    }

    /// Parses `dddd:bb:dd.f`, or `bb:dd.f` with `default_domain` (kernel lines such as Intel
    /// DMAR faults omit the domain; docs/how-railguard-decides.md §5). NVIDIA's `0000:91:00` (no function, as in
    /// `NVRM: Xid (PCI:0000:91:00)`) is accepted as function 0.
    pub fn parse_with_domain(s: &str, default_domain: u32) -> Result<Self, BdfParseError> {
        let err = |reason| BdfParseError { input: s.chars().take(64).collect(), reason };
        let s = s.trim();
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, devfn) = match parts.as_slice() {
            [d, b, df] => (u32::from_str_radix(d, 16).map_err(|_| err("domain is not hex"))?, *b, *df),
            [b, df] => (default_domain, *b, *df),
            _ => return Err(err("expected [domain:]bus:device.function")),
        };
        if bus.is_empty() || bus.len() > 2 {
            return Err(err("bus must be 1-2 hex digits"));
        }
        let bus = u8::from_str_radix(bus, 16).map_err(|_| err("bus is not hex"))?;
        let (dev, func) = match devfn.split_once('.') {
            Some((d, f)) => (d, f),
            None => (devfn, "0"),
        };
        if dev.is_empty() || dev.len() > 2 || func.len() != 1 {
            return Err(err("device must be 1-2 hex digits and function 1 digit"));
        }
        let device = u8::from_str_radix(dev, 16).map_err(|_| err("device is not hex"))?;
        let function = u8::from_str_radix(func, 16).map_err(|_| err("function is not hex"))?;
        if device > 0x1f {
            return Err(err("device number above 0x1f"));
        }
        if function > 7 {
            return Err(err("function number above 7"));
        }
        Ok(Bdf { domain, bus, device, function })
    }
}

impl FromStr for Bdf {
    type Err = BdfParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bdf::parse_with_domain(s, 0)
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl serde::Serialize for Bdf {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Bdf {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_sysfs_form() {
        let b: Bdf = "0000:91:00.0".parse().unwrap();
        assert_eq!(b, Bdf::new(0, 0x91, 0, 0));
        assert_eq!(b.to_string(), "0000:91:00.0");
        assert_eq!("10000:3b:1f.7".parse::<Bdf>().unwrap().to_string(), "10000:3b:1f.7");
    }

    #[test]
    fn short_forms_take_the_given_domain() {
        assert_eq!(Bdf::parse_with_domain("00:02.0", 1).unwrap(), Bdf::new(1, 0, 2, 0));
        // NVRM prints no function.
        assert_eq!("0000:91:00".parse::<Bdf>().unwrap(), Bdf::new(0, 0x91, 0, 0));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "zz:00.0",
            "0000:91:00.8",
            "0000:91:20.0",
            "1:2:3:4",
            "0000:191:00.0",
            "0000:91:.0",
            "0000:91:00.",
            "0000:91:00.10",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad:?} parsed");
        }
    }
}
