//! ACS and ATS from PCI configuration space (docs/how-railguard-decides.md §3).
//!
//! Extended capabilities start at 0x100: a u32 header (id = hdr & 0xffff, next = (hdr >> 20)
//! & 0xffc). Without CAP_SYS_ADMIN the `config` file shows only the first 64 bytes, so the
//! answer is "unknown", never "off".

use railguard_schema::Tristate;

const EXT_CAP_START: usize = 0x100;
const EXT_CAP_ACS: u16 = 0x000d;
const EXT_CAP_ATS: u16 = 0x000f;
/// ACS control bits.
pub const ACS_SV: u16 = 0x01;
pub const ACS_TB: u16 = 0x02;
pub const ACS_RR: u16 = 0x04;
pub const ACS_CR: u16 = 0x08;
pub const ACS_UF: u16 = 0x10;
pub const ACS_EC: u16 = 0x20;
pub const ACS_DT: u16 = 0x40;
const ATS_ENABLE: u16 = 0x8000;

/// What config space says about P2P routing for one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AcsAts {
    /// Extended config space readable at all.
    pub readable: bool,
    /// ACS control word, if the capability exists.
    pub acs_ctrl: Option<u16>,
    /// ATS enabled (None: no ATS capability, or unreadable).
    pub ats_enabled: Option<bool>,
}

impl AcsAts {
    pub const UNREADABLE: AcsAts = AcsAts { readable: false, acs_ctrl: None, ats_enabled: None };

    /// Is P2P request redirect on? Unknown when unreadable; No when there is no ACS capability.
    pub fn redirect(&self) -> Tristate {
        match (self.readable, self.acs_ctrl) {
            (false, _) => Tristate::Unknown,
            (true, None) => Tristate::No,
            (true, Some(c)) if c & ACS_RR != 0 && c & ACS_CR != 0 => Tristate::Yes,
            (true, Some(_)) => Tristate::No,
        }
    }
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*b.get(off)?, *b.get(off + 1)?]))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes([*b.get(off)?, *b.get(off + 1)?, *b.get(off + 2)?, *b.get(off + 3)?]))
}

/// Parses a config-space dump. Never panics; a malformed capability list ends the walk.
pub fn parse(config: &[u8]) -> AcsAts {
    if config.len() < EXT_CAP_START + 4 {
        return AcsAts::UNREADABLE;
    }
    let mut out = AcsAts { readable: true, acs_ctrl: None, ats_enabled: None };
    let mut off = EXT_CAP_START;
    let mut seen = std::collections::HashSet::new();
    while off >= EXT_CAP_START && seen.insert(off) {
        let Some(hdr) = u32_at(config, off) else {
            break;
        };
        if hdr == 0 || hdr == 0xffff_ffff {
            break;
        }
        match (hdr & 0xffff) as u16 {
            EXT_CAP_ACS => out.acs_ctrl = u16_at(config, off + 6),
            EXT_CAP_ATS => out.ats_enabled = u16_at(config, off + 6).map(|c| c & ATS_ENABLE != 0),
            _ => {}
        }
        off = ((hdr >> 20) & 0xffc) as usize;
    }
    out
}

/// A 4 KiB config space holding an ACS and/or ATS extended capability (fixtures and tests).
pub fn build(acs_ctrl: Option<u16>, ats_enabled: Option<bool>) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let caps: Vec<(u16, u16)> = acs_ctrl
        .map(|a| (EXT_CAP_ACS, a))
        .into_iter()
        .chain(ats_enabled.map(|e| (EXT_CAP_ATS, if e { ATS_ENABLE } else { 0 })))
        .collect();
    let mut off = EXT_CAP_START;
    for (i, (id, ctrl)) in caps.iter().enumerate() {
        let next = if i + 1 < caps.len() { off + 0x40 } else { 0 };
        let hdr = u32::from(*id) | (1 << 16) | ((next as u32) << 20);
        c[off..off + 4].copy_from_slice(&hdr.to_le_bytes());
        c[off + 6..off + 8].copy_from_slice(&ctrl.to_le_bytes());
        off += 0x40;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_acs_and_ats() {
        let p = parse(&build(Some(ACS_SV | ACS_RR | ACS_CR | ACS_UF), Some(true)));
        assert_eq!(p.redirect(), Tristate::Yes);
        assert_eq!(p.ats_enabled, Some(true));
        let p = parse(&build(Some(ACS_SV), None));
        assert_eq!(p.redirect(), Tristate::No);
        assert_eq!(p.ats_enabled, None);
    }

    #[test]
    fn sixty_four_bytes_is_unknown_not_off() {
        assert_eq!(parse(&[0u8; 64]).redirect(), Tristate::Unknown);
    }

    #[test]
    fn random_bytes_never_panic_and_loops_end() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let len = rng.random_range(0..4200);
            let mut b = vec![0u8; len];
            rng.fill(&mut b[..]);
            let _ = parse(&b);
        }
        // A capability pointing at itself.
        let mut c = vec![0u8; 4096];
        c[0x100..0x104].copy_from_slice(&(0x000du32 | (0x100 << 20)).to_le_bytes());
        assert!(parse(&c).acs_ctrl.is_some());
    }
}
