//! The HTML of the pages (pure): every value from a run, a token or a request goes through
//! [`esc`]; the only script is [`LOG_SCRIPT`], static, allowed by its hash in the
//! Content-Security-Policy ([`csp`]), which appends log lines with `textContent`-safe DOM calls
//! (`append` of strings), never `innerHTML`.

use std::fmt::Write as _;
use std::sync::LazyLock;

use base64::Engine as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::runs::RunSummary;

use super::DestinationLoad;

/// The stylesheet, inline (allowed by its hash: no front-end build, no second request).
pub(super) const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
nav a,nav form{margin-right:1em;display:inline}table{border-collapse:collapse;width:100%}\
td,th{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
.Failed,.Error{color:#b00}.Successful{color:#070}.Running,.Pending{color:#850}\
pre.log{background:#111;color:#eee;padding:.5em;max-height:30em;overflow:auto;white-space:pre-wrap}\
.note{background:#ffd;padding:.5em}.msg{white-space:pre-wrap;max-width:40em}";

/// The live log of a run page: reads `data-src` of `#logs` (the log API with `follow=true`;
/// the session cookie authenticates it), splits the NDJSON stream, and appends each line to a
/// `<pre>` per destination/pod/container, as text.
pub(super) const LOG_SCRIPT: &str = r#"(async () => {
  const root = document.getElementById('logs');
  const status = document.getElementById('logs-status');
  const panes = new Map();
  const pane = (key) => {
    let pre = panes.get(key);
    if (!pre) {
      const h = document.createElement('h3');
      h.textContent = key;
      pre = document.createElement('pre');
      pre.className = 'log';
      pre.dataset.key = key;
      root.append(h, pre);
      panes.set(key, pre);
    }
    return pre;
  };
  const show = (ev) => {
    if (ev.kind === 'line') {
      pane(ev.destination + '/' + ev.pod + '/' + ev.container).append(ev.text + '\n');
    } else {
      pane(ev.destination + (ev.pod ? '/' + ev.pod : '')).append('-- ' + ev.text + '\n');
    }
  };
  try {
    const resp = await fetch(root.dataset.src, {credentials: 'same-origin'});
    if (!resp.ok) {
      status.textContent = 'logs: ' + resp.status + ' ' + (await resp.text());
      return;
    }
    status.textContent = 'following';
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.trim()) {
          try { show(JSON.parse(line)); } catch (e) { status.textContent = 'bad line: ' + e; }
        }
      }
    }
    status.textContent = 'end of log';
  } catch (e) {
    status.textContent = 'logs: ' + e;
  }
})();"#;

fn sha256_source(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
    )
}

/// The Content-Security-Policy of every page: nothing but our own inline style and script (by
/// hash), fetches to ourselves, forms to ourselves, no framing.
pub(super) fn csp() -> &'static str {
    static CSP: LazyLock<String> = LazyLock::new(|| {
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            sha256_source(LOG_SCRIPT),
            sha256_source(STYLE)
        )
    });
    &CSP
}

/// `s` escaped for HTML text and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page: `who` is the viewer's name (the navigation and logout are shown with one).
pub(super) fn page(title: &str, who: Option<&str>, body: &str) -> String {
    let nav = match who {
        Some(who) => format!(
            "<nav><a href=\"/ui\">Verifications</a><a href=\"/ui/destinations\">Destinations</a>\
             <span id=\"who\">{}</span> <form method=\"post\" action=\"/ui/logout\">\
             <button id=\"logout\">Log out</button></form></nav>",
            esc(who)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{} — rollouts-dispatch</title><style>{STYLE}</style></head><body>{nav}\
         <h1>{}</h1>{body}</body></html>",
        esc(title),
        esc(title)
    )
}

/// The login form: a bearer token, as the Kubernetes Dashboard asks for one.
pub(super) fn login(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=\"note\" id=\"problem\">{}</p>", esc(p)))
        .unwrap_or_default();
    page(
        "Log in",
        None,
        &format!(
            "{problem}<form method=\"post\" action=\"/ui/login\">\
             <p><label for=\"token\">Bearer token</label><br>\
             <textarea id=\"token\" name=\"token\" rows=\"4\" cols=\"80\" autocomplete=\"off\" \
             required></textarea></p><p><button id=\"login\">Log in</button></p></form>\
             <p>Use your Kubernetes token of the control plane (e.g. <code>kubectl create token \
             NAME</code>) or a rollouts-dispatch tooling token. You see the verifications of the \
             namespaces where you may <code>get analysisruns</code>.</p>"
        ),
    )
}

/// A page that says why not (403, 404, 503).
pub(super) fn problem(title: &str, who: Option<&str>, text: &str) -> String {
    page(
        title,
        who,
        &format!("<p class=\"note\" id=\"problem\">{}</p>", esc(text)),
    )
}

/// Query of the list: only this project and phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListFilter {
    /// only runs of this namespace
    #[serde(default)]
    pub project: Option<String>,
    /// only runs in this phase
    #[serde(default)]
    pub phase: Option<String>,
}

impl ListFilter {
    /// Whether `run` passes.
    pub(super) fn admits(&self, run: &RunSummary) -> bool {
        let is = |want: &Option<String>, have: &str| {
            want.as_deref().is_none_or(|w| w.is_empty() || w == have)
        };
        is(&self.project, &run.namespace) && is(&self.phase, &run.phase)
    }
}

fn when(t: Option<&Time>) -> String {
    t.map(|t| t.0.strftime("%Y-%m-%d %H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn duration(secs: Option<i64>) -> String {
    match secs {
        None => String::new(),
        Some(s) if s < 60 => format!("{s}s"),
        Some(s) if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        Some(s) => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

fn run_href(run: &RunSummary) -> String {
    // Kubernetes names need no URL escaping; the pages refuse others before getting here.
    format!("/ui/runs/{}/{}", esc(&run.namespace), esc(&run.name))
}

/// The list of verifications: one row per run × metric of ours. `runs_watched`: whether the
/// server watches the control plane's runs at all.
pub(super) fn runs(
    who: &str,
    runs_watched: bool,
    filter: &ListFilter,
    rows: &[RunSummary],
    now: Time,
) -> String {
    let mut body = String::new();
    if !runs_watched {
        body.push_str(
            "<p class=\"note\" id=\"no-control-plane\">This server has no control plane \
             (<code>controlPlane</code> in its config), so it lists no runs; only service tokens \
             can log in.</p>",
        );
    }
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/ui\"><label>Project <input name=\"project\" value=\"{}\">\
         </label> <label>Phase <input name=\"phase\" value=\"{}\"></label> \
         <button>Filter</button></form>",
        esc(filter.project.as_deref().unwrap_or_default()),
        esc(filter.phase.as_deref().unwrap_or_default())
    );
    body.push_str(
        "<table id=\"runs\"><tr><th>Project</th><th>Stage</th><th>Run</th><th>Metric</th>\
         <th>Destinations</th><th>Phase</th><th>Duration</th><th>Message</th></tr>",
    );
    for run in rows {
        let metrics: Vec<(&str, &str, String, &str)> = if run.metrics.is_empty() {
            vec![(
                "",
                run.phase.as_str(),
                run.destinations().join(", "),
                run.message.as_str(),
            )]
        } else {
            run.metrics
                .iter()
                .map(|m| {
                    let message = if m.message.is_empty() {
                        &run.message
                    } else {
                        &m.message
                    };
                    (
                        m.name.as_str(),
                        m.phase.as_str(),
                        m.destinations.join(", "),
                        message.as_str(),
                    )
                })
                .collect()
        };
        for (metric, phase, destinations, message) in metrics {
            let _ = write!(
                body,
                "<tr class=\"run\" data-run=\"{ns}/{name}\"><td>{ns}</td><td>{stage}</td>\
                 <td><a class=\"run-link\" href=\"{href}\">{name}</a></td><td>{metric}</td>\
                 <td>{destinations}</td><td class=\"{phase}\">{phase}</td><td>{duration}</td>\
                 <td class=\"msg\">{message}</td></tr>",
                ns = esc(&run.namespace),
                name = esc(&run.name),
                stage = esc(run.stage.as_deref().unwrap_or_default()),
                href = run_href(run),
                metric = esc(metric),
                destinations = esc(&destinations),
                phase = esc(phase),
                duration = duration(run.duration_secs(&now)),
                message = esc(message),
            );
        }
    }
    body.push_str("</table>");
    if rows.is_empty() && runs_watched {
        body.push_str("<p id=\"empty\">No verification you may see.</p>");
    }
    page("Verifications", Some(who), &body)
}

/// The destinations: source, connection, last contact, Jobs running now.
pub(super) fn destinations(who: &str, rows: &[DestinationLoad]) -> String {
    let mut body = String::from(
        "<table id=\"destinations\"><tr><th>Destination</th><th>Source</th><th>Connected</th>\
         <th>Last contact</th><th>Jobs running</th></tr>",
    );
    for d in rows {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&d.info.name),
            esc(&d.info.source),
            if d.info.connected { "yes" } else { "no" },
            esc(d.info.last_contact.as_deref().unwrap_or_default()),
            d.running
                .map(|n| n.to_string())
                .unwrap_or_else(|| "?".into()),
        );
    }
    body.push_str("</table>");
    page("Destinations", Some(who), &body)
}

/// One run: each metric × destination with its phase and message, then the live log.
pub(super) fn run(who: &str, run: &RunSummary, logs_src: &str, now: Time) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<p>Project <b>{}</b>, stage <b>{}</b>, phase <b class=\"{phase}\" id=\"phase\">{phase}</b>, \
         started {}, duration {}</p><p class=\"msg\" id=\"message\">{}</p>",
        esc(&run.namespace),
        esc(run.stage.as_deref().unwrap_or("-")),
        when(run.started.as_ref()),
        duration(run.duration_secs(&now)),
        esc(&run.message),
        phase = esc(&run.phase),
    );
    body.push_str(
        "<table id=\"metrics\"><tr><th>Metric</th><th>Destination</th><th>Phase</th>\
         <th>Message</th></tr>",
    );
    for m in &run.metrics {
        if m.states.is_empty() {
            let _ = write!(
                body,
                "<tr><td>{}</td><td></td><td class=\"{p}\">{p}</td><td class=\"msg\">{}</td></tr>",
                esc(&m.name),
                esc(&m.message),
                p = esc(&m.phase),
            );
        }
        for (destination, state) in &m.states {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"msg\">{}</td></tr>",
                esc(&m.name),
                esc(destination),
                esc(state),
                esc(&m.message),
            );
        }
    }
    let _ = write!(
        body,
        "</table><h2>Logs</h2><p id=\"logs-status\">loading</p>\
         <div id=\"logs\" data-src=\"{}\"></div><script>{LOG_SCRIPT}</script>",
        esc(logs_src)
    );
    page(&format!("{}/{}", run.namespace, run.name), Some(who), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::MetricSummary;

    fn hostile() -> RunSummary {
        RunSummary {
            namespace: "team-a".into(),
            name: "uat.1".into(),
            stage: Some("<b>uat</b>".into()),
            phase: "Failed".into(),
            message: "<script>alert(1)</script> & \"quoted\" 'single'".into(),
            started: None,
            finished: None,
            metrics: vec![MetricSummary {
                name: "smoke\"><img src=x onerror=alert(1)>".into(),
                phase: "Failed".into(),
                message: "<img src=x onerror=alert(2)>".into(),
                destinations: vec!["a<svg>".into()],
                states: vec![("a<svg>".into(), "Failed: <x>".into())],
            }],
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }

    #[test]
    fn a_hostile_run_is_escaped_everywhere() {
        let run = hostile();
        for html in [
            runs(
                "me<i>",
                true,
                &ListFilter::default(),
                std::slice::from_ref(&run),
                now(),
            ),
            super::run(
                "me<i>",
                &run,
                "/v1/runs/team-a/uat.1/logs?follow=true",
                now(),
            ),
        ] {
            assert!(!html.contains("<script>alert"), "{html}");
            assert!(!html.contains("<img"), "{html}");
            assert!(!html.contains("<svg>"), "{html}");
            assert!(!html.contains("<b>uat"), "{html}");
            assert!(!html.contains("me<i>"), "{html}");
            assert!(
                html.contains("&lt;img src=x onerror=alert(2)&gt;"),
                "{html}"
            );
            // The one script is ours, whose hash the policy allows.
            assert_eq!(
                html.matches("<script>").count(),
                usize::from(html.contains("id=\"logs\""))
            );
        }
        let page = super::run("me", &run, "/v1/runs/team-a/uat.1/logs?follow=true", now());
        assert!(
            page.contains(
                "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot; &#39;single&#39;"
            ),
            "{page}"
        );
        let html = login(Some("token \"<x>\" refused"));
        assert!(
            html.contains("token &quot;&lt;x&gt;&quot; refused"),
            "{html}"
        );
    }

    #[test]
    fn the_filter_keeps_one_project_and_phase() {
        let a = hostile();
        let mut b = hostile();
        b.namespace = "team-b".into();
        b.phase = "Successful".into();
        let only_a = ListFilter {
            project: Some("team-a".into()),
            phase: None,
        };
        assert!(only_a.admits(&a) && !only_a.admits(&b));
        let successful = ListFilter {
            project: None,
            phase: Some("Successful".into()),
        };
        assert!(!successful.admits(&a) && successful.admits(&b));
        assert!(ListFilter::default().admits(&a) && ListFilter::default().admits(&b));
        let rows: Vec<_> = [a, b].into_iter().filter(|r| only_a.admits(r)).collect();
        let html = runs("me", true, &only_a, &rows, now());
        assert!(html.contains("data-run=\"team-a/uat.1\""), "{html}");
        assert!(!html.contains("team-b"), "{html}");
        assert!(html.contains("name=\"project\" value=\"team-a\""), "{html}");
    }

    #[test]
    fn the_policy_allows_exactly_our_script_and_style() {
        let policy = csp();
        assert!(policy.contains(&sha256_source(LOG_SCRIPT)), "{policy}");
        assert!(policy.contains(&sha256_source(STYLE)), "{policy}");
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert!(policy.starts_with("default-src 'none'"), "{policy}");
    }

    #[test]
    fn no_control_plane_is_said_on_the_page() {
        let html = runs("svc", false, &ListFilter::default(), &[], now());
        assert!(html.contains("has no control plane"), "{html}");
        assert!(!html.contains("id=\"empty\""), "{html}");
    }
}
