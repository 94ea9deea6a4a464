//! The layering of every crate and the size of the server's files, checked (`make lint` runs
//! these tests, so does `make test-fast`): no import cycle between the top-level modules of
//! `dispatch-api`, `dispatch-plugin`, `dispatch-metric-provider` and `dispatch-server`; the
//! allowed-imports tables of `docs/architecture.md` (§2 for the api crate, §3 for the server)
//! list exactly the imports the code has, both ways; no server source file too long to read in
//! one sitting. A cycle is how a crate turns into one knot; this names it the day it appears,
//! and the table that says otherwise the day the code changes.
//!
//! The graph is read from the source: a module `a` depends on `b` when non-test code under
//! `src/a` (or `src/a.rs`) names `crate::b` and `b` is a module of the crate (not an item of
//! `lib.rs`). Test code (`#[cfg(test)]` onwards, `tests.rs`) may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
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

/// The workspace's crates whose modules are checked, by directory.
const CRATES: [&str; 4] = ["api", "plugin", "metric-provider", "server"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the server crate sits in the workspace")
        .to_path_buf()
}

/// The graph of the top-level modules of the crate in `dir` (its `src/`): each module with the
/// modules it names.
fn crate_graph(dir: &str) -> Graph {
    let src = workspace().join(dir).join("src");
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
    // `crate::Error`, `crate::VERSION`, an exported macro: items of `lib.rs`, not modules.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

fn arrows(graph: &Graph) -> BTreeSet<(String, String)> {
    graph
        .iter()
        .flat_map(|(m, deps)| deps.iter().map(move |d| (m.clone(), d.clone())))
        .collect()
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
fn no_crate_has_an_import_cycle_between_its_modules() {
    for dir in CRATES {
        let graph = crate_graph(dir);
        assert!(
            graph.len() > 2 && graph.values().any(|deps| !deps.is_empty()),
            "the module graph of {dir}/src was not read: {graph:?}"
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
            "import cycles between the modules of {dir}/src: {found:?}\nthe graph:\n{}\n\
             move the shared piece down (to dispatch-api, a leaf module, or a module of its own) \
             instead",
            edges.join("\n")
        );
    }
}

/// The crates whose allowed-imports table `docs/architecture.md` keeps: the crate's directory,
/// the heading the table follows (its first fenced block), and how a message names the place.
const TABLES: [(&str, &str, &str); 2] = [
    (
        "api",
        "### Modules of `dispatch-api`",
        "docs/architecture.md §2 (Modules of `dispatch-api`)",
    ),
    (
        "server",
        "## 3. Modules of `dispatch-server`",
        "docs/architecture.md §3",
    ),
];

#[test]
fn the_architecture_tables_list_exactly_the_imports_of_the_code() {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md"))
        .expect("read docs/architecture.md");
    let mut problems = Vec::new();
    for (dir, heading, place) in TABLES {
        let block = fenced_block_after(&doc, heading)
            .unwrap_or_else(|| panic!("no fenced block after {heading:?} in docs/architecture.md"));
        let table = allowed_imports(block).unwrap_or_else(|e| panic!("{place}: {e}"));
        problems.extend(table_drift(&crate_graph(dir), &table, place));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What the table of `place` says that the code does not, and the other way round.
fn table_drift(code: &Graph, table: &Graph, place: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for m in code.keys().filter(|m| !table.contains_key(*m)) {
        problems.push(format!(
            "module {m} is not in the table; update {place} (name it as an importer or a leaf)"
        ));
    }
    let named = table
        .iter()
        .flat_map(|(m, deps)| std::iter::once(m).chain(deps));
    let unknown: BTreeSet<&String> = named.filter(|m| !code.contains_key(*m)).collect();
    for m in unknown {
        problems.push(format!(
            "the table names {m}, which is not a module of the crate; update {place}"
        ));
    }
    let (in_code, listed) = (arrows(code), arrows(table));
    for (a, b) in in_code.difference(&listed) {
        problems.push(format!(
            "{a} → {b}: {a} names crate::{b} but the table does not list the arrow; update \
             {place} (or drop the import)"
        ));
    }
    for (a, b) in listed.difference(&in_code) {
        problems.push(format!(
            "{a} → {b}: the table lists the arrow but {a} no longer names crate::{b}; update \
             {place}"
        ));
    }
    problems
}

/// The first fenced block after the line starting with `heading`.
fn fenced_block_after<'a>(doc: &'a str, heading: &str) -> Option<&'a str> {
    let at = doc.find(&format!("\n{heading}"))?;
    let rest = &doc[at..];
    let open = rest.find("\n```")?;
    let body = &rest[open + 1..];
    let body = &body[body.find('\n')? + 1..];
    Some(&body[..body.find("\n```")?])
}

/// An allowed-imports table as a graph. Lines `a ──▶ b, c (why), d`, and lines of `;`-separated
/// entries: `x, y: leaves (why)` and `a → b (why)`. Parenthesised notes may hold commas.
fn allowed_imports(block: &str) -> Result<Graph, String> {
    let mut graph = Graph::new();
    let mut leaves = BTreeSet::new();
    let mut add = |from: &str, to: &str| -> Result<(), String> {
        let from = module_name(from)?;
        let deps = graph.entry(from).or_default();
        for item in split_outside_parens(to, ',') {
            deps.insert(module_name(item)?);
        }
        Ok(())
    };
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        if let Some((from, to)) = line.split_once('▶') {
            add(from.trim_end_matches(['─', ' ']), to)?;
            continue;
        }
        for entry in split_outside_parens(line, ';') {
            if let Some((from, to)) = entry.split_once('→') {
                add(from, to)?;
            } else if let Some((names, what)) = entry.split_once(':') {
                if !what.trim_start().starts_with("leaves") {
                    return Err(format!("expected `…: leaves`, got {entry:?}"));
                }
                for leaf in split_outside_parens(names, ',') {
                    add(leaf, "")?;
                    leaves.insert(module_name(leaf)?);
                }
            } else {
                return Err(format!(
                    "neither `a ──▶ b`, `a → b` nor `…: leaves`: {entry:?}"
                ));
            }
        }
    }
    // A leaf with arrows would make the table say two things; the code check reads only one.
    if let Some(leaf) = leaves.iter().find(|l| !graph[*l].is_empty()) {
        return Err(format!(
            "{leaf} is listed as a leaf and as importing {:?}",
            graph[leaf]
        ));
    }
    Ok(graph)
}

/// `s` cut at every `sep` outside parentheses; empty pieces dropped.
fn split_outside_parens(s: &str, sep: char) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            c if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The module an item of the table names: its first word, a note in parentheses dropped.
fn module_name(item: &str) -> Result<String, String> {
    let name = item.split('(').next().unwrap_or_default().trim();
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        Ok(name.to_string())
    } else {
        Err(format!("{item:?} is not a module name"))
    }
}

#[test]
fn the_table_reader_reads_arrows_leaves_and_notes() {
    let doc = "# Doc\n## 3. Modules\n\ntext\n\n```\n cmd ───▶ agent, http (a, b), job\n \
               agent ─▶ job\n logs, job: leaves (none); http → job (names)\n```\n";
    let block = fenced_block_after(doc, "## 3. Modules").expect("a block");
    let table = allowed_imports(block).expect("a table");
    let expect: Graph = [
        ("agent", vec!["job"]),
        ("cmd", vec!["agent", "http", "job"]),
        ("http", vec!["job"]),
        ("job", vec![]),
        ("logs", vec![]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_string(), deps.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(table, expect);
    assert!(allowed_imports(" cmd ─▶ a b").is_err());
    assert!(allowed_imports(" x: roots").is_err());
    assert!(allowed_imports(" x ─▶ y\n x, y: leaves").is_err());

    let mut code = expect.clone();
    code.get_mut("job").expect("job").insert("logs".into());
    code.get_mut("cmd").expect("cmd").remove("job");
    let drift = table_drift(&code, &table, "§3");
    assert_eq!(drift.len(), 2, "{drift:?}");
    assert!(
        drift[0].starts_with("job → logs: job names crate::logs") && drift[0].contains("update §3")
    );
    assert!(drift[1].starts_with("cmd → job: the table lists") && drift[1].contains("update §3"));
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
    let src = workspace().join("server/src");
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
    let src = workspace().join("server/src");
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
