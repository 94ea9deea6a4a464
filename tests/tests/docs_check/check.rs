//! The references and YAML blocks of every doc against what exists, and the report: one line
//! per failure, `FILE:LINE: kind 'ref' does not exist (hint)`, then the tally
//! `docs: files=F targets=T flags=L keys=K values=V metrics=M paths=P yaml_blocks=Y broken=B`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::extract::{self, Kind, Ref, Tool, Tops};
use super::known::Known;
use super::markdown;
use super::yaml;

/// What the check found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Markdown files read
    pub(crate) files: usize,
    /// distinct references checked, by kind word
    pub(crate) checked: BTreeMap<&'static str, BTreeSet<String>>,
    /// YAML blocks and files validated
    pub(crate) yaml_blocks: usize,
    /// of which marked partial
    pub(crate) fragments: usize,
    /// one line per failure
    pub(crate) broken: Vec<String>,
    /// every YAML block validated and what as (`FILE:LINE: kind`)
    pub(crate) yaml_kinds: Vec<String>,
    /// unknown names taken as another tool's (their paragraph names it), with where
    pub(crate) foreign: Vec<String>,
}

impl Report {
    /// The report as printed: the failures, then the tally (always the last line).
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for b in &self.broken {
            out.push_str(b);
            out.push('\n');
        }
        let n = |k: &str| self.checked.get(k).map_or(0, BTreeSet::len);
        if std::env::var_os("DOCS_CHECK_VERBOSE").is_some() {
            for y in &self.yaml_kinds {
                out.push_str(&format!("docs: yaml block {y}\n"));
            }
            for f in &self.foreign {
                out.push_str(&format!("docs: taken as another tool's: {f}\n"));
            }
        }
        out.push_str(&format!(
            "docs: yaml blocks marked fragment: {}; unknown names taken as another tool's: {} (DOCS_CHECK_VERBOSE=1 lists them)\n",
            self.fragments,
            self.foreign.len()
        ));
        out.push_str(&format!(
            "docs: files={} targets={} flags={} keys={} values={} metrics={} paths={} yaml_blocks={} broken={}\n",
            self.files,
            n("make target"),
            n("flag"),
            n("config key"),
            n("chart value"),
            n("metric"),
            n("path"),
            self.yaml_blocks,
            self.broken.len()
        ));
        out
    }
}

/// Checks the repository at `root`.
pub(crate) fn run(root: &Path, known: &Known) -> Report {
    let mut checker = Checker::new(root, known);
    for file in markdown::doc_files(&known.files) {
        let text =
            std::fs::read_to_string(root.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        checker.doc(&file, &text);
        checker.report.files += 1;
    }
    for file in known
        .files
        .iter()
        .filter(|f| f.starts_with("config/") && (f.ends_with(".yaml") || f.ends_with(".yml")))
    {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        checker.config_file(file, &text);
    }
    checker.report
}

/// What is known, and the report being written.
pub(crate) struct Checker<'a> {
    known: &'a Known,
    tops: Tops,
    anchors: Anchors<'a>,
    /// what was found so far
    pub(crate) report: Report,
}

impl<'a> Checker<'a> {
    /// A checker of the files of `root` against `known`.
    pub(crate) fn new(root: &'a Path, known: &'a Known) -> Self {
        Checker {
            known,
            tops: Tops::of(known),
            anchors: Anchors {
                root,
                cache: BTreeMap::new(),
            },
            report: Report::default(),
        }
    }

    /// Checks one Markdown file's references and YAML blocks.
    pub(crate) fn doc(&mut self, file: &str, text: &str) {
        let parsed = markdown::parse(text);
        let chart_doc = file.starts_with("charts/");
        self.anchors
            .cache
            .entry(file.to_string())
            .or_insert_with(|| markdown::anchors(text));
        let tops = self.tops.for_doc(file, &self.known.files);
        for r in extract::refs(file, &parsed, &tops, chart_doc) {
            self.reference(file, r);
        }
        for b in &parsed.blocks {
            let mut info = b.info.split_whitespace();
            if matches!(info.next(), Some("yaml" | "yml")) {
                let fragment = info.any(|w| w == "fragment");
                self.yaml_block(file, b.line, &b.text(), fragment, chart_doc);
            }
        }
    }

    /// Checks a YAML file of `config/`: validated as a block, its comments' references as prose.
    pub(crate) fn config_file(&mut self, file: &str, text: &str) {
        self.yaml_block(file, 1, text, false, false);
        let comments = markdown::Parsed {
            prose: yaml_comments(text),
            blocks: Vec::new(),
        };
        let tops = self.tops.for_doc(file, &self.known.files);
        for r in extract::comment_refs(file, &comments, &tops) {
            self.reference(file, r);
        }
    }

    /// Counts `r` and reports it when what it names does not exist.
    fn reference(&mut self, file: &str, r: Ref) {
        // Distinct names: a flag per command it is given to.
        let id = match &r.kind {
            Kind::Flag(Tool::Server(path)) => format!("rollouts-dispatch {path} {}", r.name),
            Kind::Flag(Tool::Plugin) => format!("rollouts-dispatch-plugin {}", r.name),
            _ => r.name.clone(),
        };
        let report = &mut self.report;
        report.checked.entry(r.kind.word()).or_default().insert(id);
        let ours = Ref {
            foreign: false,
            ..r.clone()
        };
        if r.foreign && exists(file, &ours, self.known, &mut self.anchors).is_err() {
            report
                .foreign
                .push(format!("{file}:{}: {} '{}'", r.line, r.kind.word(), r.name));
        }
        if let Err(hint) = exists(file, &r, self.known, &mut self.anchors) {
            report.broken.push(format!(
                "{file}:{}: {} '{}' does not exist ({hint})",
                r.line,
                r.kind.word(),
                r.name
            ));
        }
    }

    fn yaml_block(&mut self, file: &str, line: usize, text: &str, fragment: bool, chart_doc: bool) {
        let outcome = yaml::validate(text, fragment, chart_doc, self.known);
        let report = &mut self.report;
        report.yaml_blocks += 1;
        report
            .yaml_kinds
            .push(format!("{file}:{line}: {}", outcome.kind));
        if outcome.kind.contains("fragment") {
            report.fragments += 1;
        }
        for e in outcome.errors {
            report.broken.push(format!(
                "{file}:{line}: yaml block '{}' does not validate ({e})",
                outcome.kind
            ));
        }
    }
}

/// The full-line comments of a YAML file, without their `#`.
fn yaml_comments(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            l.trim_start()
                .strip_prefix('#')
                .map(|c| (i + 1, c.to_string()))
        })
        .collect()
}

/// The heading anchors of the Markdown files, read once.
struct Anchors<'a> {
    root: &'a Path,
    cache: BTreeMap<String, BTreeSet<String>>,
}

impl Anchors<'_> {
    fn of(&mut self, file: &str) -> &BTreeSet<String> {
        let root = self.root;
        self.cache.entry(file.to_string()).or_insert_with(|| {
            std::fs::read_to_string(root.join(file))
                .map(|t| markdown::anchors(&t))
                .unwrap_or_default()
        })
    }
}

/// `Ok` when what `r` names exists, else a hint of where it was looked for.
fn exists(file: &str, r: &Ref, known: &Known, anchors: &mut Anchors<'_>) -> Result<(), String> {
    let chart_doc = file.starts_with("charts/");
    let name = r.name.as_str();
    let found = match &r.kind {
        Kind::Target => known.targets.contains(name),
        Kind::Flag(Tool::Server(path)) => {
            return match known.commands.get(path) {
                Some(flags) if flags.contains(name) => Ok(()),
                Some(_) => Err(format!(
                    "not a flag of `rollouts-dispatch {path}`: server/src/cmd, `--help`"
                )),
                None => Err(format!("no subcommand `{path}`")),
            }
        }
        Kind::Flag(Tool::Plugin) => known.plugin_flags.contains(name),
        Kind::Flag(Tool::Any) => {
            r.foreign
                || known.plugin_flags.contains(name)
                || known.commands.values().any(|f| f.contains(name))
        }
        Kind::Key => known.config_key(name) || known.chart_value(name),
        // The chart's docs also name the server config's keys (what `config:` holds).
        Kind::Value if chart_doc => known.chart_value(name) || known.config_key(name),
        Kind::Value => known.chart_value(name) || r.foreign,
        Kind::Metric => known.metrics.contains(name),
        Kind::Path => {
            let (path, anchor) = name
                .split_once('#')
                .map_or((name, None), |(p, a)| (p, Some(a)));
            // `tests/e2e_real/` in tests/README.md is tests/tests/e2e_real/.
            let here = markdown::resolve(file, path).unwrap_or_default();
            let path = if !known.path(path) && known.path(&here) {
                here.as_str()
            } else {
                path
            };
            if !known.path(path) && !anchors.cache.contains_key(path) {
                if r.foreign {
                    return Ok(());
                }
                return Err("no such file or directory in the repository".into());
            }
            return match anchor {
                Some(a) if !anchors.of(path).contains(a) => {
                    Err(format!("no heading with anchor #{a} in {path}"))
                }
                _ => Ok(()),
            };
        }
    };
    if found {
        return Ok(());
    }
    Err(match &r.kind {
        Kind::Target => "no rule in the Makefile or the files it includes".into(),
        Kind::Flag(Tool::Plugin) => "not a flag of rollouts-dispatch-plugin: metric-provider/src/lib.rs".into(),
        Kind::Flag(_) => "not a flag of any rollouts-dispatch command nor of the plugin; another tool's? name the tool on the line".into(),
        Kind::Key => "not a key of server/src/config/reference.rs reference() nor a chart value".into(),
        Kind::Value => "not in charts/rollouts-dispatch/values.yaml nor values.schema.json (nor a config key)".into(),
        Kind::Metric => "not registered in server/src/runtime/metrics.rs".into(),
        Kind::Path => unreachable!(),
    })
}
