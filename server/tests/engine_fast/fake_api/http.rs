//! The HTTP face of the fake API server: Kubernetes URL paths (`/api/v1/...`,
//! `/apis/GROUP/VERSION/...`, namespaced or not) to store operations, answers and `Status`
//! errors in the API server's shapes, and watches as newline-delimited JSON event streams.
//! PATCH applies JSON merge patches only (what the Application sync trigger sends).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State as AxumState};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use super::store::{parse_selector, ApiError, Filter, Propagation, Res};
use super::{Request, Shared, State};

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// Where a URL path points.
#[derive(Debug)]
struct Target {
    res: Res,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn parse(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (api, rest) = match parts.as_slice() {
            ["api", version, rest @ ..] => ((*version).to_string(), rest),
            ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
            _ => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (plural, None, None),
            [plural, name] => (plural, Some(name), None),
            [plural, name, sub] => (plural, Some(name), Some(sub)),
            _ => return None,
        };
        Some(Self {
            res: Res::new(&api, plural),
            namespace,
            name: name.map(|n| (*n).to_string()),
            subresource: subresource.map(|s| (*s).to_string()),
        })
    }
}

fn json_answer(code: u16, body: &Value) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn refuse(e: &ApiError) -> Response {
    json_answer(e.code, &e.status())
}

/// Takes one use of the first fault that matches, if any.
fn take_fault(state: &mut State, method: &str, target: &str) -> Option<(u16, String)> {
    let f = state.faults.iter_mut().find(|f| {
        f.times > 0 && f.method == method && f.target.split(' ').all(|part| target.contains(part))
    })?;
    f.times -= 1;
    let message = f.message.clone().unwrap_or_else(|| match f.code {
        // What the authorizer says (a 403 from admission or a quota says something else).
        403 => format!(
            "scripted by the test: HTTP 403: User \"fake\" cannot {} {target}",
            method.to_lowercase()
        ),
        code => format!("scripted by the test: HTTP {code}"),
    });
    Some((f.code, message))
}

async fn handle(
    AxumState(shared): AxumState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let raw_query = uri.query().unwrap_or_default().to_string();
    {
        let mut state = shared.lock();
        state.requests.push(Request {
            method: method.to_string(),
            path: path.clone(),
            query: raw_query.clone(),
        });
        if let Some((code, message)) =
            take_fault(&mut state, method.as_str(), &format!("{path}?{raw_query}"))
        {
            return refuse(&ApiError::new(code, message));
        }
    }
    let Some(target) = Target::parse(&path) else {
        return refuse(&ApiError::new(
            404,
            format!("the server could not find the requested resource ({path})"),
        ));
    };
    let result = match (&method, &target.name, target.subresource.as_deref()) {
        (&Method::GET, None, None) if query.get("watch").is_some_and(|w| w == "true") => {
            return watch(&shared, &target, &query);
        }
        (&Method::GET, None, None) => list(&shared, &target, &query, &headers),
        (&Method::GET, Some(name), None) => get(&shared, &target, name),
        (&Method::GET, Some(name), Some("log")) => return pod_log(&shared, &target, name, &query),
        (&Method::POST, None, None) => create(&shared, &target, &body),
        (&Method::DELETE, Some(name), None) => delete(&shared, &target, name, &body),
        (&Method::PATCH, Some(name), None) => patch(&shared, &target, name, &headers, &body),
        _ => Err(ApiError::new(
            405,
            format!("{method} {path} is not supported by the fake API server"),
        )),
    };
    match result {
        Ok((code, body)) => json_answer(code, &body),
        Err(e) => refuse(&e),
    }
}

type Answer = Result<(u16, Value), ApiError>;

fn filter(target: &Target, query: &HashMap<String, String>) -> Result<Filter, ApiError> {
    let labels = parse_selector(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::new(400, e))?;
    Ok(Filter {
        res: target.res.clone(),
        namespace: target.namespace.clone(),
        labels,
    })
}

fn list(
    shared: &Shared,
    target: &Target,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Answer {
    let filter = filter(target, query)?;
    let (mut items, rv) = {
        let state = shared.lock();
        (state.store.list(&filter), state.store.rv())
    };
    // Pages as the API server cuts them: `limit` items, and a `continue` token (here the offset
    // of the next page) while more remain.
    let offset: usize = query
        .get("continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let next = limit
        .map(|l| offset + l)
        .filter(|end| *end < items.len())
        .map(|end| end.to_string());
    items = items
        .into_iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let meta = match next {
        Some(token) => json!({"resourceVersion": rv.to_string(), "continue": token}),
        None => json!({"resourceVersion": rv.to_string()}),
    };
    let metadata_only = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadataList"));
    let list = if metadata_only {
        let items: Vec<Value> = items
            .into_iter()
            .map(|o| {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                       "metadata": o["metadata"]})
            })
            .collect();
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
               "metadata": meta, "items": items})
    } else {
        json!({"apiVersion": target.res.api, "kind": format!("{}List", target.res.kind()),
               "metadata": meta, "items": items})
    };
    Ok((200, list))
}

fn get(shared: &Shared, target: &Target, name: &str) -> Answer {
    let ns = target.namespace.as_deref().unwrap_or_default();
    shared
        .lock()
        .store
        .get(&target.res, ns, name)
        .cloned()
        .map(|o| (200, o))
        .ok_or_else(|| ApiError::not_found(&target.res, name))
}

fn create(shared: &Shared, target: &Target, body: &[u8]) -> Answer {
    let mut object: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the body is not a JSON object: {e}")))?;
    if let Some(ns) = &target.namespace {
        match object["metadata"]["namespace"].as_str() {
            None => object["metadata"]["namespace"] = ns.clone().into(),
            Some(given) if given != ns => {
                return Err(ApiError::new(
                    400,
                    format!("the namespace of the object ({given}) does not match the namespace on the request ({ns})"),
                ))
            }
            Some(_) => {}
        }
    }
    let created = shared.change(|s| s.store.create(&target.res, object))?;
    Ok((201, created))
}

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().expect("made an object above");
    for (k, v) in fields {
        if v.is_null() {
            object.remove(k);
        } else {
            merge(object.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A JSON merge patch (`application/merge-patch+json`), as the API server applies it: a
/// `metadata.resourceVersion` in the patch must be the stored one (else 409).
fn patch(shared: &Shared, target: &Target, name: &str, headers: &HeaderMap, body: &[u8]) -> Answer {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/merge-patch+json" {
        return Err(ApiError::new(
            415,
            format!("the fake API server applies merge patches only, not {content_type:?}"),
        ));
    }
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the patch is not JSON: {e}")))?;
    let ns = target.namespace.as_deref().unwrap_or_default();
    shared.change(|s| {
        let current = s
            .store
            .get(&target.res, ns, name)
            .ok_or_else(|| ApiError::not_found(&target.res, name))?;
        if let Some(rv) = patch.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
            if current.pointer("/metadata/resourceVersion").and_then(Value::as_str) != Some(rv) {
                return Err(ApiError::new(
                    409,
                    format!("Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again", target.res.plural),
                ));
            }
        }
        let patched = s.store.update(&target.res, ns, name, |o| merge(o, &patch));
        patched
            .map(|o| (200, o))
            .ok_or_else(|| ApiError::not_found(&target.res, name))
    })
}

fn delete(shared: &Shared, target: &Target, name: &str, body: &[u8]) -> Answer {
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new(400, format!("DeleteOptions are not JSON: {e}")))?
    };
    // Without a policy, deletes through this fake are background (the engine always sets one).
    let propagation = match options["propagationPolicy"].as_str() {
        Some("Foreground") => Propagation::Foreground,
        Some("Background") | None => Propagation::Background,
        Some(other) => {
            return Err(ApiError::new(
                400,
                format!("propagationPolicy {other} is not supported by the fake API server"),
            ))
        }
    };
    let uid = options["preconditions"]["uid"].as_str();
    let ns = target.namespace.as_deref().unwrap_or_default();
    let deleted = shared.change(|s| s.store.delete(&target.res, ns, name, uid, propagation))?;
    Ok((200, deleted))
}

fn pod_log(
    shared: &Shared,
    target: &Target,
    pod: &str,
    query: &HashMap<String, String>,
) -> Response {
    let ns = target.namespace.clone().unwrap_or_default();
    let state = shared.lock();
    if state.store.get(&target.res, &ns, pod).is_none() {
        return refuse(&ApiError::not_found(&target.res, pod));
    }
    let container = query.get("container").cloned().unwrap_or_default();
    let text = state
        .logs
        .get(&(ns, pod.to_string(), container))
        .cloned()
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let keep = query
        .get("tailLines")
        .and_then(|n| n.parse::<usize>().ok())
        .map_or(0, |n| lines.len().saturating_sub(n));
    let mut out = lines[keep..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], out).into_response()
}

/// A watch: the changes after the asked resourceVersion (every object as `ADDED` when it asks
/// for none or `0`), then each change as it happens, one JSON event per line.
fn watch(shared: &Arc<Shared>, target: &Target, query: &HashMap<String, String>) -> Response {
    let filter = match filter(target, query) {
        Ok(f) => f,
        Err(e) => return refuse(&e),
    };
    let from = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .unwrap_or(0);
    // The snapshot and the resourceVersion it ends at are read under one lock: nothing is
    // missed or sent twice between them.
    let (initial, cursor) = if from == 0 {
        let state = shared.lock();
        let objects: Vec<Value> = state
            .store
            .list(&filter)
            .into_iter()
            .map(|o| json!({"type": "ADDED", "object": o}))
            .collect();
        (objects, state.store.rv())
    } else {
        (Vec::new(), from)
    };
    let rx = shared.changed.subscribe();
    let first = lines(&initial);
    let events = futures::stream::unfold(
        (shared.clone(), rx, cursor, filter, first),
        |(shared, mut rx, mut cursor, filter, first)| async move {
            if let Some(chunk) = first {
                return Some((
                    Ok::<_, Infallible>(chunk),
                    (shared, rx, cursor, filter, None),
                ));
            }
            loop {
                // Mark the version seen before reading, so that no change is missed in between.
                rx.borrow_and_update();
                let pending = {
                    let state = shared.lock();
                    if state.hold_watches {
                        Vec::new()
                    } else {
                        let changes = state.store.changes_after(cursor, &filter);
                        cursor = state.store.rv();
                        changes
                            .into_iter()
                            .map(|c| json!({"type": c.kind, "object": c.object}))
                            .collect()
                    }
                };
                if let Some(chunk) = lines(&pending) {
                    return Some((Ok(chunk), (shared, rx, cursor, filter, None)));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(events),
    )
        .into_response()
}

/// Events as newline-delimited JSON (`None` when there is none).
fn lines(events: &[Value]) -> Option<Bytes> {
    if events.is_empty() {
        return None;
    }
    let mut out = String::new();
    for e in events {
        out.push_str(&e.to_string());
        out.push('\n');
    }
    Some(Bytes::from(out))
}
