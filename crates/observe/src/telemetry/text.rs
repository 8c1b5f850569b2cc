//! The `--log-format text` line: byte for byte what tracing-subscriber's default format (`Full`,
//! without colours) writes, for less CPU per line. Every call writes two such lines (its audit
//! event and `finished`), so their cost is part of every call's.
//!
//! What differs is only how the frame is written: the timestamp's date and time of day are
//! formatted once per second per thread (then only the microseconds), and the level, span names,
//! braces and target are written as they are instead of through `nu-ansi-term`'s painting (which
//! formats even when it paints nothing). The fields, the span's and the event's, are written by
//! [`TextFields`]: tracing-subscriber's `DefaultFields` (its quoting, its skipping of `log.*`
//! fields, its escaping of terminal controls in messages and errors) without painting each
//! field's name and `=`. Events converted from the `log` crate, a writer with colours and a clock
//! outside years 0–9999 go to tracing-subscriber's format itself.
//! `line_matches_the_default_format` holds the two together.

use std::{
    cell::RefCell,
    fmt::{self, Write as _},
    time::{SystemTime, UNIX_EPOCH},
};

use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{
    field::RecordFields,
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

/// The text format's fields: what `DefaultFields` writes without colours, for less CPU per field
/// (see the module's doc). A writer with colours gets `DefaultFields` itself.
#[derive(Debug, Default)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return format::DefaultFields::new().format_fields(writer, fields);
        }
        let mut visitor = FieldsVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// `DefaultVisitor`'s output, written as it is: the fields in their order, separated by spaces,
/// each `name=value` but the message, which is written as it is (its controls escaped).
struct FieldsVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl Visit for FieldsVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"))
        } else {
            self.record_debug(field, &value)
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let sanitize = self.writer.sanitizes_ansi_escapes();
        let error = Escaped(format_args!("{value}"), sanitize);
        match value.source() {
            Some(source) => self.record_debug(
                field,
                &format_args!(
                    "{error} {}.sources={}",
                    field.name(),
                    Sources(source, sanitize)
                ),
            ),
            None => self.record_debug(field, &format_args!("{error}")),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let writer = &mut self.writer;
        let pad = if std::mem::take(&mut self.is_empty) {
            Ok(())
        } else {
            writer.write_char(' ')
        };
        self.result = pad.and_then(|()| match name {
            "message" => write!(
                writer,
                "{:?}",
                Escaped(value, writer.sanitizes_ansi_escapes())
            ),
            name => {
                writer.write_str(name.strip_prefix("r#").unwrap_or(name))?;
                writer.write_char('=')?;
                write!(writer, "{value:?}")
            }
        });
    }
}

/// A value written with the terminal controls tracing-subscriber escapes (ESC, BEL, BS, FF, DEL
/// and the C1 controls) escaped as it escapes them, when `.1`.
struct Escaped<T>(T, bool);

/// Writes to the formatter with those controls escaped.
struct Escaping<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for ch in s.chars() {
            match ch {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", ch as u32)?,
                _ => self.0.write_char(ch)?,
            }
        }
        Ok(())
    }
}

impl<T: fmt::Debug> fmt::Debug for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 {
            write!(Escaping(f), "{:?}", self.0)
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 {
            write!(Escaping(f), "{}", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// An error's sources, nearest first, as `DefaultFields` lists them: `[a, b]`, each escaped.
struct Sources<'a>(&'a (dyn std::error::Error + 'static), bool);

impl fmt::Display for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        let mut next = Some(self.0);
        while let Some(error) = next {
            list.entry(&Escaped(format_args!("{error}"), self.1));
            next = error.source();
        }
        list.finish()
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

    /// An error with a source.
    #[derive(Debug)]
    struct Chained(io::Error);

    impl std::fmt::Display for Chained {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }

    impl std::error::Error for Chained {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
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
                    .event_format(TextFormat::default())
                    .fmt_fields(TextFields),
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
            // Every kind of field value, controls to escape, an error with and without sources,
            // a `log.*` field (skipped) and a raw identifier.
            let bare = io::Error::other("disk \u{7}gone\u{9b}");
            let chained = Chained(io::Error::other("inner \u{1b}[2J"));
            tracing::warn!(
                error = &bare as &dyn std::error::Error,
                cause = &chained as &dyn std::error::Error,
                flag = true,
                n = -3i64,
                big = 7u128,
                ratio = 0.5f64,
                text = "tab\t\u{7f}\u{8}\u{c}",
                log.line = 12,
                r#loop = "x",
                "r#raw" = 1,
                "a \u{1b}[31mred\u{7} {}\u{85}",
                "message"
            );
            tracing::info!(message = "only a message field");
            tracing::info!(empty = "");
        });
        let (default, fast) = (default.text(), fast.text());
        let (default, fast): (Vec<_>, Vec<_>) = (default.lines().collect(), fast.lines().collect());
        assert_eq!(default.len(), 9, "{default:#?}");
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
        let escaped = fast
            .iter()
            .find(|l| l.contains("WARN") && l.contains("cause"))
            .unwrap();
        assert!(
            escaped
                .contains(r"a \x1b[31mred\x07 message\u{85} error=disk \x07gone\u{9b} cause=outer")
                && escaped.contains(r"cause.sources=[inner \x1b[2J]")
                && !escaped.contains("log.line")
                && escaped.contains(" loop=\"x\" raw=1"),
            "{escaped}"
        );
    }
}
