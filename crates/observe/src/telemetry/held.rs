//! Log lines held on a runtime's thread while it works, and written together when it goes idle.
//!
//! Written one by one, every line is a `write` system call to standard error, two or more per call
//! the gate serves, and the threads serving calls contend for standard error's lock (a `futex`
//! wait and wake each time one waits). The thread of a current-thread runtime that holds its lines
//! (from [`hold_lines`], its `on_thread_unpark`, to [`release_lines`], its `on_thread_park`)
//! gathers them and writes the lot in one call when it runs out of work. A call's task never
//! leaves that thread, so a call's lines stay in their order. Past [`HOLD_AT_MOST`] bytes, and
//! for a warning or an error, the held lines are written at once, in their order. A thread that
//! does not hold (the blocking pool, any thread outside a runtime) writes each line as it comes.
//!
//! What holding costs: a line reaches standard error when its thread next goes idle instead of at
//! once (under load, at most 16 KiB of lines later), and a `kill -9` loses the lines held at that
//! moment: the informational lines of one busy stretch of one thread, never a warning, an error or
//! a store transition. A panic's message (the panic hook's, not a log line) can reach standard
//! error before the lines its thread held.

use std::{
    cell::RefCell,
    io::{self, Write},
};

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Held lines past this many bytes are written at once, idle or not.
pub const HOLD_AT_MOST: usize = 16 * 1024;

/// One thread's held lines.
struct Held {
    /// Whether the thread holds its lines now.
    holding: bool,
    /// The lines not yet written, in their order.
    lines: Vec<u8>,
}

thread_local! {
    static HELD: RefCell<Held> = const { RefCell::new(Held { holding: false, lines: Vec::new() }) };
}

/// From now on, this thread's lines are held until [`release_lines`]: a runtime's
/// `on_thread_unpark`.
pub fn hold_lines() {
    let _ = HELD.try_with(|held| {
        if let Ok(mut held) = held.try_borrow_mut() {
            held.holding = true;
        }
    });
}

/// Writes this thread's held lines and stops holding: a runtime's `on_thread_park`, and the end
/// of the thread's `block_on`.
pub fn release_lines() {
    let _ = HELD.try_with(|held| {
        if let Ok(mut held) = held.try_borrow_mut() {
            held.holding = false;
            write_out(&mut held.lines);
        }
    });
}

/// Sets a current-thread runtime's park hooks so that the thread running it holds its lines while
/// it works ([`hold_lines`], [`release_lines`]); call [`release_lines`] after its `block_on`
/// returns. Not for a multi-thread runtime: a call's task can move between its threads, and the
/// call's lines would then reach the log out of their order.
pub fn hold_lines_on_current_thread(
    builder: &mut tokio::runtime::Builder,
) -> &mut tokio::runtime::Builder {
    builder
        .on_thread_unpark(hold_lines)
        .on_thread_park(release_lines)
}

/// Writes `lines` to standard error in one call (the lock taken once) and empties them. A failed
/// write drops them: logging never fails a call.
fn write_out(lines: &mut Vec<u8>) {
    if lines.is_empty() {
        return;
    }
    let _ = io::stderr().lock().write_all(lines);
    lines.clear();
    if lines.capacity() > 4 * HOLD_AT_MOST {
        lines.shrink_to(HOLD_AT_MOST);
    }
}

/// Standard error, through the thread's held lines: the log layer's writer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeldStderr;

/// One line's writer: held with the thread's lines, or written with them at once.
pub(crate) struct LineWriter {
    /// A warning or an error: written at once, after the lines held before it.
    at_once: bool,
}

impl<'a> MakeWriter<'a> for HeldStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter { at_once: false }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        LineWriter {
            at_once: at_once(meta.level()),
        }
    }
}

/// Whether a line of `level` is written at once: warnings and errors (tracing orders levels by
/// verbosity, ERROR < WARN < INFO).
fn at_once(level: &Level) -> bool {
    *level <= Level::WARN
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let held = HELD.try_with(|held| {
            let Ok(mut held) = held.try_borrow_mut() else {
                return false;
            };
            held.lines.extend_from_slice(buf);
            if !held.holding || self.at_once || held.lines.len() >= HOLD_AT_MOST {
                write_out(&mut held.lines);
            }
            true
        });
        if held != Ok(true) {
            // The thread is exiting (its locals are gone) or is writing its held lines already.
            let _ = io::stderr().lock().write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's held bytes.
    fn held_bytes() -> usize {
        HELD.with(|held| held.borrow().lines.len())
    }

    fn write_line(level: Level, line: &str) {
        LineWriter {
            at_once: at_once(&level),
        }
        .write_all(line.as_bytes())
        .unwrap();
    }

    #[test]
    fn warnings_and_errors_are_written_at_once() {
        assert!(at_once(&Level::ERROR) && at_once(&Level::WARN));
        assert!(!at_once(&Level::INFO) && !at_once(&Level::DEBUG) && !at_once(&Level::TRACE));
    }

    #[test]
    fn lines_are_held_only_between_hold_and_release() {
        std::thread::spawn(|| {
            write_line(Level::INFO, "not holding\n");
            assert_eq!(
                held_bytes(),
                0,
                "a thread that does not hold writes at once"
            );
            hold_lines();
            write_line(Level::INFO, "one\n");
            write_line(Level::INFO, "two\n");
            assert_eq!(held_bytes(), 8, "both lines held while the thread works");
            release_lines();
            assert_eq!(held_bytes(), 0, "written when it parks");
            write_line(Level::INFO, "after\n");
            assert_eq!(held_bytes(), 0, "released: each line at once again");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_warning_writes_the_held_lines_and_itself_at_once() {
        std::thread::spawn(|| {
            hold_lines();
            write_line(Level::INFO, "held\n");
            assert_eq!(held_bytes(), 5);
            write_line(Level::WARN, "warned\n");
            assert_eq!(held_bytes(), 0);
            release_lines();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn past_the_bound_the_held_lines_are_written() {
        std::thread::spawn(|| {
            hold_lines();
            let line = format!("{}\n", "x".repeat(999));
            for _ in 0..HOLD_AT_MOST / line.len() {
                write_line(Level::INFO, &line);
            }
            assert!(held_bytes() > 0 && held_bytes() < HOLD_AT_MOST);
            write_line(Level::INFO, &line);
            assert_eq!(
                held_bytes(),
                0,
                "the line that crossed the bound wrote them all"
            );
            release_lines();
        })
        .join()
        .unwrap();
    }
}
