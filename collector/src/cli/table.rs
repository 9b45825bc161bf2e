//! Rows as an aligned text table (the `query` and `report` output without --json).

/// Prints rows (a JSON array of flat objects) as a table: identity columns first, in reading
/// order, the rest as they come; arrays show their first element.
pub fn print_value(rows: &serde_json::Value) {
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        println!("(none)");
        return;
    };
    let lead = ["node", "gpu", "nic", "status", "workload_nic", "failures", "probes", "reasons", "recommendation"];
    let mut cols: Vec<String> = lead.iter().filter(|c| rows[0].get(**c).is_some()).map(|c| (*c).to_owned()).collect();
    cols.extend(
        rows[0]
            .as_object()
            .map(|o| o.keys().filter(|k| !lead.contains(&k.as_str())).cloned().collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    print_columns(rows, &cols);
}

/// Prints `rows` with exactly `cols`, in that order (a missing value shows as `-`).
pub fn print_columns(rows: &[serde_json::Value], cols: &[String]) {
    if rows.is_empty() {
        println!("(none)");
        return;
    }
    // Every cell as text a terminal shows and never acts on (super::terminal).
    let cell = |v: &serde_json::Value| {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            serde_json::Value::Array(a) => {
                a.first().map(|f| f.as_str().map_or_else(|| f.to_string(), str::to_owned)).unwrap_or_else(|| "-".into())
            }
            other => other.to_string(),
        };
        super::terminal::safe(&text).into_owned()
    };
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| rows.iter().map(|r| cell(&r[c]).chars().count()).max().unwrap_or(0).max(c.len()).min(80))
        .collect();
    let line = |vals: Vec<String>| {
        vals.iter()
            .zip(&widths)
            .map(|(v, w)| format!("{:<w$}", v.chars().take(80).collect::<String>(), w = *w))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(cols.iter().map(|c| super::terminal::safe(c).into_owned()).collect()));
    for r in rows {
        println!("{}", line(cols.iter().map(|c| cell(&r[c])).collect()));
    }
}
