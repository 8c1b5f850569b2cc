//! The `--log-format text` line: byte for byte what tracing-subscriber's default format (`Full`,
//! without colours) writes, for less CPU per line. Every call writes two such lines (its audit
//! event and `finished`), so their cost is part of every call's.
//!
//! What differs is only how the frame is written: the timestamp's date and time of day are
//! formatted once per second per thread (then only the microseconds), and the level, span names,
//! braces and target are written as they are instead of through `nu-ansi-term`'s painting (which
//! formats even when it paints nothing). The fields, the span's and the event's, are still
//! formatted by tracing-subscriber's own field formatter, with its quoting and escaping. Events
//! converted from the `log` crate, a writer with colours and a clock outside years 0–9999 go to
//! tracing-subscriber's format itself. `line_matches_the_default_format` holds the two together.

use std::{
    cell::RefCell,
    fmt,
    time::{SystemTime, UNIX_EPOCH},
};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    fmt::{
        FmtContext, FormatEvent, FormatFields, FormattedFields,
        format::{self, Writer},
        time,
    },
    registry::LookupSpan,
};

/// The text format (see the module's doc).
#[derive(Default)]
pub struct TextFormat {
    fallback: format::Format<format::Full, time::SystemTime>,
}

impl<S, N> FormatEvent<S, N> for TextFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        // A `log` record carries its own target and level in `log.*` fields, which the default
        // format reads instead of the metadata's.
        let from_log = meta.fields().field("log.target").is_some();
        if from_log || writer.has_ansi_escapes() {
            return self.fallback.format_event(ctx, writer, event);
        }
        let Some(micros) = unix_micros() else {
            return self.fallback.format_event(ctx, writer, event);
        };
        if !write_timestamp(&mut writer, micros)? {
            return self.fallback.format_event(ctx, writer, event);
        }
        writer.write_str(level_str(meta.level()))?;
        writer.write_char(' ')?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                writer.write_str(span.metadata().name())?;
                seen = true;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The level as the default format writes it: five characters, right-aligned.
fn level_str(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        _ => "ERROR",
    }
}

/// Microseconds since the Unix epoch, `None` before it.
fn unix_micros() -> Option<u64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_micros()).ok()
}

thread_local! {
    /// The second last formatted on this thread and its `YYYY-MM-DDTHH:MM:SS.` (20 bytes).
    static SECOND: RefCell<(u64, [u8; 20])> = const { RefCell::new((u64::MAX, [0; 20])) };
}

/// Writes `YYYY-MM-DDTHH:MM:SS.ffffffZ ` (RFC 3339, microseconds, UTC, then a space), as
/// tracing-subscriber's `SystemTime` timer does. False, with nothing written, outside years
/// 0–9999 (the default format writes those differently).
fn write_timestamp(writer: &mut Writer<'_>, micros: u64) -> Result<bool, fmt::Error> {
    let (secs, sub) = (micros / 1_000_000, micros % 1_000_000);
    let prefix = SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, date_time(secs)?);
        }
        Some(cached.1)
    });
    let Some(prefix) = prefix else {
        return Ok(false);
    };
    let mut line = [0u8; 28];
    line[..20].copy_from_slice(&prefix);
    let mut rest = sub;
    for i in (20..26).rev() {
        line[i] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    line[26] = b'Z';
    line[27] = b' ';
    // ASCII digits and separators only.
    writer.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?)?;
    Ok(true)
}

/// `YYYY-MM-DDTHH:MM:SS.` of `secs` after the Unix epoch (UTC, proleptic Gregorian), `None`
/// after year 9999.
fn date_time(secs: u64) -> Option<[u8; 20]> {
    let days = i64::try_from(secs / 86_400).ok()?;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    if !(0..=9999).contains(&year) {
        return None;
    }
    let mut out = [0u8; 20];
    let mut put = |at: usize, value: u64, width: usize| {
        let mut value = value;
        for i in (at..at + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, year as u64, 4);
    put(5, u64::from(month), 2);
    put(8, u64::from(day), 2);
    put(11, of_day / 3600, 2);
    put(14, of_day / 60 % 60, 2);
    put(17, of_day % 60, 2);
    for (at, separator) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ] {
        out[at] = separator;
    }
    Some(out)
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt};

    use super::*;

    #[test]
    fn dates_of_known_days() {
        let at = |secs| String::from_utf8(date_time(secs).unwrap().to_vec()).unwrap();
        assert_eq!(at(0), "1970-01-01T00:00:00.");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.");
        assert_eq!(at(1_795_000_000), "2026-11-18T11:06:40.");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.");
        assert_eq!(at(253_402_300_799), "9999-12-31T23:59:59.");
        assert_eq!(date_time(253_402_300_800), None, "year 10000");
    }

    /// Collects what a layer writes.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// What the gate logs (an RPC span filled in as the gate does, its events, events outside
    /// it, values to quote and escape), through tracing-subscriber's format and through this one:
    /// the same lines, timestamps aside (both well-formed, and within a second of each other).
    #[test]
    fn line_matches_the_default_format() {
        let (default, fast) = (Lines::default(), Lines::default());
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(default.clone())
                    .with_ansi(false),
            )
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(fast.clone())
                    .with_ansi(false)
                    .event_format(TextFormat::default()),
            );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(addr = %"127.0.0.1:1", workers = 2, "oncegate serving");
            tracing::warn!("the store may lose acknowledged completions on restart");
            let span = tracing::info_span!(target: "oncegate::audit", "rpc",
                rpc = %"oncegate.v1.ActionGateService/RequestToken",
                principal = tracing::field::Empty, key = tracing::field::Empty,
                decision = tracing::field::Empty, grpc.code = tracing::field::Empty);
            span.record("principal", tracing::field::display("anonymous"));
            span.record("key", tracing::field::display("k \"1\"\u{1b}[31m"));
            let _in = span.enter();
            span.record("decision", tracing::field::display("key_reused"));
            tracing::info!(target: "oncegate::audit", decision = "key_reused",
                differing = %"/amount", fencing = 3u64, "request_token");
            let inner = tracing::info_span!("inner", n = 1);
            inner
                .in_scope(|| tracing::error!(error = %"boom\u{1b}", r#type = "x", "failed: {}", 7));
            span.record("grpc.code", "FAILED_PRECONDITION");
            tracing::info!(target: "oncegate::rpc", elapsed_ms = 2.33, "finished");
            tracing::debug!("no filter here: debug is logged too");
        });
        let (default, fast) = (default.text(), fast.text());
        let (default, fast): (Vec<_>, Vec<_>) = (default.lines().collect(), fast.lines().collect());
        assert_eq!(default.len(), 6, "{default:#?}");
        assert_eq!(default.len(), fast.len());
        for (d, f) in default.iter().zip(&fast) {
            assert_eq!(d[28..], f[28..], "after the timestamp");
            for line in [d, f] {
                let stamp = &line.as_bytes()[..28];
                assert_eq!(stamp[27], b' ', "{line:?}");
                assert_eq!(stamp[26], b'Z', "{line:?}");
                assert_eq!(stamp[19], b'.', "{line:?}");
                assert_eq!(stamp[10], b'T', "{line:?}");
            }
        }
        let audit = fast.iter().find(|l| l.contains("request_token")).unwrap();
        assert!(
            audit.contains(
                " INFO rpc{rpc=oncegate.v1.ActionGateService/RequestToken principal=anonymous "
            ) && audit.ends_with(
                "decision=key_reused}: oncegate::audit: request_token decision=\"key_reused\" \
                 differing=/amount fencing=3"
            ),
            "{audit}"
        );
    }
}
