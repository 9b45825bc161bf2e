//! What UCX says it used, from its protocol-selection tables (`UCX_PROTO_INFO=y`). NIXL does not
//! expose its UCX endpoints, so this is the only account of the lanes a NIXL transfer took. UCX
//! prints one table per worker, endpoint configuration and operation when it first selects a
//! protocol for them:
//!
//! ```text
//! [ts] [host:pid:thr]   | D intra-node cfg#1                                               |
//! [ts] [host:pid:thr]   | remote memory read by ucp_get*(multi) into host memory from host |
//! [ts] [host:pid:thr]   | Range  |    Description     |               Config               |
//! [ts] [host:pid:thr]   | 0..inf | software emulation | tcp/lo                             |
//! ```

/// One row: the message sizes it covers, the protocol, the lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub min: u64,
    /// Inclusive; `u64::MAX` for `inf`.
    pub max: u64,
    /// `zero-copy`, `software emulation`, `multi-frag copy-in`, `short`, ...
    pub protocol: String,
    /// `transport/device` as UCX names them (`rc_mlx5/mlx5_0:1`, `tcp/lo`, `cma/memory`).
    pub lanes: Vec<String>,
}

/// One table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The UCX worker's name (NIXL names it after its agent).
    pub worker: String,
    /// `self`, `intra-node` or `inter-node`.
    pub scope: String,
    pub cfg: u32,
    /// `remote memory read by ucp_get*(multi) into host memory from host`, ...
    pub operation: String,
    pub rows: Vec<Row>,
}

impl Table {
    /// A remote read (`ucp_get*`), as NIXL's READ is.
    pub fn is_read(&self) -> bool {
        self.operation.starts_with("remote memory read")
    }
    /// A remote write (`ucp_put*`), as NIXL's WRITE is.
    pub fn is_write(&self) -> bool {
        self.operation.starts_with("remote memory write")
    }
    /// The row that serves a message of `size` bytes.
    pub fn row_for(&self, size: u64) -> Option<&Row> {
        self.rows.iter().find(|r| r.min <= size && size <= r.max)
    }
}

/// The table cells of a line, without UCX's `[time] [host:pid:thread]` prefix; None for a line
/// that is not a table row.
fn cells(line: &str) -> Option<Vec<&str>> {
    let start = line.find('|')?;
    let body = line[start..].trim_end();
    let inner = body.strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

fn bound(s: &str) -> Option<u64> {
    if s == "inf" { Some(u64::MAX) } else { s.parse().ok() }
}

/// `0..inf`, `627..16515`, `0`.
fn range(s: &str) -> Option<(u64, u64)> {
    match s.split_once("..") {
        Some((a, b)) => Some((bound(a)?, bound(b)?)),
        None => bound(s).map(|v| (v, v)),
    }
}

/// Tokens of a Config cell that name a lane: `tcp/lo`, `rc_mlx5/mlx5_0:1` (percentages and
/// words between them are skipped).
fn lanes(config: &str) -> Vec<String> {
    config
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| {
            let Some((tl, dev)) = t.split_once('/') else { return false };
            !tl.is_empty()
                && !dev.is_empty()
                && tl.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && dev.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-'))
        })
        .map(str::to_owned)
        .collect()
}

/// Every complete table in `text` (UCX's log: other lines are skipped; a table cut short keeps
/// the rows it has).
pub fn parse(text: &str) -> Vec<Table> {
    let mut out: Vec<Table> = Vec::new();
    let mut cur: Option<Table> = None;
    for line in text.lines() {
        let Some(c) = cells(line) else { continue };
        match c.as_slice() {
            [one] => {
                let words: Vec<&str> = one.split_whitespace().collect();
                let header = match words.as_slice() {
                    [w, scope, cfg] => cfg.strip_prefix("cfg#").and_then(|n| n.parse().ok()).map(|n| (w, scope, n)),
                    _ => None,
                };
                match (header, cur.as_mut()) {
                    (Some((w, scope, cfg)), _) => {
                        out.extend(cur.take());
                        cur = Some(Table {
                            worker: (*w).to_owned(),
                            scope: (*scope).to_owned(),
                            cfg,
                            operation: String::new(),
                            rows: Vec::new(),
                        });
                    }
                    (None, Some(t)) if t.operation.is_empty() => t.operation = (*one).to_owned(),
                    _ => {}
                }
            }
            [r, protocol, config] => {
                if let (Some(t), Some((min, max))) = (cur.as_mut(), range(r)) {
                    t.rows.push(Row { min, max, protocol: (*protocol).to_owned(), lanes: lanes(config) });
                }
            }
            _ => {}
        }
    }
    out.extend(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As UCX 1.23 (NIXL 1.5.1's wheel) printed it here: a READ over `UCX_TLS=tcp`, the same
    /// over `tcp,self,sm` (CMA), and an active-message table with several rows.
    const LO: &str = include_str!("proto_info_lo.txt");

    #[test]
    fn reads_ucx_tables_as_printed() {
        let t = parse(LO);
        assert_eq!(t.len(), 3, "{t:#?}");
        assert_eq!((t[0].worker.as_str(), t[0].scope.as_str(), t[0].cfg), ("D", "intra-node", 1));
        assert!(t[0].is_read() && !t[0].is_write());
        assert_eq!(
            t[0].rows,
            [Row { min: 0, max: u64::MAX, protocol: "software emulation".into(), lanes: vec!["tcp/lo".into()] }]
        );
        assert_eq!(t[1].rows[0].lanes, ["cma/memory"]);
        assert_eq!(t[1].rows[0].protocol, "zero-copy");
        let am = &t[2];
        assert_eq!(am.scope, "self");
        assert!(!am.is_read() && !am.is_write());
        assert_eq!(am.row_for(0).unwrap().protocol, "short");
        assert_eq!(am.row_for(16515).unwrap().protocol, "zero-copy");
        assert_eq!(am.row_for(1 << 20).unwrap().protocol, "multi-frag copy-in");
    }

    #[test]
    fn multi_rail_and_odd_lines() {
        let text = "junk\n| E inter-node cfg#3 |\n| remote memory write by ucp_put* from host memory to host |\n\
            | Range | Description | Config |\n| 0..8192 | short | rc_mlx5/mlx5_0:1 |\n\
            | 8193..inf | zero-copy | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 |\n\
            | not a | row |\n| 12..x | bad range | tcp/lo |\n";
        let t = parse(text);
        assert_eq!(t.len(), 1);
        assert!(t[0].is_write());
        assert_eq!(t[0].rows.len(), 2, "the malformed rows are skipped");
        assert_eq!(t[0].row_for(1 << 20).unwrap().lanes, ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1"]);
        assert!(parse("").is_empty());
    }
}
