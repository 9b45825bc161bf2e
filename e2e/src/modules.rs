//! The module graph of a crate, read from its sources the way rustc finds them, and the
//! dependency cycles between sibling modules.
//!
//! Constraints:
//! - Modules are found by following `mod name;` from the crate root, as rustc does: the children
//!   of a file in `mod.rs` position (`lib.rs`, `main.rs`, `x/mod.rs`) live beside it, the
//!   children of any other file `x.rs` live in `x/`. Modules declared under `#[cfg(test)]` and
//!   inline `mod name { ... }` blocks under `#[cfg(test)]` are left out: a test may reach
//!   anywhere.
//! - A path is resolved from the module that writes it: `crate::` from the root, `self::` from
//!   the module, each `super::` one module up (the module's parent, wherever its file lives), and
//!   a path that starts with a child module's name from the module. It names the deepest module
//!   its leading segments reach; names brought in by a re-export count as the module that
//!   re-exports them (its front door).
//!
//! Operation: an edge from module `a::x::…` to `a::y::…` is an edge `x → y` in room `a`; a cycle
//! is a strongly connected set of two or more siblings. A parent using its child, or a child its
//! parent, is no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path below its crate root (`[]` is the root).
pub type ModPath = Vec<String>;

/// One module: its file and the modules its code names, with the line that names each.
#[derive(Debug, Clone)]
pub struct Module {
    pub file: PathBuf,
    pub uses: Vec<(ModPath, usize)>,
}

/// Every module of one crate, by path.
#[derive(Debug, Default)]
pub struct Crate {
    pub modules: BTreeMap<ModPath, Module>,
}

/// Two or more sibling modules of one room that reach each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub room: ModPath,
    pub members: Vec<String>,
    /// One line per edge inside the cycle: `file:line names target`.
    pub evidence: Vec<String>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let room = if self.room.is_empty() { "crate".to_string() } else { self.room.join("::") };
        write!(f, "{room}: {} ({})", self.members.join(" <-> "), self.evidence.join("; "))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModulesError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{file}: module `{name}` is declared but neither {a} nor {b} exists")]
    Missing { file: PathBuf, name: String, a: PathBuf, b: PathBuf },
}

impl Crate {
    /// Reads the crate whose root file is `root` (`src/lib.rs`).
    pub fn read(root: &Path) -> Result<Crate, ModulesError> {
        let mut krate = Crate::default();
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut todo = vec![(Vec::new(), root.to_path_buf(), dir)];
        let mut texts = BTreeMap::new();
        while let Some((path, file, children_dir)) = todo.pop() {
            let text =
                std::fs::read_to_string(&file).map_err(|source| ModulesError::Read { path: file.clone(), source })?;
            let tokens = tokens(&strip(&text));
            let tokens = without_test_blocks(&tokens);
            for name in declared_modules(&tokens) {
                let (a, b) = (children_dir.join(format!("{name}.rs")), children_dir.join(&name).join("mod.rs"));
                let (child_file, child_dir) = if a.exists() {
                    (a, children_dir.join(&name))
                } else if b.exists() {
                    (b, children_dir.join(&name))
                } else {
                    return Err(ModulesError::Missing { file, name, a, b });
                };
                let mut child = path.clone();
                child.push(name);
                todo.push((child, child_file, child_dir));
            }
            texts.insert(path.clone(), tokens);
            krate.modules.insert(path, Module { file, uses: Vec::new() });
        }
        let known: BTreeSet<ModPath> = krate.modules.keys().cloned().collect();
        for (path, tokens) in texts {
            let uses = paths(&tokens).into_iter().filter_map(|(p, line)| Some((resolve(&known, &path, &p)?, line)));
            let module = krate.modules.get_mut(&path).expect("inserted above");
            module.uses = uses.filter(|(target, _)| target != &path).collect();
        }
        Ok(krate)
    }

    /// The cycles between siblings, each room's in turn.
    pub fn cycles(&self) -> Vec<Cycle> {
        type Edges = BTreeMap<String, BTreeMap<String, String>>;
        let mut rooms: BTreeMap<ModPath, Edges> = BTreeMap::new();
        for (from, module) in &self.modules {
            for (to, line) in &module.uses {
                let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
                if common < from.len() && common < to.len() {
                    let why = format!("{}:{line} names {}", module.file.display(), to.join("::"));
                    let edges = rooms.entry(from[..common].to_vec()).or_default();
                    edges.entry(from[common].clone()).or_default().entry(to[common].clone()).or_insert(why);
                }
            }
        }
        let mut out = Vec::new();
        for (room, edges) in rooms {
            for members in strongly_connected(&edges) {
                let set: BTreeSet<&String> = members.iter().collect();
                let evidence = members
                    .iter()
                    .flat_map(|m| edges.get(m).into_iter().flatten())
                    .filter(|(to, _)| set.contains(to))
                    .map(|(_, why)| why.clone())
                    .collect();
                out.push(Cycle { room: room.clone(), members, evidence });
            }
        }
        out
    }
}

/// The source with comments, string and character literals blanked (newlines kept, so lines
/// still count).
fn strip(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('#') | Some('"')) && !ident_char(i.checked_sub(1).map(|j| b[j])) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < b.len() && !(b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#'))) {
                j += 1;
            }
            let end = (j + 1 + hashes).min(b.len());
            out.extend(b[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                let skip = if b[i] == '\\' { 2 } else { 1 };
                for k in 0..skip {
                    out.push(blank(b.get(i + k).copied().unwrap_or(' ')));
                }
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (b.get(i + 2) == Some(&'\'') || (next == Some('\\'))) {
            // A character literal ('x' or '\n', '\''); a lifetime has no closing quote.
            let mut j = i + 1;
            if b.get(j) == Some(&'\\') {
                j += 2;
            }
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.extend(std::iter::repeat_n(' ', j + 1 - i));
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_alphabetic() || c == '_' {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                out.push(Token { text: chars[start..i].iter().collect(), line: n + 1 });
            } else if c == ':' && chars.get(i + 1) == Some(&':') {
                out.push(Token { text: "::".into(), line: n + 1 });
                i += 2;
            } else if c.is_whitespace() {
                i += 1;
            } else {
                out.push(Token { text: c.to_string(), line: n + 1 });
                i += 1;
            }
        }
    }
    out
}

/// The tokens less every item under `#[cfg(test)]` (a `mod tests;` line or a braced block).
fn without_test_blocks(t: &[Token]) -> Vec<Token> {
    let is = |i: usize, s: &str| t.get(i).is_some_and(|x| x.text == s);
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let cfg_test =
            is(i, "#") && is(i + 1, "[") && is(i + 2, "cfg") && is(i + 3, "(") && is(i + 4, "test") && is(i + 5, ")");
        if !cfg_test {
            out.push(t[i].clone());
            i += 1;
            continue;
        }
        // Skip to the end of the item: its `;`, or its braced body.
        let mut j = i + 7;
        while j < t.len() && t[j].text != ";" && t[j].text != "{" {
            j += 1;
        }
        if is(j, "{") {
            let mut depth = 0;
            while j < t.len() {
                match t[j].text.as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        i = j + 1;
    }
    out
}

/// `mod name;` declarations (not inline modules).
fn declared_modules(t: &[Token]) -> Vec<String> {
    t.windows(3).filter(|w| w[0].text == "mod" && w[2].text == ";").map(|w| w[1].text.clone()).collect()
}

/// Every path the code writes, `use` trees expanded, with its line.
fn paths(t: &[Token]) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i].text == "use" {
            let mut j = i + 1;
            let tree = use_tree(t, &mut j, &[]);
            out.extend(tree);
            i = j;
            continue;
        }
        let starts = is_ident(&t[i].text) && (i == 0 || t[i - 1].text != "::");
        if starts && t.get(i + 1).is_some_and(|x| x.text == "::") {
            let mut p = vec![t[i].text.clone()];
            let mut j = i + 1;
            while t.get(j).is_some_and(|x| x.text == "::") && t.get(j + 1).is_some_and(|x| is_ident(&x.text)) {
                p.push(t[j + 1].text.clone());
                j += 2;
            }
            out.push((p, t[i].line));
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// One use tree from `t[*j]`, every leaf as a full path with `prefix`; leaves `*j` after it.
fn use_tree(t: &[Token], j: &mut usize, prefix: &[String]) -> Vec<(Vec<String>, usize)> {
    let mut path = prefix.to_vec();
    let line = t.get(*j).map_or(0, |x| x.line);
    while *j < t.len() {
        let x = &t[*j].text;
        if x == "{" {
            *j += 1;
            let mut out = Vec::new();
            while *j < t.len() && t[*j].text != "}" {
                out.extend(use_tree(t, j, &path));
                if t.get(*j).is_some_and(|x| x.text == ",") {
                    *j += 1;
                }
            }
            *j += 1;
            if t.get(*j).is_some_and(|x| x.text == ";") {
                *j += 1;
            }
            return out;
        }
        if x == "as" {
            *j += 2;
            continue;
        }
        if x == "," || x == "}" {
            break;
        }
        if x == ";" {
            *j += 1;
            break;
        }
        if is_ident(x) && x != "self" || x == "self" && path.is_empty() {
            path.push(x.clone());
        }
        *j += 1;
    }
    vec![(path, line)]
}

/// The deepest module of `known` that `path`, written in module `at`, reaches.
fn resolve(known: &BTreeSet<ModPath>, at: &ModPath, path: &[String]) -> Option<ModPath> {
    let mut base = at.clone();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &path[1..];
        }
        Some("self") => rest = &path[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = at.clone();
            child.push(first.to_string());
            if !known.contains(&child) {
                return None;
            }
        }
        None => return None,
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if !known.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// Tarjan's strongly connected components of two or more members.
fn strongly_connected(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut members = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                members.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if members.len() > 1 {
                members.sort();
                s.out.push(members);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}
