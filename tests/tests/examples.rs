//! Every example under `config/` is parsed here so none can rot: the AnalysisTemplates' plugin
//! blocks validate (after `{{args.*}}` substitution, as the controller does), the
//! `argo-rollouts-config` snippet registers the plugin with flags the plugin accepts, and the
//! Kargo Stage references templates that exist and declare every Stage arg (Kargo's rule).
//! `make e2e` also creates the templates on a real apiserver.

use dispatch_tests::cluster::node::images;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use dispatch_api::{JobConfig, PLUGIN_NAME};
use dispatch_tests::artifacts::{example_analysis_templates, repo_path};
use serde_json::Value;

fn config_dir() -> PathBuf {
    repo_path("config")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The AnalysisTemplates in `config/analysis-templates`, by metadata.name.
fn templates() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (path, t) in example_analysis_templates().expect("config/analysis-templates") {
        assert_eq!(t["kind"], "AnalysisTemplate", "{}", path.display());
        out.insert(
            t["metadata"]["name"].as_str().expect("a name").to_string(),
            t,
        );
    }
    out
}

/// Replaces `{{args.X}}` / `{{ args.X }}` like the controller does before calling the plugin.
fn substitute(text: &str, args: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (k, v) in args {
        out = out
            .replace(&format!("{{{{args.{k}}}}}"), v)
            .replace(&format!("{{{{ args.{k} }}}}"), v);
    }
    out
}

#[test]
fn analysis_templates_have_valid_plugin_blocks() {
    let templates = templates();
    assert!(
        templates.len() >= 4,
        "expected the example templates, found {:?}",
        templates.keys()
    );
    for (name, t) in &templates {
        let args: BTreeMap<String, String> = t["spec"]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let n = a["name"].as_str().expect("arg name").to_string();
                let v = if n == "destination" {
                    "cluster-a".to_string()
                } else {
                    format!("example-{n}")
                };
                (n, v)
            })
            .collect();
        let mut blocks = 0;
        for m in t["spec"]["metrics"].as_array().expect("metrics") {
            let Some(block) = m["provider"]["plugin"].get(PLUGIN_NAME) else {
                continue;
            };
            let json = substitute(&serde_json::to_string(block).expect("json"), &args);
            assert!(
                !json.contains("{{"),
                "{name}: an arg is used but not declared: {json}"
            );
            let config = JobConfig::parse(json.as_bytes())
                .unwrap_or_else(|e| panic!("{name}/{}: {e}", m["name"]));
            passes_the_example_policy(name, &config);
            blocks += 1;
        }
        assert!(blocks > 0, "{name} has no {PLUGIN_NAME} metric");
    }
}

/// The example template's Job passes the pod security that config/server.yaml gives team-web on
/// prod-eu (the rule its comments point the ALB example to); only a template that runs as
/// another service account needs that rule: team-payments' (the defaults) refuses just those.
fn passes_the_example_policy(name: &str, config: &JobConfig) {
    use dispatch_server::config::ServerConfig;
    use dispatch_server::job::{build, JobInput, RunContext};
    use dispatch_server::podsecurity::{enforce, our_labels};
    use dispatch_server::policy::Policy;

    let server = ServerConfig::parse(
        &std::fs::read_to_string(config_dir().join("server.yaml")).expect("config/server.yaml"),
        "config file config/server.yaml",
    )
    .expect("config/server.yaml is valid");
    let policy = Policy::new(server.policy.as_ref(), &server.origin);
    if let Some(observe) = config.observe() {
        // No Job, so no pod security: the policy gives team-web the observed object's namespace
        // (an Application's through `applicationNamespaces`, never the Jobs' `namespaces`).
        use dispatch_api::observe::Observe;
        let (namespace, allowed) = match observe {
            Observe::Rollout(r) => {
                let ns = r.namespace.clone().unwrap_or_else(|| "verification".into());
                let allowed = policy.check("team-web", "prod-eu", &ns);
                (ns, allowed)
            }
            Observe::Application(a) => {
                let allowed = policy.check_application("team-web", "prod-eu", &a.namespace);
                (a.namespace.clone(), allowed)
            }
        };
        assert!(
            allowed.is_ok(),
            "{name}: config/server.yaml gives team-web no rule for namespace {namespace}: {allowed:?}"
        );
        return;
    }
    for project in ["team-web", "team-payments"] {
        let run = RunContext {
            name: "uat.1".into(),
            namespace: project.into(),
            uid: "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a".into(),
            ..RunContext::default()
        };
        let mut job = build(&JobInput {
            run: &run,
            metric: "m",
            measurement: 1,
            config,
            destination: "prod-eu",
            namespace: "verification",
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(policy.check(project, "prod-eu", "verification").is_ok());
        let profile = policy.profile(project, "prod-eu", "verification");
        let verdict = enforce(&mut job, &profile, &our_labels(&run.uid, "prod-eu"));
        let own_account = config
            .job_spec()
            .and_then(|spec| spec.get("template"))
            .and_then(|t| t.pointer("/spec/serviceAccountName"))
            .is_some_and(Value::is_string);
        match (project, verdict) {
            ("team-web", Err(e)) => panic!("{name}: {e}"),
            ("team-payments", Ok(())) if own_account => {
                panic!("{name}: runs as its own service account, yet the defaults allow it")
            }
            ("team-payments", Err(e)) if !own_account => panic!("{name}: {e}"),
            _ => {}
        }
    }
}

/// Every example Job, with the server's defaults applied as the server applies them for team-web
/// on prod-eu (`restricted`), is one a real kubelet starts: each container runs as non-root with
/// a numeric user other than 0 (the kubelet refuses `runAsNonRoot` with an image that runs as
/// root or as a named user it cannot verify, kubernetes
/// pkg/kubelet/kuberuntime/security_context_others.go:34-67, and busybox runs as root,
/// curlimages/curl as `curl_user`), none is privileged or escalates, and the restricted Pod
/// Security Standards pass (the server's own PSA checks, `podsecurity::enforce`).
#[test]
fn every_example_job_starts_on_a_real_kubelet_under_restricted() {
    use dispatch_server::config::ServerConfig;
    use dispatch_server::job::{build, JobInput, RunContext};
    use dispatch_server::podsecurity::{enforce, our_labels, Level};
    use dispatch_server::policy::Policy;

    let server = ServerConfig::parse(
        &std::fs::read_to_string(config_dir().join("server.yaml")).expect("config/server.yaml"),
        "config file config/server.yaml",
    )
    .expect("config/server.yaml is valid");
    let policy = Policy::new(server.policy.as_ref(), &server.origin);
    let profile = policy.profile("team-web", "prod-eu", "verification");
    assert_eq!(profile.level, Level::Restricted);
    let run = RunContext {
        name: "uat.1".into(),
        namespace: "team-web".into(),
        uid: "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a".into(),
        ..RunContext::default()
    };
    let mut jobs = 0;
    for (name, config) in example_blocks() {
        if config.observe().is_some() {
            continue;
        }
        let mut job = build(&JobInput {
            run: &run,
            metric: "m",
            measurement: 1,
            config: &config,
            destination: "prod-eu",
            namespace: "verification",
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        enforce(&mut job, &profile, &our_labels(&run.uid, "prod-eu"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let pod = &job["spec"]["template"]["spec"];
        let psc = &pod["securityContext"];
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                let at = format!("{name}: {list} {}", c["name"]);
                let sc = &c["securityContext"];
                let effective = |f: &str| {
                    Some(&sc[f])
                        .filter(|v| !v.is_null())
                        .unwrap_or(&psc[f])
                        .clone()
                };
                assert_eq!(effective("runAsNonRoot"), Value::Bool(true), "{at}");
                let user = effective("runAsUser");
                assert!(
                    user.as_u64().is_some_and(|u| u > 0),
                    "{at}: runAsUser {user}: the kubelet cannot check runAsNonRoot against the \
                     image's own user"
                );
                assert!(!sc["privileged"].as_bool().unwrap_or(false), "{at}");
                assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false), "{at}");
                let image = c["image"].as_str().unwrap_or_default();
                // The real node (`make e2e-real`) pulls each example's image from its own
                // registry: a new image needs a recipe there (tests/k8s/node-images.sh).
                assert!(
                    images::recipe_of(image).is_some(),
                    "{at}: image {image} has no recipe in dispatch_tests::cluster::node::images::IMAGES: \
                     prefer one of those, or add a recipe for it"
                );
            }
        }
        jobs += 1;
    }
    assert!(jobs >= 4, "the example Jobs: {jobs}");
}

/// The plugin blocks of every example template, args substituted, by template name.
fn example_blocks() -> Vec<(String, JobConfig)> {
    let mut out = Vec::new();
    for (name, t) in templates() {
        let args: BTreeMap<String, String> = t["spec"]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let n = a["name"].as_str().expect("arg name").to_string();
                (n.clone(), format!("example-{n}"))
            })
            .collect();
        for m in t["spec"]["metrics"].as_array().expect("metrics") {
            if let Some(block) = m["provider"]["plugin"].get(PLUGIN_NAME) {
                let json = substitute(&serde_json::to_string(block).expect("json"), &args);
                let config = JobConfig::parse(json.as_bytes())
                    .unwrap_or_else(|e| panic!("{name}/{}: {e}", m["name"]));
                out.push((name.clone(), config));
            }
        }
    }
    out
}

#[test]
fn the_argo_rollouts_config_snippet_registers_the_plugin_with_valid_flags() {
    let cm = yaml(&config_dir().join("argo-rollouts-config.yaml"));
    assert_eq!(cm["metadata"]["name"], "argo-rollouts-config");
    let plugins: Value = serde_saphyr::from_str(
        cm["data"]["metricProviderPlugins"]
            .as_str()
            .expect("a YAML string"),
    )
    .expect("metricProviderPlugins is YAML");
    let ours = plugins
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["name"] == PLUGIN_NAME)
        .expect("the plugin is registered under rollouts-dispatch/job");
    let mut argv = vec!["rollouts-dispatch-plugin".to_string()];
    argv.extend(
        ours["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string()),
    );
    let parsed = dispatch_metric_provider_args(&argv);
    assert!(parsed.contains("--server"), "{argv:?}");
}

/// The plugin's own argument parser accepts the snippet's args.
fn dispatch_metric_provider_args(argv: &[String]) -> String {
    let args = dispatch_metric_provider::Args::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("plugin args {argv:?}: {e}"));
    assert!(
        args.server
            .as_deref()
            .is_some_and(|s| s.starts_with("https://")),
        "{argv:?}"
    );
    argv.join(" ")
}

/// The names of a Stage's `verification.args`.
fn stage_args(stage: &Value) -> Vec<&str> {
    stage["spec"]["verification"]["args"]
        .as_array()
        .expect("verification.args")
        .iter()
        .map(|a| a["name"].as_str().expect("name"))
        .collect()
}

/// Kargo drops a Stage arg that no template declares (akuity/kargo
/// `pkg/rollouts/analysis_template.go:179-197`, `mergeArgs`): the examples declare each one.
fn assert_declares(stage: &Value, name: &str, template: &Value) {
    let declared: Vec<&str> = template["spec"]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str())
        .collect();
    for a in stage_args(stage) {
        assert!(
            declared.contains(&a),
            "template {name} does not declare Stage arg {a}: Kargo would drop it"
        );
    }
}

#[test]
fn the_kargo_stage_uses_existing_templates_that_declare_its_args() {
    let stage = yaml(&config_dir().join("kargo-stage.yaml"));
    assert_eq!(stage["kind"], "Stage");
    let templates = templates();
    for r in stage["spec"]["verification"]["analysisTemplates"]
        .as_array()
        .expect("templates")
    {
        let name = r["name"].as_str().expect("template name");
        let t = templates
            .get(name)
            .unwrap_or_else(|| panic!("the Stage references {name}, which config/ lacks"));
        assert_declares(&stage, name, t);
    }
}

#[test]
fn the_airgapped_stage_syncs_through_the_api_and_verifies_with_its_application_template() {
    let path = config_dir().join("kargo-stage-airgapped.yaml");
    let text = std::fs::read_to_string(&path).expect("config/kargo-stage-airgapped.yaml");
    let docs: Vec<Value> = text
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect();
    let of_kind = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("{} has no {kind}", path.display()))
    };
    let (stage, template) = (of_kind("Stage"), of_kind("AnalysisTemplate"));
    let name = template["metadata"]["name"].as_str().expect("a name");
    assert_eq!(
        stage["spec"]["verification"]["analysisTemplates"][0]["name"], name,
        "the Stage verifies with the template beside it"
    );
    assert_declares(stage, name, template);

    // The plugin block, with the args as the controller substitutes them, is an application check.
    let args: BTreeMap<String, String> = stage_args(stage)
        .into_iter()
        .map(|a| (a.to_string(), format!("example-{a}")))
        .collect();
    let block = &template["spec"]["metrics"][0]["provider"]["plugin"][PLUGIN_NAME];
    let json = substitute(&serde_json::to_string(block).expect("json"), &args);
    let config = JobConfig::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        config.observe().map(|o| o.kind()),
        Some("application"),
        "{name}: {json}"
    );

    // The http steps call the sync trigger, then poll the Application's state.
    let urls: Vec<(String, String)> = stage["spec"]["promotionTemplate"]["spec"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["uses"] == "http")
        .map(|s| {
            let c = &s["config"];
            (
                c["method"].as_str().unwrap_or("GET").to_string(),
                c["url"].as_str().expect("url").to_string(),
            )
        })
        .collect();
    let route = dispatch_api::observe::APPLICATION
        .split("/{destination}")
        .next()
        .expect("the routes' prefix");
    assert!(
        urls.iter()
            .any(|(m, u)| m == "POST" && u.contains(route) && u.ends_with(":sync")),
        "no POST …:sync step: {urls:?}"
    );
    assert!(
        urls.iter()
            .any(|(m, u)| m == "GET" && u.contains("/applications/") && !u.ends_with(":sync")),
        "no GET step polling the Application: {urls:?}"
    );
    // Both name the Stage the Application must be authorized for (a missing one is a 400).
    let steps = serde_json::to_string(&stage["spec"]["promotionTemplate"]).expect("json");
    assert!(
        steps.contains("?stage=${{ ctx.stage }}") && steps.contains(r#"\"stage\": ctx.stage"#),
        "the http steps do not name the Stage (`?stage=`, `\"stage\"`): {steps}"
    );
}

/// The chart's default image, `repository:appVersion`.
fn chart_image() -> String {
    let values = yaml(&repo_path("charts/rollouts-dispatch/values.yaml"));
    let chart = yaml(&repo_path("charts/rollouts-dispatch/Chart.yaml"));
    format!(
        "{}:{}",
        values["image"]["repository"]
            .as_str()
            .expect("image.repository"),
        chart["appVersion"].as_str().expect("appVersion")
    )
}

/// The volume `mounts` names at `path` (or a parent of it), and that volume in `volumes`.
fn volume_at<'a>(mounts: &'a Value, volumes: &'a Value, path: &str) -> &'a Value {
    let mount = mounts
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| {
            let at = m["mountPath"].as_str().expect("mountPath");
            path == at || path.starts_with(&format!("{at}/"))
        })
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    volumes
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {} for {path}", mount["name"]))
}

#[test]
fn the_argo_helm_values_deliver_and_register_the_plugin() {
    use dispatch_server::cmd::install_plugin::PLUGIN_FILE;
    use dispatch_server::cmd::{Cli, Command};
    let values = yaml(&config_dir().join("argo-helm-values.yaml"));
    let controller = &values["controller"];
    let init = &controller["initContainers"][0];
    assert_eq!(
        init["image"],
        chart_image().as_str(),
        "the init container runs our chart's image"
    );
    // The init container's args are a real `rollouts-dispatch install-plugin` command line.
    let mut argv = vec!["rollouts-dispatch".to_string()];
    argv.extend(
        init["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string()),
    );
    let Command::InstallPlugin(install) = Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .command
    else {
        panic!("{argv:?} is not install-plugin");
    };
    let dir = install.to.to_str().expect("a UTF-8 path");
    // It writes into an emptyDir that the controller mounts at the same path …
    let shared = volume_at(&init["volumeMounts"], &controller["volumes"], dir);
    assert!(shared.get("emptyDir").is_some(), "{shared}");
    assert_eq!(
        volume_at(&controller["volumeMounts"], &controller["volumes"], dir)["name"],
        shared["name"]
    );
    // … where the registered location points.
    let plugin = controller["metricProviderPlugins"]
        .as_array()
        .expect("metricProviderPlugins")
        .iter()
        .find(|p| p["name"] == PLUGIN_NAME)
        .expect("the plugin is registered under rollouts-dispatch/job");
    assert_eq!(
        plugin["location"],
        format!("file://{dir}/{PLUGIN_FILE}").as_str()
    );
    // The plugin's args are valid, equal to the ConfigMap example's, and their files are mounted:
    // the token a projected ServiceAccount token for the server's audience.
    let args: Vec<String> = plugin["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect();
    let mut argv = vec!["rollouts-dispatch-plugin".to_string()];
    argv.extend(args.iter().cloned());
    dispatch_metric_provider_args(&argv);
    let cm = yaml(&config_dir().join("argo-rollouts-config.yaml"));
    let example: Value =
        serde_saphyr::from_str(cm["data"]["metricProviderPlugins"].as_str().expect("YAML"))
            .expect("metricProviderPlugins is YAML");
    assert_eq!(plugin["args"], example[0]["args"]);
    let file_arg = |flag: &str| {
        let i = args.iter().position(|a| a == flag).expect(flag);
        args[i + 1].clone()
    };
    let token = volume_at(
        &controller["volumeMounts"],
        &controller["volumes"],
        &file_arg("--token-file"),
    );
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        dispatch_server::http::auth::AUDIENCE
    );
    let ca = volume_at(
        &controller["volumeMounts"],
        &controller["volumes"],
        &file_arg("--ca-file"),
    );
    assert!(
        ca["configMap"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-ca")),
        "{ca}"
    );
}
