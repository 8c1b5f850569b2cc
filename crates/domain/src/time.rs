//! Times as people and programs read them: RFC 3339 in UTC, to the millisecond, from the store's
//! Unix milliseconds (events, refusals that say when something frees up).

use time::{OffsetDateTime, format_description::FormatItem, macros::format_description};

use crate::ledger::Millis;

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
const RFC3339_MILLIS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds (`2026-12-03T14:05:00.000Z`); a
/// time beyond what a calendar date holds is written as its Unix milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(RFC3339_MILLIS).ok())
        .unwrap_or_else(|| format!("{ms} (Unix milliseconds)"))
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn utc_with_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_614_265_330_000), "2021-02-25T15:02:10.000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }
}
