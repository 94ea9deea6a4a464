//! The reference to a measurement's Jobs that lives in the measurement's metadata: where
//! they are, so that any replica (or a restarted one) can answer without state of its own.
//!
//! Measurement metadata is **not** trusted: it lives in the AnalysisRun's status, and the
//! AnalysisRun CRD has no status subresource, so anyone with `edit` on a project namespace can
//! write it, and the Rollouts controller then calls Resume/Terminate with whatever is there.
//! So the server signs every reference it hands out ([`JobRef::signed`], HMAC under domain
//! [`signing::JOB_REF`] over the canonical JSON without the signature) and
//! [`JobRef::from_request`] accepts one back only when the signature verifies, it names the
//! request's run (uid, namespace, name), metric and measurement index, and its Job name is the
//! one the formula gives. The index matters: without it, the signed reference of a measurement
//! that passed could be copied into a later measurement of the same metric, which would then
//! read the earlier Job's verdict as its own. The index is in the signed bytes already (it always
//! was), so references signed before the check, and by any key still in force, verify as before. The policy is checked again on its placements by the engine
//! ([`super::Engine::check_placements`]).

use std::collections::BTreeMap;

use dispatch_api::observe::Observe;
use dispatch_api::Require;
use serde::{Deserialize, Serialize};

use crate::job;
use crate::signing::{self, SignatureError, Signer};

/// The measurement's metadata holds no usable [`JobRef`].
#[derive(Debug, thiserror::Error)]
pub enum JobRefError {
    /// no `dispatch-ref` key
    #[error("the measurement has no {REF_KEY} metadata: it was not started by this server")]
    Missing,
    /// the key is there, its JSON is not a reference
    #[error("the measurement's {REF_KEY} metadata is unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
    /// more placements than any measurement of this server has
    #[error(
        "the measurement's {REF_KEY} metadata lists {0} destinations, more than the {max} this \
         server ever places; it was not written by this server",
        max = super::MAX_PLACEMENTS
    )]
    TooManyPlacements(usize),
}

/// A reference in a request that the server refuses to act on. Every message says that no Job
/// was read or deleted, and why the reference is not this measurement's.
#[derive(Debug, thiserror::Error)]
pub enum RefRefused {
    /// not JSON of a reference
    #[error(
        "refusing the measurement's {REF_KEY}: it is unreadable ({0}). No Job was read or deleted"
    )]
    Unreadable(#[source] serde_json::Error),
    /// no signature, a bad one, or one by a key this server does not hold
    #[error(
        "refusing the measurement's {REF_KEY}: it was not signed by this server: {0}. The server \
         signs every reference it hands out; this one was written by someone else or changed \
         after the server wrote it (measurement metadata lives in the AnalysisRun's status, which \
         anyone with edit on its namespace can write). A measurement started before the server \
         signed its references ends here too: run the analysis again. No Job was read or deleted"
    )]
    Signature(#[source] SignatureError),
    /// signed, but for another run, metric or measurement
    #[error(
        "refusing the measurement's {REF_KEY}: it belongs to run {found} and not to this \
         measurement's run {expected}; it was copied from another measurement. No Job was read \
         or deleted"
    )]
    OtherMeasurement {
        /// `namespace/name (uid …) metric …` of the reference
        found: String,
        /// the same of the request
        expected: String,
    },
    /// signed, but its Job name is not the formula's
    #[error(
        "refusing the measurement's {REF_KEY}: its Job name {found:?} is not the name of \
         measurement {measurement} of this run and metric ({expected:?}). No Job was read or \
         deleted"
    )]
    JobName {
        /// the name in the reference
        found: String,
        /// the name the formula gives
        expected: String,
        /// the measurement index in the reference
        measurement: u32,
    },
}

/// Measurement metadata key holding the [`JobRef`] as JSON.
pub const REF_KEY: &str = "dispatch-ref";
/// Measurement metadata key with the Job name (as Argo's built-in provider).
pub const JOB_NAME_KEY: &str = "job-name";
/// Measurement metadata key with the Job namespace (of the first destination).
pub const JOB_NAMESPACE_KEY: &str = "job-namespace";

/// One destination of a measurement and the namespace of its Job there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// destination name
    pub destination: String,
    /// namespace there
    pub namespace: String,
}

/// Everything needed to find a measurement's Jobs again; round-trips through measurement
/// metadata ([`JobRef::metadata`], [`JobRef::from_metadata`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRef {
    /// the AnalysisRun's UID
    pub run_uid: String,
    /// the AnalysisRun's namespace: the Kargo project the policy is checked for
    #[serde(default)]
    pub run_namespace: String,
    /// the AnalysisRun's name
    #[serde(default)]
    pub run_name: String,
    /// the metric
    #[serde(default)]
    pub metric: String,
    /// `n` of the Job name
    #[serde(default)]
    pub measurement: u32,
    /// the Job name (the same on every destination)
    pub name: String,
    /// `all` or `any`
    pub require: Require,
    /// log lines of a failed container in the message
    pub log_tail: u32,
    /// where the Jobs are
    pub placements: Vec<Placement>,
    /// the server's deadline for a verdict, in seconds since the Unix epoch (the block's
    /// `activeDeadline`, else `engine.measurementDeadline`, plus `engine.deadlineGrace`, from
    /// when the Jobs were created); 0: none (a reference from before deadlines)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline: u64,
    /// what an observe check (`rollout:`, `application:`) follows on each placement, in the
    /// placement's namespace; `None`: the placements hold Jobs. Signed with the rest, so the
    /// block of a later request (which tenants can edit) never changes what is observed; left
    /// out when `None`, so references signed before it still verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe: Option<Observe>,
    /// the server's signature over the rest ([`JobRef::canonical`]); empty: unsigned
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sig: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a request says its measurement is: a reference must name the same.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// the AnalysisRun's UID
    pub run_uid: &'a str,
    /// its namespace
    pub run_namespace: &'a str,
    /// its name
    pub run_name: &'a str,
    /// the metric
    pub metric: &'a str,
    /// the measurement index the request is for (`MeasurementRef::index`, at least 1)
    pub measurement: u32,
}

impl JobRef {
    /// The reference a `DispatchJob` record stands for on `destination`: one placement,
    /// unsigned and without a deadline. Never handed out: the agent acts with it on its own
    /// cluster, the server on a pending deletion.
    pub fn of_record(spec: &crate::store::DispatchJobSpec, destination: &str) -> Self {
        let (run_namespace, run_name) = spec.run.split_once('/').unwrap_or_default();
        Self {
            run_uid: spec.run_uid.clone(),
            run_namespace: run_namespace.to_string(),
            run_name: run_name.to_string(),
            metric: spec.metric.clone(),
            measurement: spec.measurement,
            name: spec.job_name.clone(),
            require: Require::All,
            log_tail: spec.log_tail,
            placements: vec![Placement {
                destination: destination.to_string(),
                namespace: spec.namespace.clone(),
            }],
            deadline: 0,
            observe: spec.observe.clone(),
            sig: String::new(),
        }
    }

    /// The measurement metadata for this reference.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(JOB_NAME_KEY.to_string(), self.name.clone());
        if let Some(p) = self.placements.first() {
            m.insert(JOB_NAMESPACE_KEY.to_string(), p.namespace.clone());
        }
        // Serializing plain strings and numbers cannot fail.
        m.insert(
            REF_KEY.to_string(),
            serde_json::to_string(self).unwrap_or_default(),
        );
        m
    }

    /// Where the Jobs are, `destination/namespace` comma-separated (for spans and logs).
    pub fn destinations(&self) -> String {
        self.placements
            .iter()
            .map(|p| format!("{}/{}", p.destination, p.namespace))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The reference stored by [`JobRef::metadata`], as written (not verified: see
    /// [`JobRef::from_request`]).
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, JobRefError> {
        let json = metadata.get(REF_KEY).ok_or(JobRefError::Missing)?;
        let job: Self = serde_json::from_str(json)?;
        if job.placements.len() > super::MAX_PLACEMENTS {
            return Err(JobRefError::TooManyPlacements(job.placements.len()));
        }
        Ok(job)
    }

    /// The bytes the signature covers: the JSON of every field but the signature, in field
    /// order. Computed from the parsed struct, so unknown fields an editor adds are dropped (and
    /// unused), and the same reference always gives the same bytes.
    pub fn canonical(&self) -> Vec<u8> {
        let unsigned = JobRef {
            sig: String::new(),
            ..self.clone()
        };
        serde_json::to_vec(&unsigned).unwrap_or_default()
    }

    /// This reference with the server's signature.
    pub fn signed(mut self, signer: &Signer) -> Self {
        self.sig = signer.sign(signing::JOB_REF, &self.canonical());
        self
    }

    /// The reference in `metadata` (`Ok(None)`: there is none), if this server signed it for the
    /// measurement `expected` and its Job name is the formula's. Makes no API call: a refused
    /// reference reaches no destination.
    pub fn from_request(
        metadata: &BTreeMap<String, String>,
        signer: &Signer,
        expected: Expected<'_>,
    ) -> Result<Option<Self>, RefRefused> {
        let Some(json) = metadata.get(REF_KEY) else {
            return Ok(None);
        };
        let r: JobRef = serde_json::from_str(json).map_err(RefRefused::Unreadable)?;
        signer
            .verify(signing::JOB_REF, &r.canonical(), &r.sig)
            .map_err(RefRefused::Signature)?;
        let same = r.run_uid == expected.run_uid
            && r.run_namespace == expected.run_namespace
            && r.run_name == expected.run_name
            && r.metric == expected.metric
            && r.measurement == expected.measurement;
        if !same {
            let show = |ns: &str, name: &str, uid: &str, metric: &str, n: u32| {
                format!("{ns}/{name} (uid {uid}), metric {metric:?}, measurement {n}")
            };
            return Err(RefRefused::OtherMeasurement {
                found: show(
                    &r.run_namespace,
                    &r.run_name,
                    &r.run_uid,
                    &r.metric,
                    r.measurement,
                ),
                expected: show(
                    expected.run_namespace,
                    expected.run_name,
                    expected.run_uid,
                    expected.metric,
                    expected.measurement,
                ),
            });
        }
        let name = job::job_name(&r.run_uid, &r.metric, r.measurement);
        if r.name != name {
            return Err(RefRefused::JobName {
                found: r.name,
                expected: name,
                measurement: r.measurement,
            });
        }
        Ok(Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::{Expected, JobRef, Placement, RefRefused, Require, SignatureError, REF_KEY};
    use crate::job;
    use crate::signing::Signer;
    use dispatch_api::observe::Observe;
    use std::collections::BTreeMap;

    const KEY: &[u8] = b"job-ref-test-key-0123456789abcdef0123456789";

    fn genuine() -> JobRef {
        JobRef {
            run_uid: "u1".into(),
            run_namespace: "team-a".into(),
            run_name: "r".into(),
            metric: "m".into(),
            measurement: 2,
            name: job::job_name("u1", "m", 2),
            require: Require::All,
            log_tail: 5,
            placements: vec![Placement {
                destination: "a".into(),
                namespace: "v".into(),
            }],
            deadline: 0,
            observe: None,
            sig: String::new(),
        }
    }

    fn expected() -> Expected<'static> {
        Expected {
            run_uid: "u1",
            run_namespace: "team-a",
            run_name: "r",
            metric: "m",
            measurement: 2,
        }
    }

    fn check(r: &JobRef) -> Result<Option<JobRef>, RefRefused> {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        JobRef::from_request(&r.metadata(), &signer, expected())
    }

    #[test]
    fn a_signed_reference_of_this_measurement_is_accepted() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let r = genuine().signed(&signer);
        assert!(r.sig.starts_with("v1."));
        assert_eq!(check(&r).unwrap(), Some(r.clone()));
        // No reference: the caller recomputes it from the request.
        assert!(JobRef::from_request(&BTreeMap::new(), &signer, expected())
            .unwrap()
            .is_none());
        // The canonical bytes leave the signature out, so signing twice gives the same.
        assert_eq!(r.clone().signed(&signer), r);
    }

    #[test]
    fn unsigned_edited_and_foreign_references_are_refused() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let e = check(&genuine()).unwrap_err();
        assert!(
            matches!(e, RefRefused::Signature(SignatureError::Missing)),
            "{e:?}"
        );
        assert!(e.to_string().contains("not signed by this server"), "{e}");
        let mut edited = genuine().signed(&signer);
        edited.placements[0].destination = "b".into();
        assert!(matches!(
            check(&edited).unwrap_err(),
            RefRefused::Signature(SignatureError::Mismatch { .. })
        ));
        let other_key = Signer::new(&[b"another-key-0123456789abcdef0123456789".to_vec()]).unwrap();
        assert!(matches!(
            check(&genuine().signed(&other_key)).unwrap_err(),
            RefRefused::Signature(SignatureError::UnknownKey { .. })
        ));
        let bad = BTreeMap::from([(REF_KEY.to_string(), "{".to_string())]);
        assert!(matches!(
            JobRef::from_request(&bad, &signer, expected()).unwrap_err(),
            RefRefused::Unreadable(_)
        ));
    }

    #[test]
    fn the_signature_covers_what_an_observe_check_follows() {
        use dispatch_api::observe::RolloutCheck;
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let rollout = |name: &str| {
            Some(Observe::Rollout(RolloutCheck {
                name: name.into(),
                namespace: None,
                image: Some("shop/web:2".into()),
                revision: None,
            }))
        };
        // A reference without a check has no `observe` key: those signed before it verify.
        assert!(!genuine().metadata()[REF_KEY].contains("observe"));
        let signed = JobRef {
            observe: rollout("web"),
            ..genuine()
        }
        .signed(&signer);
        assert_eq!(check(&signed).unwrap().unwrap().observe, rollout("web"));
        let mut edited = signed.clone();
        edited.observe = rollout("payments");
        assert!(matches!(
            check(&edited).unwrap_err(),
            RefRefused::Signature(SignatureError::Mismatch { .. })
        ));
        let mut dropped = signed;
        dropped.observe = None;
        assert!(matches!(
            check(&dropped).unwrap_err(),
            RefRefused::Signature(SignatureError::Mismatch { .. })
        ));
    }

    #[test]
    fn genuine_references_of_other_measurements_are_refused() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        for edit in [
            (|r: &mut JobRef| r.run_uid = "u2".into()) as fn(&mut JobRef),
            |r| r.run_namespace = "team-b".into(),
            |r| r.run_name = "other".into(),
            |r| r.metric = "m2".into(),
            |r| r.measurement = 1,
            |r| r.measurement = 3,
        ] {
            let mut r = genuine();
            edit(&mut r);
            r.name = job::job_name(&r.run_uid, &r.metric, r.measurement);
            let e = check(&r.signed(&signer)).unwrap_err();
            assert!(matches!(e, RefRefused::OtherMeasurement { .. }), "{e:?}");
            assert!(
                e.to_string()
                    .contains("team-a/r (uid u1), metric \"m\", measurement 2"),
                "{e}"
            );
        }
        // A reference signed by a key rotated out of first place still verifies, and is bound
        // to its measurement all the same.
        let old = genuine().signed(&signer);
        let rotated = Signer::new(&[
            b"new-job-ref-key-0123456789abcdef0123456789".to_vec(),
            KEY.to_vec(),
        ])
        .unwrap();
        assert_eq!(
            JobRef::from_request(&old.metadata(), &rotated, expected()).unwrap(),
            Some(old.clone())
        );
        let later = Expected {
            measurement: 3,
            ..expected()
        };
        assert!(matches!(
            JobRef::from_request(&old.metadata(), &rotated, later).unwrap_err(),
            RefRefused::OtherMeasurement { .. }
        ));
        let mut foreign = genuine();
        foreign.name = "someone-elses-job".into();
        let e = check(&foreign.signed(&signer)).unwrap_err();
        assert!(
            matches!(&e, RefRefused::JobName { expected, .. } if *expected == job::job_name("u1", "m", 2)),
            "{e:?}"
        );
    }
}
