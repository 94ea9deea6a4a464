//! `rollouts-dispatch run` and `rollouts-dispatch doctor`: the real binary against a real cluster
//! (`make test-cli`, which builds the binary first).
//!
//! One cluster starts once per test binary and is shared (`dispatch_tests::shared`); kwok runs
//! the pods, and pod-template annotations choose the container's exit code. `#[ignore]`d so
//! that a plain `cargo test` needs no cluster binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use dispatch_tests::block::{Block, RULE_ALLOWS};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::rollouts_dispatch_binary;
use dispatch_tests::shared::{block_on, Shared};

static CLUSTER: Shared<Cluster> = Shared::new();

/// A token that must never appear in `doctor` output.
const SECRET_TOKEN: &str = "cli-test-secret-token-5f2c9a";

fn cluster() -> Result<&'static Cluster> {
    CLUSTER.get_or_start(|| Cluster::start("cli"))
}

/// A scratch directory for `test` inside the cluster's directory.
fn scratch(c: &Cluster, test: &str) -> Result<PathBuf> {
    let dir = c.dir().join("cli-tests").join(test);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The server config: destination `a` is the test cluster, via its kubeconfig; any project may
/// use it (the policy denies by default).
fn write_config(c: &Cluster, dir: &Path, extra: &str) -> Result<PathBuf> {
    let path = dir.join("server.yaml");
    std::fs::write(
        &path,
        format!(
            "policy: {{rules: [{{projects: ['*'], destinations: [a], namespaces: ['*'], {RULE_ALLOWS}}}]}}\n\
             destinations:\n- name: a\n  kubeconfig: {}\n{extra}",
            c.kubeconfig.display()
        ),
    )?;
    Ok(path)
}

/// An AnalysisTemplate with one `rollouts-dispatch/job` metric (and one web metric) whose
/// container exits `exit_code` after 2s.
fn write_template(dir: &Path, exit_code: i32) -> Result<PathBuf> {
    let annotations = serde_json::to_string(
        &Block::default()
            .exits(exit_code)
            .runs_for("2s")
            .annotations(),
    )?;
    let path = dir.join("template.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: argoproj.io/v1alpha1
kind: AnalysisTemplate
metadata:
  name: cli-test
spec:
  args:
  - name: destination
  - name: greeting
    value: hello
  metrics:
  - name: web
    provider:
      web:
        url: http://example.invalid/
  - name: check
    provider:
      plugin:
        rollouts-dispatch/job:
          destination: "{{{{args.destination}}}}"
          spec:
            backoffLimit: 0
            template:
              metadata:
                annotations: {annotations}
              spec:
                restartPolicy: Never
                containers:
                - name: check
                  image: example.invalid/check:1
                  env:
                  - name: GREETING
                    value: "{{{{ args.greeting }}}}"
"#
        ),
    )?;
    Ok(path)
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr (tail)\n{}",
            self.code,
            self.stdout,
            tail(&self.stderr, 30)
        )
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn rollouts_dispatch(args: &[&str]) -> Result<Ran> {
    let out: Output = Command::new(rollouts_dispatch_binary()?)
        .args(args)
        .env("ROLLOUTS_DISPATCH_LOG", "warn")
        .env_remove("ROLLOUTS_DISPATCH_CONFIG")
        .output()
        .context("running rollouts-dispatch")?;
    let ran = Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    // Shown with --nocapture.
    println!("$ rollouts-dispatch {}\n{}", args.join(" "), ran.describe());
    Ok(ran)
}

fn run_template(test: &str, exit_code: i32, destination: &str) -> Result<Ran> {
    let c = cluster()?;
    let dir = scratch(c, test)?;
    let config = write_config(c, &dir, "")?;
    let template = write_template(&dir, exit_code)?;
    rollouts_dispatch(&[
        "run",
        "-f",
        &template.display().to_string(),
        "--arg",
        &format!("destination={destination}"),
        "--arg",
        "greeting=hi there",
        "--config",
        &config.display().to_string(),
        "--timeout",
        "2m",
    ])
}

#[test]
#[ignore = "needs clusters: make test-cli"]
fn run_successful_job_exits_0() -> Result<()> {
    let ran = run_template("success", 0, "a")?;
    ensure!(ran.code == Some(0), "{}", ran.describe());
    ensure!(
        ran.stdout.contains("verdict: Successful"),
        "{}",
        ran.describe()
    );
    // The Job is left for inspection; `{{ args.greeting }}` was substituted from --arg.
    let name = ran
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("a: job default/"))
        .and_then(|l| l.strip_suffix(" created"))
        .with_context(|| {
            format!(
                "no `a: job default/<name> created` line\n{}",
                ran.describe()
            )
        })?
        .to_string();
    let c = cluster()?;
    let job = block_on(async {
        let jobs: kube::Api<k8s_openapi::api::batch::v1::Job> =
            kube::Api::namespaced(c.client().await?, "default");
        jobs.get(&name).await.context("reading the Job")
    })?;
    let env =
        serde_json::to_value(&job)?["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    let greeting = env
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "GREETING")
        .map(|e| e["value"].clone());
    ensure!(
        greeting == Some(serde_json::json!("hi there")),
        "GREETING in job {name}: {greeting:?} (env {env})"
    );
    Ok(())
}

#[test]
#[ignore = "needs clusters: make test-cli"]
fn run_failed_job_exits_1() -> Result<()> {
    let ran = run_template("failure", 1, "a")?;
    ensure!(ran.code == Some(1), "{}", ran.describe());
    ensure!(ran.stdout.contains("verdict: Failed"), "{}", ran.describe());
    Ok(())
}

#[test]
#[ignore = "needs clusters: make test-cli"]
fn run_unknown_destination_names_it() -> Result<()> {
    let ran = run_template("unknown", 0, "nowhere")?;
    ensure!(
        ran.code.is_some_and(|c| c != 0),
        "expected a failure\n{}",
        ran.describe()
    );
    // A destination no rule of the project lists is refused as the policy's, whether it exists
    // or not (another tenant's names are not confirmed), naming what the rules allow.
    ensure!(
        ran.stderr.contains("the destination \"nowhere\"")
            && ran.stderr.contains("allow destinations a"),
        "{}",
        ran.describe()
    );
    Ok(())
}

#[test]
#[ignore = "needs clusters: make test-cli"]
fn doctor_reports_good_and_unreachable_destinations() -> Result<()> {
    let c = cluster()?;
    let dir = scratch(c, "doctor")?;
    let config = write_config(
        c,
        &dir,
        &format!(
            "- name: down\n  server: https://127.0.0.1:1\n  token: {SECRET_TOKEN}\n  insecure: true\n"
        ),
    )?;
    let ran = rollouts_dispatch(&[
        "doctor",
        "--config",
        &config.display().to_string(),
        "--timeout",
        "20s",
    ])?;
    ensure!(ran.code == Some(1), "{}", ran.describe());
    let all = format!("{}\n{}", ran.stdout, ran.stderr);
    ensure!(
        !all.contains(SECRET_TOKEN),
        "the token leaked:\n{}",
        ran.describe()
    );
    ensure!(ran.stdout.contains("config: OK"), "{}", ran.describe());
    let header = ran
        .stdout
        .lines()
        .find(|l| l.starts_with("NAME"))
        .with_context(|| format!("no table header\n{}", ran.describe()))?;
    for col in ["SOURCE", "SERVER", "REACHABLE", "RBAC", "DETAIL"] {
        ensure!(header.contains(col), "header without {col}: {header}");
    }
    let row = |name: &str| {
        ran.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    let a = row("a").with_context(|| format!("no row a\n{}", ran.describe()))?;
    // NAME SOURCE SERVER REACHABLE RBAC DETAIL…
    ensure!(
        a.get(2) == Some(&c.server.as_str()),
        "row a: {a:?}\n{}",
        ran.describe()
    );
    ensure!(
        a.get(3) == Some(&"yes") && a.get(4) == Some(&"ok"),
        "row a: {a:?}\n{}",
        ran.describe()
    );
    let down = row("down").with_context(|| format!("no row down\n{}", ran.describe()))?;
    ensure!(
        down.get(2) == Some(&"https://127.0.0.1:1") && down.get(3) == Some(&"no"),
        "row down: {down:?}\n{}",
        ran.describe()
    );
    // One line per destination on the Jobs older than the retention.
    let retention = |name: &str| {
        ran.stdout
            .lines()
            .find(|l| l.starts_with(&format!("retention {name}: ")))
            .map(str::to_string)
    };
    ensure!(
        retention("a").is_some_and(|l| !l.contains("cannot see")),
        "no retention line for a\n{}",
        ran.describe()
    );
    ensure!(
        retention("down").is_some_and(|l| l.contains("cannot see")),
        "no retention line for down\n{}",
        ran.describe()
    );
    Ok(())
}
