//! The server crate's layering and size, checked (`make lint` runs these tests, so does
//! `make test-fast`): no import cycle between its top-level modules (`docs/architecture.md` says
//! which module may import which), no source file too long to read in one sitting. A cycle is
//! how a crate turns into one knot; this names it the day it appears.
//!
//! The graph is read from the source: a module `a` depends on `b` when non-test code under
//! `src/a` (or `src/a.rs`) names `crate::b`. Test code (`#[cfg(test)]` onwards, `tests.rs`) may
//! reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read server/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The production part of a file: up to its first `#[cfg(test)]`, comments dropped.
fn production_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named as `crate::name` or inside `crate::{a, b::c}`.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for part in group.split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn server_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        // Test modules: `tests.rs`, and the files of a `tests/` folder beside it.
        if rel.file_name().is_some_and(|n| n == "tests.rs")
            || rel.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a file name");
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let deps = graph.entry(top.clone()).or_default();
        deps.extend(
            crate_references(&production_code(&text))
                .into_iter()
                .filter(|d| *d != top),
        );
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.graph.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn the_server_modules_import_each_other_without_cycles() {
    let graph = server_graph();
    assert!(
        graph.contains_key("engine") && graph.contains_key("runtime"),
        "the module graph was not read: {graph:?}"
    );
    let found = cycles(&graph);
    let edges: Vec<String> = graph
        .iter()
        .map(|(m, deps)| {
            format!(
                "  {m} -> {}",
                deps.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles between server modules: {found:?}\nthe graph:\n{}\n\
         move the shared piece down (to dispatch-api, runtime/ or a leaf module) instead",
        edges.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_string(), deps.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    let refs =
        crate_references("use crate::{engine::Engine, job};\nlet x = crate::policy::glob_match;");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        vec!["engine", "job", "policy"]
    );
}

#[test]
fn every_server_source_file_reads_in_one_sitting() {
    const MAX_LINES: usize = 800;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these along their concerns (at most {MAX_LINES} lines each): {long:?}"
    );
}

#[test]
fn production_code_has_typed_errors() {
    // A `String` error loses its cause and cannot be matched; thiserror types keep both.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let code = production_code(&std::fs::read_to_string(f).expect("read a source file"));
        for (n, line) in code.lines().enumerate() {
            if result_error_types(line).iter().any(|e| e == "String") {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "production Result<_, String> (use a thiserror type): {found:#?}"
    );
}

/// The error type of every `Result<T, E>` written on `line` (`E` with white space removed).
fn result_error_types(line: &str) -> Vec<String> {
    let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    for (i, _) in compact.match_indices("Result<") {
        let (mut depth, mut comma) = (0i32, None);
        for (j, c) in compact[i + "Result<".len()..].char_indices() {
            match c {
                '<' | '(' => depth += 1,
                '>' | ')' if depth > 0 => depth -= 1,
                ',' if depth == 0 => comma = Some(j + 1),
                '>' => {
                    if let Some(start) = comma {
                        let args = &compact[i + "Result<".len()..];
                        out.push(args[start..j].to_string());
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn the_error_type_finder_reads_nested_generics() {
    assert_eq!(
        result_error_types("fn f(m: &BTreeMap<String, String>) -> Result<Self, JobRefError> {"),
        vec!["JobRefError"]
    );
    assert_eq!(
        result_error_types("-> Result<(Vec<u8>, BTreeMap<String, String>), String>"),
        vec!["String"]
    );
    assert!(result_error_types("-> anyhow::Result<()>").is_empty());
}
