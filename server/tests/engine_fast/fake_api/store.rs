//! The object store of the fake API server: JSON objects by resource, namespace and name, one
//! resourceVersion counter, and the history of every change, which watches replay from the
//! resourceVersion they ask for.
//!
//! It applies what the real API server applies and the engine relies on: a 409 `AlreadyExists`
//! on a second create, server-set `uid`/`resourceVersion`/`creationTimestamp`, a 409 `Conflict`
//! when a delete's UID precondition does not hold, foreground deletion (the object first gets a
//! `deletionTimestamp`, then its dependents and itself go) and the garbage collection of objects
//! whose owner is deleted.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

/// A resource: API group/version (`v1`, `batch/v1`) and plural (`jobs`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Res {
    pub(crate) api: String,
    pub(crate) plural: String,
}

impl Res {
    pub(crate) fn new(api: &str, plural: &str) -> Self {
        Self {
            api: api.to_string(),
            plural: plural.to_string(),
        }
    }

    /// The kind of its objects, for list responses (`jobs` → `Job`); only the resources the
    /// engine reads are spelled out, the others get a plausible capitalisation.
    pub(crate) fn kind(&self) -> String {
        let known = [
            ("jobs", "Job"),
            ("pods", "Pod"),
            ("secrets", "Secret"),
            ("analysisruns", "AnalysisRun"),
            ("applications", "Application"),
            ("stages", "Stage"),
        ];
        if let Some((_, k)) = known.iter().find(|(p, _)| *p == self.plural) {
            return (*k).to_string();
        }
        let singular = self.plural.trim_end_matches('s');
        let mut c = singular.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect())
            .unwrap_or_default()
    }
}

/// A refusal in the shape of a Kubernetes `Status`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Gone",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "InternalError",
        };
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    fn already_exists(res: &Res, name: &str) -> Self {
        Self {
            reason: "AlreadyExists",
            ..Self::new(409, format!("{} {name:?} already exists", res.plural))
        }
    }

    pub(crate) fn not_found(res: &Res, name: &str) -> Self {
        Self::new(404, format!("{} {name:?} not found", res.plural))
    }

    /// The `Status` body.
    pub(crate) fn status(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// One change, as a watch sends it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) res: Res,
    /// `ADDED`, `MODIFIED` or `DELETED`
    pub(crate) kind: &'static str,
    pub(crate) object: Value,
}

/// What a list or watch selects: a resource, optionally one namespace, and a label selector.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    pub(crate) res: Res,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: Vec<Requirement>,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
}

/// Parses the equality-based label selectors the engine sends (`a=b,c!=d,e,!f`); anything else
/// is refused, so that a selector this fake does not understand fails a test instead of
/// silently matching everything.
pub(crate) fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains(['(', ')', ' ']) {
            return Err(format!("unsupported label selector requirement {part:?}"));
        }
        let r = if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEq(k.into(), v.into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::Eq(k.into(), v.into())
        } else if let Some(k) = part.strip_prefix('!') {
            Requirement::NotExists(k.into())
        } else {
            Requirement::Exists(part.into())
        };
        out.push(r);
    }
    Ok(out)
}

impl Filter {
    pub(crate) fn matches(&self, res: &Res, object: &Value) -> bool {
        if *res != self.res {
            return false;
        }
        if let Some(ns) = &self.namespace {
            if meta_str(object, "namespace") != Some(ns.as_str()) {
                return false;
            }
        }
        let label = |k: &str| object["metadata"]["labels"][k].as_str();
        self.labels.iter().all(|r| match r {
            Requirement::Eq(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

/// `metadata.<field>` of `object` as a string.
pub(crate) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object["metadata"][field].as_str()
}

type Key = (Res, String, String);

fn key_of(res: &Res, object: &Value) -> Key {
    (
        res.clone(),
        meta_str(object, "namespace")
            .unwrap_or_default()
            .to_string(),
        meta_str(object, "name").unwrap_or_default().to_string(),
    )
}

/// How a delete removes dependents, from `DeleteOptions.propagationPolicy` (`Orphan` is refused
/// by the HTTP layer: the engine never orphans Pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Propagation {
    Foreground,
    Background,
}

/// The objects and their history.
#[derive(Debug, Default)]
pub(crate) struct Store {
    rv: u64,
    uids: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// foreground deletions stop after setting `deletionTimestamp` (a slow garbage collector)
    pub(crate) hold_deletions: bool,
}

impl Store {
    /// The current resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    fn record(&mut self, res: &Res, kind: &'static str, object: &Value) {
        self.history.push(Change {
            rv: self.rv,
            res: res.clone(),
            kind,
            object: object.clone(),
        });
    }

    fn stamp(&mut self, object: &mut Value) {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
    }

    /// Sets what the API server sets on create, keeping what the caller gave.
    fn admit(&mut self, object: &mut Value) {
        if meta_str(object, "uid").is_none() {
            self.uids += 1;
            object["metadata"]["uid"] =
                format!("00000000-0000-4000-8000-{:012x}", self.uids).into();
        }
        if meta_str(object, "creationTimestamp").is_none() {
            let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            object["metadata"]["creationTimestamp"] = now.into();
        }
        object["metadata"]["generation"] = 1.into();
    }

    /// A create through the API: refused when the name is taken.
    pub(crate) fn create(&mut self, res: &Res, mut object: Value) -> Result<Value, ApiError> {
        let key = key_of(res, &object);
        if key.2.is_empty() {
            return Err(ApiError::new(400, "metadata.name: Required value"));
        }
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &key.2));
        }
        self.admit(&mut object);
        self.stamp(&mut object);
        self.record(res, "ADDED", &object);
        self.objects.insert(key, object.clone());
        Ok(object)
    }

    /// Creates or replaces `object` as a controller would (no conflict check); server-set
    /// fields of an existing object are kept unless `object` sets them.
    pub(crate) fn put(&mut self, res: &Res, mut object: Value) -> Value {
        let key = key_of(res, &object);
        let kind = match self.objects.get(&key) {
            Some(old) => {
                for f in ["uid", "creationTimestamp"] {
                    if meta_str(&object, f).is_none() {
                        object["metadata"][f] = old["metadata"][f].clone();
                    }
                }
                "MODIFIED"
            }
            None => "ADDED",
        };
        self.admit(&mut object);
        self.stamp(&mut object);
        self.record(res, kind, &object);
        self.objects.insert(key, object.clone());
        object
    }

    /// Changes an existing object in place; `None` when it does not exist.
    pub(crate) fn update(
        &mut self,
        res: &Res,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let key = (res.clone(), namespace.to_string(), name.to_string());
        let mut object = self.objects.get(&key)?.clone();
        change(&mut object);
        self.stamp(&mut object);
        self.record(res, "MODIFIED", &object);
        self.objects.insert(key, object.clone());
        Some(object)
    }

    pub(crate) fn get(&self, res: &Res, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(res.clone(), namespace.to_string(), name.to_string()))
    }

    pub(crate) fn list(&self, filter: &Filter) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((res, _, _), o)| filter.matches(res, o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The changes after resourceVersion `rv` that `filter` selects.
    pub(crate) fn changes_after(&self, rv: u64, filter: &Filter) -> Vec<Change> {
        // History is in resourceVersion order.
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history[start..]
            .iter()
            .filter(|c| filter.matches(&c.res, &c.object))
            .cloned()
            .collect()
    }

    /// Removes an object now (`DELETED`), then the objects it owns.
    pub(crate) fn remove(&mut self, res: &Res, namespace: &str, name: &str) -> Option<Value> {
        let key = (res.clone(), namespace.to_string(), name.to_string());
        let mut object = self.objects.remove(&key)?;
        self.stamp(&mut object);
        self.record(res, "DELETED", &object);
        if let Some(uid) = meta_str(&object, "uid").map(String::from) {
            self.remove_dependents(&uid);
        }
        Some(object)
    }

    fn remove_dependents(&mut self, owner_uid: &str) {
        let owned: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner_uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (res, ns, name) in owned {
            self.remove(&res, &ns, &name);
        }
    }

    /// A delete through the API, with the UID precondition and propagation policy of
    /// `DeleteOptions`. Returns the object as the API server does: with its
    /// `deletionTimestamp` when the deletion is foreground.
    pub(crate) fn delete(
        &mut self,
        res: &Res,
        namespace: &str,
        name: &str,
        precondition_uid: Option<&str>,
        propagation: Propagation,
    ) -> Result<Value, ApiError> {
        let Some(existing) = self.get(res, namespace, name) else {
            return Err(ApiError::not_found(res, name));
        };
        let uid = meta_str(existing, "uid").unwrap_or_default().to_string();
        if let Some(want) = precondition_uid {
            if want != uid {
                return Err(ApiError::new(
                    409,
                    format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                    ),
                ));
            }
        }
        if propagation == Propagation::Background {
            return Ok(self
                .remove(res, namespace, name)
                .unwrap_or_else(|| json!({})));
        }
        if meta_str(existing, "deletionTimestamp").is_some() {
            // A second foreground delete of an object being deleted changes nothing.
            return Ok(existing.clone());
        }
        let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let marked = self
            .update(res, namespace, name, |o| {
                o["metadata"]["deletionTimestamp"] = now.into();
                o["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
            })
            .unwrap_or_else(|| json!({}));
        if !self.hold_deletions {
            self.finish_deletion(res, namespace, name);
        }
        Ok(marked)
    }

    /// The garbage collector's part of a foreground deletion: dependents first, then the object.
    fn finish_deletion(&mut self, res: &Res, namespace: &str, name: &str) {
        if let Some(uid) = self
            .get(res, namespace, name)
            .and_then(|o| meta_str(o, "uid"))
            .map(String::from)
        {
            self.remove_dependents(&uid);
        }
        self.remove(res, namespace, name);
    }

    /// Completes every foreground deletion held by [`Store::hold_deletions`].
    pub(crate) fn finish_deletions(&mut self) {
        let pending: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, o)| meta_str(o, "deletionTimestamp").is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for (res, ns, name) in pending {
            self.finish_deletion(&res, &ns, &name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn selectors_parse_and_match() {
        let res = Res::new("batch/v1", "jobs");
        let filter = Filter {
            res: res.clone(),
            namespace: Some("ns".into()),
            labels: parse_selector("a=1,b!=2,c,!d").unwrap(),
        };
        assert!(filter.matches(&res, &job("x", json!({"a": "1", "c": ""}))));
        assert!(!filter.matches(&res, &job("x", json!({"a": "1", "b": "2", "c": ""}))));
        assert!(!filter.matches(&res, &job("x", json!({"a": "1", "c": "", "d": ""}))));
        assert!(!filter.matches(
            &Res::new("v1", "pods"),
            &job("x", json!({"a": "1", "c": ""}))
        ));
        assert!(parse_selector("a in (1,2)").is_err());
    }

    #[test]
    fn creates_conflict_and_watches_replay_from_a_resource_version() {
        let res = Res::new("batch/v1", "jobs");
        let mut s = Store::default();
        let created = s.create(&res, job("x", json!({}))).unwrap();
        assert!(meta_str(&created, "uid").is_some());
        assert_eq!(s.create(&res, job("x", json!({}))).unwrap_err().code, 409);
        let after = s.rv();
        s.update(&res, "ns", "x", |o| o["status"] = json!({"active": 1}));
        let filter = Filter {
            res: res.clone(),
            namespace: None,
            labels: vec![],
        };
        let changes = s.changes_after(after, &filter);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].kind, "MODIFIED");
        assert_eq!(s.changes_after(0, &filter).len(), 2);
    }

    #[test]
    fn foreground_deletion_takes_the_dependents_and_checks_the_uid() {
        let jobs = Res::new("batch/v1", "jobs");
        let pods = Res::new("v1", "pods");
        let mut s = Store::default();
        let j = s.create(&jobs, job("x", json!({}))).unwrap();
        let uid = meta_str(&j, "uid").unwrap().to_string();
        s.create(
            &pods,
            json!({"metadata": {"name": "x-1", "namespace": "ns",
                                "ownerReferences": [{"kind": "Job", "name": "x", "uid": uid}]}}),
        )
        .unwrap();
        let wrong = s.delete(&jobs, "ns", "x", Some("other"), Propagation::Foreground);
        assert_eq!(wrong.unwrap_err().code, 409);
        s.hold_deletions = true;
        let marked = s
            .delete(&jobs, "ns", "x", Some(&uid), Propagation::Foreground)
            .unwrap();
        assert!(meta_str(&marked, "deletionTimestamp").is_some());
        assert!(
            s.get(&pods, "ns", "x-1").is_some(),
            "held: nothing removed yet"
        );
        s.finish_deletions();
        assert!(s.get(&jobs, "ns", "x").is_none() && s.get(&pods, "ns", "x-1").is_none());
        let missing = s.delete(&jobs, "ns", "x", None, Propagation::Foreground);
        assert_eq!(missing.unwrap_err().code, 404);
    }
}
