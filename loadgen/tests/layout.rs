//! The layout rules of loadgen's and the test kit's sources, checked on the
//! files themselves so they cannot drift:
//!
//! - no file imports a file that imports it back, directly or around a
//!   longer circle (a type two files need lives in a third, lower one): the
//!   graph of `crate::` paths between files has no cycle;
//! - loadgen's parts are layered one way ([`LOADGEN_LAYERS`], the order
//!   `lib.rs` states): a file imports only its own part or lower ones, so
//!   nothing below `cli` sees a flag;
//! - every file opens with `//!` module docs;
//! - no file over 500 lines, no function over 100 lines (rustfmt layout: a
//!   function ends at the first `}` line at its own indentation).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 500;

/// loadgen's top-level modules, top layer first (as `lib.rs` lists them);
/// the modules of one entry are one layer.
const LOADGEN_LAYERS: &[&[&str]] = &[
    &["cli"],
    &["modes"],
    &["report"],
    &["measure"],
    &["client"],
    &["workload"],
    &["config", "record", "error"],
];
const MAX_FN_LINES: usize = 100;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src` (`client/openai/mod.rs` ->
/// `client::openai`; `lib.rs` -> the crate root, "").
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The paths after each `prefix` (e.g. `crate::`) on code lines (comments
/// skipped), as segments; `prefix` must not follow an identifier character.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            let after = &rest[i + prefix.len()..];
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(after.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                let segs: Vec<String> = after[..end]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                out.push(segs);
            }
            rest = &after[end..];
        }
    }
    out
}

/// The `crate::...` paths a file mentions.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    paths_after(text, "crate::")
}

/// The modules a file refers to: `crate::` paths anywhere, `super::` paths
/// outside its test module, and its child modules by bare name.
fn refs(me: &str, modules: &BTreeSet<String>, text: &str) -> BTreeSet<String> {
    let join = |base: &str, segs: &[String]| -> Vec<String> {
        base.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .chain(segs.iter().cloned())
            .collect()
    };
    let mut out: BTreeSet<String> = crate_paths(text)
        .iter()
        .map(|segs| resolve(modules, segs))
        .collect();
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let parent = me.rsplit_once("::").map_or("", |(p, _)| p);
    for segs in paths_after(code, "super::") {
        out.insert(resolve(modules, &join(parent, &segs)));
    }
    let prefix = if me.is_empty() {
        String::new()
    } else {
        format!("{me}::")
    };
    let children = modules.iter().filter_map(|m| {
        m.strip_prefix(&prefix)
            .filter(|c| !c.is_empty() && !c.contains("::"))
    });
    for child in children {
        for segs in paths_after(code, &format!("{child}::")) {
            let mut full = vec![child.to_string()];
            full.extend(segs);
            out.insert(resolve(modules, &join(me, &full)));
        }
    }
    out.remove(me);
    out
}

/// The file (module) a path resolves to: its longest prefix that is a module.
fn resolve(modules: &BTreeSet<String>, segs: &[String]) -> String {
    (0..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

/// A cycle in the import graph, if any (as a list of modules).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str()) {
            let mut stack = Vec::new();
            if let Some(c) = visit(node, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Functions longer than the limit: (line, length).
fn long_functions(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let is_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) async fn ",
            "const fn ",
            "pub const fn ",
        ]
        .iter()
        .any(|p| t.starts_with(p));
        if !is_fn || t.ends_with(';') || t.ends_with('}') {
            continue;
        }
        let indent = &line[..line.len() - t.len()];
        let close = format!("{indent}}}");
        if let Some(len) = lines[i + 1..].iter().position(|l| *l == close) {
            if len + 2 > MAX_FN_LINES {
                out.push((i + 1, len + 2));
            }
        }
    }
    out
}

/// The layer of a module (0 = top), by its first segment; `None` for the
/// crate root, which may use every part.
fn layer_of(layers: &[&[&str]], module: &str) -> Option<Result<usize, String>> {
    let top = module.split("::").next().filter(|t| !t.is_empty())?;
    Some(
        layers
            .iter()
            .position(|l| l.contains(&top))
            .ok_or_else(|| format!("{module}: `{top}` is in no layer of the list")),
    )
}

/// Every import of a higher layer (and every module in no layer), as
/// `from -> to` lines.
fn layer_violations(graph: &BTreeMap<String, BTreeSet<String>>, layers: &[&[&str]]) -> Vec<String> {
    let mut out = Vec::new();
    for (from, tos) in graph {
        let Some(mine) = layer_of(layers, from) else {
            continue;
        };
        let mine = match mine {
            Ok(l) => l,
            Err(e) => {
                out.push(e);
                continue;
            }
        };
        for to in tos {
            match layer_of(layers, to) {
                Some(Ok(theirs)) if theirs < mine => {
                    out.push(format!("{from} -> {to}: imports a higher layer"));
                }
                Some(Err(e)) => out.push(e),
                _ => {}
            }
        }
    }
    out
}

fn check_crate(src: &Path, layers: Option<&[&[&str]]>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    assert!(files.len() > 5, "found the sources in {}", src.display());
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let name = file
            .strip_prefix(src)
            .expect("under src")
            .display()
            .to_string();
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if !first.starts_with("//!") {
            problems.push(format!("{name}: does not open with //! module docs"));
        }
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            problems.push(format!("{name}: {n} lines (limit {MAX_FILE_LINES})"));
        }
        for (line, len) in long_functions(&text) {
            problems.push(format!(
                "{name}:{line}: a function of {len} lines (limit {MAX_FN_LINES})"
            ));
        }
        let me = module_of(src, file);
        graph.insert(me.clone(), refs(&me, &modules, &text));
    }
    assert!(
        problems.is_empty(),
        "{}:\n{}",
        src.display(),
        problems.join("\n")
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}: import circle: {}", src.display(), cycle.join(" -> "));
    }
    if let Some(layers) = layers {
        let wrong = layer_violations(&graph, layers);
        assert!(
            wrong.is_empty(),
            "{}: layer order broken:\n{}",
            src.display(),
            wrong.join("\n")
        );
    }
}

#[test]
fn loadgen_sources_keep_the_layout_rules() {
    check_crate(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        Some(LOADGEN_LAYERS),
    );
}

#[test]
fn testkit_sources_keep_the_layout_rules() {
    check_crate(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/src"),
        None,
    );
}

#[test]
fn the_checker_finds_circles_and_long_functions() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("bench".into()).or_default().insert("report".into());
    g.entry("report".into()).or_default().insert("sweep".into());
    g.entry("sweep".into()).or_default().insert("bench".into());
    let cycle = find_cycle(&g).expect("the old circle");
    assert_eq!(cycle.first(), cycle.last());
    g.entry("sweep".into()).or_default().remove("bench");
    assert!(find_cycle(&g).is_none());
    let long = format!("fn f() {{\n{}}}\n", "    x();\n".repeat(MAX_FN_LINES));
    assert_eq!(long_functions(&long), vec![(1, MAX_FN_LINES + 2)]);
    assert!(long_functions("fn g() {\n    x();\n}\n").is_empty());
    let segs = crate_paths("use crate::client::openai::conn::{Dialer, Used};");
    assert_eq!(segs, vec![vec!["client", "openai", "conn"]]);
    let modules: BTreeSet<String> = ["", "mock", "mock::config", "mock::http", "mock::timeline"]
        .into_iter()
        .map(String::from)
        .collect();
    let http = "use super::config::TlsIdentity;\nuse super::MockConfig;\n#[cfg(test)]\nmod tests { use super::*; }";
    let want: BTreeSet<String> = ["mock::config", "mock"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(refs("mock::http", &modules, http), want, "super:: paths");
    let parent = "use timeline::Shared;\nfn f() { http::spawn(); }";
    let want: BTreeSet<String> = ["mock::timeline", "mock::http"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(
        refs("mock", &modules, parent),
        want,
        "child modules by name"
    );
}

#[test]
fn the_checker_finds_an_import_of_a_higher_layer() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            g.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
        }
        g
    };
    let fine = graph(&[
        ("cli::build", "modes::setup"),
        ("modes::session", "workload"),
        ("client::pool", "config"),
        ("record", "error"),
        ("", "cli"),
    ]);
    assert!(layer_violations(&fine, LOADGEN_LAYERS).is_empty());
    let planted = graph(&[
        ("workload::schedule", "cli"),
        ("measure::progress", "cli::options"),
        ("cli::build", "modes::setup"),
    ]);
    let wrong = layer_violations(&planted, LOADGEN_LAYERS);
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(
        wrong[0].starts_with("measure::progress -> cli::options"),
        "{wrong:?}"
    );
    let unknown = graph(&[("extras::x", "config")]);
    assert!(layer_violations(&unknown, LOADGEN_LAYERS)[0].contains("in no layer"));
    // The real graph: a planted `use crate::cli::Args;` in a workload file
    // is caught through the same path resolution the crate check uses.
    let modules: BTreeSet<String> = ["", "cli", "workload", "workload::schedule"]
        .into_iter()
        .map(String::from)
        .collect();
    let text = "//! x\nuse crate::cli::Args;\n";
    let mut g = BTreeMap::new();
    g.insert(
        "workload::schedule".to_string(),
        refs("workload::schedule", &modules, text),
    );
    assert_eq!(
        layer_violations(&g, LOADGEN_LAYERS),
        vec!["workload::schedule -> cli: imports a higher layer"]
    );
}
