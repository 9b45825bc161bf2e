//! How the reading commands print what they read (`-o table|wide|json|yaml`).
//!
//! `table` shows the columns a person scans (per question), fitted to the terminal; `wide`
//! every column, those first, nothing cut ([`table`]); `json` the
//! rows as the API returns them; `yaml` the same in YAML (block style, every string
//! double-quoted, so a node named `no` or `1e3` stays a string).

use std::fmt::Write;

use serde_json::Value;

use super::{table, terminal};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// The main columns, aligned.
    Table,
    /// Every column, aligned.
    Wide,
    /// The rows as the API returns them.
    Json,
    /// The same rows in YAML.
    Yaml,
}

/// Prints `rows` (a JSON array of flat objects) in `format`; `columns`: the table's columns
/// (those a row has), in order.
pub fn print(rows: &Value, format: OutputFormat, columns: &[&str]) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => println!("{}", terminal::json_safe(serde_json::to_string_pretty(rows)?)),
        OutputFormat::Yaml => print!("{}", terminal::json_safe(yaml(rows))),
        OutputFormat::Wide => table::print_wide(rows, columns),
        OutputFormat::Table => match (rows.as_array(), columns_of(rows, columns)) {
            (Some(arr), Some(cols)) => table::print_columns(arr, &cols),
            _ => table::print_value(rows),
        },
    }
    Ok(())
}

/// Those of `columns` the first row has, in order; None when it has none of them (every column
/// is shown then).
fn columns_of(rows: &Value, columns: &[&str]) -> Option<Vec<String>> {
    let first = rows.as_array()?.first()?;
    let keep: Vec<String> = columns.iter().filter(|c| first.get(**c).is_some()).map(|c| (*c).to_owned()).collect();
    (!keep.is_empty()).then_some(keep)
}

/// YAML for a JSON value: block collections, strings as JSON string literals (valid YAML
/// double-quoted scalars), numbers, booleans and null as they are.
pub fn yaml(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Array(a) if a.is_empty() => out.push_str("[]\n"),
        Value::Object(o) if o.is_empty() => out.push_str("{}\n"),
        Value::Array(_) | Value::Object(_) => block(&mut out, v, 0),
        scalar => {
            let _ = writeln!(out, "{}", inline(scalar));
        }
    }
    out
}

fn inline(v: &Value) -> String {
    match v {
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        // A JSON string literal is a YAML double-quoted scalar.
        other => other.to_string(),
    }
}

fn nested(v: &Value) -> bool {
    matches!(v, Value::Array(a) if !a.is_empty()) || matches!(v, Value::Object(o) if !o.is_empty())
}

fn block(out: &mut String, v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match v {
        Value::Array(a) => {
            for item in a {
                if nested(item) {
                    // "- " then the item's first line on the same line, the rest indented.
                    let mut inner = String::new();
                    block(&mut inner, item, indent + 2);
                    let _ = write!(out, "{pad}- {}", &inner[indent + 2..]);
                } else {
                    let _ = writeln!(out, "{pad}- {}", inline(item));
                }
            }
        }
        Value::Object(o) => {
            for (k, item) in o {
                let key = Value::String(k.clone()).to_string();
                if nested(item) {
                    let _ = writeln!(out, "{pad}{key}:");
                    block(out, item, indent + 2);
                } else {
                    let _ = writeln!(out, "{pad}{key}: {}", inline(item));
                }
            }
        }
        scalar => {
            let _ = writeln!(out, "{pad}{}", inline(scalar));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_keeps_structure_and_quotes_every_string() {
        let v = serde_json::json!([
            {"node": "no", "gpu": 3, "reasons": ["a: b", "\"quoted\"\n"], "pin": {"nic": "mlx5_2", "verified": false}, "x": null, "e": []},
            {"node": "1e3", "gpu": 0, "reasons": [], "pin": null, "x": 1.5, "e": {}}
        ]);
        let y = yaml(&v);
        // Keys come sorted (serde_json's map).
        assert_eq!(
            y,
            "- \"e\": []\n  \"gpu\": 3\n  \"node\": \"no\"\n  \"pin\":\n    \"nic\": \"mlx5_2\"\n    \"verified\": false\n  \"reasons\":\n    - \"a: b\"\n    - \"\\\"quoted\\\"\\n\"\n  \"x\": null\n\
             - \"e\": {}\n  \"gpu\": 0\n  \"node\": \"1e3\"\n  \"pin\": null\n  \"reasons\": []\n  \"x\": 1.5\n"
        );
        assert_eq!(yaml(&serde_json::json!([])), "[]\n");
    }

    #[test]
    fn the_table_keeps_the_named_columns_in_order() {
        let v = serde_json::json!([{"a": 1, "b": 2, "c": 3}]);
        assert_eq!(columns_of(&v, &["c", "a", "z"]), Some(vec!["c".to_owned(), "a".to_owned()]));
        assert_eq!(columns_of(&v, &["z"]), None, "no named column: every column");
        assert_eq!(columns_of(&serde_json::json!([]), &["a"]), None);
    }
}
