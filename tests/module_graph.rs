//! No import cycles between the modules of a crate.
//!
//! Reads every crate's `src/**/*.rs` (following `mod` declarations from `lib.rs`/`main.rs`),
//! collects which module refers to which, and asserts that each crate's module graph is acyclic.
//!
//! The rule:
//! - A module refers to another through a `use` declaration or a `crate::`, `super::` or `self::`
//!   path in its code. Comments, string literals and `#[cfg(test)]` items are not read.
//! - A reference goes to the module that *defines* the item: re-exports (`pub use`, also globs)
//!   are followed, so `use crate::Mode` in a child of a crate whose root says
//!   `pub use compile::Mode` is an edge to `compile`, not to the root.
//! - A reference from a module to one of its own descendants is not an edge: a parent declares,
//!   re-exports and dispatches to its children (lib.rs, mod.rs). A reference from a child to an
//!   item *defined* in its parent's file is an edge, like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module by its path from the crate root, segments joined by `::`; the root is `""`.
type ModPath = String;

/// What the test knows of one module: its cleaned source, its imports, its child modules.
struct Module {
    file: PathBuf,
    /// Code with comments, literals and test-only items removed.
    code: String,
    children: BTreeSet<String>,
    /// `use` bindings: the name they bring into scope and the path they name.
    imports: Vec<(String, Vec<String>)>,
    /// Every path the module refers to (use paths and inline `crate::`/`super::`/`self::` paths).
    references: Vec<Vec<String>>,
}

/// One crate's modules.
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn parent_of(m: &str) -> Option<String> {
    if m.is_empty() {
        None
    } else {
        Some(m.rsplit_once("::").map_or(String::new(), |(p, _)| p.to_string()))
    }
}

fn join(m: &str, child: &str) -> String {
    if m.is_empty() {
        child.to_string()
    } else {
        format!("{m}::{child}")
    }
}

fn is_descendant(m: &str, of: &str) -> bool {
    m != of && (of.is_empty() || m.starts_with(&format!("{of}::")))
}

// ---- reading sources ----------------------------------------------------------------------------

/// Removes comments, string and char literals (keeping lifetimes) and `#[cfg(test)]` items.
fn clean(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&c| c == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body + rest[body..].find(&close).map_or(rest.len() - body, |e| e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}', '{'); otherwise a lifetime or a label.
            let len = match rest[1..].chars().next() {
                Some('\\') => rest.get(3..).and_then(|r| r.find('\'')).map(|e| e + 4),
                Some(c) if rest[1 + c.len_utf8()..].starts_with('\'') => Some(2 + c.len_utf8()),
                _ => None,
            };
            match len {
                Some(len) => {
                    i += len;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    strip_test_items(&out)
}

/// Drops every item that follows `#[cfg(test)]`: up to its `;` or its balanced `{ ... }`.
fn strip_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The `use` declarations of `code` (their trees, without `use` and `;`) and the code without them.
fn split_uses(code: &str) -> (Vec<String>, String) {
    let mut trees = Vec::new();
    let mut rest_code = String::new();
    let mut rest = code;
    loop {
        let found = rest.match_indices("use ").find(|&(k, _)| k == 0 || !is_ident_byte(rest.as_bytes()[k - 1]));
        let Some((k, _)) = found else { break };
        let end = rest[k..].find(';').map_or(rest.len(), |e| k + e);
        rest_code.push_str(&rest[..k]);
        trees.push(rest[k + 4..end].to_string());
        rest = &rest[(end + 1).min(rest.len())..];
    }
    rest_code.push_str(rest);
    (trees, rest_code)
}

/// Flattens a use tree (`crate::a::{self, b::{c as d, *}}`) into `(bound name, path)` pairs.
fn flatten_use(tree: &str) -> Vec<(String, Vec<String>)> {
    fn walk(prefix: &[String], tree: &str, out: &mut Vec<(String, Vec<String>)>) {
        let tree = tree.trim().trim_start_matches("::");
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let mut path = prefix.to_vec();
            path.extend(tree[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&path, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            walk(&path, &inner[start..], out);
            return;
        }
        let (path_text, alias) = match tree.split_once(" as ") {
            Some((p, a)) => (p, Some(a.trim().to_string())),
            None => (tree, None),
        };
        let mut path = prefix.to_vec();
        for seg in path_text.split("::").map(str::trim).filter(|s| !s.is_empty()) {
            if seg != "self" || path.is_empty() {
                path.push(seg.to_string());
            }
        }
        let name = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
        out.push((name, path));
    }
    let tree = tree.trim();
    let tree = tree.strip_prefix("pub").map_or(tree, |t| {
        let t = t.trim_start();
        if t.starts_with('(') {
            t[t.find(')').map_or(0, |e| e + 1)..].trim_start()
        } else {
            t
        }
    });
    let mut out = Vec::new();
    walk(&[], tree, &mut out);
    out
}

/// Inline paths that start with `crate`, `super` or `self`, e.g. `crate::topo::topo_order`.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !(is_ident_byte(b[i - 1]) || b[i - 1] == b':');
        let head = ["crate::", "super::", "self::"].iter().find(|h| code[i..].starts_with(*h));
        if !(boundary && head.is_some()) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (is_ident_byte(b[j]) || b[j] == b':') {
            j += 1;
        }
        paths.push(code[i..j].split("::").filter(|s| !s.is_empty()).map(String::from).collect());
        i = j;
    }
    paths
}

/// `mod name;` declarations (file modules) of `code`.
fn declared_modules(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for stmt in code.split([';', '{', '}']) {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        if let Some(p) = words.iter().position(|w| *w == "mod") {
            if p + 2 == words.len() && code.contains(&format!("mod {};", words[p + 1])) {
                found.push(words[p + 1].to_string());
            }
        }
    }
    found
}

fn module_from_source(file: PathBuf, src: &str) -> Module {
    let code = clean(src);
    let children = declared_modules(&code).into_iter().collect();
    let (trees, rest) = split_uses(&code);
    let imports: Vec<(String, Vec<String>)> = trees.iter().flat_map(|t| flatten_use(t)).collect();
    let mut references: Vec<Vec<String>> = imports.iter().map(|(_, p)| p.clone()).collect();
    references.extend(inline_paths(&rest));
    Module { file, code, children, imports, references }
}

/// Reads a crate from its root file, following `mod` declarations.
fn read_crate(root_file: &Path) -> Crate {
    let mut modules = BTreeMap::new();
    let mut pending = vec![(String::new(), root_file.to_path_buf())];
    while let Some((path, file)) = pending.pop() {
        let src = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let module = module_from_source(file.clone(), &src);
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let dir = if ["lib", "main", "mod"].contains(&stem) {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for child in &module.children {
            let flat = dir.join(format!("{child}.rs"));
            let nested = dir.join(child).join("mod.rs");
            let child_file = if flat.exists() { flat } else { nested };
            pending.push((join(&path, child), child_file));
        }
        modules.insert(path, module);
    }
    Crate { modules }
}

// ---- resolving references -----------------------------------------------------------------------

impl Crate {
    /// Whether module `m` itself defines an item called `name`.
    fn defines(&self, m: &str, name: &str) -> bool {
        let code = &self.modules[m].code;
        ["fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod", "macro_rules!"].iter().any(|kw| {
            code.match_indices(&format!("{kw} {name}")).any(|(k, _)| {
                let after = code.as_bytes().get(k + kw.len() + 1 + name.len()).copied().unwrap_or(b' ');
                let before = if k == 0 { b' ' } else { code.as_bytes()[k - 1] };
                !is_ident_byte(after) && !is_ident_byte(before)
            })
        })
    }

    /// The module that defines what `path` names when written in module `from`; `None` for
    /// another crate's item.
    fn resolve(&self, from: &str, path: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let mut cur = from.to_string();
        let mut rest = path;
        match path[0].as_str() {
            "crate" => {
                cur = String::new();
                rest = &path[1..];
            }
            "self" => rest = &path[1..],
            "super" => {
                while rest.first().map(String::as_str) == Some("super") {
                    cur = parent_of(&cur)?;
                    rest = &rest[1..];
                }
            }
            first if self.modules[from].children.contains(first) => {}
            first => {
                // A path through a name this module imported (`use crate::backend; backend::X`).
                let (_, target) = self.modules[from].imports.iter().find(|(n, p)| n == first && p != path)?;
                let mut full = target.clone();
                full.extend(path[1..].iter().cloned());
                return self.resolve(from, &full, depth + 1);
            }
        }
        for (k, seg) in rest.iter().enumerate() {
            if self.modules[&cur].children.contains(seg) {
                cur = join(&cur, seg);
                continue;
            }
            if seg == "*" {
                return Some(cur);
            }
            return Some(self.item_home(&cur, seg, &rest[k + 1..], depth));
        }
        Some(cur)
    }

    /// Where item `name` of module `m` is defined (following `m`'s imports and globs).
    fn item_home(&self, m: &str, name: &str, tail: &[String], depth: usize) -> ModPath {
        let module = &self.modules[m];
        if let Some((_, target)) = module.imports.iter().find(|(n, _)| n == name) {
            let mut full = target.clone();
            full.extend(tail.iter().cloned());
            return self.resolve(m, &full, depth + 1).unwrap_or_else(|| m.to_string());
        }
        if !self.defines(m, name) {
            for (_, glob) in module.imports.iter().filter(|(n, _)| n == "*") {
                let mut full = glob[..glob.len() - 1].to_vec();
                full.push(name.to_string());
                if let Some(home) = self.resolve(m, &full, depth + 1) {
                    if self.defines(&home, name) {
                        return home;
                    }
                }
            }
        }
        m.to_string()
    }

    /// Edges `from -> to` of the module graph, each with one reference that made it.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), String> {
        let mut edges = BTreeMap::new();
        for (from, module) in &self.modules {
            for path in &module.references {
                let Some(to) = self.resolve(from, path, 0) else { continue };
                if to == *from || is_descendant(&to, from) {
                    continue;
                }
                edges.entry((from.clone(), to)).or_insert_with(|| path.join("::"));
            }
        }
        edges
    }
}

// ---- finding cycles -----------------------------------------------------------------------------

/// A cycle of the directed graph, as its nodes with the first repeated at the end; `None` if the
/// graph is acyclic.
fn find_cycle<N: Ord + Clone>(edges: &BTreeSet<(N, N)>) -> Option<Vec<N>> {
    let mut next: BTreeMap<&N, Vec<&N>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // 0: unvisited, 1: on the DFS stack, 2: done.
    let mut state: BTreeMap<&N, u8> = BTreeMap::new();
    fn visit<'n, N: Ord>(
        n: &'n N,
        next: &BTreeMap<&'n N, Vec<&'n N>>,
        state: &mut BTreeMap<&'n N, u8>,
        stack: &mut Vec<&'n N>,
    ) -> Option<Vec<&'n N>> {
        state.insert(n, 1);
        stack.push(n);
        for &m in next.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|&s| s == m).unwrap();
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(m);
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(m, next, state, stack) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n, 2);
        None
    }
    let nodes: Vec<&N> = next.keys().copied().collect();
    for n in nodes {
        if state.get(n).copied().unwrap_or(0) == 0 {
            if let Some(cycle) = visit(n, &next, &mut state, &mut Vec::new()) {
                return Some(cycle.into_iter().cloned().collect());
            }
        }
    }
    None
}

/// Every crate root of the workspace: `crates/*/src/{lib,main}.rs` and the root package's.
fn crate_roots() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("src")];
    let mut members: Vec<PathBuf> =
        std::fs::read_dir(root.join("crates")).unwrap().map(|e| e.unwrap().path().join("src")).collect();
    members.sort();
    dirs.extend(members);
    dirs.iter().flat_map(|d| ["lib.rs", "main.rs"].map(|f| d.join(f))).filter(|f| f.exists()).collect()
}

#[test]
fn every_crate_has_an_acyclic_module_graph() {
    let roots = crate_roots();
    assert!(roots.len() >= 7, "found only {} crate roots: {roots:?}", roots.len());
    let mut problems = Vec::new();
    for root in &roots {
        let krate = read_crate(root);
        let edges = krate.edges();
        let graph: BTreeSet<(ModPath, ModPath)> = edges.keys().cloned().collect();
        if let Some(cycle) = find_cycle(&graph) {
            let name = |m: &str| if m.is_empty() { "crate".to_string() } else { m.to_string() };
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let file = krate.modules[&w[0]].file.display();
                    format!(
                        "  {} -> {}   ({file} refers to `{}`)",
                        name(&w[0]),
                        name(&w[1]),
                        edges[&(w[0].clone(), w[1].clone())]
                    )
                })
                .collect();
            problems.push(format!("{}: import cycle\n{}", root.display(), steps.join("\n")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

// ---- the checker checked --------------------------------------------------------------------------

fn edge_set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn find_cycle_reports_a_cycle_and_accepts_a_dag() {
    let dag = edge_set(&[("a", "b"), ("b", "c"), ("a", "c"), ("d", "a")]);
    assert_eq!(find_cycle(&dag), None);
    let cyclic = edge_set(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")]);
    let cycle = find_cycle(&cyclic).expect("b -> c -> d -> b is a cycle");
    assert_eq!(cycle, ["b", "c", "d", "b"]);
    assert_eq!(find_cycle(&edge_set(&[("x", "y"), ("y", "x")])).map(|c| c.len()), Some(3));
}

/// A crate from in-memory files: `(module path, source)`.
fn fake_crate(files: &[(&str, &str)]) -> Crate {
    let modules = files
        .iter()
        .map(|(path, src)| (path.to_string(), module_from_source(PathBuf::from(format!("{path}.rs")), src)))
        .collect();
    Crate { modules }
}

fn fake_edges(files: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    fake_crate(files).edges().into_keys().collect()
}

#[test]
fn references_resolve_through_reexports_and_parents_own_their_children() {
    let files = [
        ("", "mod compile; mod trace; mod error;\npub use compile::Mode;\npub use error::{Error, Result};\npub fn helper() {}"),
        ("compile", "use crate::trace::{self, Recorder};\npub enum Mode { A }\nfn f() { trace::run(); }"),
        ("trace", "use crate::{Mode, Result};\n// use crate::compile::Nothing;\nfn g() -> &'static str { \"crate::compile::X\" }\nfn h() { crate::helper(); }"),
        ("error", "pub struct Error; pub type Result<T> = std::result::Result<T, Error>;\n#[cfg(test)]\nmod tests { use crate::compile::Mode; }"),
    ];
    let edges = fake_edges(&files);
    // `crate::Mode` is compile's, `crate::Result` error's, `crate::helper` the root's own item;
    // the root's re-exports of its children are no edges; comments, strings and tests are not read.
    assert_eq!(edges, edge_set(&[("compile", "trace"), ("trace", "compile"), ("trace", "error"), ("trace", "")]));
    let graph: BTreeSet<(String, String)> = edges;
    assert_eq!(find_cycle(&graph), Some(vec!["compile".to_string(), "trace".to_string(), "compile".to_string()]));
}

#[test]
fn child_modules_and_globs_resolve_to_the_defining_module() {
    let files = [
        ("", "mod plan; mod fusion; mod topo;\npub use plan::*;"),
        ("plan", "pub struct Body;"),
        ("topo", "pub fn order() {}"),
        ("fusion", "mod row;\nuse row::Geometry;\nstruct Fuser;"),
        (
            "fusion::row",
            "use super::Fuser;\nuse crate::Body;\npub struct Geometry;\nfn f() { super::super::topo::order(); }",
        ),
    ];
    assert_eq!(
        fake_edges(&files),
        edge_set(&[("fusion::row", "fusion"), ("fusion::row", "plan"), ("fusion::row", "topo")])
    );
}
