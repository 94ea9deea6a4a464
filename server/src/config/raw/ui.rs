//! The `ui:` section: where people reach the pages (`externalURL`) and how they are recognised
//! (`people`: their Kubernetes tokens, or the headers of a trusted authenticating proxy).

use std::time::Duration;

use dispatch_api::parse_go_duration;
use serde::Deserialize;

use super::{invalid, InvalidField};
use crate::config::{AddressRange, PeopleConfig, ProxyConfig, SessionSettings, UiConfig};

/// oauth2-proxy's header for the user with `--pass-user-headers`.
const USER_HEADER: &str = "X-Forwarded-User";
/// oauth2-proxy's header for the groups (comma-separated) with `--pass-user-headers`.
const GROUPS_HEADER: &str = "X-Forwarded-Groups";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawUi {
    #[serde(rename = "externalURL")]
    external_url: Option<String>,
    people: Option<RawPeople>,
    #[serde(rename = "sessionLifetime")]
    session_lifetime: Option<String>,
    #[serde(rename = "maxSessions")]
    max_sessions: Option<usize>,
}

/// The longest `ui.sessionLifetime`: a login is a person's Kubernetes token held by the server.
const MAX_SESSION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// The largest `ui.maxSessions` (each holds a token of a few KiB in memory).
const MAX_MAX_SESSIONS: usize = 1_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPeople {
    token_review: Option<bool>,
    proxy: Option<RawProxy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProxy {
    #[serde(default)]
    trusted_addresses: Vec<String>,
    user_header: Option<String>,
    groups_header: Option<String>,
}

/// What is wrong with a key of `ui:`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UiProblem {
    #[error(
        "{0:?} is not an absolute http(s) URL without query or fragment (e.g. \
         https://dispatch.example.com); it is where people open the pages, and each measurement \
         message ends with <externalURL>/ui/runs/<namespace>/<name>"
    )]
    ExternalUrl(String),
    #[error(
        "`true` needs `controlPlane`: people's tokens are reviewed by the control plane's \
         apiserver; add `controlPlane` (`controlPlane: {{}}` in-cluster), or remove it"
    )]
    TokenReviewWithoutControlPlane,
    #[error(
        "needs `controlPlane`: what a person named by the proxy may see is decided by \
         SubjectAccessReviews there; add `controlPlane` (`controlPlane: {{}}` in-cluster), or \
         remove the proxy"
    )]
    ProxyWithoutControlPlane,
    #[error(
        "is empty: list the proxy's addresses (IPs or CIDRs, e.g. 10.0.0.0/8); headers from any \
         other peer are ignored, so without one the proxy is never trusted"
    )]
    NoTrustedAddresses,
    #[error("{0:?} is neither an IP address nor a CIDR block (e.g. 10.0.0.5 or 10.0.0.0/8)")]
    NotAnAddress(String),
    #[error("{0:?} is not an HTTP header name (e.g. {1})")]
    NotAHeader(String, &'static str),
    #[error(
        "{0:?} is not a duration between 1m and 168h (e.g. 8h): how long a login to the pages \
         lasts"
    )]
    SessionLifetime(String),
    #[error("{0} is not between 1 and {MAX_MAX_SESSIONS}: the most logins held at once")]
    MaxSessions(usize),
}

/// The typed `ui:` section; `control_plane`: whether the file has `controlPlane`.
pub(in crate::config) fn validate_ui(
    raw: Option<RawUi>,
    control_plane: bool,
) -> Result<UiConfig, InvalidField> {
    let Some(raw) = raw else {
        return Ok(UiConfig {
            external_url: None,
            people: PeopleConfig {
                token_review: control_plane,
                proxy: None,
            },
            sessions: SessionSettings::default(),
        });
    };
    let external_url = raw
        .external_url
        .map(|u| check_external_url(&u).map_err(|e| invalid("ui.externalURL", e)))
        .transpose()?;
    let people = raw.people.unwrap_or(RawPeople {
        token_review: None,
        proxy: None,
    });
    let token_review = match (people.token_review, control_plane) {
        (Some(true), false) => {
            return Err(invalid(
                "ui.people.tokenReview",
                UiProblem::TokenReviewWithoutControlPlane,
            ))
        }
        (Some(v), _) => v,
        (None, cp) => cp,
    };
    if people.proxy.is_some() && !control_plane {
        return Err(invalid(
            "ui.people.proxy",
            UiProblem::ProxyWithoutControlPlane,
        ));
    }
    let proxy = people.proxy.map(validate_proxy).transpose()?;
    let mut sessions = SessionSettings::default();
    if let Some(text) = raw.session_lifetime {
        sessions.lifetime = parse_go_duration(&text)
            .ok()
            .filter(|d| (Duration::from_secs(60)..=MAX_SESSION_LIFETIME).contains(d))
            .ok_or_else(|| invalid("ui.sessionLifetime", UiProblem::SessionLifetime(text)))?;
    }
    if let Some(max) = raw.max_sessions {
        if !(1..=MAX_MAX_SESSIONS).contains(&max) {
            return Err(invalid("ui.maxSessions", UiProblem::MaxSessions(max)));
        }
        sessions.max = max;
    }
    Ok(UiConfig {
        external_url,
        people: PeopleConfig {
            token_review,
            proxy,
        },
        sessions,
    })
}

/// `url` without a trailing `/`, when it is an absolute http(s) URL with a host and no query.
fn check_external_url(url: &str) -> Result<String, UiProblem> {
    let bad = || UiProblem::ExternalUrl(url.to_string());
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) || uri.query().is_some() {
        return Err(bad());
    }
    if url.contains('#') || url.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn validate_proxy(p: RawProxy) -> Result<ProxyConfig, InvalidField> {
    let at = "ui.people.proxy";
    if p.trusted_addresses.is_empty() {
        return Err(invalid(
            format!("{at}.trustedAddresses"),
            UiProblem::NoTrustedAddresses,
        ));
    }
    let trusted_addresses = p
        .trusted_addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            AddressRange::parse(a.trim()).ok_or_else(|| {
                invalid(
                    format!("{at}.trustedAddresses[{i}]"),
                    UiProblem::NotAnAddress(a.clone()),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let header = |key: &str, value: Option<String>, default: &'static str| {
        let value = value.unwrap_or_else(|| default.to_string());
        http::HeaderName::from_bytes(value.as_bytes())
            .map(|h| h.as_str().to_string())
            .map_err(|_| invalid(format!("{at}.{key}"), UiProblem::NotAHeader(value, default)))
    };
    Ok(ProxyConfig {
        trusted_addresses,
        user_header: header("userHeader", p.user_header, USER_HEADER)?,
        groups_header: header("groupsHeader", p.groups_header, GROUPS_HEADER)?,
    })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use crate::config::ServerConfig;

    fn parse(text: &str) -> Result<ServerConfig, String> {
        ServerConfig::parse(text, "config file t.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn token_review_follows_the_control_plane_unless_set() {
        assert!(!parse("").unwrap().ui.people.token_review);
        assert!(parse("controlPlane: {}").unwrap().ui.people.token_review);
        let off = parse("controlPlane: {}\nui: {people: {tokenReview: false}}").unwrap();
        assert!(!off.ui.people.token_review);
        let e = parse("ui: {people: {tokenReview: true}}").unwrap_err();
        assert!(
            e.contains("ui.people.tokenReview: `true` needs `controlPlane`"),
            "{e}"
        );
        let e = parse("ui: {people: {proxy: {trustedAddresses: ['::1']}}}").unwrap_err();
        assert!(e.contains("ui.people.proxy: needs `controlPlane`"), "{e}");
    }

    #[test]
    fn sessions_last_a_bounded_time_and_are_bounded_in_number() {
        let d = parse("").unwrap().ui.sessions;
        assert_eq!((d.lifetime.as_secs(), d.max), (8 * 3600, 10_000));
        let c = parse("ui: {sessionLifetime: 30m, maxSessions: 50}").unwrap();
        assert_eq!(
            (c.ui.sessions.lifetime.as_secs(), c.ui.sessions.max),
            (1800, 50)
        );
        for (text, key) in [
            ("ui: {sessionLifetime: 10s}", "ui.sessionLifetime"),
            ("ui: {sessionLifetime: 720h}", "ui.sessionLifetime"),
            ("ui: {sessionLifetime: soon}", "ui.sessionLifetime"),
            ("ui: {maxSessions: 0}", "ui.maxSessions"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn the_external_url_is_absolute_http_without_query() {
        let c = parse("ui: {externalURL: 'https://d.example.com/dispatch/'}").unwrap();
        assert_eq!(
            c.ui.external_url.as_deref(),
            Some("https://d.example.com/dispatch")
        );
        for bad in [
            "d.example.com",
            "ftp://d.example.com",
            "https://d.example.com/?x=1",
            "https://d.example.com/#x",
            "/ui",
        ] {
            let e = parse(&format!("ui: {{externalURL: '{bad}'}}")).unwrap_err();
            assert!(
                e.contains("ui.externalURL:") && e.contains("https://dispatch.example.com"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_proxy_is_trusted_only_from_its_addresses() {
        let c = parse(
            "controlPlane: {}\nui: {people: {proxy: {trustedAddresses: ['10.1.0.0/16', '::1']}}}",
        )
        .unwrap();
        let p = c.ui.people.proxy.unwrap();
        assert_eq!(p.user_header, "x-forwarded-user");
        assert_eq!(p.groups_header, "x-forwarded-groups");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let trusted = |s: &str| p.trusted_addresses.iter().any(|r| r.contains(ip(s)));
        assert!(trusted("10.1.200.3"));
        assert!(
            trusted("::ffff:10.1.0.1"),
            "an IPv4-mapped peer is its IPv4 address"
        );
        assert!(trusted("::1"));
        assert!(!trusted("10.2.0.1"));
        assert!(!trusted("127.0.0.1"));
        for (text, needle) in [
            (
                "ui: {people: {proxy: {}}}",
                "ui.people.proxy.trustedAddresses: is empty",
            ),
            (
                "ui: {people: {proxy: {trustedAddresses: ['10.0.0.0/33']}}}",
                "ui.people.proxy.trustedAddresses[0]: \"10.0.0.0/33\" is neither",
            ),
            (
                "ui: {people: {proxy: {trustedAddresses: [x]}}}",
                "ui.people.proxy.trustedAddresses[0]",
            ),
            (
                "ui: {people: {proxy: {trustedAddresses: ['::1'], userHeader: 'a b'}}}",
                "ui.people.proxy.userHeader: \"a b\" is not an HTTP header name",
            ),
            ("ui: {externalUrl: x}", "unknown field `externalUrl`"),
        ] {
            let e = parse(&format!("controlPlane: {{}}\n{text}")).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
