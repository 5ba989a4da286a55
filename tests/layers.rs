//! Tidy tests over `src/` (in the manner of rust-analyzer's `tidy`): imports run down the
//! layers ARCHITECTURE.md names ("Layers", "Service layers"), and no two files import each
//! other, however indirectly.
//!
//! The test reads the sources as text: every `use` tree and every `crate::`/`super::`/`self::`
//! path outside tests, resolved to the file that defines the item (through `pub use`
//! re-exports, as the compiler does). A module's declaration of its children (`mod x;`) is not
//! an import; a file's `#[cfg(test)]` modules and test files are left out (tests may import
//! anything).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The crate's layers, bottom first: a file may import only from its own layer or lower.
/// Longest prefix wins; paths are relative to `src/`.
const CRATE_LAYERS: &[(&str, u8)] = &[
    ("model/", 1),
    ("trace.rs", 1),
    ("actors/messages.rs", 1),
    ("config/", 2),
    ("ports/", 2),
    ("actors/", 3),
    ("adapters/", 4),
    ("testing/", 4),
    ("sim/", 5),
    ("service/", 6),
];

/// The service's layers, bottom first (ARCHITECTURE.md, "Service layers"). Paths relative to
/// `src/service/`; longest prefix wins.
const SERVICE_LAYERS: &[(&str, u8)] = &[
    // base: settings, tokens, TLS, connections, the audit log, trace export.
    ("settings/", 1),
    ("token.rs", 1),
    ("tls.rs", 1),
    ("pgconnect.rs", 1),
    ("pgtls.rs", 1),
    ("audit/", 1),
    ("telemetry/", 1),
    // state: the store and the lease.
    ("store/", 2),
    ("lease/", 2),
    // parts of a model: its metrics, events and cloud.
    ("metrics/", 3),
    ("events/", 3),
    ("cloud/", 3),
    // the service's error (it wraps the store's) and its data directory.
    ("error.rs", 3),
    ("datadir.rs", 3),
    // one model's runtime; the many models' host; the HTTP layer; the wiring.
    ("runtime/", 4),
    ("host/", 5),
    ("http/", 6),
    ("serve.rs", 7),
    // the facade: what the binary, the tests and embedders use.
    ("mod.rs", 7),
];

/// The sources under `src/` (without `src/bin`), keyed by their path relative to `src/`,
/// comments and test modules taken out.
struct Sources {
    files: BTreeMap<String, String>,
}

impl Sources {
    fn read() -> Sources {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut raw = BTreeMap::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
                if path.is_dir() {
                    if rel != "bin" {
                        stack.push(path);
                    }
                } else if rel.ends_with(".rs") {
                    raw.insert(rel, std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        // Files declared as test-only modules (`#[cfg(test)] mod x;`, `#[cfg(all(test, ..))]`).
        let mut test_only = BTreeSet::new();
        for (file, text) in &raw {
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let attr = line.trim();
                if !(attr.starts_with("#[cfg(test)]") || attr.starts_with("#[cfg(all(test")) {
                    continue;
                }
                let Some(next) = lines.get(i + 1).map(|l| l.trim()) else { continue };
                if let Some(name) = next.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                    let dir = module_dir(file);
                    test_only.insert(format!("{dir}{name}.rs"));
                    test_only.insert(format!("{dir}{name}/mod.rs"));
                }
            }
        }
        let files = raw
            .into_iter()
            .filter(|(f, _)| !test_only.contains(f) && !f.ends_with("/tests.rs") && !f.ends_with("_tests.rs"))
            .map(|(f, text)| (f, without_tests(&without_comments(&text))))
            .collect();
        Sources { files }
    }

    /// The file of module `segs` (`[]`: the crate root).
    fn module_file(&self, segs: &[String]) -> Option<String> {
        if segs.is_empty() {
            return Some("lib.rs".to_owned());
        }
        let base = segs.join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")].into_iter().find(|c| self.files.contains_key(c))
    }

    /// The file that defines the item at the absolute path `segs`, following re-exports.
    fn defining_file(&self, segs: &[String], depth: usize) -> Option<String> {
        let mut module: Vec<String> = Vec::new();
        let mut file = self.module_file(&[])?;
        let mut i = 0;
        while i < segs.len() {
            module.push(segs[i].clone());
            match self.module_file(&module) {
                Some(f) => {
                    file = f;
                    i += 1;
                }
                None => {
                    module.pop();
                    break;
                }
            }
        }
        if i == segs.len() || depth > 16 {
            return Some(file);
        }
        let item = &segs[i];
        // A `#[macro_export]` macro is the crate root's item, but its file is where it is
        // written.
        if module.is_empty() {
            let exported = format!("#[macro_export]\nmacro_rules! {item} ");
            if let Some((f, _)) = self.files.iter().find(|(_, text)| text.contains(&exported)) {
                return Some(f.clone());
            }
        }
        let trees = use_trees(&self.files[&file]);
        for (public, path, alias) in &trees {
            if *public && alias == item && path.last().map(String::as_str) != Some("*") {
                if let Some(abs) = absolute(self, &file, path) {
                    let mut rest = abs;
                    rest.extend(segs[i + 1..].iter().cloned());
                    return self.defining_file(&rest, depth + 1);
                }
            }
        }
        let globs: Vec<&Vec<String>> = trees
            .iter()
            .filter(|(p, path, _)| *p && path.last().map(String::as_str) == Some("*"))
            .map(|t| &t.1)
            .collect();
        if globs.len() == 1 {
            if let Some(mut abs) = absolute(self, &file, &globs[0][..globs[0].len() - 1]) {
                abs.extend(segs[i..].iter().cloned());
                return self.defining_file(&abs, depth + 1);
            }
        }
        Some(file)
    }

    /// Every file each file imports from.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (file, text) in &self.files {
            let mut to = BTreeSet::new();
            let mut add = |path: &[String]| {
                if let Some(abs) = absolute(self, file, path) {
                    if let Some(target) = self.defining_file(&abs, 0) {
                        if &target != file {
                            to.insert(target);
                        }
                    }
                }
            };
            // A module brought in by name (`use crate::model::{self, ...}`) is no import by
            // itself: the paths through it (`model::Machine`) are.
            let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (_, mut path, alias) in use_trees(text) {
                if path.last().map(String::as_str) == Some("*") {
                    path.pop();
                }
                if let Some(abs) = absolute(self, file, &path) {
                    if !abs.is_empty() && self.module_file(&abs).is_some() {
                        modules.insert(alias, abs);
                        continue;
                    }
                }
                add(&path);
            }
            let starts: Vec<String> =
                ["crate", "super", "self"].into_iter().map(str::to_owned).chain(modules.keys().cloned()).collect();
            for mut path in inline_paths(&without_uses(text), &starts) {
                if let Some(abs) = modules.get(&path[0]) {
                    path.splice(0..1, std::iter::once("crate".to_owned()).chain(abs.iter().cloned()));
                }
                add(&path);
            }
            edges.insert(file.clone(), to);
        }
        edges
    }
}

/// The folder a file's child modules live in: `a/mod.rs` → `a/`, `a/b.rs` → `a/b/`.
fn module_dir(file: &str) -> String {
    match file.strip_suffix("mod.rs").or_else(|| file.strip_suffix("lib.rs")) {
        Some(dir) => dir.to_owned(),
        None => format!("{}/", file.trim_end_matches(".rs")),
    }
}

/// The module path of a file: `service/store/mod.rs` → `[service, store]`.
fn module_of(file: &str) -> Vec<String> {
    let trimmed = file.trim_end_matches(".rs");
    let mut segs: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if matches!(segs.last().map(String::as_str), Some("mod") | Some("lib")) {
        segs.pop();
    }
    segs
}

/// A path as written in `file`, made absolute; `None` for another crate's path.
fn absolute(src: &Sources, file: &str, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut module = module_of(file);
    match first.as_str() {
        "crate" => Some(path[1..].to_vec()),
        "self" => {
            module.extend(path[1..].iter().cloned());
            Some(module)
        }
        "super" => {
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                module.pop();
                rest = &rest[1..];
            }
            module.extend(rest.iter().cloned());
            Some(module)
        }
        _ => {
            // A child module named without `self::` (edition 2018).
            let mut child = module.clone();
            child.push(first.clone());
            src.module_file(&child).map(|_| {
                module.extend(path.iter().cloned());
                module
            })
        }
    }
}

/// The text without comments, and with every string and character literal emptied (so that
/// neither a `//` nor a brace inside a literal is taken for code).
fn without_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, c)| chars.get(i + k) == Some(&c));
    while i < chars.len() {
        let c = chars[i];
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0;
            while i < chars.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (chars.get(i + 1) == Some(&'"') || chars.get(i + 1) == Some(&'#'))
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            j += 1;
            while j < chars.len() && !at(j, &close) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + close.chars().count();
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\''), or a lifetime ('a).
            if chars.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The text without its `#[cfg(test)] mod name { ... }` blocks.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        if trimmed.starts_with("mod ") && trimmed.find('{').is_some_and(|b| trimmed.find(';').is_none_or(|s| b < s)) {
            let open = after.find('{').unwrap();
            let mut depth = 0usize;
            let mut end = after.len();
            for (i, c) in after[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The `use` items of a text: (public, path, the name it binds), one per leaf of each tree.
fn use_trees(text: &str) -> Vec<(bool, Vec<String>, String)> {
    let mut out = Vec::new();
    for stmt in use_statements(text) {
        let (public, tree) = stmt;
        expand(&tree, &[], &mut |path, alias| out.push((public, path, alias)));
    }
    out
}

/// Each `use` statement: whether it is public (`pub`, `pub(crate)`, ...), and its tree.
fn use_statements(text: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = find_use(rest) {
        let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        let head = rest[line_start..at].trim();
        let public = head.starts_with("pub");
        let body = &rest[at + 4..];
        let Some(end) = body.find(';') else { break };
        out.push((public, body[..end].split_whitespace().collect::<Vec<_>>().join(" ")));
        rest = &body[end..];
    }
    out
}

/// Where the next `use ` keyword starts a line's item (after indentation, `pub`, `pub(...)`).
fn find_use(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let lead = line.len() - trimmed.len();
        let after_pub = if let Some(r) = trimmed.strip_prefix("pub") {
            let r = r.trim_start();
            let r = if r.starts_with('(') { r[r.find(')').map_or(0, |i| i + 1)..].trim_start() } else { r };
            Some(r)
        } else {
            None
        };
        let candidate = after_pub.unwrap_or(trimmed);
        if candidate.starts_with("use ") {
            return Some(offset + lead + (trimmed.len() - candidate.len()));
        }
        offset += line.len();
    }
    None
}

fn expand(tree: &str, prefix: &[String], out: &mut dyn FnMut(Vec<String>, String)) {
    let tree = tree.trim();
    match tree.find('{') {
        None => {
            let (path, alias) = match tree.split_once(" as ") {
                Some((p, a)) => (p.trim(), Some(a.trim())),
                None => (tree, None),
            };
            let mut segs: Vec<String> = prefix.to_vec();
            segs.extend(path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned));
            if segs.last().map(String::as_str) == Some("self") {
                segs.pop();
            }
            let name = alias.map(str::to_owned).or_else(|| segs.last().cloned()).unwrap_or_default();
            if !segs.is_empty() {
                out(segs, name);
            }
        }
        Some(open) => {
            let mut segs: Vec<String> = prefix.to_vec();
            segs.extend(tree[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned));
            let Some(close) = tree.rfind('}') else { return };
            let inner = &tree[open + 1..close];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&inner[start..i], &segs, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&inner[start..], &segs, out);
        }
    }
}

fn without_uses(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = find_use(rest) {
        let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        out.push_str(&rest[..line_start]);
        let Some(end) = rest[at..].find(';') else { break };
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Every path written inline that starts with one of `starts` (`crate`, `super`, `self`, and
/// the modules the file brought in by name).
fn inline_paths(text: &str, starts: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for start in starts {
        let start = format!("{start}::");
        let start = start.as_str();
        let mut from = 0;
        while let Some(i) = text[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let end = text[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(text.len(), |e| at + e);
            let segs: Vec<String> = text[at..end].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
            if segs.len() > 1 {
                out.push(segs);
            }
        }
    }
    out
}

fn layer_of(table: &[(&str, u8)], path: &str) -> Option<u8> {
    table.iter().filter(|(prefix, _)| path.starts_with(prefix)).max_by_key(|(prefix, _)| prefix.len()).map(|(_, l)| *l)
}

#[test]
fn imports_run_down_the_crate_layers() {
    let edges = Sources::read().imports();
    let mut wrong = Vec::new();
    for (from, tos) in &edges {
        let Some(mine) = layer_of(CRATE_LAYERS, from) else { continue };
        for to in tos {
            if let Some(theirs) = layer_of(CRATE_LAYERS, to) {
                if theirs > mine {
                    wrong.push(format!("{from} (layer {mine}) imports {to} (layer {theirs})"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports that run up a layer (ARCHITECTURE.md, \"Layers\"):\n{}", wrong.join("\n"));
}

#[test]
fn imports_run_down_the_service_layers() {
    let edges = Sources::read().imports();
    let mut wrong = Vec::new();
    let mut unplaced = BTreeSet::new();
    for (from, tos) in &edges {
        let Some(from_in) = from.strip_prefix("service/") else { continue };
        let Some(mine) = layer_of(SERVICE_LAYERS, from_in) else {
            unplaced.insert(from.clone());
            continue;
        };
        for to in tos {
            let Some(to_in) = to.strip_prefix("service/") else { continue };
            match layer_of(SERVICE_LAYERS, to_in) {
                Some(theirs) if theirs > mine => {
                    wrong.push(format!("{from} (layer {mine}) imports {to} (layer {theirs})"))
                }
                Some(_) => {}
                None => {
                    unplaced.insert(to.clone());
                }
            }
        }
    }
    assert!(unplaced.is_empty(), "service files in no layer (add them to SERVICE_LAYERS): {unplaced:?}");
    assert!(
        wrong.is_empty(),
        "imports that run up a service layer (ARCHITECTURE.md, \"Service layers\"):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other() {
    let edges = Sources::read().imports();
    // Depth-first search for a back edge; each cycle found is printed as a path.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut cycles = Vec::new();
    fn visit<'a>(
        at: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(at, 1);
        path.push(at);
        for to in edges.get(at).into_iter().flatten() {
            match state.get(to.as_str()) {
                None => visit(to, edges, state, path, cycles),
                Some(1) => {
                    let from = path.iter().position(|p| *p == to.as_str()).unwrap();
                    let mut cycle: Vec<&str> = path[from..].to_vec();
                    cycle.push(to);
                    cycles.push(cycle.join(" -> "));
                }
                Some(_) => {}
            }
        }
        path.pop();
        state.insert(at, 2);
    }
    for file in edges.keys() {
        if !state.contains_key(file.as_str()) {
            visit(file, &edges, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    assert!(cycles.is_empty(), "files that import each other:\n{}", cycles.join("\n"));
}

#[test]
fn the_resolver_follows_re_exports_and_sees_inline_paths() {
    // The tidy tests are only as good as the resolver: check it on known facts of this tree.
    let src = Sources::read();
    let edges = src.imports();
    // `crate::model::MachineId` is re-exported by `model/mod.rs` from `types.rs` (a glob).
    let users_of_types = edges.values().filter(|tos| tos.contains("model/types.rs")).count();
    assert!(users_of_types > 10, "model/types.rs imported by {users_of_types} files");
    let to_model_mod: Vec<&String> =
        edges.iter().filter(|(_, tos)| tos.contains("model/mod.rs")).map(|(f, _)| f).collect();
    assert!(to_model_mod.is_empty(), "model/mod.rs only re-exports, yet imported by {to_model_mod:?}");
    // The wiring creates the actors: it imports their shells.
    assert!(edges["actors/wiring.rs"].iter().any(|t| t.ends_with("/actor.rs")), "{:?}", edges["actors/wiring.rs"]);
    // An exported macro is its file's: `crate::forward_broker!` is `ports/broker.rs`, not the root.
    assert!(edges["actors/containers/mod.rs"].contains("ports/broker.rs"), "{:?}", edges["actors/containers/mod.rs"]);
    assert!(!edges["actors/containers/mod.rs"].contains("lib.rs"));
}
