//! The JSON Schema of the configuration file, generated from [`reference()`]: one property per
//! documented key, with its type, its enum values and its required keys, and
//! `additionalProperties: false` everywhere (every raw struct denies unknown fields). It is the
//! `config` property of the Helm chart's values.schema.json, so that the chart takes every key the
//! server accepts and refuses the others (`make docs` writes it there; a test fails when the file
//! is out of date).

use serde_json::{json, Map, Value as Json};

use super::reference::{reference, FieldDefault, FieldDoc};

/// The chart's values.schema.json, relative to the server crate.
#[cfg(test)]
const VALUES_SCHEMA: &str = "../charts/rollouts-dispatch/values.schema.json";

/// Go durations as `parse_go_duration` takes them (dispatch-api/src/duration.rs): `0`, or numbers
/// with units, e.g. `1h30m`, `1.5s`.
const DURATION_PATTERN: &str = r"^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// The values of a key documented as `enum` (the reference names them in prose only).
fn enum_values(key: &str) -> &'static [&'static str] {
    match key {
        "policy.rules[].podSecurity" => &["restricted", "baseline", "privileged"],
        "agents.store" => &["memory", "kubernetes"],
        other => panic!("{other} is an enum: list its values in config::schema::enum_values"),
    }
}

/// The schema of a key whose documented type does not say all the parser takes; `None`: its
/// type's schema.
fn special(key: &str, item: &Json) -> Option<Json> {
    match key {
        // `argocd:` is one instance (a map, the form before topologies) or a list of them
        // (raw/argocd.rs, `RawArgoCdSection`).
        "argocd" => Some(json!({"oneOf": [item, {"type": "array", "items": item}]})),
        // a user id, or `none` (raw.rs, `RawUser`)
        "policy.rules[].defaultRunAsUser" => Some(json!({
            "oneOf": [{"type": "integer", "minimum": 1, "maximum": 2147483647}, {"enum": ["none"]}]
        })),
        _ => None,
    }
}

/// The schema of one value of documented type `ty` (objects: without their properties).
fn type_schema(d: &FieldDoc) -> Json {
    match d.ty {
        "string" | "path" => json!({"type": "string"}),
        "bool" => json!({"type": "boolean"}),
        "integer" => json!({"type": "integer", "minimum": 0}),
        "duration" => json!({"type": "string", "pattern": DURATION_PATTERN}),
        "enum" => json!({"type": "string", "enum": enum_values(&d.key)}),
        "string map" => json!({"type": "object", "additionalProperties": {"type": "string"}}),
        "quantity map" => json!({
            "type": "object",
            "additionalProperties": {"type": ["string", "number"]}
        }),
        "list of strings" | "list of globs" => {
            json!({"type": "array", "items": {"type": "string"}})
        }
        "object" | "list of objects" => json!({"type": "object", "additionalProperties": false}),
        other => panic!("{}: type {other:?} has no schema in config::schema", d.key),
    }
}

/// The schema of the object whose keys are `section.*` (`""`: the top level; `a[]`: an item of
/// list `a`): its properties, and the keys it requires.
fn object_schema(docs: &[FieldDoc], section: &str) -> Json {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for d in docs.iter().filter(|d| d.section() == section) {
        let name = d.key.rsplit('.').next().unwrap_or(&d.key);
        let mut schema = match d.ty {
            "object" => object_schema(docs, &d.key),
            "list of objects" => object_schema(docs, &format!("{}[]", d.key)),
            _ => type_schema(d),
        };
        if d.ty == "list of objects" {
            schema = special(&d.key, &schema)
                .unwrap_or_else(|| json!({"type": "array", "items": schema}));
        } else if let Some(s) = special(&d.key, &schema) {
            schema = s;
        }
        if d.default == FieldDefault::Required {
            required.push(json!(name));
        }
        properties.insert(name.to_string(), schema);
    }
    let mut out =
        json!({"type": "object", "additionalProperties": false, "properties": properties});
    if !required.is_empty() {
        out["required"] = Json::Array(required);
    }
    out
}

/// The JSON Schema (draft-07) of the configuration file: the `config` property of the chart's
/// values.schema.json.
pub fn config_schema() -> Json {
    let mut schema = object_schema(&reference(), "");
    schema["description"] = json!(
        "server.yaml (config/server.yaml, docs/configuration.md). Generated from \
         server/src/config/reference.rs by `make docs`; do not edit."
    );
    schema
}

/// `text` (values.schema.json, two-space indented) with the value of its top-level property
/// `config` replaced by `schema`, the rest kept as written; `None` when it has no such property.
#[cfg(test)]
fn splice_config(text: &str, schema: &Json) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| *l == "    \"config\": {")?;
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.trim_end_matches(',') == "    }")?;
    let comma = if lines[end].ends_with(',') { "," } else { "" };
    let pretty = serde_json::to_string_pretty(schema).ok()?;
    let mut body: Vec<String> = pretty.lines().map(|l| format!("    {l}")).collect();
    body[0] = format!("    \"config\": {}", body[0].trim_start());
    if let Some(last) = body.last_mut() {
        last.push_str(comma);
    }
    let mut out: Vec<String> = lines[..start].iter().map(|l| l.to_string()).collect();
    out.extend(body);
    out.extend(lines[end + 1..].iter().map(|l| l.to_string()));
    Some(out.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::ServerConfig;

    fn parses(text: &str) -> Result<(), String> {
        ServerConfig::parse(text, "test")
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// A configuration with `value` at `key`, for the keys with enum values or a special schema.
    fn document(key: &str, value: &Json) -> String {
        let rule = json!({"projects": ["p"], "destinations": ["d"], "namespaces": ["n"]});
        let doc = match key {
            "policy.rules[].podSecurity" | "policy.rules[].defaultRunAsUser" => {
                let mut rule = rule;
                rule[key.rsplit('.').next().unwrap()] = value.clone();
                json!({"policy": {"rules": [rule]}})
            }
            "agents.store" => json!({"agents": {"store": value, "destinations": [{"name": "e"}]}}),
            "argocd" => json!({"argocd": value}),
            other => panic!("{other}: add a document for it to config::schema::tests"),
        };
        doc.to_string()
    }

    #[test]
    fn enum_values_are_what_the_parser_takes() {
        for d in reference().iter().filter(|d| d.ty == "enum") {
            for v in enum_values(&d.key) {
                let text = document(&d.key, &json!(v));
                parses(&text).unwrap_or_else(|e| panic!("{}: {v} is refused: {e}", d.key));
            }
            let text = document(&d.key, &json!("zzz"));
            assert!(parses(&text).is_err(), "{}: zzz is accepted", d.key);
        }
    }

    #[test]
    fn special_forms_are_what_the_parser_takes() {
        for (key, ok) in [
            ("argocd", json!({"namespace": "argocd"})),
            ("argocd", json!([{"name": "main"}])),
            ("policy.rules[].defaultRunAsUser", json!(1000)),
            ("policy.rules[].defaultRunAsUser", json!("none")),
        ] {
            let text = document(key, &ok);
            parses(&text).unwrap_or_else(|e| panic!("{key}: {ok} is refused: {e}"));
        }
        assert!(parses(&document("policy.rules[].defaultRunAsUser", &json!("root"))).is_err());
    }

    #[test]
    fn the_schema_has_every_documented_key() {
        let schema = config_schema();
        for d in reference() {
            let mut at = &schema;
            for seg in d.key.split('.') {
                let (name, list) = match seg.strip_suffix("[]") {
                    Some(n) => (n, true),
                    None => (seg, false),
                };
                at = &at["properties"][name];
                if list {
                    at = match at.get("oneOf") {
                        Some(forms) => &forms[1]["items"],
                        None => &at["items"],
                    };
                }
            }
            assert!(at.is_object(), "{} is not in the schema", d.key);
        }
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(
            schema["properties"]["policy"]["properties"]["rules"]["items"]["required"],
            json!(["projects", "destinations", "namespaces"])
        );
    }

    #[test]
    fn splice_keeps_the_rest_of_the_file() {
        let text = "{\n  \"properties\": {\n    \"a\": 1,\n    \"config\": {\n      \"type\": \"object\"\n    },\n    \"b\": 2\n  }\n}\n";
        let out = splice_config(text, &json!({"x": true})).unwrap();
        assert_eq!(
            out,
            "{\n  \"properties\": {\n    \"a\": 1,\n    \"config\": {\n      \"x\": true\n    },\n    \"b\": 2\n  }\n}\n"
        );
    }

    /// The chart's values.schema.json has this schema as `config`; `UPDATE_DOCS=1` (`make docs`)
    /// writes it there.
    #[test]
    fn chart_values_schema_is_up_to_date() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(VALUES_SCHEMA);
        let text = std::fs::read_to_string(&path).unwrap();
        let want = config_schema();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let spliced = splice_config(&text, &want)
                .unwrap_or_else(|| panic!("{}: no top-level `config` property", path.display()));
            std::fs::write(&path, spliced).unwrap();
            return;
        }
        let have: Json = serde_json::from_str(&text).unwrap();
        assert!(
            have["properties"]["config"] == want,
            "the `config` schema of {VALUES_SCHEMA} differs from config_schema(): run `make docs` \
             to regenerate it from server/src/config/reference.rs"
        );
    }
}
