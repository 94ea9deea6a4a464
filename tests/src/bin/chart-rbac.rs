//! `chart-rbac`: the RBAC golden test of the Helm chart (charts/chart-rbac.sh, run by `make chart`).
//!
//! Reads `helm template` renderings (`VARIANT=FILE`), resolves every RoleBinding and
//! ClusterRoleBinding to the Role or ClusterRole the rendering contains, and expands each rule into
//! grants `VARIANT SUBJECT SCOPE RESOURCE VERB` (one verb on one resource for one subject, in one
//! namespace or cluster-wide). `check` compares them with the checked-in allowlist
//! (charts/rbac-allowlist.txt) both ways: a grant the chart renders that is not listed fails (a new
//! verb, resource or scope must be added on purpose), and so does a listed grant the chart no longer
//! renders (the file stays exact). `write` rewrites the allowlist from the renderings, for a
//! deliberate update reviewed as a diff. Whatever the allowlist says, wildcards (`*`), aggregated
//! ClusterRoles and bindings to roles the chart does not render (e.g. `cluster-admin`) fail: their
//! grants cannot be enumerated.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

const USAGE: &str = "usage: chart-rbac check|write --allowlist FILE VARIANT=RENDERING.yaml...";

/// One grant: a subject may use one verb on one resource in one scope, in one rendering.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    variant: String,
    subject: String,
    scope: String,
    resource: String,
    verb: String,
}

impl Grant {
    fn fields(&self) -> [&str; 5] {
        [
            &self.variant,
            &self.subject,
            &self.scope,
            &self.resource,
            &self.verb,
        ]
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chart-rbac: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    ensure!(mode == "check" || mode == "write", "{USAGE}");
    let mut allowlist: Option<PathBuf> = None;
    let mut renderings: Vec<(String, PathBuf)> = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--allowlist" {
            allowlist = Some(args.next().context("--allowlist needs a file")?.into());
        } else if let Some((variant, file)) = arg.split_once('=') {
            renderings.push((variant.to_owned(), file.into()));
        } else {
            bail!("unexpected argument {arg:?}; {USAGE}");
        }
    }
    let allowlist = allowlist.context(USAGE)?;
    ensure!(!renderings.is_empty(), "no renderings; {USAGE}");
    let mut grants = BTreeSet::new();
    for (variant, file) in &renderings {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        grants.extend(
            grants_of(variant, &text)
                .with_context(|| format!("rendering {variant} ({})", file.display()))?,
        );
    }
    if mode == "write" {
        std::fs::write(&allowlist, render_allowlist(&allowlist, &grants)?)
            .with_context(|| format!("writing {}", allowlist.display()))?;
        println!(
            "chart-rbac: wrote {} grants of {} renderings to {}",
            grants.len(),
            renderings.len(),
            allowlist.display()
        );
        return Ok(());
    }
    compare(&grants, &read_allowlist(&allowlist)?, &allowlist)?;
    println!(
        "chart: RBAC golden ok: {} grants in {} renderings match {}",
        grants.len(),
        renderings.len(),
        allowlist.display()
    );
    Ok(())
}

/// Fails unless the rendered grants are exactly the listed ones, naming each difference.
fn compare(grants: &BTreeSet<Grant>, listed: &BTreeSet<Grant>, allowlist: &Path) -> Result<()> {
    let new: Vec<&Grant> = grants.difference(listed).collect();
    let gone: Vec<&Grant> = listed.difference(grants).collect();
    if new.is_empty() && gone.is_empty() {
        return Ok(());
    }
    let mut msg = String::new();
    if !new.is_empty() {
        msg += &format!(
            "{} RBAC grant(s) rendered by the chart are not in {}:\n{}\
             A new verb, resource, scope or subject must be added on purpose: name the code path \
             that needs it in a comment of the template, then run `make chart-rbac-allowlist` and \
             commit the allowlist diff.\n",
            new.len(),
            allowlist.display(),
            lines(&new)
        );
    }
    if !gone.is_empty() {
        msg += &format!(
            "{} grant(s) in {} are no longer rendered by the chart:\n{}\
             Remove them (`make chart-rbac-allowlist`) so that the file stays exact.\n",
            gone.len(),
            allowlist.display(),
            lines(&gone)
        );
    }
    bail!("{msg}RBAC golden test FAILED")
}

fn lines(grants: &[&Grant]) -> String {
    grants
        .iter()
        .map(|g| format!("  {}\n", g.fields().join("  ")))
        .collect()
}

/// The grants of one rendering (a multi-document YAML stream).
fn grants_of(variant: &str, text: &str) -> Result<BTreeSet<Grant>> {
    let docs: Vec<Option<Value>> = serde_saphyr::from_multiple(text).context("parsing YAML")?;
    let objects: Vec<Value> = docs
        .into_iter()
        .flatten()
        .filter(|d| d.is_object())
        .collect();
    let str_at = |o: &Value, path: &str| -> String {
        o.pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    // (kind, namespace or "", name) → rules.
    let mut roles: BTreeMap<(String, String, String), Value> = BTreeMap::new();
    for o in &objects {
        let kind = str_at(o, "/kind");
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let name = str_at(o, "/metadata/name");
        ensure!(
            o.get("aggregationRule").is_none(),
            "ClusterRole {name} has an aggregationRule: its grants depend on other roles; list the rules instead"
        );
        let ns = if kind == "Role" {
            namespace_of(o, &kind, &name)?
        } else {
            String::new()
        };
        let rules = o.get("rules").cloned().unwrap_or(Value::Array(Vec::new()));
        roles.insert((kind, ns, name), rules);
    }
    let mut grants = BTreeSet::new();
    for o in &objects {
        let kind = str_at(o, "/kind");
        let (scope, lookup_ns) = match kind.as_str() {
            "RoleBinding" => {
                let ns = namespace_of(o, &kind, &str_at(o, "/metadata/name"))?;
                (format!("ns:{ns}"), ns)
            }
            "ClusterRoleBinding" => ("cluster".to_owned(), String::new()),
            _ => continue,
        };
        let binding = str_at(o, "/metadata/name");
        let role_kind = str_at(o, "/roleRef/kind");
        let role_name = str_at(o, "/roleRef/name");
        let key_ns = if role_kind == "Role" {
            lookup_ns.clone()
        } else {
            String::new()
        };
        let rules = roles
            .get(&(role_kind.clone(), key_ns, role_name.clone()))
            .with_context(|| {
                format!(
                    "{kind} {binding} binds {role_kind} {role_name}, which this rendering does not \
                     contain: its grants cannot be checked (a built-in role such as cluster-admin, \
                     admin or edit grants far more than the code uses); bind a role of the chart"
                )
            })?;
        let subjects = o
            .get("subjects")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for s in &subjects {
            let subject = match str_at(s, "/kind").as_str() {
                "ServiceAccount" => {
                    let ns = s
                        .get("namespace")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .unwrap_or_else(|| lookup_ns.clone());
                    format!("sa:{ns}/{}", str_at(s, "/name"))
                }
                "User" => format!("user:{}", str_at(s, "/name")),
                "Group" => format!("group:{}", str_at(s, "/name")),
                other => bail!("{kind} {binding}: subject of unknown kind {other:?}"),
            };
            for rule in rules.as_array().into_iter().flatten() {
                for (resource, verb) in expand(rule).with_context(|| format!("{kind} {binding}"))? {
                    grants.insert(Grant {
                        variant: variant.to_owned(),
                        subject: subject.clone(),
                        scope: scope.clone(),
                        resource,
                        verb,
                    });
                }
            }
        }
    }
    Ok(grants)
}

fn namespace_of(o: &Value, kind: &str, name: &str) -> Result<String> {
    o.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .with_context(|| {
            format!("{kind} {name} has no metadata.namespace (the chart must set it explicitly)")
        })
}

/// One rule as (resource, verb) pairs; a resource is `plural[/subresource][.group]`, with
/// `{name,…}` for `resourceNames`, or `url:PATH` for `nonResourceURLs`.
fn expand(rule: &Value) -> Result<Vec<(String, String)>> {
    let list = |key: &str| -> Vec<String> {
        rule.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let (groups, resources, verbs) = (list("apiGroups"), list("resources"), list("verbs"));
    let (names, urls) = (list("resourceNames"), list("nonResourceURLs"));
    for (what, values) in [
        ("apiGroups", &groups),
        ("resources", &resources),
        ("verbs", &verbs),
        ("resourceNames", &names),
        ("nonResourceURLs", &urls),
    ] {
        ensure!(
            !values.iter().any(|v| v.contains('*')),
            "a rule has a wildcard in {what} ({values:?}): wildcards grant whatever the API server \
             adds later; list exactly what the code uses"
        );
    }
    let names = if names.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", names.join(","))
    };
    let mut out = Vec::new();
    for verb in &verbs {
        for url in &urls {
            out.push((format!("url:{url}"), verb.clone()));
        }
        for group in &groups {
            for resource in &resources {
                let resource = if group.is_empty() {
                    format!("{resource}{names}")
                } else {
                    format!("{resource}.{group}{names}")
                };
                out.push((resource, verb.clone()));
            }
        }
    }
    Ok(out)
}

fn read_allowlist(path: &Path) -> Result<BTreeSet<Grant>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let [variant, subject, scope, resource, verb] = f[..] else {
            bail!(
                "{}:{}: want 5 fields (VARIANT SUBJECT SCOPE RESOURCE VERB), got {line:?}",
                path.display(),
                i + 1
            );
        };
        out.insert(Grant {
            variant: variant.into(),
            subject: subject.into(),
            scope: scope.into(),
            resource: resource.into(),
            verb: verb.into(),
        });
    }
    Ok(out)
}

/// The allowlist file: its leading comment block kept as is, then the grants in aligned columns.
fn render_allowlist(path: &Path, grants: &BTreeSet<Grant>) -> Result<String> {
    let header: String = match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut widths = [0usize; 5];
    for g in grants {
        for (w, f) in widths.iter_mut().zip(g.fields()) {
            *w = (*w).max(f.len());
        }
    }
    let mut out = header;
    for g in grants {
        let f = g.fields();
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
            f[0],
            f[1],
            f[2],
            f[3],
            f[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
        out += line.trim_end();
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERING: &str = r#"
---
# Source: a comment-only document
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: jobs, namespace: team-a}
rules:
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [create, delete]
  - apiGroups: [""]
    resources: [pods/log]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: jobs, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: jobs}
subjects: [{kind: ServiceAccount, name: server, namespace: rd}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reviews}
rules: [{apiGroups: [authentication.k8s.io], resources: [tokenreviews], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reviews}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reviews}
subjects: [{kind: ServiceAccount, name: server, namespace: rd}]
"#;

    fn listed(grants: &BTreeSet<Grant>) -> Vec<String> {
        grants.iter().map(|g| g.fields().join(" ")).collect()
    }

    #[test]
    fn bindings_expand_to_one_grant_per_verb_resource_and_scope() {
        let grants = grants_of("v", RENDERING).unwrap();
        assert_eq!(
            listed(&grants),
            [
                "v sa:rd/server cluster tokenreviews.authentication.k8s.io create",
                "v sa:rd/server ns:team-a jobs.batch create",
                "v sa:rd/server ns:team-a jobs.batch delete",
                "v sa:rd/server ns:team-a pods/log get",
            ]
        );
    }

    #[test]
    fn an_unbound_role_grants_nothing_and_a_binding_to_a_foreign_role_fails() {
        let unbound = RENDERING.replace("kind: RoleBinding", "kind: ConfigMap");
        assert_eq!(grants_of("v", &unbound).unwrap().len(), 1);
        let foreign = RENDERING.replace(
            "kind: ClusterRole, name: reviews",
            "kind: ClusterRole, name: cluster-admin",
        );
        let err = format!("{:#}", grants_of("v", &foreign).unwrap_err());
        assert!(err.contains("binds ClusterRole cluster-admin"), "{err}");
    }

    #[test]
    fn a_grant_added_or_removed_fails_the_comparison_both_ways() {
        let grants = grants_of("v", RENDERING).unwrap();
        let file = Path::new("charts/rbac-allowlist.txt");
        assert!(compare(&grants, &grants, file).is_ok());
        let more = grants_of(
            "v",
            &RENDERING.replace("[create, delete]", "[create, delete, update]"),
        )
        .unwrap();
        let err = format!("{:#}", compare(&more, &grants, file).unwrap_err());
        assert!(
            err.contains("1 RBAC grant(s) rendered by the chart are not in")
                && err.contains("jobs.batch  update"),
            "{err}"
        );
        let fewer = grants_of("v", &RENDERING.replace("[create, delete]", "[create]")).unwrap();
        let err = format!("{:#}", compare(&fewer, &grants, file).unwrap_err());
        assert!(
            err.contains("1 grant(s) in charts/rbac-allowlist.txt are no longer rendered")
                && err.contains("jobs.batch  delete"),
            "{err}"
        );
    }

    #[test]
    fn wildcards_fail_whatever_the_allowlist_says() {
        let wild = RENDERING.replace("verbs: [create, delete]", "verbs: [\"*\"]");
        let err = format!("{:#}", grants_of("v", &wild).unwrap_err());
        assert!(err.contains("wildcard in verbs"), "{err}");
    }

    #[test]
    fn the_written_allowlist_reads_back_to_the_same_grants() {
        let grants = grants_of("v", RENDERING).unwrap();
        let dir = std::env::temp_dir().join(format!("chart-rbac-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allowlist.txt");
        std::fs::write(&file, "# header kept\nold line dropped\n").unwrap();
        std::fs::write(&file, render_allowlist(&file, &grants).unwrap()).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.starts_with("# header kept\n") && !text.contains("old line"),
            "{text}"
        );
        assert_eq!(read_allowlist(&file).unwrap(), grants);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
