//! The shape of the code: no two sibling modules of any crate reach each other
//! ([`railguard_e2e::modules`]), and the check itself resolves paths the way rustc does.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use railguard_e2e::modules::{Crate, Cycle};

fn cycles_of(root: &Path) -> Vec<Cycle> {
    Crate::read(root).unwrap_or_else(|e| panic!("{e}")).cycles()
}

#[test]
fn no_crate_of_the_workspace_has_a_module_cycle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut found = Vec::new();
    let mut modules = 0;
    for krate in ["agent", "collector", "schema", "telemetry", "testkit", "e2e"] {
        let root = workspace.join(krate).join("src/lib.rs");
        let read = Crate::read(&root).unwrap_or_else(|e| panic!("{e}"));
        modules += read.modules.len();
        found.extend(read.cycles().into_iter().map(|c| format!("{krate}: {c}")));
    }
    assert!(modules > 150, "the walk found only {modules} modules: it no longer follows `mod` declarations");
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// A fixture crate: `tasks.rs` (not `mod.rs`) declares `a` and `b`, which live in `tasks/`.
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

#[test]
fn super_in_a_child_of_a_file_that_is_not_mod_rs_is_that_file() {
    let dir = fixture(&[
        ("src/lib.rs", "mod tasks;\npub fn top() {}\n"),
        ("src/tasks.rs", "mod a;\nmod b;\npub use a::A;\n"),
        ("src/tasks/a.rs", "use super::b::B;\npub struct A(B);\n"),
        ("src/tasks/b.rs", "pub struct B;\npub fn f() { super::a::A(B); }\n"),
    ]);
    let cycles = cycles_of(&dir.path().join("src/lib.rs"));
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].room, vec!["tasks".to_string()]);
    assert_eq!(cycles[0].members, ["a", "b"]);
    assert!(cycles[0].evidence.iter().any(|e| e.ends_with("a.rs:1 names tasks::b")), "{:?}", cycles[0].evidence);
    assert!(cycles[0].evidence.iter().any(|e| e.ends_with("b.rs:2 names tasks::a")), "{:?}", cycles[0].evidence);
}

#[test]
fn a_third_module_breaks_the_cycle_and_tests_comments_and_strings_do_not_count() {
    let dir = fixture(&[
        ("src/lib.rs", "pub mod tasks;\n"),
        ("src/tasks/mod.rs", "mod a;\nmod b;\nmod shared;\n"),
        ("src/tasks/shared.rs", "pub const KEY: &str = \"super::a::x\";\n"),
        ("src/tasks/a.rs", "use super::shared::KEY;\npub fn go() { super::b::run(KEY) }\n"),
        (
            "src/tasks/b.rs",
            "use super::shared::{self, KEY as K};\n// super::a::go()\n/* crate::tasks::a */\n\
             pub fn run(_: &str) { let _ = r#\"super::a\"#; let _ = '\"'; let _ = shared::KEY; }\n\
             #[cfg(test)]\nmod tests {\n    use super::super::a;\n}\n",
        ),
    ]);
    let cycles = cycles_of(&dir.path().join("src/lib.rs"));
    assert!(cycles.is_empty(), "{cycles:?}");
}

#[test]
fn a_child_and_its_parent_are_no_cycle_but_crate_paths_across_rooms_are() {
    let dir = fixture(&[
        ("src/lib.rs", "mod store;\nmod assess;\n"),
        ("src/store/mod.rs", "mod read;\npub use read::Row;\npub fn open() {}\n"),
        ("src/store/read.rs", "pub struct Row;\npub fn f() { super::open(); crate::assess::rules::decide(); }\n"),
        ("src/assess/mod.rs", "pub mod rules;\n"),
        ("src/assess/rules.rs", "use crate::store::Row;\npub fn decide() -> Option<Row> { None }\n"),
    ]);
    let cycles = cycles_of(&dir.path().join("src/lib.rs"));
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].room.is_empty());
    assert_eq!(cycles[0].members, ["assess", "store"]);
}

#[test]
fn a_declared_module_without_a_file_is_a_clear_error() {
    let dir = fixture(&[("src/lib.rs", "mod gone;\n")]);
    let err = Crate::read(&dir.path().join("src/lib.rs")).unwrap_err().to_string();
    assert!(err.contains("module `gone` is declared") && err.contains("gone.rs"), "{err}");
}

/// ARCHITECTURE.md's record path: each step's file exists and is named once, and every room of
/// the agent and the collector appears in the map.
#[test]
fn architecture_names_files_that_exist_and_every_room() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(workspace.join("ARCHITECTURE.md")).unwrap();
    let path_section = text.split("## The record path").nth(1).unwrap().split("\n## ").next().unwrap();
    let mut files = Vec::new();
    for row in path_section.lines().filter(|l| l.starts_with("| ") && l.contains(". ")) {
        let last = row.trim_end_matches('|').rsplit('|').next().unwrap();
        let file = last.split('`').nth(1).unwrap_or_else(|| panic!("no file in {row}"));
        assert!(workspace.join(file).is_file(), "ARCHITECTURE.md names {file}, which does not exist");
        assert!(!files.contains(&file), "{file} is named twice in the record path");
        // The function or type named beside the file is defined in it.
        if let Some(item) = last.split('`').nth(3) {
            let source = std::fs::read_to_string(workspace.join(file)).unwrap();
            let defined =
                ["fn ", "struct ", "function ", "enum "].iter().any(|k| source.contains(&format!("{k}{item}")));
            assert!(defined, "ARCHITECTURE.md says {file} holds {item}, which it does not define");
        }
        files.push(file);
    }
    assert!((10..=15).contains(&files.len()), "the record path names {} files (at most 15)", files.len());
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    for krate in ["agent", "collector"] {
        let src = workspace.join(krate).join("src");
        for entry in std::fs::read_dir(&src).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name == "lib.rs" || name == "main.rs" {
                continue;
            }
            let full = format!("{krate}/src/{name}");
            let named = if name.ends_with(".rs") {
                lines.iter().any(|l| {
                    l.contains(&full) || (l.contains(&format!("`{name}`")) && l.contains(&format!("`{krate}/src/")))
                })
            } else {
                text.contains(&format!("{full}/"))
            };
            if !named {
                missing.push(full);
            }
        }
    }
    assert!(missing.is_empty(), "rooms ARCHITECTURE.md does not name: {missing:?}");
    assert!(lines.len() <= 250, "ARCHITECTURE.md is {} lines: move detail into docs/design/", lines.len());
}

/// Every relative link of the project's Markdown reaches a file that exists, so moving a note
/// cannot leave a reader at a dead end.
#[test]
fn every_relative_link_in_the_docs_reaches_a_file() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut pages = Vec::new();
    let mut todo = vec![workspace.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !name.starts_with('.') && !["target", "node_modules", "__pycache__"].contains(&name.as_str()) {
                    todo.push(path);
                }
            } else if name.ends_with(".md") {
                pages.push(path);
            }
        }
    }
    assert!(pages.len() > 10, "found only {} Markdown pages", pages.len());
    let mut dead = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (n, line) in text.lines().enumerate() {
            for link in line.split("](").skip(1) {
                let Some(target) = link.split(')').next() else { continue };
                let target = target.split('#').next().unwrap().trim();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") || target.contains(' ')
                {
                    continue;
                }
                if !page.parent().unwrap().join(target).exists() {
                    dead.push(format!("{}:{}: {target}", page.strip_prefix(workspace).unwrap().display(), n + 1));
                }
            }
        }
    }
    assert!(dead.is_empty(), "links to nothing:\n{}", dead.join("\n"));
}

/// The dashboard's scripts read without scrolling sideways: no line over 120 characters.
#[test]
fn no_dashboard_script_line_is_over_120_characters() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("web");
    let mut long = Vec::new();
    for name in ["app.js", "charts.js"] {
        let text = std::fs::read_to_string(web.join(name)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.chars().count() > 120 {
                long.push(format!("web/{name}:{} ({} characters)", n + 1, line.chars().count()));
            }
        }
    }
    assert!(long.is_empty(), "lines over 120 characters:\n{}", long.join("\n"));
}

/// The database behind one wall: no statement of the collector outside `collector/src/store/`.
#[test]
fn every_sql_statement_of_the_collector_is_in_the_store() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("collector/src");
    let mut outside = Vec::new();
    let mut inside = 0;
    let mut todo = vec![src.clone()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let statements =
                ["sqlx::query", "query_as(", "query_as::<", "query_scalar(", "query_scalar::<", "raw_sql("]
                    .iter()
                    .map(|s| text.matches(s).count())
                    .sum::<usize>();
            if path.starts_with(src.join("store")) {
                inside += statements;
            } else if statements > 0 {
                outside.push(format!("{} ({statements})", path.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    assert!(inside > 100, "found only {inside} statements in the store: the check no longer sees them");
    assert!(outside.is_empty(), "SQL outside collector/src/store/: {outside:?}");
}
