//! The agent's own checks of the work the server sends, before any API call in its cluster: the
//! namespace is one of the agent's (`--namespaces`; for an observe record, the namespace of
//! the observed object, which the check must name alike), the Job is the one the record names, and
//! its pod security profile (`--pod-security`, `--service-accounts`,
//! `--automount-service-account-token`, and the allowlists of what the pods may reference, set
//! and use: `--secrets`, `--config-maps`, `--scheduling`, `--max-resources`, `--pod-labels` …)
//! allows it — the same `podsecurity` code the server ran, with the agent's own values.
//!
//! The agent trusts no one here: not the server (compromised, or a man in the middle), nor
//! whoever can write `DispatchJob` records on the control plane. A refused item is never
//! created; its report says which field the agent refused and why.

use dispatch_api::agent::DispatchJobSpec;
use dispatch_api::observe::Observe;
use serde_json::Value;

use crate::job;
use crate::podsecurity::{self, Profile, Refused};
use crate::policy::glob_match;

/// What the agent allows in its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// globs of the namespaces where it creates and deletes Jobs
    pub namespaces: Vec<String>,
    /// the pod security of every Job it creates
    pub profile: Profile,
}

/// A work item the agent refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentRefused {
    /// the namespace is not one of the agent's
    #[error(
        "the agent refused it: namespace {namespace:?} is not one of its namespaces ({allowed}); \
         start the agent with `--namespaces` listing it"
    )]
    Namespace {
        /// the namespace asked for
        namespace: String,
        /// the agent's `--namespaces`
        allowed: String,
    },
    /// the Job object does not match the record it came with
    #[error("the agent refused it: `{field}` is {found:?}, but the record says {expected:?}")]
    Mismatch {
        /// the field of the Job
        field: &'static str,
        /// its value
        found: String,
        /// what the record names
        expected: String,
    },
    /// the pod security profile refuses it
    #[error("the agent refused it: {0}")]
    PodSecurity(#[from] Refused),
}

impl Guard {
    /// Checks work item `spec` for destination `destination`; returns the Job to create (with
    /// the unset restricted fields filled in), `None` for a record without a Job (adopt only)
    /// and for a deletion, which only needs the namespace to be the agent's: a Job this agent
    /// must not create may still be one to delete (created before its flags changed).
    pub fn admit(
        &self,
        destination: &str,
        spec: &DispatchJobSpec,
    ) -> Result<Option<Value>, AgentRefused> {
        if !self
            .namespaces
            .iter()
            .any(|g| glob_match(g, &spec.namespace))
        {
            return Err(AgentRefused::Namespace {
                namespace: spec.namespace.clone(),
                allowed: self.namespaces.join(", "),
            });
        }
        if let Some(observe) = &spec.observe {
            // The agent reads the record's namespace (the one just checked): the check must
            // name the same, and it never comes with a Job to create.
            let named = match observe {
                Observe::Rollout(r) => r.namespace.as_ref(),
                Observe::Application(a) => Some(&a.namespace),
            };
            if let Some(ns) = named.filter(|ns| **ns != spec.namespace) {
                return Err(AgentRefused::Mismatch {
                    field: "observe.namespace",
                    found: ns.clone(),
                    expected: spec.namespace.clone(),
                });
            }
            if spec.job.is_some() {
                return Err(AgentRefused::Mismatch {
                    field: "job",
                    found: "a Job".into(),
                    expected: "none with an observe check".into(),
                });
            }
            return Ok(None);
        }
        let Some(job) = spec.job.as_ref().filter(|_| !spec.delete) else {
            return Ok(None);
        };
        for (field, pointer, expected) in [
            ("metadata.name", "/metadata/name", &spec.job_name),
            ("metadata.namespace", "/metadata/namespace", &spec.namespace),
        ] {
            let found = job.pointer(pointer).and_then(Value::as_str);
            if found != Some(expected.as_str()) {
                return Err(AgentRefused::Mismatch {
                    field,
                    found: found.unwrap_or_default().to_string(),
                    expected: expected.clone(),
                });
            }
        }
        let mut job = job.clone();
        let mut ours = podsecurity::our_labels(&spec.run_uid, destination);
        // A server from before `job::LABEL_RUN_UID` labels its Jobs with Argo's key: accepted
        // with this record's run UID only, so an agent can be upgraded before its server.
        ours.push((job::LABEL_ARGO_RUN_UID.to_string(), spec.run_uid.clone()));
        podsecurity::enforce(&mut job, &self.profile, &ours)?;
        Ok(Some(job))
    }
}

/// The namespaces of `--namespaces`, else the agent's own (`$POD_NAMESPACE`, from the downward
/// API): an agent never creates Jobs everywhere unless told so (`--namespaces '*'`).
pub fn namespaces(
    flag: &[String],
    pod_namespace: Option<String>,
) -> Result<Vec<String>, MissingNamespaces> {
    let given: Vec<String> = flag
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    if !given.is_empty() {
        return Ok(given);
    }
    match pod_namespace.filter(|n| !n.trim().is_empty()) {
        Some(own) => Ok(vec![own]),
        None => Err(MissingNamespaces),
    }
}

/// Neither `--namespaces` nor `$POD_NAMESPACE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the agent needs the namespaces where it may create Jobs: give `--namespaces NS[,NS…]` (globs; \
     '*' for all), or set POD_NAMESPACE (the downward API's metadata.namespace) to use its own"
)]
pub struct MissingNamespaces;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podsecurity::{Level, Origin};
    use serde_json::json;

    const UID: &str = "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a";

    fn guard(level: Level) -> Guard {
        Guard {
            namespaces: vec!["verify".into(), "team-*".into()],
            profile: Profile {
                level,
                ..Profile::restricted(Origin::Agent)
            },
        }
    }

    fn spec(namespace: &str, pod: Value) -> DispatchJobSpec {
        let labels = json!({
            "rollouts-dispatch.io/run-uid": UID, "rollouts-dispatch.io/managed": "true",
            "rollouts-dispatch.io/destination": "edge"});
        DispatchJobSpec {
            destination: "edge".into(),
            namespace: namespace.into(),
            job_name: "j".into(),
            run_uid: UID.into(),
            run: "team-a/run".into(),
            metric: "m".into(),
            measurement: 1,
            log_tail: 0,
            job: Some(json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "j", "namespace": namespace, "labels": labels},
                "spec": {"template": {"metadata": {"labels": labels}, "spec": pod}}})),
            delete: false,
            observe: None,
            sync: None,
            for_stage: None,
        }
    }

    fn plain() -> Value {
        json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]})
    }

    #[test]
    fn namespaces_outside_the_allowlist_are_refused() {
        let g = guard(Level::Restricted);
        assert!(g.admit("edge", &spec("verify", plain())).is_ok());
        assert!(g.admit("edge", &spec("team-a-checks", plain())).is_ok());
        for ns in ["kube-system", "default", "verify2", ""] {
            let e = g.admit("edge", &spec(ns, plain())).unwrap_err();
            assert!(
                matches!(e, AgentRefused::Namespace { .. })
                    && e.to_string().contains("--namespaces"),
                "{ns}: {e}"
            );
        }
        // Also for a record without a Job (adopt or delete only).
        let mut bare = spec("kube-system", plain());
        bare.job = None;
        assert!(g.admit("edge", &bare).is_err());
        bare.namespace = "verify".into();
        assert_eq!(g.admit("edge", &bare), Ok(None));
    }

    #[test]
    fn an_observe_record_is_checked_against_the_namespaces_and_never_carries_a_job() {
        use dispatch_api::observe::{ApplicationCheck, RolloutCheck};
        let g = guard(Level::Restricted);
        let mut s = spec("verify", plain());
        s.job = None;
        s.observe = Some(Observe::Rollout(RolloutCheck {
            name: "web".into(),
            namespace: None,
            image: None,
            revision: None,
        }));
        assert_eq!(g.admit("b", &s), Ok(None));
        let mut outside = s.clone();
        outside.namespace = "kube-system".into();
        let e = g.admit("b", &outside).unwrap_err();
        assert!(e.to_string().contains("\"kube-system\""), "{e}");
        let mut other = s.clone();
        other.observe = Some(Observe::Application(ApplicationCheck {
            name: "web".into(),
            namespace: "argocd".into(),
            revision: None,
        }));
        let e = g.admit("b", &other).unwrap_err();
        assert!(
            matches!(
                e,
                AgentRefused::Mismatch {
                    field: "observe.namespace",
                    ..
                }
            ),
            "{e}"
        );
        let mut with_job = s;
        with_job.job = Some(plain());
        assert!(matches!(
            g.admit("b", &with_job).unwrap_err(),
            AgentRefused::Mismatch { field: "job", .. }
        ));
    }

    #[test]
    fn the_job_must_be_the_one_the_record_names() {
        let g = guard(Level::Privileged);
        let mut s = spec("verify", plain());
        s.job.as_mut().unwrap()["metadata"]["namespace"] = json!("kube-system");
        let e = g.admit("edge", &s).unwrap_err().to_string();
        assert!(e.contains("`metadata.namespace` is \"kube-system\""), "{e}");
        let mut s = spec("verify", plain());
        s.run_uid = "another-run".into();
        let e = g.admit("edge", &s).unwrap_err().to_string();
        assert!(e.contains("rollouts-dispatch.io/run-uid"), "{e}");
    }

    #[test]
    fn a_server_from_before_our_label_is_still_served() {
        let g = guard(Level::Restricted);
        let legacy = |uid: &str| {
            let mut s = spec("verify", plain());
            for at in ["/metadata/labels", "/spec/template/metadata/labels"] {
                let labels = s.job.as_mut().unwrap().pointer_mut(at).unwrap();
                let labels = labels.as_object_mut().unwrap();
                labels.remove(job::LABEL_RUN_UID);
                labels.insert(job::LABEL_ARGO_RUN_UID.into(), json!(uid));
            }
            s
        };
        assert!(g.admit("edge", &legacy(UID)).is_ok());
        // With this record's run UID only.
        let e = g.admit("edge", &legacy("another-run")).unwrap_err();
        assert!(e.to_string().contains(job::LABEL_ARGO_RUN_UID), "{e}");
    }

    #[test]
    fn pod_security_is_checked_again_and_filled() {
        let job = guard(Level::Restricted)
            .admit("edge", &spec("verify", plain()))
            .unwrap()
            .unwrap();
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], json!(false));
        assert_eq!(pod["securityContext"]["runAsNonRoot"], json!(true));
        let mut privileged = plain();
        privileged["hostPID"] = json!(true);
        let e = guard(Level::Baseline)
            .admit("edge", &spec("verify", privileged.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "the agent refused it: pod security refuses `spec.template.spec.hostPID`"
            ) && e.contains("--pod-security privileged"),
            "{e}"
        );
        assert!(guard(Level::Privileged)
            .admit("edge", &spec("verify", privileged.clone()))
            .is_ok());
        // Deleting a Job the agent would not create is allowed, in its namespaces only.
        let mut delete = spec("verify", privileged);
        delete.delete = true;
        assert_eq!(guard(Level::Restricted).admit("edge", &delete), Ok(None));
        delete.namespace = "kube-system".into();
        assert!(guard(Level::Restricted).admit("edge", &delete).is_err());
    }

    #[test]
    fn the_agents_allowlists_apply_whatever_the_server_allowed() {
        let mut pod = plain();
        pod["volumes"] = json!([{"name": "s", "secret": {"secretName": "argocd-secret"}}]);
        let e = guard(Level::Restricted)
            .admit("edge", &spec("verify", pod.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`spec.template.spec.volumes[0].secret.secretName`")
                && e.contains("`rollouts-dispatch agent --secrets argocd-secret`"),
            "{e}"
        );
        let mut g = guard(Level::Restricted);
        g.profile.allow.secrets = vec!["argocd-secret".into()];
        let job = g.admit("edge", &spec("verify", pod)).unwrap().unwrap();
        // The agent fills in the resource defaults too.
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"],
            json!({"cpu": "100m", "memory": "128Mi"})
        );
    }

    #[test]
    fn namespaces_default_to_the_agents_own_or_refuse_to_start() {
        assert_eq!(
            namespaces(&["a".into(), " b ".into()], Some("own".into())),
            Ok(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(
            namespaces(&[], Some("own".into())),
            Ok(vec!["own".to_string()])
        );
        let e = namespaces(&[String::new()], None).unwrap_err().to_string();
        assert!(
            e.contains("--namespaces") && e.contains("POD_NAMESPACE"),
            "{e}"
        );
    }
}
