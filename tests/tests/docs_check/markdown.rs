//! Which Markdown files are the docs, and their parts: prose lines, code spans, fenced code
//! blocks (with their info string), links and the anchors of their headings (GitHub's slugs).
//! A small hand parser: the docs use a plain subset of CommonMark.

use std::collections::BTreeSet;
use std::path::Path;

/// The Markdown files checked, repository-relative, from the files git knows: every `*.md`
/// outside build output, fuzz corpora and vendored code.
pub(crate) fn doc_files(files: &BTreeSet<String>) -> Vec<String> {
    const SKIP: [&str; 5] = [
        "target/",
        "fuzz/",
        "vendor/",
        "node_modules/",
        "third_party/",
    ];
    files
        .iter()
        .filter(|f| f.ends_with(".md"))
        .filter(|f| {
            !SKIP
                .iter()
                .any(|s| f.starts_with(s) || f.contains(&format!("/{s}")))
        })
        .cloned()
        .collect()
}

/// A fenced code block.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// the line of the opening fence (1-based)
    pub(crate) line: usize,
    /// the info string: `yaml`, `sh`, `yaml fragment`, …
    pub(crate) info: String,
    /// the content, each line with its number
    pub(crate) lines: Vec<(usize, String)>,
}

impl Block {
    /// The content as one text (the lines joined).
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        for (_, l) in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// One Markdown file split into what the extractor reads.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// lines outside code blocks (number, text)
    pub(crate) prose: Vec<(usize, String)>,
    /// fenced code blocks
    pub(crate) blocks: Vec<Block>,
}

/// Splits `text` into prose lines and fenced blocks; HTML comments count as prose.
pub(crate) fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    let mut open: Option<(String, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        match &mut open {
            Some((run, b)) => {
                let t = trimmed.trim_end();
                let closes = t.len() >= run.len() && t.chars().all(|c| run.starts_with(c));
                if closes {
                    if let Some((_, b)) = open.take() {
                        out.blocks.push(b);
                    }
                } else {
                    b.lines.push((n, line.to_string()));
                }
            }
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                let first = trimmed.chars().next().unwrap_or('`');
                let run: String = trimmed.chars().take_while(|c| *c == first).collect();
                let info = trimmed[run.len()..].trim().to_string();
                open = Some((
                    run,
                    Block {
                        line: n,
                        info,
                        lines: Vec::new(),
                    },
                ));
            }
            None => out.prose.push((n, line.to_string())),
        }
    }
    if let Some((_, b)) = open {
        out.blocks.push(b);
    }
    out
}

/// The code spans of a prose line (the text between matching backtick runs).
pub(crate) fn code_spans(line: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let start = i + run;
        let mut j = start;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|c| **c == '`').count();
                if r == run {
                    closed = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                spans.push(
                    chars[start..end]
                        .iter()
                        .collect::<String>()
                        .trim()
                        .to_string(),
                );
                i = end + run;
            }
            None => i = start,
        }
    }
    spans
}

/// A prose line without its code spans (links are looked for there).
pub(crate) fn without_spans(line: &str) -> String {
    let mut out = line.to_string();
    for s in code_spans(line) {
        out = out.replacen(&format!("`{s}`"), " ", 1);
    }
    out
}

/// The targets of the inline links `[text](target)` and images of a prose line.
pub(crate) fn links(line: &str) -> Vec<String> {
    let line = without_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                let target = after[..j]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string();
                out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
                rest = &after[j..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's anchors of the headings of `text`: lower-cased, punctuation dropped, spaces to
/// hyphens; a repeated slug gets `-1`, `-2`, …
pub(crate) fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in parse(text).prose {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let title = t.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title.trim());
        let mut s = base.clone();
        let mut k = 1;
        while seen.contains(&s) {
            s = format!("{base}-{k}");
            k += 1;
        }
        seen.insert(s);
    }
    seen
}

/// The slug of one heading's text.
pub(crate) fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// `path` relative to the directory of `from` (both repository-relative), `..` resolved;
/// `None` when it leaves the repository.
pub(crate) fn resolve(from: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Path::new(from)
        .parent()
        .map(|p| {
            p.to_str()
                .unwrap_or("")
                .split('/')
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if path.starts_with('/') {
        parts.clear();
    }
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}
