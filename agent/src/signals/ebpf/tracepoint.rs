//! Kernel tracepoints as evidence: which ones (IOMMU faults, PCIe AER, NIC health), and their
//! raw records decoded with the `format` file the running kernel publishes (read at run time,
//! so a kernel that moved a field is still read right).

use std::collections::BTreeMap;

use railguard_schema::SignalKind;

/// A watched tracepoint: category, name, the kernel program that copies it, the signal it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracepoint {
    pub category: &'static str,
    pub name: &'static str,
    pub program: &'static str,
    pub kind: SignalKind,
}

/// The tracepoints, in the order the kernel programs number them (`rg_tracepoint_event.tp`).
pub const TRACEPOINTS: [Tracepoint; 3] = [
    Tracepoint {
        category: "iommu",
        name: "io_page_fault",
        program: "tp_iommu_io_page_fault",
        kind: SignalKind::IommuPageFault,
    },
    Tracepoint { category: "ras", name: "aer_event", program: "tp_ras_aer_event", kind: SignalKind::PcieAer },
    Tracepoint {
        category: "devlink",
        name: "devlink_health_report",
        program: "tp_devlink_health_report",
        kind: SignalKind::NicHealthReport,
    },
];

/// One field of a tracepoint format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub data_loc: bool,
}

/// Parses `events/<category>/<name>/format`.
pub fn parse_format(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let decl = l.strip_prefix("field:")?.split(';').next()?;
            let name = decl.split_whitespace().last()?.split('[').next()?.to_owned();
            let num = |key: &str| -> Option<usize> { l.split(key).nth(1)?.split(';').next()?.trim().parse().ok() };
            Some(Field { name, offset: num("offset:")?, size: num("size:")?, data_loc: decl.contains("__data_loc") })
        })
        .collect()
}

/// Decodes a raw record into name → value strings (integers, `__data_loc` strings). A field the
/// record is too short to hold is left out.
pub fn decode_record(fields: &[Field], raw: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for f in fields.iter().filter(|f| !f.name.starts_with("common_")) {
        let Some(bytes) = raw.get(f.offset..f.offset + f.size) else { continue };
        let v = if f.data_loc && f.size == 4 {
            let loc = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let (off, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
            match raw.get(off..off + len) {
                Some(s) => String::from_utf8_lossy(s).trim_end_matches('\0').to_owned(),
                None => continue,
            }
        } else {
            match f.size {
                1 => bytes[0].to_string(),
                2 => u16::from_ne_bytes([bytes[0], bytes[1]]).to_string(),
                4 => format!("0x{:x}", u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                8 => format!("0x{:x}", u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]))),
                _ => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            }
        };
        out.insert(f.name.clone(), v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_files_decode_records() {
        let fmt = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                   \tfield:__data_loc char[] device;\toffset:8;\tsize:4;\tsigned:0;\n\
                   \tfield:u64 iova;\toffset:16;\tsize:8;\tsigned:0;\n";
        let f = parse_format(fmt);
        assert_eq!(f.len(), 3);
        let mut raw = vec![0u8; 64];
        raw[8..12].copy_from_slice(&((13u32 << 16) | 40).to_ne_bytes());
        raw[40..53].copy_from_slice(b"0000:3b:00.0\0");
        raw[16..24].copy_from_slice(&0x7fff_0000u64.to_ne_bytes());
        let d = decode_record(&f, &raw);
        assert_eq!(d["device"], "0000:3b:00.0");
        assert_eq!(d["iova"], "0x7fff0000");
        // A truncated record drops what it cannot hold, never panics.
        assert!(!decode_record(&f, &raw[..20]).contains_key("device"));
    }
}
