//! `scripts/setup.sh` installs everything the project runs: every program a script, a Rust
//! source or a Python source runs by name is named in `scripts/needs.list`, which setup.sh
//! reads; and every program the list says a Debian system or setup.sh provides is here.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use railguard_e2e::needs::{NeedKind, parse_list, python_programs, rust_programs, shell_programs};

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).canonicalize().unwrap()
}

/// Files under `dir` (recursively) whose name ends with `ext`, skipping build output and
/// virtual environments.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "node_modules" | ".venv" | "__pycache__") {
                files(&p, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(p);
        }
    }
}

/// The programs each source file runs, by the file that runs it.
fn programs_run() -> BTreeMap<String, BTreeSet<String>> {
    let root = root();
    let mut by_program: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut note = |programs: BTreeSet<String>, file: &Path| {
        for p in programs {
            by_program.entry(p).or_default().insert(file.strip_prefix(&root).unwrap().display().to_string());
        }
    };
    let mut scripts = Vec::new();
    files(&root.join("scripts"), ".sh", &mut scripts);
    for f in &scripts {
        note(shell_programs(&std::fs::read_to_string(f).unwrap()), f);
    }
    let mut rust = Vec::new();
    for crate_dir in ["agent", "collector", "e2e", "schema", "telemetry", "testkit"] {
        files(&root.join(crate_dir), ".rs", &mut rust);
    }
    // The scanner's own source holds its tests' sample text, not spawns.
    for f in rust.iter().filter(|f| !f.ends_with("e2e/src/needs.rs")) {
        note(rust_programs(&std::fs::read_to_string(f).unwrap()), f);
    }
    let mut python = Vec::new();
    files(&root.join("integrations"), ".py", &mut python);
    files(&root.join("agent/tests"), ".py", &mut python);
    for f in &python {
        note(python_programs(&std::fs::read_to_string(f).unwrap()), f);
    }
    assert!(
        scripts.len() >= 8 && rust.len() >= 100,
        "the sources were found: {} scripts, {} Rust",
        scripts.len(),
        rust.len()
    );
    by_program
}

#[test]
fn every_program_the_project_runs_is_in_the_list_setup_installs_from() {
    let root = root();
    let list = parse_list(&std::fs::read_to_string(root.join("scripts/needs.list")).unwrap()).unwrap();
    let named: BTreeSet<&str> = list.iter().filter(|n| n.kind.is_program()).map(|n| n.name.as_str()).collect();
    // The project's own binaries run by name.
    let own = ["railguard-agent", "railguard-collector"];
    let missing: Vec<String> = programs_run()
        .into_iter()
        .filter(|(p, _)| !named.contains(p.as_str()) && !own.contains(&p.as_str()))
        .map(|(p, files)| format!("{p} (run by {})", files.into_iter().collect::<Vec<_>>().join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "programs run but not in scripts/needs.list (add each with its Debian package, so scripts/setup.sh installs it):\n  {}",
        missing.join("\n  ")
    );
    // setup.sh installs from the list (it reads it), and the test's check is what it checks.
    let setup = std::fs::read_to_string(root.join("scripts/setup.sh")).unwrap();
    assert!(setup.contains("needs.list"), "scripts/setup.sh reads scripts/needs.list");
}

/// What setup.sh ran for: every program the list names as installed by it or by Debian is on
/// this machine (the suite runs after setup.sh), and every file glob matches.
#[test]
fn everything_the_list_names_is_here_after_setup() {
    let list = parse_list(&std::fs::read_to_string(root().join("scripts/needs.list")).unwrap()).unwrap();
    let on_path = |name: &str| {
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file())).unwrap_or(false)
    };
    let mut absent = Vec::new();
    for n in &list {
        let here = match n.kind {
            NeedKind::Cmd | NeedKind::Base | NeedKind::PyPi | NeedKind::Rust => on_path(&n.name),
            NeedKind::File => glob_matches(&n.name),
            NeedKind::PyMod => std::process::Command::new("python3")
                .args(["-c", &format!("import {}", n.name)])
                .status()
                .is_ok_and(|s| s.success()),
            NeedKind::Opt => true,
        };
        if !here {
            absent.push(format!("{:?} {} ({})", n.kind, n.name, n.package));
        }
    }
    assert!(absent.is_empty(), "named in scripts/needs.list but not on this machine after setup.sh: {absent:?}");
}

/// A glob with `*` in any component (as the list's `file` lines use), matched on the filesystem.
fn glob_matches(pattern: &str) -> bool {
    fn walk(dir: &Path, parts: &[&str]) -> bool {
        let Some((first, rest)) = parts.split_first() else { return true };
        if !first.contains('*') {
            let p = dir.join(first);
            return if rest.is_empty() { p.exists() } else { p.is_dir() && walk(&p, rest) };
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return false };
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            wildcard(first, &name) && (rest.is_empty() || walk(&e.path(), rest))
        })
    }
    let parts: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    walk(Path::new("/"), &parts)
}

/// `*` matches any run of characters.
fn wildcard(pattern: &str, name: &str) -> bool {
    let pieces: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut at = first.len();
    let end = name.len() - last.len();
    for mid in &pieces[1..pieces.len() - 1] {
        match name[at..end].find(mid) {
            Some(i) => at += i + mid.len(),
            None => return false,
        }
    }
    true
}
