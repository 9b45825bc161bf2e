//! The events the kernel programs write into the ring buffer: `#[repr(C)]` mirrors of
//! `ebpf/railguard_events.h`, checked field by field against the header by a test that parses it.

/// `RG_EV_UCX_ERROR_CQE`: a [`UcxCqeEvent`].
pub const EV_UCX_ERROR_CQE: u32 = 100;
/// `RG_EV_STATUS_RETURN`: a [`StatusEvent`].
pub const EV_STATUS_RETURN: u32 = 102;
/// `RG_EV_TRACEPOINT`: a [`TracepointEvent`].
pub const EV_TRACEPOINT: u32 = 200;

/// Mirrors `struct rg_ucx_cqe_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UcxCqeEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub log_level: i32,
    pub ktime_ns: u64,
    pub cqe: [u8; 64],
    /// Which attached library fired: an index into the agent's attach list.
    pub cookie: u64,
}

/// Mirrors `struct rg_tracepoint_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TracepointEvent {
    pub kind: u32,
    pub tp: u32,
    pub len: u32,
    pub pad: u32,
    pub ktime_ns: u64,
    pub raw: [u8; 256],
}

/// Mirrors `struct rg_status_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StatusEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub pad: u32,
    pub ktime_ns: u64,
    pub status: i64,
    pub cookie: u64,
}

/// An event read out of a ring-buffer item, if the item is at least that large.
#[allow(unsafe_code)] // the one read of kernel-written bytes as an event; see SAFETY
pub fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: T is one of the #[repr(C)] plain-data events above (every bit pattern valid);
    // the size was checked, and the read is unaligned because ring-buffer items need not be.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A field of a struct in the header: name, size of one element, element count.
    #[derive(Debug)]
    struct CField {
        name: String,
        size: usize,
        count: usize,
    }

    /// Parses `#define NAME number` and the `struct rg_* { ... };` blocks of the header.
    fn parse_header(text: &str) -> (BTreeMap<String, usize>, BTreeMap<String, Vec<CField>>) {
        let mut defines = BTreeMap::new();
        let mut structs = BTreeMap::new();
        let mut current: Option<(String, Vec<CField>)> = None;
        for line in text.lines() {
            let code = line.split("/*").next().unwrap_or("").trim();
            if let Some(rest) = code.strip_prefix("#define ") {
                let mut it = rest.split_whitespace();
                if let (Some(name), Some(value)) = (it.next(), it.next())
                    && let Ok(v) = value.parse::<usize>()
                {
                    defines.insert(name.to_owned(), v);
                }
            } else if let Some(name) = code.strip_prefix("struct ").and_then(|r| r.strip_suffix('{')) {
                current = Some((name.trim().to_owned(), Vec::new()));
            } else if code.starts_with("};") {
                if let Some((name, fields)) = current.take() {
                    structs.insert(name, fields);
                }
            } else if let Some((_, fields)) = current.as_mut()
                && let Some(decl) = code.strip_suffix(';')
            {
                let mut it = decl.split_whitespace();
                let (Some(ty), Some(name)) = (it.next(), it.next()) else { continue };
                let size = match ty {
                    "__u8" | "__s8" => 1,
                    "__u16" | "__s16" => 2,
                    "__u32" | "__s32" => 4,
                    "__u64" | "__s64" => 8,
                    other => panic!("unknown type {other} in the header"),
                };
                let (name, count) = match name.split_once('[') {
                    Some((n, len)) => {
                        let len = len.trim_end_matches(']');
                        (n, len.parse().unwrap_or_else(|_| defines[len]))
                    }
                    None => (name, 1),
                };
                fields.push(CField { name: name.to_owned(), size, count });
            }
        }
        (defines, structs)
    }

    /// C layout (natural alignment, no packing): each field's offset, and the struct's size.
    fn c_layout(fields: &[CField]) -> (Vec<(String, usize)>, usize) {
        let (mut offset, mut align) = (0usize, 1usize);
        let mut out = Vec::new();
        for f in fields {
            offset = offset.next_multiple_of(f.size);
            align = align.max(f.size);
            out.push((f.name.clone(), offset));
            offset += f.size * f.count;
        }
        (out, offset.next_multiple_of(align))
    }

    #[test]
    fn layouts_match_the_c_header() {
        let header = include_str!("../../../../ebpf/railguard_events.h");
        let (defines, structs) = parse_header(header);
        assert_eq!(defines["RG_EV_UCX_ERROR_CQE"], EV_UCX_ERROR_CQE as usize);
        assert_eq!(defines["RG_EV_STATUS_RETURN"], EV_STATUS_RETURN as usize);
        assert_eq!(defines["RG_EV_TRACEPOINT"], EV_TRACEPOINT as usize);

        macro_rules! check {
            ($c:literal, $rust:ty, [$($field:ident),*]) => {{
                let (offsets, size) = c_layout(&structs[$c]);
                let rust: Vec<(String, usize)> =
                    vec![$((stringify!($field).to_owned(), std::mem::offset_of!($rust, $field))),*];
                assert_eq!(rust, offsets, "{} field names and offsets", $c);
                assert_eq!(std::mem::size_of::<$rust>(), size, "{} size", $c);
            }};
        }
        check!("rg_ucx_cqe_event", UcxCqeEvent, [kind, pid, tid, log_level, ktime_ns, cqe, cookie]);
        check!("rg_tracepoint_event", TracepointEvent, [kind, tp, len, pad, ktime_ns, raw]);
        check!("rg_status_event", StatusEvent, [kind, pid, tid, pad, ktime_ns, status, cookie]);
        assert_eq!(structs.len(), 3, "a struct in the header has no Rust mirror: {:?}", structs.keys());
    }

    #[test]
    fn short_items_are_not_read() {
        assert!(read::<UcxCqeEvent>(&[0u8; 10]).is_none());
        let mut bytes = vec![0u8; std::mem::size_of::<StatusEvent>()];
        bytes[..4].copy_from_slice(&EV_STATUS_RETURN.to_ne_bytes());
        assert_eq!(read::<StatusEvent>(&bytes).unwrap().kind, EV_STATUS_RETURN);
    }
}
