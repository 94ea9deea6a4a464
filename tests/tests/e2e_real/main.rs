//! The product on a real node (`make e2e-real`, issue #28): one cluster whose pods run in real
//! containers (containerd + runc, the kubelet and kube-proxy of the control plane's version,
//! CoreDNS; `dispatch_tests::cluster::node`) under the `restricted` Pod Security level, enforced by
//! the API server's defaults in every namespace.
//!
//! In order, on that one cluster: [`node`] — a pod starts, resolves a Service, reaches the API
//! server through the `kubernetes` Service, and its log is the kubelet's; a privileged pod is
//! refused. [`install`] — our image under its public name, `helm install` of the chart, the real
//! Argo Rollouts controller as a pod with our plugin from its init container; [`agent`] — the
//! agent's own release of the chart, dialling the server. [`examples`] — templates of
//! config/analysis-templates/ as written, each to its documented verdict through all of it
//! (smoke.yaml on a direct and on the agent's destination). [`logs`] — `logs -f` of a running
//! container. [`waiting`] — every waiting reason of a real kubelet, each ending fast.
//!
//! Not here: stage.yaml and application.yaml need Argo CD Applications that a real Argo CD
//! manages (issue #29, `make e2e-argocd`).
//!
//! `#[ignore]`d: `make e2e-real` runs it with `--ignored` (as root, after `make real-node-bin`,
//! `make image` and `make helm`). The last line it prints (also written to `$SUMMARY_FILE` if
//! set) is
//! `real: node=ready examples=K/K restricted=ok chart_pods=ready plugin=init-container waiting_reasons=W/W kubelet_logs=ok`.

mod agent;
mod examples;
mod install;
mod logs;
mod node;
mod waiting;

use std::time::Duration;

use anyhow::{ensure, Result};
use dispatch_tests::cluster::argo::apply_namespace;
use dispatch_tests::cluster::{Cluster, ClusterOptions};
use dispatch_tests::kargo::{Freight, PROJECT};
use dispatch_tests::summary;

use install::{
    ARGOCD_NAMESPACE, JOB_NAMESPACE, RELEASE_NAMESPACE, ROLLOUTS_NAMESPACE, WEB_NAMESPACE,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root and the real-node pieces: run `make e2e-real`"]
async fn the_product_on_a_real_node() -> Result<()> {
    let mut options = ClusterOptions::new("real");
    options.real_node = true;
    options.ready_timeout = Duration::from_secs(240);
    let cluster = Cluster::start_with(options).await?;
    println!(
        "real: node ready in {:.1}s ({})",
        cluster.start_time.as_secs_f64(),
        cluster.dir().display()
    );
    let client = cluster.client().await?;

    node::check(&cluster).await?;
    let restricted = node::privileged_pod_is_refused(&cluster).await?;
    println!("real: node=ready restricted={restricted}");

    // The product, as a user installs it.
    let image = install::push_our_image(&cluster)?;
    for ns in [
        PROJECT,
        JOB_NAMESPACE,
        WEB_NAMESPACE,
        ROLLOUTS_NAMESPACE,
        ARGOCD_NAMESPACE,
        agent::NAMESPACE,
        agent::JOB_NAMESPACE,
    ] {
        apply_namespace(&client, ns).await?;
    }
    let helm = install::helm_install(
        &cluster,
        "rollouts-dispatch",
        RELEASE_NAMESPACE,
        &install::chart_values(PROJECT),
    )?;
    println!("real: helm install of {image}:\n{helm}");
    install::install_controller(&cluster, None).await?;
    println!("real: chart_pods=ready controller=ready");

    // The agent, for a cluster that only dials out (its own release of the chart).
    let agent = agent::install(&cluster).await?;
    println!("real: helm install of the agent:\n{agent}");

    // The examples, as written: (file, Kargo Stage, args).
    examples::install_my_app(&cluster)?;
    examples::install_alb_verifier(&cluster)?;
    examples::install_web_rollout(&cluster)?;
    install::wait_available(&cluster, "my-app", "my-app", Duration::from_secs(120)).await?;
    let alb = examples::play_alb_controller(client.clone()).await?;
    let freight = Freight::create(&client).await?;
    let runs = examples::project_runs(&cluster).await?;
    let mut passed = 0;
    let mut total = 0;
    for (file, stage, args) in [
        ("smoke.yaml", "uat", vec![("destination", "in-cluster")]),
        ("smoke.yaml", "edge", vec![("destination", agent::EDGE)]),
        ("multi-destination.yaml", "prod", vec![]),
        (
            "alb-ingress.yaml",
            "edge",
            vec![
                ("destination", "in-cluster"),
                ("host", "my-app.example.com"),
            ],
        ),
        (
            "rollout.yaml",
            "uat",
            vec![
                ("destination", "in-cluster"),
                ("image", examples::WEB_IMAGE),
            ],
        ),
    ] {
        total += 1;
        let ulid = format!("01jreal{total:019}");
        let run = examples::run_from(&examples::template(file)?, &freight, stage, &ulid, &args)?;
        let (phase, message) = examples::verdict_of(&runs, run).await?;
        println!("real: example {file} ({args:?}): {phase}: {message}");
        if phase == "Successful" {
            passed += 1;
        }
    }
    alb.abort();
    ensure!(passed == total, "examples passed {passed}/{total}");

    // The plugin in the controller's pod followed the resume hints with the pod's own
    // ServiceAccount (no --kube-* flags: the in-cluster default), and resumed a measurement when
    // its Job ended.
    let hints = resume_hints_in_controller_log(&client).await?;
    println!("real: resume hints in the controller's pod: {hints}");

    // A real container's log, followed while it runs.
    let followed = logs::follow(&cluster, &freight).await?;

    // Every reason a real kubelet keeps a container from running, each ending fast.
    let waiting = waiting::check_all(&cluster, &freight).await?;
    let (planned, scenarios) = (waiting.planned, waiting.total);
    ensure!(
        planned == scenarios,
        "waiting reasons as planned: {planned}/{scenarios}"
    );
    ensure!(
        waiting.kubelet_log,
        "no verdict quoted the crash-looping container's log line"
    );
    println!("real: kubelet logs: a verdict's log tail, and logs -f of {followed} lines");

    let line = format!(
        "real: node=ready examples={passed}/{total} restricted={restricted} chart_pods=ready plugin=init-container waiting_reasons={planned}/{scenarios} kubelet_logs=ok"
    );
    summary::report(&line)?;
    Ok(())
}

/// What the controller pod's log says of the plugin's resume hints: it must have followed them
/// and resumed at least one measurement on a Job's end (`metric-provider/src/resume.rs`).
async fn resume_hints_in_controller_log(client: &kube::Client) -> Result<String> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), ROLLOUTS_NAMESPACE);
    let listed = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=argo-rollouts"))
        .await?;
    let pod = listed
        .items
        .first()
        .and_then(|p| p.metadata.name.clone())
        .ok_or_else(|| anyhow::anyhow!("no argo-rollouts pod"))?;
    let log = pods.logs(&pod, &kube::api::LogParams::default()).await?;
    let following = log.contains("following the server's resume hints");
    let resumed = log
        .lines()
        .filter(|l| l.contains("a Job finished: the measurement resumes now"))
        .count();
    ensure!(
        following && resumed > 0,
        "the plugin in pod {pod} did not follow the resume hints (following: {following}, \
         resumes on a Job's end: {resumed}); its lines:\n{}",
        log.lines()
            .filter(|l| l.contains("rollouts-dispatch-plugin"))
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(format!(
        "followed, {resumed} measurements resumed on their Job's end"
    ))
}
