//! docs/configuration.md shows every command's `--help` exactly as the binaries print it, so the
//! reference cannot drift from the flags. After changing a flag, regenerate it with
//! `RAILGUARD_BLESS=1 cargo nextest run -p railguard-e2e -E 'binary(cli_docs)'`.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use railguard_e2e::bin;

/// Every command a user runs, as (binary, arguments).
const COMMANDS: &[(&str, &[&str])] = &[
    ("railguard-collector", &["serve"]),
    ("railguard-collector", &["query", "failures"]),
    ("railguard-collector", &["query", "gpus"]),
    ("railguard-collector", &["query", "nodes"]),
    ("railguard-collector", &["query", "history"]),
    ("railguard-collector", &["export"]),
    ("railguard-collector", &["report"]),
    ("railguard-agent", &["run"]),
    ("railguard-agent", &["topo"]),
    ("railguard-agent", &["probe"]),
    ("railguard-agent", &["preflight"]),
    ("railguard-agent", &["selftest"]),
    ("railguard-agent", &["watch"]),
    ("railguard-agent", &["snapshot"]),
    ("railguard-agent", &["sim-fixture"]),
];

fn help(binary: &str, args: &[&str]) -> String {
    // A clean environment: clap prints an `[env: NAME=value]` it finds set.
    let out = std::process::Command::new(bin(binary))
        .args(args)
        .arg("--help")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    assert!(out.status.success(), "{binary} {args:?} --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn block(binary: &str, args: &[&str], text: &str) -> (String, String, String) {
    let name = format!("{binary} {}", args.join(" "));
    let begin = format!("<!-- BEGIN {name} --help -->\n```text\n");
    let end = format!("```\n<!-- END {name} --help -->");
    (begin.clone() + text + &end, begin, end)
}

/// Options of a `--help` text that have no description (a flag without a doc comment), and
/// possible values without one (`- name` instead of `- name: what it means`).
fn undescribed(help: &str) -> Vec<String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if let Some(value) = t.strip_prefix("- ") {
            if !value.contains(": ") {
                out.push(t.to_owned());
            }
            continue;
        }
        let is_option = t.starts_with("--") || t.chars().nth(1).is_some_and(|c| c.is_ascii_alphanumeric());
        if !t.starts_with('-') || !is_option {
            continue;
        }
        // `--flag <V>  text` on one line, or the text indented on the next line.
        let inline = t.split("  ").skip(1).any(|s| !s.trim().is_empty());
        let next = lines.get(i + 1).is_some_and(|n| {
            let indent = n.len() - n.trim_start().len();
            indent > line.len() - t.len() && !n.trim_start().starts_with('-') && !n.trim().is_empty()
        });
        if !inline && !next {
            out.push(t.to_owned());
        }
    }
    out
}

#[test]
fn every_flag_says_what_it_does() {
    let missing: Vec<String> = COMMANDS
        .iter()
        .flat_map(|(binary, args)| {
            undescribed(&help(binary, args)).into_iter().map(move |o| format!("{binary} {}: {o}", args.join(" ")))
        })
        .collect();
    assert!(missing.is_empty(), "flags without a doc comment:\n{}", missing.join("\n"));
    assert_eq!(
        undescribed("  -x, --flag <V>\n  -y  why\n      - a: fine\n      - b\n"),
        vec!["-x, --flag <V>", "- b"],
        "the check itself"
    );
}

#[test]
fn configuration_md_shows_every_commands_help() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let mut doc = std::fs::read_to_string(&path).unwrap();
    let bless = std::env::var("RAILGUARD_BLESS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (binary, args) in COMMANDS {
        let (want, begin, end) = block(binary, args, &help(binary, args));
        let Some(start) = doc.find(&begin) else {
            stale.push(format!("{binary} {args:?}: no block (add `{}` … `{end}`)", begin.trim_end()));
            continue;
        };
        let Some(len) = doc[start..].find(&end).map(|i| i + end.len()) else {
            stale.push(format!("{binary} {args:?}: block not closed"));
            continue;
        };
        if doc[start..start + len] != want {
            stale.push(format!("{binary} {args:?}: --help changed"));
            doc.replace_range(start..start + len, &want);
        }
    }
    if bless && stale.iter().all(|s| s.ends_with("--help changed")) {
        std::fs::write(&path, doc).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/configuration.md is stale (RAILGUARD_BLESS=1 regenerates the blocks):\n{}",
        stale.join("\n")
    );
}
