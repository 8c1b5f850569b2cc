//! The configuration file's `[notifications]` table and `[[webhooks]]` entries (docs/CONTRACT.md
//! §7), validated into the notify crate's [`Settings`]: every error names the setting, never a
//! secret. A secret comes from the file (`secrets`) or from an environment variable named in it
//! (`secret_env`, several secrets separated by spaces), read when the gate starts
//! ([`oncegate_notify::Settings::read_secret_env`], from `Config::from_flags`), not when the file
//! is parsed.

use std::{collections::HashSet, time::Duration};

use serde::Deserialize;

use super::{error::FileError, policy::seconds};
use oncegate_domain::event::EventType;
use oncegate_notify::{Format, Secret, Settings, Webhook, defaults};

/// `[notifications]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NotificationsTable {
    source: Option<String>,
    poll_interval_seconds: Option<f64>,
    scan_interval_seconds: Option<f64>,
    budget_window_seconds: Option<f64>,
    retention_seconds: Option<f64>,
}

/// One `[[webhooks]]` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookTable {
    name: String,
    url: String,
    /// `"*"`, or a list of event types.
    events: toml::Value,
    #[serde(default)]
    secrets: Vec<String>,
    secret_env: Option<String>,
    format: Option<String>,
    timeout_seconds: Option<f64>,
    max_attempts: Option<u32>,
    max_age_seconds: Option<f64>,
    retry_initial_seconds: Option<f64>,
    retry_max_seconds: Option<f64>,
}

/// The longest a webhook attempt may be given.
const MAX_TIMEOUT_MS: i64 = 300_000;

/// Validates both.
pub(super) fn settings(
    table: &NotificationsTable,
    webhooks: &[WebhookTable],
) -> Result<Settings, FileError> {
    let ms = |what: &str, value: Option<f64>, default: i64| match value {
        Some(s) => seconds(what, s),
        None => Ok(default),
    };
    let source = table
        .source
        .clone()
        .unwrap_or_else(|| defaults::SOURCE.into());
    if source.is_empty() {
        return Err(FileError::new("notifications.source must not be empty"));
    }
    let mut parsed: Vec<Webhook> = Vec::with_capacity(webhooks.len());
    for w in webhooks {
        let webhook = webhook(w)?;
        if parsed.iter().any(|p| p.name == webhook.name) {
            return Err(FileError::new(format!(
                "webhooks: the name {:?} is used twice",
                webhook.name
            )));
        }
        parsed.push(webhook);
    }
    let poll = ms(
        "notifications.poll_interval_seconds",
        table.poll_interval_seconds,
        defaults::POLL_INTERVAL_MS as i64,
    )?;
    let scan = ms(
        "notifications.scan_interval_seconds",
        table.scan_interval_seconds,
        defaults::SCAN_INTERVAL_MS as i64,
    )?;
    Ok(Settings {
        webhooks: parsed,
        source,
        poll_interval: Duration::from_millis(poll as u64),
        scan_interval: Duration::from_millis(scan as u64),
        budget_window: ms(
            "notifications.budget_window_seconds",
            table.budget_window_seconds,
            defaults::BUDGET_WINDOW,
        )?,
        retention: ms(
            "notifications.retention_seconds",
            table.retention_seconds,
            defaults::RETENTION,
        )?,
    })
}

fn webhook(w: &WebhookTable) -> Result<Webhook, FileError> {
    let valid_name = !w.name.is_empty()
        && w.name.len() <= 64
        && w.name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c));
    if !valid_name {
        return Err(FileError::new(format!(
            "webhooks: name {:?} must be 1 to 64 of A-Z a-z 0-9 _ . -",
            w.name
        )));
    }
    let at = |field: &str| format!("webhooks.{}.{field}", w.name);
    let host = w
        .url
        .strip_prefix("https://")
        .or_else(|| w.url.strip_prefix("http://"));
    if host.is_none_or(|rest| rest.is_empty() || rest.starts_with('/')) {
        return Err(FileError::new(format!(
            "{} must be an http:// or https:// URL with a host",
            at("url")
        )));
    }
    let events = events(&at("events"), &w.events)?;
    let format = match w.format.as_deref() {
        None | Some("cloudevents") => Format::CloudEvents,
        Some("slack") => Format::Slack,
        Some(other) => {
            return Err(FileError::new(format!(
                "{} must be \"cloudevents\" or \"slack\", got {other:?}",
                at("format")
            )));
        }
    };
    let mut secrets = Vec::new();
    for (i, text) in w.secrets.iter().enumerate() {
        secrets.push(
            Secret::parse(text)
                .map_err(|why| FileError::new(format!("{}[{i}]: {why}", at("secrets"))))?,
        );
    }
    if secrets.is_empty() && w.secret_env.is_none() && format == Format::CloudEvents {
        return Err(FileError::new(format!(
            "{}: a cloudevents webhook is signed (Standard Webhooks): give `secrets` or \
             `secret_env` (whsec_<base64>)",
            at("secrets")
        )));
    }
    let ms = |field: &str, value: Option<f64>, default: i64| match value {
        Some(s) => seconds(&at(field), s),
        None => Ok(default),
    };
    let timeout = ms(
        "timeout_seconds",
        w.timeout_seconds,
        defaults::TIMEOUT_MS as i64,
    )?;
    if timeout > MAX_TIMEOUT_MS {
        return Err(FileError::new(format!(
            "{} must be at most {} seconds",
            at("timeout_seconds"),
            MAX_TIMEOUT_MS / 1000
        )));
    }
    let max_attempts = w.max_attempts.unwrap_or(defaults::MAX_ATTEMPTS);
    if max_attempts == 0 {
        return Err(FileError::new(format!(
            "{} must be at least 1",
            at("max_attempts")
        )));
    }
    let retry_initial = ms(
        "retry_initial_seconds",
        w.retry_initial_seconds,
        defaults::RETRY_INITIAL,
    )?;
    let retry_max = ms(
        "retry_max_seconds",
        w.retry_max_seconds,
        defaults::RETRY_MAX,
    )?;
    if retry_initial > retry_max {
        return Err(FileError::new(format!(
            "{} is above {}",
            at("retry_initial_seconds"),
            at("retry_max_seconds")
        )));
    }
    Ok(Webhook {
        name: w.name.clone(),
        url: w.url.clone(),
        events,
        secrets,
        secret_env: w.secret_env.clone(),
        format,
        timeout: Duration::from_millis(timeout as u64),
        max_attempts,
        max_age: ms("max_age_seconds", w.max_age_seconds, defaults::MAX_AGE)?,
        retry_initial,
        retry_max,
    })
}

/// `"*"` (every type) or a non-empty list of types (short or full CloudEvents names).
fn events(at: &str, value: &toml::Value) -> Result<Vec<EventType>, FileError> {
    let names: Vec<&str> = match value {
        toml::Value::String(s) if s == "*" => return Ok(EventType::ALL.to_vec()),
        toml::Value::Array(items) => items.iter().filter_map(toml::Value::as_str).collect(),
        _ => Vec::new(),
    };
    let listed = match value {
        toml::Value::Array(items) => items.len(),
        _ => 0,
    };
    if names.is_empty() || names.len() != listed {
        return Err(FileError::new(format!(
            "{at} must be \"*\" or a non-empty list of event types ({})",
            known()
        )));
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for name in names {
        let kind = EventType::parse(name).ok_or_else(|| {
            FileError::new(format!("{at}: unknown event type {name:?} ({})", known()))
        })?;
        if seen.insert(kind) {
            out.push(kind);
        }
    }
    Ok(out)
}

fn known() -> String {
    EventType::ALL
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn parse(text: &str) -> Result<Settings, FileError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            notifications: NotificationsTable,
            #[serde(default)]
            webhooks: Vec<WebhookTable>,
        }
        let file: File = toml::from_str(text)?;
        let mut settings = settings(&file.notifications, &file.webhooks)?;
        let env = |name: &str| match name {
            "HOOK_SECRETS" => Some(format!("{SECRET} {SECRET}")),
            "SHORT" => Some("whsec_c2hvcnQ=".into()),
            "BLANK" => Some(" ".into()),
            _ => None,
        };
        settings.read_secret_env(&env).map_err(FileError::new)?;
        Ok(settings)
    }

    #[test]
    fn a_webhook_with_its_defaults() {
        let s = parse(&format!(
            "[[webhooks]]\nname = \"ops\"\nurl = \"https://hooks.example.com/x\"\nevents = \"*\"\nsecrets = [\"{SECRET}\"]\n"
        ))
        .unwrap();
        let w = &s.webhooks[0];
        assert_eq!(w.events, EventType::ALL.to_vec());
        assert_eq!(w.format, Format::CloudEvents);
        assert_eq!(w.timeout, Duration::from_secs(10));
        assert_eq!((w.max_attempts, w.secrets.len()), (15, 1));
        assert_eq!(s.retention, 7 * 86_400_000);
        assert_eq!(s.source, "oncegate");
    }

    #[test]
    fn secrets_come_from_the_environment_too() {
        let s = parse(
            "[[webhooks]]\nname = \"ops\"\nurl = \"http://127.0.0.1:9/\"\nevents = [\"approval.requested\", \"dev.oncegate.approval.decided\"]\nsecret_env = \"HOOK_SECRETS\"\n",
        )
        .unwrap();
        assert_eq!(s.webhooks[0].secrets.len(), 2);
        assert_eq!(
            s.webhooks[0].events,
            [EventType::ApprovalRequested, EventType::ApprovalDecided]
        );
    }

    #[test]
    fn bad_webhooks_name_the_setting() {
        let base = "name = \"ops\"\nurl = \"https://h.example/\"";
        for (text, needle) in [
            (
                format!("{base}\nevents = \"*\""),
                "webhooks.ops.secrets: a cloudevents webhook is signed",
            ),
            (
                format!("{base}\nevents = []\nformat = \"slack\""),
                "webhooks.ops.events must be",
            ),
            (
                format!("{base}\nevents = [\"approval\"]\nformat = \"slack\""),
                "unknown event type \"approval\"",
            ),
            (
                format!("{base}\nevents = \"*\"\nformat = \"teams\""),
                "webhooks.ops.format",
            ),
            (
                format!("{base}\nevents = \"*\"\nsecrets = [\"whsec_c2hvcnQ=\"]"),
                "webhooks.ops.secrets[0]: a secret's key is 5 bytes",
            ),
            (
                format!("{base}\nevents = \"*\"\nsecret_env = \"NOPE\""),
                "the environment variable NOPE is not set",
            ),
            (
                format!("{base}\nevents = \"*\"\nformat = \"slack\"\ntimeout_seconds = 900"),
                "timeout_seconds must be at most 300",
            ),
            (
                format!("{base}\nevents = \"*\"\nformat = \"slack\"\nmax_attempts = 0"),
                "max_attempts must be at least 1",
            ),
            (
                format!(
                    "{base}\nevents = \"*\"\nformat = \"slack\"\nretry_initial_seconds = 10\nretry_max_seconds = 1"
                ),
                "is above",
            ),
            (
                "name = \"o k\"\nurl = \"https://h/\"\nevents = \"*\"\nformat = \"slack\"".into(),
                "must be 1 to 64",
            ),
            (
                "name = \"ok\"\nurl = \"ftp://h/\"\nevents = \"*\"\nformat = \"slack\"".into(),
                "webhooks.ok.url",
            ),
            (
                format!("{base}\nevents = \"*\"\nformat = \"slack\"\nurl2 = 1"),
                "unknown field",
            ),
        ] {
            let err = parse(&format!("[[webhooks]]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains("MfKQ"), "{err}");
        }
        let twice = format!("[[webhooks]]\n{base}\nevents = \"*\"\nformat = \"slack\"\n").repeat(2);
        assert!(
            parse(&twice)
                .unwrap_err()
                .to_string()
                .contains("used twice")
        );
    }
}
