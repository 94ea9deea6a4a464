//! Shell commands in code spans and blocks: `make` targets, the flags of `rollouts-dispatch`
//! (by subcommand, also after `kubectl exec … --` and in a comment) and of the plugin, `--set`
//! chart values, repository paths among the words.

use super::extract::{path_token, Kind, Ref, Tool, Tops};

/// The references of a shell block: `make` targets, our commands' flags, `--set` values,
/// repository paths; a command continued with `\` is one line, a comment's command too.
pub(crate) fn shell_refs(lines: &[(usize, String)], tops: &Tops, out: &mut Vec<Ref>) {
    let mut joined: Vec<(usize, String)> = Vec::new();
    let mut continuing = false;
    for (n, l) in lines {
        let text = l.trim();
        if continuing {
            if let Some((_, prev)) = joined.last_mut() {
                prev.push(' ');
                prev.push_str(text.trim_start_matches('#').trim_end_matches('\\'));
            }
        } else {
            joined.push((*n, text.trim_end_matches('\\').to_string()));
        }
        continuing = text.ends_with('\\');
    }
    for (n, line) in joined {
        let line = line.trim_start_matches("$ ");
        if let Some(comment) = line.strip_prefix('#') {
            // A command in a comment ("or by hand: rollouts-dispatch agent --server …").
            if let Some(i) = comment.find("rollouts-dispatch ") {
                let words: Vec<&str> = comment[i..].split_whitespace().collect();
                command_refs(&words, n, tops, out);
            }
            continue;
        }
        let commands = line.split(['|', ';', '(', ')']).flat_map(|c| c.split("&&"));
        for cmd in commands {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            command_refs(&words, n, tops, out);
        }
    }
}

/// The references of one command's words (environment assignments first are skipped).
pub(crate) fn command_refs(words: &[&str], n: usize, tops: &Tops, out: &mut Vec<Ref>) {
    let words: Vec<&str> = words
        .iter()
        .copied()
        .take_while(|w| !w.starts_with('#'))
        .collect();
    let start = words
        .iter()
        .position(|w| !is_assignment(w))
        .unwrap_or(words.len());
    let words = &words[start..];
    // `kubectl exec … -- rollouts-dispatch token issue …`: our command after the `--`.
    if let Some(i) = words
        .windows(2)
        .position(|w| w[0] == "--" && w[1].starts_with("rollouts-dispatch"))
    {
        command_refs(&words[i + 1..], n, tops, out);
        return command_refs(&words[..i], n, tops, out);
    }
    let Some(first) = words.first() else { return };
    let mut rest = &words[1..];
    match *first {
        "make" => {
            for w in rest.iter().take_while(|w| !w.starts_with(['>', '&', '2'])) {
                if !w.starts_with('-') && !is_assignment(w) && !w.contains('/') {
                    out.push(Ref {
                        kind: Kind::Target,
                        name: w.trim_matches(['`', ',']).to_string(),
                        line: n,
                        foreign: false,
                    });
                }
            }
            return;
        }
        "rollouts-dispatch" => {
            let mut path = String::new();
            while let Some(w) = rest.first() {
                let candidate = if path.is_empty() {
                    w.to_string()
                } else {
                    format!("{path} {w}")
                };
                if !tops.commands.contains(&candidate) {
                    break;
                }
                path = candidate;
                rest = &rest[1..];
            }
            flags(rest, &Tool::Server(path), n, out);
        }
        "rollouts-dispatch-plugin" => flags(rest, &Tool::Plugin, n, out),
        _ => {}
    }
    let mut set_next = false;
    for w in words {
        if set_next {
            let key = w.trim_matches(['\'', '"']).split('=').next().unwrap_or("");
            if !key.is_empty() && !key.contains('$') {
                out.push(Ref {
                    kind: Kind::Value,
                    name: key.to_string(),
                    line: n,
                    foreign: false,
                });
            }
        }
        set_next = *w == "--set" || *w == "--set-string";
        if let Some(p) = path_token(w, tops) {
            out.push(Ref {
                kind: Kind::Path,
                name: p,
                line: n,
                foreign: false,
            });
        }
    }
}

fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The flags among a command's arguments (`--x`, `--x=v`, `-f`), up to a redirection.
pub(crate) fn flags(words: &[&str], tool: &Tool, n: usize, out: &mut Vec<Ref>) {
    for w in words.iter().take_while(|w| !w.starts_with(['>', '<'])) {
        let w = w.trim_end_matches([',', ')', ';']);
        let name = w.split('=').next().unwrap_or(w);
        let long = name.len() > 2
            && name.starts_with("--")
            && name[2..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-');
        let short = name.len() == 2
            && name.starts_with('-')
            && name[1..].chars().all(|c| c.is_ascii_alphabetic());
        if long || short {
            out.push(Ref {
                kind: Kind::Flag(tool.clone()),
                name: name.to_string(),
                line: n,
                foreign: false,
            });
        }
    }
}
