//! What the project runs from the machine, read from its sources, against what
//! `scripts/needs.list` names (and so what `scripts/setup.sh` installs).
//!
//! - Shell scripts: every word in a command's position (after `;`, `|`, `&&`, a newline, `(`,
//!   `$(`, `then`, `do`, …), with the programs that wrappers (`env`, `timeout`, `setpriv`,
//!   `xargs`, …, and the script's own functions that run their arguments, `exec "$@"`) run;
//!   heredoc bodies, single-quoted text, `case` patterns, redirection targets,
//!   assignments, variables, paths, the script's own functions and shell builtins are not
//!   programs.
//! - Rust: `Command::new("name")` and the chaos suite's `sh(&["name", …])`.
//! - Python: `subprocess.*(["name", …])`.

use std::collections::{BTreeMap, BTreeSet};

/// One line of `scripts/needs.list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub kind: NeedKind,
    pub name: String,
    pub package: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeedKind {
    /// A program setup.sh installs when missing.
    Cmd,
    /// A file or library (a glob) setup.sh installs when missing.
    File,
    /// Python modules python3 must import.
    PyMod,
    /// A program from PyPI.
    PyPi,
    /// The Rust toolchain.
    Rust,
    /// A program used when present.
    Opt,
    /// Part of every Debian system.
    Base,
}

impl NeedKind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "cmd" => Self::Cmd,
            "file" => Self::File,
            "pymod" => Self::PyMod,
            "pypi" => Self::PyPi,
            "rust" => Self::Rust,
            "opt" => Self::Opt,
            "base" => Self::Base,
            _ => return None,
        })
    }

    /// Whether `name` is a program (run by name from PATH).
    pub fn is_program(self) -> bool {
        !matches!(self, Self::File | Self::PyMod)
    }
}

/// Parses `scripts/needs.list`; a malformed line is an error naming it.
pub fn parse_list(text: &str) -> Result<Vec<Need>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, name, package] = f[..] else {
            return Err(format!("line {}: want `kind name package`: {line}", n + 1));
        };
        let kind = NeedKind::parse(kind).ok_or_else(|| format!("line {}: unknown kind {kind}", n + 1))?;
        out.push(Need { kind, name: name.to_owned(), package: package.to_owned() });
    }
    Ok(out)
}

/// Shell builtins and keywords: never programs of the machine.
const BUILTINS: &[&str] = &[
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "while",
    "until",
    "do",
    "done",
    "case",
    "esac",
    "in",
    "function",
    "return",
    "local",
    "export",
    "set",
    "shift",
    "echo",
    "printf",
    "read",
    "cd",
    "exit",
    "trap",
    "wait",
    "kill",
    "test",
    "[",
    "[[",
    "]]",
    "]",
    "true",
    "false",
    ":",
    "source",
    ".",
    "eval",
    "exec",
    "declare",
    "readonly",
    "unset",
    "command",
    "type",
    "alias",
    "break",
    "continue",
    "umask",
    "let",
    "mapfile",
    "readarray",
    "compgen",
    "pwd",
    "{",
    "}",
    "!",
    "time",
    "select",
    "getopts",
    "hash",
    "ulimit",
    "disown",
    "jobs",
    "bg",
    "fg",
    "builtin",
    "caller",
    "enable",
    "help",
    "logout",
    "popd",
    "pushd",
    "dirs",
    "shopt",
    "suspend",
    "times",
    "unalias",
    "coproc",
];

/// Programs that run another program given after their options: (name, words of arguments
/// before the program that are not options, e.g. timeout's duration).
const WRAPPERS: &[(&str, usize)] =
    &[("env", 0), ("timeout", 1), ("setpriv", 0), ("nice", 0), ("nohup", 0), ("stdbuf", 0), ("xargs", 0), ("sudo", 0)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    /// The next word is a command.
    Command,
    /// The next words are arguments.
    Argument,
    /// After a wrapper: options, assignments and `skip` plain words, then a command.
    Wrapped { skip: usize },
    /// A `case` subject, up to `in`.
    CaseSubject,
    /// A `case` pattern, up to `)`.
    CasePattern,
}

struct Shell<'a> {
    s: &'a [char],
    i: usize,
    found: BTreeSet<String>,
    /// `case … esac` nesting.
    cases: Vec<()>,
    /// The script's functions that run their arguments as a command, with how many leading
    /// arguments they shift off first.
    wrappers: &'a BTreeMap<String, usize>,
}

/// What [`Shell`] records when `"$@"` stands in a command's position.
const RUNS_ITS_ARGUMENTS: &str = "\"$@\"";

/// The words in command position of `text`, with `wrappers` running their arguments.
fn parse_words(text: &str, wrappers: &BTreeMap<String, usize>) -> BTreeSet<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut sh = Shell { s: &chars, i: 0, found: BTreeSet::new(), cases: Vec::new(), wrappers };
    sh.parse(false);
    sh.found
}

/// The programs a shell script runs (by name), without its own functions and builtins.
pub fn shell_programs(script: &str) -> BTreeSet<String> {
    let text = without_heredocs(script);
    let functions = defined_functions(&text);
    // A function whose body runs "$@" is a wrapper (after the arguments it shifts off); one that
    // calls a wrapper with "$@" too.
    let mut wrappers = BTreeMap::new();
    loop {
        let found: BTreeMap<String, usize> = functions
            .iter()
            .filter(|(_, body)| parse_words(body, &wrappers).contains(RUNS_ITS_ARGUMENTS))
            .map(|(name, body)| (name.clone(), shifts(body)))
            .collect();
        if found == wrappers {
            break;
        }
        wrappers = found;
    }
    let mut found = parse_words(&text, &wrappers);
    found.retain(|w| !BUILTINS.contains(&w.as_str()) && !functions.contains_key(w) && w != RUNS_ITS_ARGUMENTS);
    found
}

/// The script with heredoc bodies removed (their text is data: YAML, Python, an init script).
fn without_heredocs(script: &str) -> String {
    let mut out = String::new();
    let mut until: Vec<String> = Vec::new();
    for line in script.lines() {
        if let Some(end) = until.first() {
            if line.trim() == end {
                until.remove(0);
            }
            out.push('\n');
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("<<") {
            let after = &rest[at + 2..];
            if let Some(here_string) = after.strip_prefix('<') {
                rest = here_string;
                continue;
            }
            let word: String = after
                .trim_start_matches('-')
                .trim_start()
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !word.is_empty() {
                until.push(word);
            }
            rest = after;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// How many positional arguments a function body shifts off (`shift`, `shift N`).
fn shifts(body: &str) -> usize {
    let words: Vec<&str> = body.split(|c: char| c.is_whitespace() || c == ';').filter(|w| !w.is_empty()).collect();
    words
        .iter()
        .enumerate()
        .filter(|(_, w)| **w == "shift")
        .map(|(i, _)| words.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or(1))
        .sum()
}

/// `name() {` and `function name` definitions, with their bodies: to the end of the line for
/// a one-line function, else to the next line that is `}` alone.
fn defined_functions(text: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let l = line.trim_start();
        let l = l.strip_prefix("function ").unwrap_or(l).trim_start();
        let name: String = l.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect();
        let Some(rest) = l[name.len()..].trim_start().strip_prefix("()") else { continue };
        if name.is_empty() {
            continue;
        }
        let body = if rest.trim_end().ends_with('}') {
            rest.to_owned()
        } else {
            let end = lines[n + 1..].iter().position(|l| l.trim_end() == "}").map_or(lines.len(), |e| n + 1 + e);
            lines[n + 1..end].join("\n")
        };
        out.insert(name, body);
    }
    out
}

fn is_assignment(w: &str) -> bool {
    let name: String = w.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && (w[name.len()..].starts_with('=') || w[name.len()..].starts_with("+=") || w[name.len()..].starts_with('['))
        && w.contains('=')
}

/// A word that names a program on PATH: no variable, no path, no glob, not a number (a
/// descriptor: `exec 9>file`).
fn is_program_name(w: &str) -> bool {
    !w.is_empty()
        && w.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-'))
        && !w.starts_with('-')
        && !w.chars().all(|c| c.is_ascii_digit())
}

impl Shell<'_> {
    fn peek(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    /// Parses until the end, or (`sub`) until the `)` closing a `$(`.
    fn parse(&mut self, sub: bool) {
        let mut pos = Pos::Command;
        let mut word = String::new();
        // The word is a redirection's target (not a command, not an argument that counts).
        let mut redirect = false;
        // The word holds quoted or substituted text: it cannot be a plain program name.
        let mut literal = true;
        while let Some(c) = self.peek(0) {
            match c {
                '\\' => {
                    if self.peek(1) != Some('\n') {
                        word.extend(self.peek(1));
                    }
                    self.i += 2;
                    continue;
                }
                '\'' => {
                    self.i += 1;
                    while let Some(q) = self.peek(0) {
                        self.i += 1;
                        if q == '\'' {
                            break;
                        }
                        word.push(q);
                    }
                    literal = false;
                    continue;
                }
                '"' => {
                    self.i += 1;
                    self.double_quoted(&mut word);
                    literal = false;
                    continue;
                }
                '$' if self.peek(1) == Some('(') => {
                    if self.peek(2) == Some('(') {
                        self.skip_arithmetic(3);
                    } else {
                        self.i += 2;
                        self.parse(true);
                    }
                    word.push('$');
                    literal = false;
                    continue;
                }
                '`' => {
                    self.i += 1;
                    let start = self.i;
                    while self.peek(0).is_some_and(|q| q != '`') {
                        self.i += 1;
                    }
                    let inner: String = self.s[start..self.i].iter().collect();
                    self.found.extend(shell_programs(&inner));
                    self.i += 1;
                    word.push('$');
                    literal = false;
                    continue;
                }
                '#' if word.is_empty() => {
                    while self.peek(0).is_some_and(|q| q != '\n') {
                        self.i += 1;
                    }
                    continue;
                }
                '<' | '>' => {
                    self.end_word(&mut word, &mut pos, &mut redirect, &mut literal);
                    if self.peek(1) == Some('(') {
                        // Process substitution: a command of its own (and the target of a `<`).
                        self.i += 2;
                        self.parse(true);
                        redirect = false;
                        continue;
                    }
                    while self.peek(0).is_some_and(|q| matches!(q, '<' | '>' | '&')) {
                        self.i += 1;
                    }
                    // `2>&1`, `>&2`: the target is a descriptor, already consumed with `&`.
                    if self.peek(0).is_some_and(|q| q.is_ascii_digit() || q == '-') && self.s[self.i - 1] == '&' {
                        while self.peek(0).is_some_and(|q| q.is_ascii_digit() || q == '-') {
                            self.i += 1;
                        }
                    } else {
                        redirect = true;
                    }
                    continue;
                }
                ' ' | '\t' => self.end_word(&mut word, &mut pos, &mut redirect, &mut literal),
                '\n' | ';' | '&' | '|' => {
                    self.end_word(&mut word, &mut pos, &mut redirect, &mut literal);
                    redirect = false;
                    if c == ';' && self.peek(1) == Some(';') && !self.cases.is_empty() {
                        self.i += 2;
                        pos = Pos::CasePattern;
                        continue;
                    }
                    // A digit before `>&` was taken as a word's start; a newline inside a case
                    // pattern list keeps it a pattern.
                    if pos != Pos::CasePattern && pos != Pos::CaseSubject {
                        pos = Pos::Command;
                    }
                }
                '(' if word.is_empty() && self.peek(1) == Some('(') => {
                    // `(( … ))` and `for (( … ))`: arithmetic, no command in it.
                    self.skip_arithmetic(2);
                    continue;
                }
                '(' => {
                    let array = word.ends_with('=') && pos == Pos::Command;
                    self.end_word(&mut word, &mut pos, &mut redirect, &mut literal);
                    if array {
                        // `x=( … )`: the elements are data.
                        self.skip_array();
                        continue;
                    }
                    if pos != Pos::CasePattern {
                        pos = Pos::Command;
                    }
                }
                ')' => {
                    self.end_word(&mut word, &mut pos, &mut redirect, &mut literal);
                    if sub {
                        self.i += 1;
                        return;
                    }
                    pos = Pos::Command;
                }
                _ => word.push(c),
            }
            self.i += 1;
        }
        self.end_word(&mut word, &mut pos, &mut redirect, &mut literal);
    }

    fn double_quoted(&mut self, word: &mut String) {
        while let Some(c) = self.peek(0) {
            match c {
                '\\' => {
                    word.extend(self.peek(1));
                    self.i += 2;
                }
                '"' => {
                    self.i += 1;
                    return;
                }
                '$' if self.peek(1) == Some('(') => {
                    if self.peek(2) == Some('(') {
                        self.skip_arithmetic(3);
                    } else {
                        self.i += 2;
                        self.parse(true);
                    }
                    word.push('$');
                }
                _ => {
                    word.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// Skips an array literal's elements and its closing `)` (the `(` is at the cursor).
    fn skip_array(&mut self) {
        self.i += 1;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\\' => self.i += 1,
                '\'' => {
                    while self.peek(0).is_some_and(|q| q != '\'') {
                        self.i += 1;
                    }
                    self.i += 1;
                }
                '"' => {
                    let mut ignored = String::new();
                    self.double_quoted(&mut ignored);
                }
                ')' => return,
                _ => {}
            }
        }
    }

    /// Skips `$(( … ))` (`opening`: 3) or an arithmetic command `(( … ))` (2).
    fn skip_arithmetic(&mut self, opening: usize) {
        self.i += opening;
        let mut depth = 2;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    fn end_word(&mut self, word: &mut String, pos: &mut Pos, redirect: &mut bool, literal: &mut bool) {
        let w = std::mem::take(word);
        let was_literal = std::mem::replace(literal, true);
        if w.is_empty() && was_literal {
            return;
        }
        if std::mem::take(redirect) {
            return;
        }
        match *pos {
            Pos::Argument => {
                if w == "esac" {
                    self.cases.pop();
                }
            }
            Pos::CaseSubject => {
                if w == "in" {
                    *pos = Pos::CasePattern;
                }
            }
            Pos::CasePattern => {
                if w == "esac" && was_literal {
                    self.cases.pop();
                    *pos = Pos::Argument;
                }
            }
            Pos::Wrapped { skip } => {
                if w.starts_with('-') || is_assignment(&w) {
                } else if skip > 0 {
                    *pos = Pos::Wrapped { skip: skip - 1 };
                } else {
                    *pos = Pos::Command;
                    self.command_word(w, was_literal, pos);
                }
            }
            Pos::Command => self.command_word(w, was_literal, pos),
        }
    }

    fn command_word(&mut self, w: String, literal: bool, pos: &mut Pos) {
        if is_assignment(&w) {
            return; // `X=y cmd`, `x=$(…)`: still a command position
        }
        if !literal && w == "$@" {
            self.found.insert(RUNS_ITS_ARGUMENTS.to_owned());
        }
        match w.as_str() {
            "if" | "then" | "else" | "elif" | "do" | "while" | "until" | "!" | "{" | "time" | "exec" => return,
            "case" => {
                self.cases.push(());
                *pos = Pos::CaseSubject;
                return;
            }
            "esac" => {
                self.cases.pop();
                *pos = Pos::Argument;
                return;
            }
            _ => {}
        }
        *pos = Pos::Argument;
        if !literal || !is_program_name(&w) {
            return;
        }
        if let Some((_, skip)) = WRAPPERS.iter().find(|(n, _)| *n == w) {
            *pos = Pos::Wrapped { skip: *skip };
        } else if let Some(skip) = self.wrappers.get(&w) {
            *pos = Pos::Wrapped { skip: *skip };
        }
        self.found.insert(w);
    }
}

/// Programs a Rust source runs by name: `Command::new("x")`, `sh(&["x", …])`.
pub fn rust_programs(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pat in ["Command::new(\"", "sh(&[\""] {
        for (at, _) in source.match_indices(pat) {
            let rest = &source[at + pat.len()..];
            if let Some(end) = rest.find('"') {
                let name = &rest[..end];
                if is_program_name(name) {
                    out.insert(name.to_owned());
                }
            }
        }
    }
    out
}

/// Programs a Python source runs by name: `subprocess.<fn>(["x", …])`.
pub fn python_programs(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in source.match_indices("subprocess.") {
        let rest = &source[at..];
        let Some(open) = rest.find('(') else { continue };
        let args = rest[open + 1..].trim_start();
        let Some(list) = args.strip_prefix('[') else { continue };
        let list = list.trim_start();
        let Some(q) = list.chars().next().filter(|c| *c == '"' || *c == '\'') else { continue };
        if let Some(end) = list[1..].find(q) {
            let name = &list[1..1 + end];
            if is_program_name(name) {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(words: &[&str]) -> BTreeSet<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn commands_in_every_position_and_nothing_else() {
        let script = r#"#!/usr/bin/env bash
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
up() { local x; x=$(pgbackrest --stanza=a info | grep -c ok); echo "$x"; }
for f in "$dir"/pids/*; do kill "$(cat "$f")" 2>/dev/null || true; done
FOO=bar patroni "$dir/p.yml" >"$dir/logs/p.log" 2>&1 &
timeout "${T:-600}" qemu-system-x86_64 -m 1 </dev/null | tr -d '\r'
as_pg() { exec setpriv --reuid="$u" env HOME="$d" "$@"; }
backrest() {
  (PGPASSWORD=$(cat "$d/su") as_pg pgbackrest --config="$1" "$@")
}
agent() { "$bin/railguard-agent" run "$@" & }
agent sim-node --fabric sim
exec 9>"$d.lock"
members=(pg0 pg1 "pg 2")
step() { local name=$1; shift; "$@" >"$out/$name.txt"; }
step nvidia-smi-list nvidia-smi -L
ls -d /usr/lib/postgresql/*/bin | sort -V | xargs -n1 basename
case "$cmd" in
  up) up ;;
  *.ko.xz) xz -dc "$f" ;;
  cmd | file) zstd -q ;;
esac
python3 -c 'import subprocess; subprocess.run(["secret-tool"])'
cat >"$d/x.yml" <<YML
scope: etcdctl patronictl
YML
echo $((1 + 2)) "$(haproxy -v)"
for ((i = 3; i >= 0; i--)); do tr x y; done
((n++)) || od -c x
"$bin/railguard-agent" run
mapfile -t a < <(printf '%s\n' x | awk 'NF')
up
"#;
        assert_eq!(
            shell_programs(script),
            set(&[
                "awk",
                "basename",
                "cat",
                "dirname",
                "env",
                "grep",
                "haproxy",
                "ls",
                "nvidia-smi",
                "od",
                "patroni",
                "pgbackrest",
                "python3",
                "qemu-system-x86_64",
                "setpriv",
                "sort",
                "timeout",
                "tr",
                "xargs",
                "xz",
                "zstd",
            ])
        );
    }

    #[test]
    fn rust_and_python_spawns() {
        let rs = r#"let a = Command::new("promtool"); sh(&["ip", "link"]); Command::new(bin("railguard-agent"));"#;
        assert_eq!(rust_programs(rs), set(&["ip", "promtool"]));
        let py = "out = subprocess.run(\n    [sys.executable, x])\nsubprocess.check_output(['nvidia-smi', '-L'])";
        assert_eq!(python_programs(py), set(&["nvidia-smi"]));
    }

    #[test]
    fn the_list_parses_and_refuses_a_malformed_line() {
        let l = parse_list("# c\ncmd pgbackrest pgbackrest\nfile /usr/x/*.so libx\n").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0], Need { kind: NeedKind::Cmd, name: "pgbackrest".into(), package: "pgbackrest".into() });
        assert!(parse_list("cmd pgbackrest").unwrap_err().contains("line 1"));
        assert!(parse_list("prog x y").unwrap_err().contains("unknown kind prog"));
    }
}
