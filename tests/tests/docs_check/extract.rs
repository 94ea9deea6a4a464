//! From a Markdown file's parts to references: `make` targets and flags in code spans and shell
//! blocks, dotted config keys and chart values in code spans and `--set`, metric names anywhere,
//! repository paths in code spans, shell blocks and links.
//!
//! Only code is read for names, never prose: "make one" is English, `make one` a target.

use std::collections::BTreeSet;

use super::commands::{command_refs, flags, shell_refs};
use super::known::Known;
use super::markdown::{self, Parsed};

/// What a reference names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// a `make` target
    Target,
    /// a flag of `rollouts-dispatch <subcommand>` (the path, `` for any of ours)
    Flag(Tool),
    /// a server config key
    Key,
    /// a chart value
    Value,
    /// a Prometheus metric of the server
    Metric,
    /// a file or directory of the repository, or a heading anchor (`file#anchor`)
    Path,
}

/// Whose flag.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tool {
    /// `rollouts-dispatch` and this subcommand path (`token issue`)
    Server(String),
    /// `rollouts-dispatch-plugin`
    Plugin,
    /// a bare `--flag`: one of ours, or another tool's if its paragraph names one
    Any,
}

impl Kind {
    /// The word of the report.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Kind::Target => "make target",
            Kind::Flag(_) => "flag",
            Kind::Key => "config key",
            Kind::Value => "chart value",
            Kind::Metric => "metric",
            Kind::Path => "path",
        }
    }
}

/// One name the docs use, and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ref {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) line: usize,
    /// its paragraph names another tool or project ([`OTHER_TOOLS`]): a bare flag, a chart
    /// value outside the chart's docs or a path that is not ours may be that one's
    pub(crate) foreign: bool,
}

/// The tools and projects whose flags and keys the docs may give without them being ours: in a
/// paragraph that names one, a bare `--flag` or a chart value outside the chart's docs that is
/// not ours is taken as theirs (paths: [`UPSTREAM`]).
pub(crate) const OTHER_TOOLS: [&str; 27] = [
    "kubectl",
    "helm",
    "cargo",
    "go",
    "controller",
    "argo",
    "argo-rollouts",
    "oauth2-proxy",
    "openssl",
    "curl",
    "kube-apiserver",
    "kubelet",
    "etcd",
    "kwok",
    "chromium",
    "tarpaulin",
    "schemathesis",
    "helm-docs",
    "crane",
    "argocd",
    "kargo",
    "akuity",
    "argoproj",
    "promtool",
    "apt-get",
    "rustc",
    "repo-server",
];

/// Whether a text names one of [`OTHER_TOOLS`] (as a word: "ago" is not Go).
pub(crate) fn names_other_tool(line: &str) -> bool {
    line.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
        .any(|w| OTHER_TOOLS.contains(&w) || w.starts_with("controller"))
}

/// The first segments of the names the extractor looks for, from [`Known`].
#[derive(Debug, Default)]
pub(crate) struct Tops {
    /// the repository's top-level directories and files, and those of the doc's directory
    /// (`src/` in tests/README.md)
    pub(crate) repo: BTreeSet<String>,
    /// the server config's top-level keys
    pub(crate) config: BTreeSet<String>,
    /// the chart's top-level values
    pub(crate) chart: BTreeSet<String>,
    /// the subcommand paths of `rollouts-dispatch` (`serve`, `token issue`)
    pub(crate) commands: BTreeSet<String>,
}

impl Tops {
    /// Read from what exists.
    pub(crate) fn of(known: &Known) -> Self {
        let first = |s: &String| s.split(['.', '/', ' ']).next().unwrap_or("").to_string();
        Tops {
            repo: known
                .files
                .iter()
                .map(|f| f.split('/').next().unwrap_or("").to_string())
                .collect(),
            config: known.config_keys.iter().map(first).collect(),
            chart: known.chart_values.iter().map(first).collect(),
            commands: known
                .commands
                .keys()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
        }
    }

    /// These, with the entries of the directory of `file` as roots too.
    pub(crate) fn for_doc(&self, file: &str, files: &BTreeSet<String>) -> Self {
        let mut repo = self.repo.clone();
        if let Some((dir, _)) = file.rsplit_once('/') {
            let prefix = format!("{dir}/");
            repo.extend(files.iter().filter_map(|f| {
                f.strip_prefix(&prefix)
                    .and_then(|rest| rest.split('/').next())
                    .map(str::to_string)
            }));
        }
        Tops {
            repo,
            config: self.config.clone(),
            chart: self.chart.clone(),
            commands: self.commands.clone(),
        }
    }
}

/// The top-level directories and files a path may start with.
fn is_repo_rooted(token: &str, tops: &Tops) -> bool {
    let first = token.split('/').next().unwrap_or("");
    !first.is_empty() && token.contains('/') && tops.repo.contains(first)
}

/// Every reference of a Markdown file (`file`: repository-relative, for relative links).
/// `tops`: the repository's top-level entries; `chart_doc`: a chart README, whose dotted spans
/// are chart values first.
pub(crate) fn refs(file: &str, parsed: &Parsed, tops: &Tops, chart_doc: bool) -> Vec<Ref> {
    let mut out = Vec::new();
    let foreign = foreign_lines(parsed);
    for (n, line) in &parsed.prose {
        for span in markdown::code_spans(line) {
            span_refs(&span, *n, tops, chart_doc, &mut out);
        }
        let definition = line
            .trim_start()
            .strip_prefix('[')
            .and_then(|l| l.split_once("]: "))
            .map(|(_, t)| t.split_whitespace().next().unwrap_or("").to_string());
        for target in markdown::links(line).into_iter().chain(definition) {
            if let Some(p) = link_path(file, &target) {
                out.push(Ref {
                    kind: Kind::Path,
                    name: p,
                    line: *n,
                    foreign: false,
                });
            }
        }
        metrics(line, *n, &mut out);
    }
    for b in &parsed.blocks {
        let lang = b.info.split_whitespace().next().unwrap_or("");
        match lang {
            "sh" | "bash" | "shell" | "console" | "" => shell_refs(&b.lines, tops, &mut out),
            _ => {}
        }
        for (n, l) in &b.lines {
            metrics(l, *n, &mut out);
        }
    }
    let cited = cited_lines(parsed);
    for r in &mut out {
        r.foreign = match r.kind {
            Kind::Path => cited.contains(&r.line),
            _ => foreign.contains(&r.line),
        };
    }
    out
}

/// The projects whose code the docs cite by path (`Kargo api/v1alpha1/stage_types.go:216`).
const UPSTREAM: [&str; 10] = [
    "kargo",
    "akuity",
    "argo",
    "argoproj",
    "argocd",
    "argo-cd",
    "argo-rollouts",
    "kubernetes",
    "kube-rs",
    "prometheus",
];

/// The prose lines that name an upstream project, or follow one that does (a citation broken
/// over two lines): a path there that is not ours is that project's.
fn cited_lines(parsed: &Parsed) -> BTreeSet<usize> {
    let names = |line: &str| {
        line.to_lowercase()
            .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .any(|w| UPSTREAM.contains(&w))
    };
    let mut out = BTreeSet::new();
    for (n, line) in &parsed.prose {
        if names(line) {
            out.insert(*n);
            out.insert(n + 1);
        }
    }
    out
}

/// The references of the comments of a YAML file (`parsed.prose`: the comment lines): as in
/// prose, and every word that is a repository path, code span or not.
pub(crate) fn comment_refs(file: &str, parsed: &Parsed, tops: &Tops) -> Vec<Ref> {
    let mut out = refs(file, parsed, tops, false);
    let cited = cited_lines(parsed);
    for (n, line) in &parsed.prose {
        for word in markdown::without_spans(line).split_whitespace() {
            if let Some(p) = path_token(word, tops) {
                let foreign = cited.contains(n);
                out.push(Ref {
                    kind: Kind::Path,
                    name: p,
                    line: *n,
                    foreign,
                });
            }
        }
    }
    out
}

/// The prose lines whose paragraph (lines up to a blank one, a heading or a list item) names
/// another tool or project.
fn foreign_lines(parsed: &Parsed) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    let mut flush = |p: &mut Vec<(usize, &str)>| {
        let text: Vec<&str> = p.iter().map(|(_, l)| *l).collect();
        if names_other_tool(&text.join(" ")) {
            out.extend(p.iter().map(|(n, _)| *n));
        }
        p.clear();
    };
    let mut last = 0;
    for (n, line) in &parsed.prose {
        let t = line.trim_start();
        let starts = t.is_empty() || t.starts_with(['#', '-', '*', '|']) || *n != last + 1;
        if starts {
            flush(&mut paragraph);
        }
        if !t.is_empty() {
            paragraph.push((*n, line));
        }
        last = *n;
    }
    flush(&mut paragraph);
    out
}

/// A link's repository path (`docs/x.md#anchor`), `None` for URLs and mail.
pub(crate) fn link_path(file: &str, target: &str) -> Option<String> {
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = target
        .split_once('#')
        .map_or((target, None), |(p, a)| (p, Some(a)));
    let path = if path.is_empty() {
        file.to_string()
    } else {
        markdown::resolve(file, path)?
    };
    Some(match anchor {
        Some(a) => format!("{path}#{a}"),
        None => path,
    })
}

/// `rollouts_dispatch_…` names on a line.
fn metrics(line: &str, n: usize, out: &mut Vec<Ref>) {
    let mut rest = line;
    while let Some(i) = rest.find("rollouts_dispatch_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let wildcard = tail[len..].starts_with('*') || name.ends_with('_');
        if !wildcard && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(Ref {
                kind: Kind::Metric,
                name: name.to_string(),
                line: n,
                foreign: false,
            });
        }
        rest = &tail[len..];
    }
}

/// The references of one code span of a prose line.
fn span_refs(span: &str, n: usize, tops: &Tops, chart_doc: bool, out: &mut Vec<Ref>) {
    let words: Vec<&str> = span.split_whitespace().collect();
    let Some(first) = words.first() else { return };
    if *first == "make"
        || *first == "rollouts-dispatch"
        || *first == "rollouts-dispatch-plugin"
        || first.contains('=')
    {
        command_refs(&words, n, tops, out);
        return;
    }
    if *first == "helm" || *first == "--set" {
        command_refs(&words, n, tops, out);
        return;
    }
    if tops.commands.contains(*first) && words.iter().any(|w| w.starts_with('-')) {
        let mut w = vec!["rollouts-dispatch"];
        w.extend(&words);
        command_refs(&w, n, tops, out);
        return;
    }
    if first.starts_with("--") {
        flags(&words, &Tool::Any, n, out);
        return;
    }
    if let Some(key) = dotted(span) {
        let top = key.split(['.', '[']).next().unwrap_or("");
        let in_config = tops.config.contains(top);
        let kind = if chart_doc || !in_config {
            Kind::Value
        } else {
            Kind::Key
        };
        if in_config || tops.chart.contains(top) {
            out.push(Ref {
                kind,
                name: key,
                line: n,
                foreign: false,
            });
        }
        return;
    }
    if words.len() == 1 {
        if let Some(p) = path_token(first, tops) {
            out.push(Ref {
                kind: Kind::Path,
                name: p,
                line: n,
                foreign: false,
            });
        }
    }
}

/// File extensions that make a dotted word a file name, not a key (`server.yaml`, `agent.rs`).
const EXTENSIONS: [&str; 22] = [
    "yaml", "yml", "json", "rs", "md", "mk", "sh", "go", "toml", "txt", "key", "crt", "pem",
    "token", "jwt", "keys", "log", "csr", "tgz", "gz", "mod", "sum",
];

/// A dotted key at the start of a span (`engine.connectTimeout`, `agents.store: kubernetes`,
/// `tls.x={a}`, `policy.rules[].projects`), if the span is one.
pub(crate) fn dotted(span: &str) -> Option<String> {
    let span = span.strip_prefix(".Values.").unwrap_or(span);
    let end = span
        .find(|c: char| !(c.is_ascii_alphanumeric() || "._-[]".contains(c)))
        .unwrap_or(span.len());
    let (key, rest) = span.split_at(end);
    if !(rest.is_empty() || rest.starts_with([':', '=', ' '])) || !key.contains('.') {
        return None;
    }
    let segs: Vec<&str> = key.split('.').collect();
    let ok = segs.iter().all(|s| {
        let s = s.trim_end_matches("[]");
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) && !s.contains(['[', ']'])
    });
    let last = segs.last().copied().unwrap_or("");
    (ok && !EXTENSIONS.contains(&last)).then(|| key.to_string())
}

/// A repository path in a token (`config/server.yaml`, `server/src/x.rs:12-20`, `tests/`):
/// quotes, trailing punctuation and a line suffix dropped; `None` for anything else.
pub(crate) fn path_token(token: &str, tops: &Tops) -> Option<String> {
    let t = token
        .trim_start_matches(|c| "'\"(`".contains(c))
        .trim_end_matches(|c| "'\"(),;.:`".contains(c));
    let t = match t.split_once(':') {
        Some((p, lines))
            if lines
                .chars()
                .all(|c| c.is_ascii_digit() || c == '-' || c == ',') =>
        {
            p
        }
        _ => t,
    };
    if t.contains(['*', '<', '>', '{', '$', '…', '?', '|']) || t.contains("...") {
        return None;
    }
    is_repo_rooted(t, tops).then(|| t.to_string())
}
