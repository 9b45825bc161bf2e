//! Rows as an aligned text table (the `query` and `report` output for a terminal).
//!
//! `-o table` fits [`WIDTH`] columns (or `$COLUMNS` where the shell sets it): the columns of
//! free text (reasons) give up width first, then the widest, and a cell too long
//! for its column is cut at a word with `…`; times show to the second, in UTC. `-o wide` shows
//! every column, the question's main ones first in their order, the rest after in name order,
//! an object's fields as columns of their own (`pin.nic`), a list's items joined with `; `;
//! nothing is cut. Every cell is made safe for a terminal ([`super::terminal`]).

use serde_json::Value;

/// The width `-o table` fits when `$COLUMNS` does not say.
pub const WIDTH: usize = 120;
/// The narrowest a column gives up width to.
const MIN_COLUMN: usize = 12;
/// Columns of free text: they give up width first (a recommendation's pin leads its text and
/// gives up width only after them).
const TEXT: &[&str] = &["reasons", "why", "diagnosis", "summary"];

/// Prints rows (a JSON array of flat objects) fitted to the terminal: `lead` columns first (those
/// the rows have), then every other in name order.
pub fn print_value(rows: &Value) {
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        println!("(none)");
        return;
    };
    let lead = ["node", "gpu", "nic", "status", "workload_nic", "failures", "probes", "reasons", "recommendation"];
    let cols = ordered(rows, &lead);
    print_columns(rows, &cols);
}

/// Prints `rows` with exactly `cols`, in that order (a missing value shows as `-`), fitted to
/// the terminal's width.
pub fn print_columns(rows: &[Value], cols: &[String]) {
    print!("{}", render(rows, cols, Some(width())));
}

/// Prints every column of `rows`, `main` first: objects flattened, nothing cut.
pub fn print_wide(rows: &Value, main: &[&str]) {
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        println!("(none)");
        return;
    };
    let flat: Vec<Value> = rows.iter().map(flatten).collect();
    let cols = ordered(&flat, main);
    print!("{}", render(&flat, &cols, None));
}

/// The terminal's width: `$COLUMNS` where it is a sane number, else [`WIDTH`].
fn width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|w| (40..=1000).contains(w)).unwrap_or(WIDTH)
}

/// The columns of `rows` (from every row: a later row may have a field the first lacks): those
/// of `lead` in its order, then the rest in name order.
fn ordered(rows: &[Value], lead: &[&str]) -> Vec<String> {
    let mut all = std::collections::BTreeSet::new();
    for r in rows {
        if let Some(o) = r.as_object() {
            all.extend(o.keys().cloned());
        }
    }
    let mut cols: Vec<String> = lead.iter().filter(|c| all.contains(**c)).map(|c| (*c).to_owned()).collect();
    cols.extend(all.into_iter().filter(|k| !lead.contains(&k.as_str())));
    cols
}

/// A row with its objects' fields as columns of their own (`pin.nic`), nested once per level.
fn flatten(row: &Value) -> Value {
    fn into(prefix: &str, v: &Value, out: &mut serde_json::Map<String, Value>) {
        match v {
            Value::Object(o) if !o.is_empty() => {
                for (k, v) in o {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    into(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_owned(), other.clone());
            }
        }
    }
    let mut out = serde_json::Map::new();
    into("", row, &mut out);
    Value::Object(out)
}

/// A cell's text: strings as they are (an RFC 3339 time to the second, in UTC), null as `-`,
/// a list's items joined with `; `, anything else as JSON; safe for a terminal.
fn cell(v: &Value) -> String {
    let text = match v {
        Value::String(s) => time(s).unwrap_or_else(|| s.clone()),
        Value::Null => "-".into(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => {
            a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned)).collect::<Vec<_>>().join("; ")
        }
        other => other.to_string(),
    };
    super::terminal::safe(&text).into_owned()
}

/// An RFC 3339 time as `2026-12-06 10:05:42Z`.
fn time(s: &str) -> Option<String> {
    let looks = s.len() >= 20 && s.as_bytes().get(10) == Some(&b'T') && s.as_bytes().get(4) == Some(&b'-');
    let t = chrono::DateTime::parse_from_rfc3339(s).ok().filter(|_| looks)?;
    Some(t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M:%SZ").to_string())
}

/// `text` in at most `width` characters: cut at the last word that fits, with `…`.
pub fn elide(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let head: String = text.chars().take(width - 1).collect();
    // At a word: the room ends one, or one ends in its last two thirds; else mid-word.
    let whole = text.chars().nth(width - 1) == Some(' ');
    let cut =
        if whole { Some(head.len()) } else { head.rfind(' ').filter(|&i| head[..i].chars().count() >= width / 3) };
    let kept = cut.map_or(head.as_str(), |i| head[..i].trim_end());
    format!("{kept}…")
}

/// Column widths for `natural` widths within `limit` (None: no limit): the text columns give up
/// width first, then any column, always the widest, never below [`MIN_COLUMN`] (or its header).
fn fit(cols: &[String], natural: &[usize], limit: Option<usize>) -> Vec<usize> {
    let mut widths = natural.to_vec();
    let Some(limit) = limit else { return widths };
    let gaps = 2 * cols.len().saturating_sub(1);
    let floor = |i: usize| MIN_COLUMN.max(cols[i].chars().count()).min(natural[i]);
    for text_first in [true, false] {
        loop {
            let total: usize = widths.iter().sum::<usize>() + gaps;
            if total <= limit {
                return widths;
            }
            let widest = (0..cols.len())
                .filter(|&i| !text_first || TEXT.contains(&cols[i].as_str()))
                .filter(|&i| widths[i] > floor(i))
                .max_by_key(|&i| (widths[i], std::cmp::Reverse(i)));
            let Some(i) = widest else { break };
            let next = (0..cols.len()).filter(|&j| j != i).map(|j| widths[j]).filter(|&w| w < widths[i]).max();
            let over = total - limit;
            // Down to the next widest column's width (so the widest share what is taken), or by
            // what is over, whichever takes less; never below the floor.
            let target = widths[i].saturating_sub(over).max(next.unwrap_or(0)).max(floor(i));
            widths[i] = if target < widths[i] { target } else { floor(i) };
        }
    }
    widths
}

/// The table's text: a header line and a line per row.
fn render(rows: &[Value], cols: &[String], limit: Option<usize>) -> String {
    if rows.is_empty() {
        return "(none)\n".into();
    }
    let header: Vec<String> = cols.iter().map(|c| super::terminal::safe(c).into_owned()).collect();
    let cells: Vec<Vec<String>> = rows.iter().map(|r| cols.iter().map(|c| cell(&r[c])).collect()).collect();
    let natural: Vec<usize> = (0..cols.len())
        .map(|i| cells.iter().map(|r| r[i].chars().count()).max().unwrap_or(0).max(header[i].chars().count()))
        .collect();
    let widths = fit(cols, &natural, limit);
    let line = |vals: &[String]| {
        let mut out = vals
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{:<w$}", elide(v, *w), w = *w))
            .collect::<Vec<_>>()
            .join("  ");
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(&header);
    for r in &cells {
        out.push_str(&line(r));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rows() -> Vec<Value> {
        (0..3)
            .map(|i| {
                serde_json::json!({
                    "node": format!("gpu-node-{i:04}"), "gpu": i, "status": "corrupting",
                    "verification": "gpu_memory", "workload_nic": "mlx5_0",
                    "recommendation": "UCX_NET_DEVICES=mlx5_1:1 (verified on the simulated fabric, not on hardware)",
                    "changed_at": "2026-12-06T10:05:42.123456Z",
                    "reasons": ["2 silent corruptions on the workload's pair GPU0 via mlx5_0 in the window, the NIC's own DMA into GPU memory", "second"],
                    "pin": {"nic": "mlx5_1", "path_class": "node"},
                })
            })
            .collect()
    }

    const MAIN: &[&str] =
        &["node", "gpu", "status", "verification", "workload_nic", "recommendation", "changed_at", "reasons"];

    #[test]
    fn the_table_fits_its_width_cutting_free_text_at_a_word() {
        let cols: Vec<String> = MAIN.iter().map(|c| (*c).to_owned()).collect();
        let text = render(&rows(), &cols, Some(120));
        for line in text.lines() {
            assert!(line.chars().count() <= 120, "{} wide: {line}", line.chars().count());
        }
        let first = text.lines().nth(1).unwrap();
        // Identity, status and time whole; the time to the second, in UTC.
        assert!(first.starts_with("gpu-node-0000  0    corrupting  gpu_memory    mlx5_0"), "{text}");
        assert!(first.contains("2026-12-06 10:05:42Z"), "{text}");
        // The free text cut at a word, said so.
        let full = "2 silent corruptions on the workload's pair GPU0 via mlx5_0 in the window";
        let reason = first.rsplit("  ").next().unwrap();
        let kept = reason.strip_suffix('…').unwrap_or_else(|| panic!("not cut: {reason}"));
        assert!(full.starts_with(kept) && full[kept.len()..].starts_with(' '), "cut mid-word: {reason}");
        // Without a limit nothing is cut.
        let wide = render(&rows(), &cols, None);
        assert!(wide.contains("not on hardware)") && !wide.contains('…'), "{wide}");
    }

    #[test]
    fn wide_puts_the_main_columns_first_and_flattens_objects() {
        let flat: Vec<Value> = rows().iter().map(flatten).collect();
        let cols = ordered(&flat, MAIN);
        assert_eq!(&cols[..MAIN.len()], MAIN);
        assert_eq!(&cols[MAIN.len()..], ["pin.nic", "pin.path_class"]);
        let text = render(&flat, &cols, None);
        assert!(text.lines().next().unwrap().ends_with("pin.nic  pin.path_class"), "{text}");
        assert!(text.contains("; second"), "a list's items are joined: {text}");
    }

    #[test]
    fn eliding_cuts_at_a_word_or_mid_word_when_none_ends_late_enough() {
        assert_eq!(elide("short", 10), "short");
        assert_eq!(elide("one two three four", 12), "one two…");
        assert_eq!(elide("abcdefghijklmnop", 8), "abcdefg…");
        assert_eq!(elide("one two three", 8), "one two…", "the room ends a word");
        assert_eq!(elide("x", 0), "");
        for w in 1..30 {
            assert!(elide("the quick brown fox jumps over the lazy dog", w).chars().count() <= w);
        }
    }

    #[test]
    fn fitting_takes_from_text_columns_first_then_the_widest() {
        let cols: Vec<String> = ["node", "reasons", "changed_at"].iter().map(|c| (*c).to_owned()).collect();
        assert_eq!(fit(&cols, &[20, 100, 20], Some(80)), vec![20, 36, 20]);
        // Text at its floor and still over: the widest of the rest gives way.
        assert_eq!(fit(&cols, &[60, 100, 20], Some(60)), vec![24, 12, 20]);
        // Nothing can give more: as narrow as the floors allow.
        assert_eq!(fit(&cols, &[30, 30, 30], Some(10)), vec![12, 12, 12]);
    }
}
