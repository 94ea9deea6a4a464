//! The configuration reference: every key of the file with its type, default and meaning
//! ([`reference()`]), rendered as Markdown into docs/configuration.md ([`reference_markdown`],
//! `make docs`); its tests check it against the parser in both directions.

/// What a key defaults to when it is not in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldDefault {
    /// the key must be given
    Required,
    /// this value (YAML) is applied by [`ServerConfig::parse`]; a test checks it
    ///
    /// [`ServerConfig::parse`]: crate::config::ServerConfig::parse
    Value(&'static str),
    /// not set; what that means (empty: nothing)
    Unset(&'static str),
}

/// One key of the configuration file, for the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDoc {
    /// path of the key: `engine.connectTimeout`, `agents.destinations[].namespace`
    pub key: String,
    /// `string`, `path`, `bool`, `integer`, `duration`, `enum`, `string map`, `quantity map`,
    /// `list of strings`, `list of globs`, `object`, `list of objects`
    pub ty: &'static str,
    /// its default
    pub default: FieldDefault,
    /// one line
    pub description: &'static str,
}

impl FieldDoc {
    /// The section (table) the key belongs to: the path of its parent, empty for top-level keys.
    pub fn section(&self) -> &str {
        self.key.rsplit_once('.').map_or("", |(parent, _)| parent)
    }
}

/// The access keys shared by `controlPlane` and `destinations[]` (`RawAccess`).
#[rustfmt::skip]
const ACCESS_FIELDS: [(&str, &str, FieldDefault, &str); 13] = [
    ("kubeconfig", "path", FieldDefault::Unset("`$KUBECONFIG`, else `~/.kube/config`"), "kubeconfig file; with `context`, excludes `server`"),
    ("context", "string", FieldDefault::Unset("the kubeconfig's current context"), "context of the kubeconfig"),
    ("server", "string", FieldDefault::Unset(""), "API server URL (`https://host:port`); the credentials below need it"),
    ("token", "string", FieldDefault::Unset(""), "bearer token (never logged); excludes `tokenFile`"),
    ("tokenFile", "path", FieldDefault::Unset(""), "file with a bearer token, re-read when it changes (projected tokens)"),
    ("caData", "string", FieldDefault::Unset(""), "CA certificate(s), PEM; excludes `caFile`"),
    ("caFile", "path", FieldDefault::Unset(""), "CA certificate file, PEM"),
    ("certData", "string", FieldDefault::Unset(""), "client certificate, PEM; with `keyData`"),
    ("keyData", "string", FieldDefault::Unset(""), "client key, PEM (never logged); with `certData`"),
    ("certFile", "path", FieldDefault::Unset(""), "client certificate file; with `keyFile`, excludes `certData`"),
    ("keyFile", "path", FieldDefault::Unset(""), "client key file; with `certFile`"),
    ("insecure", "bool", FieldDefault::Value("false"), "skip verification of the server certificate"),
    ("tlsServerName", "string", FieldDefault::Unset("the host of `server`"), "server name for TLS verification"),
];

/// Every key of the configuration file, section by section, in the order of the reference.
///
/// Tests check it against the parser: every key listed is accepted, every key accepted is listed
/// (from serde's unknown-field errors), and the [`FieldDefault::Value`]s are what
/// [`ServerConfig::parse`] applies. `docs/configuration.md` is [`reference_markdown`].
///
/// [`ServerConfig::parse`]: crate::config::ServerConfig::parse
#[rustfmt::skip]
pub fn reference() -> Vec<FieldDoc> {
    use FieldDefault::{Required, Unset, Value};
    let f = |key: &str, ty, default, description| FieldDoc {
        key: key.to_string(),
        ty,
        default,
        description,
    };
    let mut docs = vec![
        f("controlPlane", "object", Unset("the in-cluster service account, else `$KUBECONFIG`"), "how to reach the control plane: Kargo Stages, Argo CD Applications and cluster Secrets, `DispatchJob`s"),
        f("destinations", "list of objects", Unset("none"), "destinations by name, each reached with a kubeconfig (+ context) or a server URL + credentials"),
        f("kubeconfigContexts", "object", Unset("unset; without a file, every context of the default kubeconfig"), "every context of a kubeconfig as a destination named after the context"),
        f("argocd", "list of objects", Unset("unset: no Argo CD destinations; `destination: stage` reads Applications in namespace `argocd` of the control plane"), "the Argo CD instances: each one's cluster Secrets as destinations, watched live on the cluster it runs on, and where `destination: stage` reads a Stage's Applications (the instance serving the Stage's `spec.shard`). One map instead of a list is the single instance of before: on the control plane, named `argocd`, serving every Stage whatever its shard. A destination name that two cluster Secrets claim, of one instance or of two, is unusable (its error names both)"),
        f("policy", "object", Unset("unset: nothing is dispatched, every measurement is refused (deny by default; a warning at start)"), "which Kargo projects may run Jobs on which destinations and namespaces, and with which pod security"),
        f("engine", "object", Unset("the defaults below"), "timeouts of the dispatch engine"),
        f("agents", "object", Unset("unset: no agent destinations"), "destinations reached through `rollouts-dispatch agent` (clusters that can only dial out; the server holds no credentials for them)"),
        f("confirmRuns", "bool", Value("true"), "with `controlPlane`: every measurement request (run, resume, terminate, garbage collection) is served only when its AnalysisRun exists on the control plane with that namespace, name and uid and has that metric with the rollouts-dispatch/job plugin, from a watch of analysisruns (needs list and watch on `analysisruns.argoproj.io` there; until the watch has listed them, requests are answered 503 and retried). Without `controlPlane` runs are not confirmed (logged at start, shown by `doctor`), and `true` is an error; `false` turns it off"),
        f("jobs", "object", Unset("the defaults below"), "how long our Jobs stay once done"),
        f("applicationSync", "object", Unset("unset: no Application may be synced through the API"), "the sync trigger of Argo CD Applications (`POST /v1/destinations/{d}/applications/{ns}/{name}:sync`, for Kargo's `http` step); reading an Application (`GET`) needs only the policy (`policy.rules[].applicationNamespaces`) and the Application's `kargo.akuity.io/authorized-stage`"),
        f("ui", "object", Unset("the defaults below"), "the full logs of runs for people (`GET /v1/runs/{namespace}/{name}/logs`, `rollouts-dispatch logs`, the `/ui` pages): who people are, and where the pages are"),
        f("budgets", "object", Unset("the defaults below"), "what one Kargo project (the AnalysisRun's namespace) or one agent destination may hold at once on a server replica, so that no project takes what another's calls need. Beyond its budget a request is answered `429 over_budget` with `Retry-After: 1` and a message naming the project and the key (the plugin keeps the measurement Running and retries); other projects are not affected. Refusals are counted in `rollouts_dispatch_over_budget_total{key}`. The budgets of everyone together are `serve`'s flags (`--max-concurrent-requests`, `--max-log-reads`, `--max-log-uploads`, …)"),
    ];
    for (key, ty, default, description) in ACCESS_FIELDS {
        docs.push(f(&format!("controlPlane.{key}"), ty, default, description));
    }
    docs.extend([
        f("destinations[].name", "string", Required, "its name in `destination:`; unique, no commas or white space, not `stage`"),
        f("destinations[].labels", "string map", Unset("no labels"), "labels for `destinationSelector`"),
        f("destinations[].namespace", "string", Unset("the first of `namespaces`, else the kubeconfig context's namespace, else `default`"), "default namespace of Jobs there; with `namespaces`, one of them"),
        f("destinations[].namespaces", "list of strings", Unset("every namespace: Jobs and Pods are listed and watched cluster-wide"), "the only namespaces Jobs may run in there (namespace names, no globs, at least one): its Jobs and Pods are listed and watched in each of them, so its credentials need no cluster-wide read, and a measurement placed in another namespace gets `Error` naming the destination, the namespace and this key, before any call to the destination"),
    ]);
    for (key, ty, default, description) in ACCESS_FIELDS {
        docs.push(f(&format!("destinations[].{key}"), ty, default, description));
    }
    docs.extend([
        f("kubeconfigContexts.path", "path", Unset("`$KUBECONFIG`, else `~/.kube/config`"), "the kubeconfig file"),
        f("kubeconfigContexts.contexts", "list of globs", Unset("all contexts"), "globs (`*`, `?`) over context names"),
        f("kubeconfigContexts.labels", "string map", Unset("no labels"), "labels of every such destination"),
        f("kubeconfigContexts.namespace", "string", Unset("`default`"), "default namespace of Jobs when the context has none"),
        f("argocd[].name", "string", Unset("`argocd` for the single map; required in a list"), "unique; named in messages. With `kubeconfig`, also the name of the destination that is the cluster the instance runs on (so not a name of `destinations[]` or `agents.destinations[]`, not `in-cluster`)"),
        f("argocd[].kubeconfig", "object", Unset("neither this nor `destination`: the control plane"), "the instance runs on the cluster of this kubeconfig: its cluster Secrets and Applications are read there, and with `inCluster` that cluster is a destination named after the instance; excludes `destination`"),
        f("argocd[].kubeconfig.path", "path", Unset("`$KUBECONFIG`, else `~/.kube/config`"), "the kubeconfig file"),
        f("argocd[].kubeconfig.context", "string", Unset("the kubeconfig's current context"), "its context"),
        f("argocd[].destination", "string", Unset("neither this nor `kubeconfig`: the control plane"), "the instance runs on this direct destination (`destinations[]` or a context of `kubeconfigContexts`, never an agent destination), read with its credentials; Applications on `https://kubernetes.default.svc` or `in-cluster` run their Jobs there (with `inCluster`); excludes `kubeconfig`"),
        f("argocd[].shards", "list of strings", Unset("the single map: every Stage; a list item: the Stages without `spec.shard` (`[\"\"]`)"), "the Kargo shards (a Stage's `spec.shard`, kargo api/v1alpha1/stage_types.go:216) whose Stages promote through this instance; `\"\"` stands for the Stages without a shard. A shard is served by at most one instance; a Stage whose shard no instance serves is refused (naming the Stage, its shard and this key), never resolved elsewhere"),
        f("argocd[].namespace", "string", Value("argocd"), "namespace of Argo CD and its cluster Secrets (and of the Applications a Stage names without a namespace)"),
        f("argocd[].inCluster", "bool", Value("true"), "the cluster the instance runs on is a destination, where Applications on `https://kubernetes.default.svc` or `in-cluster` run their Jobs (like Argo CD's `cluster.inClusterEnabled`): the implicit `in-cluster` on the control plane (one instance there at most), the instance's `name` with `kubeconfig`, the `destination` itself; false: such Applications are refused"),
        f("argocd[].inClusterNamespaces", "list of strings", Unset("every namespace: watched cluster-wide"), "the only namespaces Jobs may run in on the instance's own cluster (namespace names), each watched on its own, so the server needs no cluster-wide read of Jobs and Pods there; its default namespace is `defaultNamespace` when listed, else the first. Not with `destination` (set that destination's `namespaces`)"),
        f("argocd[].defaultNamespace", "string", Value("default"), "default namespace of Jobs on these destinations; a Secret may override it with annotation `rollouts-dispatch.io/namespace`, and limit the destination to namespaces with annotation `rollouts-dispatch.io/namespaces: a,b` (like `destinations[].namespaces`; the default is then `defaultNamespace` when listed, else the first)"),
        f("argocd[].execProviders", "list of strings", Unset("none: a Secret with `execProviderConfig` is refused (its destination is broken)"), "the commands a cluster Secret's `execProviderConfig` may run inside the server, exactly as its `command` gives them (e.g. `/usr/local/bin/gke-gcloud-auth-plugin`); anyone who can write Secrets in the Argo CD namespace chooses the command"),
        f("policy.allowAll", "bool", Value("false"), "`true`: every project may use every destination and namespace, with the default pod security (`restricted`, service account `default`, no API token); a warning at start; excludes `rules`"),
        f("policy.rules", "list of objects", Unset("none: nothing is dispatched (a warning at start)"), "allow rules; any matching rule allows; when several match, the most permissive `podSecurity` applies and their `serviceAccounts`, `automountServiceAccountToken` and pod allowlists (`secrets` … `podAnnotations`) add up"),
        f("policy.rules[].projects", "list of globs", Required, "Kargo projects (AnalysisRun namespaces)"),
        f("policy.rules[].destinations", "list of globs", Required, "destination names"),
        f("policy.rules[].namespaces", "list of globs", Required, "namespaces on the destination the rule's Jobs may run in (and the Rollouts and Applications it may observe); `[\"*\"]`, every namespace, must be written and is warned about at start and by `doctor`"),
        f("policy.rules[].applicationNamespaces", "list of globs", Unset("none: no Application may be read or synced through this rule (`namespaces` is for Jobs only)"), "namespaces on the destination whose Argo CD Applications the projects may read and sync (`GET|POST /v1/destinations/{d}/applications/{ns}/{name}[:sync]`) and observe (`application:` checks); on the routes the Application must also list the caller's `<project>:<stage>` in its annotation `kargo.akuity.io/authorized-stage`, as Kargo requires (no globs; `application:` checks do not read it yet)"),
        f("policy.rules[].podSecurity", "enum", Value("restricted"), "Pod Security Standards level of the Jobs: `restricted` (unset restricted fields are filled in: seccomp RuntimeDefault, runAsNonRoot, allowPrivilegeEscalation false, drop ALL), `baseline` or `privileged`; below `privileged` also no `manualSelector`, `selector` or `nodeName`"),
        f("policy.rules[].serviceAccounts", "list of strings", Value("[\"default\"]"), "service accounts the Jobs' pods may run as (exact names; unset `serviceAccountName` is `default`)"),
        f("policy.rules[].automountServiceAccountToken", "bool", Value("false"), "whether the Jobs' pods may get an API token; when false, `automountServiceAccountToken: false` is set on pods that leave it unset and `true` or a projected `serviceAccountToken` volume is refused"),
        f("policy.rules[].defaultRunAsUser", "integer", Value("65532"), "at `restricted`, the pod's `runAsUser` and `runAsGroup` (the group only when none is set) when neither the pod nor any container sets `runAsUser`: the kubelet enforces `runAsNonRoot` against the image's own user otherwise, and refuses to start an image that runs as root (busybox) or as a named user (curlimages/curl) with `CreateContainerConfigError`. A user id from 1 to 2147483647; `none` keeps the image's user (for platforms that assign one, e.g. OpenShift's SCCs). A template's own user is never changed. Several matching rules: the first's. The agent's `--default-run-as-user` does the same in its cluster"),
        f("policy.callers", "list of objects", Unset("none: every TokenReview caller is refused (callers fail closed), and `serve` refuses to start with a `--token-review-allow` user no entry matches"), "binds Kubernetes users (TokenReview identities) to the Kargo projects they may act for; the first entry whose `subject` matches applies, and a user no entry matches gets 403 naming the entry to add. The Rollouts controller serves every namespace: `{subject: \"system:serviceaccount:argo-rollouts:argo-rollouts\", projects: [\"*\"]}`. JWTs are bound by their `projects` claim instead (`token issue --project`; required)"),
        f("policy.callers[].subject", "string", Required, "glob (`*`, `?`) over Kubernetes usernames, e.g. `system:serviceaccount:team-a:*`"),
        f("policy.callers[].projects", "list of globs", Required, "Kargo projects (AnalysisRun namespaces) that user may act for; any other gets 403 `forbidden`"),
        f("engine.connectTimeout", "duration", Value("5s"), "TCP + TLS connect to a destination API server"),
        f("engine.requestTimeout", "duration", Value("20s"), "bound on one API call (create, get, delete, list)"),
        f("engine.cacheWait", "duration", Value("2s"), "how long a status lookup waits for a destination's first cache sync before asking the API server"),
        f("engine.logTimeout", "duration", Value("5s"), "bound on reading a log tail from `pods/log`"),
        f("engine.measurementDeadline", "duration", Value("30m"), "a measurement's deadline when its block sets no `activeDeadline`: past it (plus `deadlineGrace`) without a verdict, the server ends it in `Error` naming what did not answer, and deletes its Jobs"),
        f("engine.deadlineGrace", "duration", Value("2m"), "added to the deadline of every measurement that runs Jobs, so that the destination's own `activeDeadlineSeconds` verdict (`Failed`, DeadlineExceeded) comes first; not to observe checks (`rollout:`, `application:`), which have no Job: at their `activeDeadline` they end `Failed` with what they saw"),
        f("engine.startGrace", "duration", Value("30s"), "how long a Job's container may fail to start (`CreateContainerConfigError`: a missing Secret or ConfigMap key, runAsNonRoot against an image that runs as root; `CreateContainerError`, `RunContainerError`, a start hook's error) before the measurement ends in `Error` naming the pod, the container, the reason and the kubelet's message; the kubelet tries again every ~10s, so what comes a moment later still lets it start. Measured from the pod's `status.startTime`; `0s`: at once. An image that cannot be pulled is `Inconclusive` at once (as with Argo's job provider), an image name that does not parse an `Error` at once, a container in `CrashLoopBackOff` `Failed` at once with its last log lines. The agent's `--start-grace` does the same in its cluster"),
        f("engine.schedulingGrace", "duration", Value("60s"), "how long a Job's pod may stay unschedulable (PodScheduled False, reason `Unschedulable`) before the measurement ends in `Error` naming the pod and the scheduler's message; measured from the condition's `lastTransitionTime`. Raise it where a cluster autoscaler adds nodes for such pods (minutes); `0s`: at once. A pod held by scheduling gates stays pending. The agent's `--scheduling-grace` does the same in its cluster"),
        f("engine.maxMeasurementDeadline", "duration", Value("6h"), "the longest `activeDeadline` a block may ask for: a longer one is refused when the measurement starts (400, naming `activeDeadline`, its value and this key), so that no tenant holds its Stage for days; at least `measurementDeadline`. Finished agent records are kept at least this long plus `deadlineGrace` (see `jobs.retention`)"),
        f("agents.store", "enum", Value("memory"), "where agent work is kept: `memory` (in the server process: one replica only, forgotten on restart, agents resync) or `kubernetes` (`DispatchJob` resources on the control plane, CRD in config/crds: any number of replicas)"),
        f("agents.namespace", "string", Unset("`$POD_NAMESPACE`, else `rollouts-dispatch`"), "namespace of the `DispatchJob` resources (store `kubernetes`)"),
        f("agents.offlineAfter", "duration", Value("60s"), "an agent not heard from for this long is shown as not connected (at least 1s)"),
        f("agents.destinations", "list of objects", Unset("none"), "the agent destinations; the agent's token names its destination (`token issue --destination`)"),
        f("agents.destinations[].name", "string", Required, "its name in `destination:` and in the agent's token; unique, not also in `destinations`"),
        f("agents.destinations[].labels", "string map", Unset("no labels"), "labels for `destinationSelector`"),
        f("agents.destinations[].namespace", "string", Value("default"), "default namespace of Jobs there"),
        f("applicationSync.destinations", "list of globs", Unset("none: every sync is refused (403 naming this key)"), "globs (`*`, `?`) over the destinations whose Applications a plugin token may sync (on top of `policy.rules`: project × destination × `applicationNamespaces`, and the Application's `kargo.akuity.io/authorized-stage`). The server patches the Application itself on a direct destination (needs `patch` on `applications.argoproj.io` there); an agent destination's agent does it, only when started with `--argocd-sync`"),
        f("ui.externalURL", "string", Unset("no link in messages"), "where people open the pages (absolute `http(s)://` URL, no query): every measurement message ends with ` — logs: <externalURL>/ui/runs/<namespace>/<name>`, so Kargo's verification tab shows where the full logs are"),
        f("ui.sessionLifetime", "duration", Value("8h"), "how long a login to the pages lasts (1m to 168h): the session cookie holds a random id, the token stays in the memory of the replica that took the login (with several replicas, route people to one replica, e.g. `sessionAffinity: ClientIP`, or they log in again on another); logout ends it at once"),
        f("ui.maxSessions", "integer", Value("10000"), "the most logins to the pages held at once (1 to 1000000); a login beyond ends the session that expires first"),
        f("ui.people", "object", Unset("the defaults below"), "how people of the control plane are recognised; what a person sees is what a SubjectAccessReview allows (`get analysisruns.argoproj.io` in the run's namespace on the control plane)"),
        f("ui.people.tokenReview", "bool", Value("true"), "with `controlPlane`: accept people's Kubernetes bearer tokens of the control plane (TokenReview without audiences: the apiserver's own, e.g. `kubectl create token`); needs `create` on `tokenreviews` and `subjectaccessreviews` there. Without `controlPlane` the default is false and `true` is an error"),
        f("ui.people.proxy", "object", Unset("unset: no proxy is trusted, user headers are ignored"), "an authenticating proxy in front of the server (oauth2-proxy with `--pass-user-headers`) whose user and group headers name the person; needs `controlPlane`"),
        f("ui.people.proxy.trustedAddresses", "list of strings", Required, "the proxy's IP addresses or CIDR blocks (`10.0.0.0/8`); the headers of any other peer are ignored (logged at debug)"),
        f("ui.people.proxy.userHeader", "string", Value("X-Forwarded-User"), "the header naming the Kubernetes user"),
        f("ui.people.proxy.groupsHeader", "string", Value("X-Forwarded-Groups"), "the header listing the user's groups, comma-separated"),
        f("jobs.ttlAfterFinished", "duration", Value("1h"), "`spec.ttlSecondsAfterFinished` of every Job whose template sets none (the template's wins): the destination deletes the Job and its Pods this long after it finished; at least 1m, long enough that the verdict is read first"),
        f("jobs.retention", "duration", Value("24h"), "the orphan sweep (`serve --sweep-orphans-every`) deletes the Jobs and agent records of AnalysisRuns that completed longer ago than this, as well as those of deleted runs; the same loop, with `agents` and no control plane too, asks agents to delete the Jobs of records whose final state was reported longer ago than this (but never sooner than `engine.maxMeasurementDeadline` + `engine.deadlineGrace`); at least 1m"),
    ]);
    // The pod allowlists of a rule (#27): what the Jobs' pods may reference, set and use.
    docs.extend([
        f("policy.rules[].secrets", "list of globs", Unset("none: a pod naming any Secret is refused"), "Secrets the Jobs' pods may read: `secret` volumes, projected `secret` sources, `env[].valueFrom.secretKeyRef`, `envFrom[].secretRef` (init, regular and ephemeral containers), a CSI volume's `nodePublishSecretRef` and the secret refs of in-tree volumes. A name like a legacy service-account token Secret's (`<service account>-token-<suffix>`, e.g. `default-token-abcde`, which would hand the pod that account's API token) is allowed only by an entry naming it exactly, never by a glob: Secret types are not read (that would need `get secrets` where Jobs run, and a Secret read at creation can be replaced before the kubelet mounts it), so a token Secret created by hand under another name is kept out only by not listing it"),
        f("policy.rules[].configMaps", "list of globs", Unset("none"), "ConfigMaps the Jobs' pods may read: `configMap` volumes, projected `configMap` sources, `configMapKeyRef`, `envFrom[].configMapRef`"),
        f("policy.rules[].persistentVolumeClaims", "list of globs", Unset("none"), "PersistentVolumeClaims the Jobs' pods may mount (`persistentVolumeClaim.claimName`) or fill an ephemeral volume from (`dataSource`/`dataSourceRef`; any other data source, a snapshot, is refused)"),
        f("policy.rules[].csiDrivers", "list of globs", Unset("none"), "CSI drivers of inline `csi` volumes (e.g. `secrets-store.csi.k8s.io`, which reads whatever its SecretProviderClass names: list it only where that is meant)"),
        f("policy.rules[].imagePullSecrets", "list of globs", Unset("none"), "the `imagePullSecrets` the Jobs' pods may name (the service account's own pull Secrets are added by Kubernetes and not checked)"),
        f("policy.rules[].ephemeralVolumes", "bool", Value("false"), "whether the Jobs' pods may have `ephemeral` volumes (a PersistentVolumeClaim created for the pod, of any storage class)"),
        f("policy.rules[].scheduling", "list of strings", Unset("none: every field below is refused when set"), "pod spec fields that decide where and how the pods run, allowed when listed: `tolerations`, `nodeSelector`, `affinity`, `priorityClassName` (and `priority`), `runtimeClassName`, `hostAliases`, `dnsConfig`, `dnsPolicy` (other than `ClusterFirst`, always allowed), `schedulerName`, `topologySpreadConstraints`, `overhead`, `preemptionPolicy`, `resourceClaims`. Empty values pass"),
        f("policy.rules[].resources", "object", Unset("the built-in defaults and caps below"), "each container's requests and limits: for every resource with a default, an unset limit becomes the default (at least the request) and an unset request the default (at most the limit), in init and regular containers; then every request and limit (containers, ephemeral containers, the pod's `resources`) must be at most its resource's `max`, and a resource with no `max` is refused. Several matching rules: the larger of each"),
        f("policy.rules[].resources.default", "quantity map", Value("{cpu: 100m, memory: 128Mi}"), "resource name → Kubernetes quantity (`100m`, `0.5`, `128Mi`, `1G`), laid over the built-ins resource by resource; each at most its `max`"),
        f("policy.rules[].resources.max", "quantity map", Value("{cpu: 2, ephemeral-storage: 4Gi, memory: 2Gi}"), "resource name → the most a request or limit may be, laid over the built-ins resource by resource; name other resources (`nvidia.com/gpu: 1`) to allow them"),
        f("policy.rules[].jobLimits", "object", Unset("the built-in caps below"), "caps on the Job's own fields; several matching rules: the larger of each"),
        f("policy.rules[].jobLimits.parallelism", "integer", Value("1"), "the most `spec.parallelism` may be (pods at once); at least 1"),
        f("policy.rules[].jobLimits.completions", "integer", Value("1"), "the most `spec.completions` may be; at least 1"),
        f("policy.rules[].jobLimits.backoffLimit", "integer", Value("6"), "the most `spec.backoffLimit` and `spec.backoffLimitPerIndex` may be; an unset `backoffLimit` is set to 6 (the Kubernetes default), or this when lower"),
        f("policy.rules[].podLabels", "list of globs", Unset("none: the pod template may carry only our labels"), "label keys the pod template may set (a pod's labels decide which Services send it traffic and which NetworkPolicies select it); our reserved keys stay ours whatever this says. The Job's own labels (the block's `metadata`) are not restricted"),
        f("policy.rules[].podAnnotations", "list of globs", Unset("none"), "annotation keys the pod template may set (annotations trigger mutating webhooks: sidecar, secret and credential injectors)"),
        f("budgets.measurementCallsPerProject", "integer", Value("32"), "measurement calls (run, resume, terminate, garbage collection) of one project served at once, out of `--max-concurrent-requests` (256); above the 30 analysis workers of one Rollouts controller (argo-rollouts controller/controller.go `DefaultAnalysisThreads`), so the controller alone is never refused; at least 1"),
        f("budgets.applicationCallsPerProject", "integer", Value("16"), "Application reads and syncs (`/v1/destinations/{d}/applications/…`) of one project served at once, out of `--max-concurrent-requests`; at least 1"),
        f("budgets.logStreamsPerProject", "integer", Value("8"), "reads of the logs of one project's runs (`GET /v1/runs/{namespace}/{name}/logs`, the run page, `logs -f`) open at once, each held until its stream ends, out of `--max-log-reads` (128); at least 1"),
        f("budgets.logRequestsPerProject", "integer", Value("32"), "log requests of one project's Jobs on agent destinations open at once, waiting for their agent or streaming from it (a read asks one per Job there, all or none); each streaming one holds an upload slot (`--max-log-uploads`, 64), so one project cannot take them all; at least 1"),
        f("budgets.pendingLogRequestsPerDestination", "integer", Value("16"), "log requests of one agent destination waiting for its agent to start their upload (the agent uploads 4 at once, and a request it has not started within 30s ends with a note); at least 1"),
    ]);
    docs
}

// The path in the first line is part of docs/configuration.md, kept as is by the split.
const REFERENCE_INTRO: &str = "\
<!-- Generated from server/src/config/reference.rs (`reference()`); do not edit: run `make docs`. -->

# Server configuration reference

The server configuration file is YAML, given to `rollouts-dispatch serve`, `run` and `doctor`
with `--config FILE` (or `$ROLLOUTS_DISPATCH_CONFIG`); in the Helm chart it is the `config:`
value. Every top-level key is optional. Without a file, the embedded default applies: every
context of `$KUBECONFIG` / `~/.kube/config` is a destination, and there is no policy, so nothing
is dispatched: the policy denies by default (`policy.rules`, or `policy: {allowAll: true}`, opens
it). An unknown key, or a value that cannot be used, is refused
with one message naming the file and the key (`destinations[1].server: …`).

A commented example is [`config/server.yaml`](../config/server.yaml).

Keys are written as paths: `agents.destinations[].namespace` is `namespace` in an item of the
list `destinations` under `agents`. Durations are Go durations (`90s`, `2m`, `1h30m`). Globs
match with `*` and `?`. A destination (in `destinations` or `controlPlane`) is reached either
with `kubeconfig` (+ `context`) or with `server` and credentials, never both.
";

/// The reference as Markdown: an introduction, then one table per section of [`reference()`].
/// `docs/configuration.md` holds exactly this (a test checks it; `make docs` rewrites it).
pub fn reference_markdown() -> String {
    let docs = reference();
    let mut sections: Vec<&str> = Vec::new();
    for d in &docs {
        if !sections.contains(&d.section()) {
            sections.push(d.section());
        }
    }
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(REFERENCE_INTRO);
    for section in sections {
        if section.is_empty() {
            out.push_str("\n## Top level\n\n");
        } else {
            out.push_str(&format!("\n## `{section}`\n\n"));
        }
        out.push_str("| Key | Type | Default | Description |\n|---|---|---|---|\n");
        for d in docs.iter().filter(|d| d.section() == section) {
            let default = match d.default {
                FieldDefault::Required => "required".to_string(),
                FieldDefault::Value(v) => format!("`{v}`"),
                FieldDefault::Unset("") => "—".to_string(),
                FieldDefault::Unset(note) => note.to_string(),
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                d.key,
                d.ty,
                cell(&default),
                cell(d.description)
            ));
        }
    }
    out
}

/// The reference against the parser; `UPDATE_DOCS=1` rewrites docs/configuration.md (`make docs`).
#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use dispatch_api::parse_go_duration;
    use serde_json::{json, Map, Value as Json};

    use super::*;
    use crate::config::raw::RawConfig;
    use crate::config::{Access, ConfirmRuns, ServerConfig, StoreKind};

    /// A value of a documented type that the raw structs accept.
    fn example(ty: &str) -> Json {
        match ty {
            "string" | "path" | "enum" => json!("x"),
            "bool" => json!(true),
            "duration" => json!("5s"),
            "string map" => json!({"k": "v"}),
            "list of strings" | "list of globs" => json!(["x"]),
            "object" => json!({}),
            "list of objects" => json!([]),
            "integer" => json!(1),
            "quantity map" => json!({"cpu": "1"}),
            other => panic!("type {other:?} has no example value: add one to `example`"),
        }
    }

    /// Sets `key` (`a.b[].c`) in `doc` unless already there; `b[]` is the first item of list `b`.
    fn insert(doc: &mut Map<String, Json>, key: &str, value: Json) {
        let mut segments: Vec<&str> = key.split('.').collect();
        let last = segments.pop().unwrap();
        let mut cursor = doc;
        for seg in segments {
            cursor = match seg.strip_suffix("[]") {
                Some(list) => {
                    let Json::Array(items) = cursor.entry(list).or_insert_with(|| json!([])) else {
                        panic!("{key}: {list} is not a list")
                    };
                    if items.is_empty() {
                        items.push(json!({}));
                    }
                    items[0].as_object_mut().unwrap()
                }
                None => cursor
                    .entry(seg)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .unwrap_or_else(|| panic!("{key}: {seg} is not an object")),
            };
        }
        cursor.entry(last).or_insert(value);
    }

    /// A document with `key` set to `value` and the required keys of the list items on its path.
    fn document_with(docs: &[FieldDoc], key: &str, value: Json) -> String {
        let mut doc = Map::new();
        for r in docs {
            let on_path = !r.section().is_empty() && key.starts_with(&format!("{}.", r.section()));
            if r.default == FieldDefault::Required && on_path && r.key != key {
                insert(&mut doc, &r.key, example(r.ty));
            }
        }
        insert(&mut doc, key, value);
        Json::Object(doc).to_string()
    }

    fn parse_raw(text: &str) -> Result<RawConfig, String> {
        serde_saphyr::from_str::<RawConfig>(text).map_err(|e| e.to_string())
    }

    /// The sections with fields of their own: the top level, every object and list item.
    fn sections(docs: &[FieldDoc]) -> Vec<String> {
        let mut out = vec![String::new()];
        for d in docs {
            match d.ty {
                "object" => out.push(d.key.clone()),
                "list of objects" => out.push(format!("{}[]", d.key)),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn reference_is_well_formed() {
        let docs = reference();
        let mut keys = BTreeSet::new();
        for d in &docs {
            assert!(keys.insert(d.key.as_str()), "{} is documented twice", d.key);
            assert!(!d.description.is_empty(), "{} has no description", d.key);
            example(d.ty);
        }
        for d in &docs {
            let section = d.section();
            if section.is_empty() {
                continue;
            }
            let (parent, ty) = match section.strip_suffix("[]") {
                Some(list) => (list, "list of objects"),
                None => (section, "object"),
            };
            assert!(
                docs.iter().any(|p| p.key == parent && p.ty == ty),
                "{}: its parent `{parent}` must be documented as {ty}",
                d.key
            );
        }
    }

    #[test]
    fn every_documented_key_is_accepted_alone() {
        let docs = reference();
        for d in &docs {
            let text = document_with(&docs, &d.key, example(d.ty));
            if let Err(e) = parse_raw(&text) {
                panic!(
                    "documented key `{}` is rejected by the parser: {e}\n{text}",
                    d.key
                );
            }
        }
    }

    #[test]
    fn every_documented_key_is_accepted_at_once() {
        let docs = reference();
        let mut doc = Map::new();
        for d in &docs {
            insert(&mut doc, &d.key, example(d.ty));
        }
        let text = Json::Object(doc).to_string();
        if let Err(e) = parse_raw(&text) {
            panic!("a document with every documented key is rejected: {e}\n{text}");
        }
    }

    /// serde lists the fields a struct accepts in its unknown-field error: each section's list
    /// must be the documented one, so a field added to a raw struct without docs fails here.
    #[test]
    fn every_accepted_key_is_documented() {
        let docs = reference();
        for section in sections(&docs) {
            let probe = if section.is_empty() {
                "zzz".to_string()
            } else {
                format!("{section}.zzz")
            };
            let text = document_with(&docs, &probe, json!(1));
            let e = match parse_raw(&text) {
                Ok(_) => panic!("{text}: accepted an unknown field"),
                Err(e) => e,
            };
            assert!(e.contains("unknown field `zzz`"), "{text}: {e}");
            // `… unknown field `zzz`, expected one of a, b, c` (or `expected a`; serde quotes
            // the names with backticks, serde-saphyr does not)
            let listed = e
                .split_once("expected ")
                .map_or("", |(_, rest)| rest.lines().next().unwrap_or(""));
            let listed = listed.strip_prefix("one of ").unwrap_or(listed);
            let accepted: BTreeSet<&str> = listed
                .split(", ")
                .map(|f| f.trim().trim_matches('`'))
                .filter(|f| !f.is_empty())
                .collect();
            let documented: BTreeSet<&str> = docs
                .iter()
                .filter(|d| d.section() == section)
                .map(|d| d.key.rsplit('.').next().unwrap())
                .collect();
            let name = if section.is_empty() {
                "the top level"
            } else {
                &section
            };
            let undocumented: Vec<_> = accepted.difference(&documented).collect();
            let unknown: Vec<_> = documented.difference(&accepted).collect();
            assert!(
                undocumented.is_empty() && unknown.is_empty(),
                "keys of {name}: accepted by the parser but missing from reference(): \
                 {undocumented:?}; in reference() but not accepted: {unknown:?} (parser: {e})"
            );
        }
    }

    #[test]
    fn documented_defaults_are_what_parse_applies() {
        let c = ServerConfig::parse(
            r#"
controlPlane: {server: "https://cp.example"}
destinations: [{name: a, server: "https://a.example"}]
argocd: {}
policy: {rules: [{projects: [p], destinations: [d], namespaces: [n]}]}
engine: {}
agents: {destinations: [{name: e}]}
jobs: {}
ui: {people: {proxy: {trustedAddresses: ["10.0.0.1"]}}}
"#,
            "test",
        )
        .unwrap();
        let dur = |v: &str| parse_go_duration(v).unwrap();
        let Access::Direct(cp) = &c.control_plane else {
            panic!("direct")
        };
        let Access::Direct(dest) = &c.destinations[0].access else {
            panic!("direct")
        };
        let argocd = &c.argocd[0];
        let agents = c.agents.as_ref().unwrap();
        let rule = &c.policy.as_ref().unwrap().rules[0];
        let mut checked = 0;
        for d in reference() {
            let FieldDefault::Value(v) = d.default else {
                continue;
            };
            let applied = match d.key.as_str() {
                "controlPlane.insecure" => v == cp.insecure.to_string(),
                "destinations[].insecure" => v == dest.insecure.to_string(),
                "argocd[].namespace" => v == argocd.namespace,
                "argocd[].inCluster" => v == argocd.in_cluster.to_string(),
                "argocd[].defaultNamespace" => v == argocd.default_namespace,
                "policy.rules[].serviceAccounts" => {
                    serde_json::from_str::<Vec<String>>(v).unwrap() == rule.service_accounts
                }
                "policy.rules[].podSecurity" => v == rule.pod_security.as_str(),
                "policy.rules[].automountServiceAccountToken" => {
                    v == rule.automount_service_account_token.to_string()
                }
                "policy.allowAll" => v == c.policy.as_ref().unwrap().allow_all.to_string(),
                "policy.rules[].ephemeralVolumes" => v == rule.allow.ephemeral_volumes.to_string(),
                "policy.rules[].resources.default" => {
                    v == quantity_map(&rule.allow.resources.default)
                }
                "policy.rules[].resources.max" => v == quantity_map(&rule.allow.resources.max),
                "policy.rules[].jobLimits.parallelism" => {
                    v == rule.allow.job_limits.parallelism.to_string()
                }
                "policy.rules[].jobLimits.completions" => {
                    v == rule.allow.job_limits.completions.to_string()
                }
                "policy.rules[].jobLimits.backoffLimit" => {
                    v == rule.allow.job_limits.backoff_limit.to_string()
                }
                "confirmRuns" => v == (c.confirm_runs == ConfirmRuns::On).to_string(),
                "engine.connectTimeout" => dur(v) == c.engine.connect_timeout,
                "engine.requestTimeout" => dur(v) == c.engine.request_timeout,
                "engine.cacheWait" => dur(v) == c.engine.cache_wait,
                "engine.measurementDeadline" => dur(v) == c.engine.measurement_deadline,
                "engine.deadlineGrace" => dur(v) == c.engine.deadline_grace,
                "engine.maxMeasurementDeadline" => dur(v) == c.engine.max_measurement_deadline,
                "engine.logTimeout" => dur(v) == c.engine.log_timeout,
                "engine.startGrace" => dur(v) == c.engine.start_grace,
                "engine.schedulingGrace" => dur(v) == c.engine.scheduling_grace,
                "policy.rules[].defaultRunAsUser" => v == rule.default_user.to_string(),
                "agents.store" => {
                    agents.store
                        == match v {
                            "memory" => StoreKind::Memory,
                            "kubernetes" => StoreKind::Kubernetes,
                            other => panic!("agents.store: {other:?}"),
                        }
                }
                "agents.offlineAfter" => dur(v) == agents.offline_after,
                "agents.destinations[].namespace" => v == agents.destinations[0].namespace,
                "jobs.ttlAfterFinished" => dur(v) == c.jobs.ttl_after_finished,
                "jobs.retention" => dur(v) == c.jobs.retention,
                "ui.people.tokenReview" => v == c.ui.people.token_review.to_string(),
                "budgets.measurementCallsPerProject" => {
                    v == c.budgets.measurement_calls_per_project.to_string()
                }
                "budgets.applicationCallsPerProject" => {
                    v == c.budgets.application_calls_per_project.to_string()
                }
                "budgets.logStreamsPerProject" => {
                    v == c.budgets.log_streams_per_project.to_string()
                }
                "budgets.logRequestsPerProject" => {
                    v == c.budgets.log_requests_per_project.to_string()
                }
                "budgets.pendingLogRequestsPerDestination" => {
                    v == c.budgets.pending_log_requests_per_destination.to_string()
                }
                "ui.sessionLifetime" => dur(v) == c.ui.sessions.lifetime,
                "ui.maxSessions" => v == c.ui.sessions.max.to_string(),
                "ui.people.proxy.userHeader" => {
                    v.eq_ignore_ascii_case(&c.ui.people.proxy.as_ref().unwrap().user_header)
                }
                "ui.people.proxy.groupsHeader" => {
                    v.eq_ignore_ascii_case(&c.ui.people.proxy.as_ref().unwrap().groups_header)
                }
                other => panic!(
                    "{other}: documented default {v} is checked by no test; add it to \
                     documented_defaults_are_what_parse_applies"
                ),
            };
            assert!(
                applied,
                "{}: reference() says the default is {v}, ServerConfig::parse applies another",
                d.key
            );
            checked += 1;
        }
        assert_eq!(checked, 41);
        // without a file, or without an `engine:` section, the engine defaults are the same
        assert_eq!(ServerConfig::embedded_default().engine, c.engine);
        assert_eq!(ServerConfig::parse("", "test").unwrap().engine, c.engine);
    }

    /// A quantity map as the reference writes it: `{cpu: 100m, memory: 128Mi}`.
    fn quantity_map(
        m: &std::collections::BTreeMap<String, crate::podsecurity::Quantity>,
    ) -> String {
        let items: Vec<String> = m.iter().map(|(k, q)| format!("{k}: {q}")).collect();
        format!("{{{}}}", items.join(", "))
    }

    #[test]
    fn docs_configuration_md_is_up_to_date() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
        let want = reference_markdown();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "docs/configuration.md differs from reference_markdown() (first at line {}): \
                 run `make docs` to regenerate it from server/src/config/reference.rs",
                line + 1
            );
        }
    }
}
