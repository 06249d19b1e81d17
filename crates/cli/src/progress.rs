//! Progress of long work on standard error: on a terminal one line redrawn in place (a bar,
//! the amounts, the rate and the time left), at most ten times a second; when standard error is
//! a pipe or a file, a plain line every few seconds instead, so that a log stays readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// What the amounts count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, shown in GB (and the rate in MB/s).
    Bytes,
    /// Things (tensors, runs), shown as counts.
    Items,
}

/// Whether standard error is a terminal that can redraw a line.
pub fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
}

/// One task's progress.
pub struct Progress {
    label: String,
    total: u64,
    unit: Unit,
    tty: bool,
    start: Instant,
    last: Option<Instant>,
    /// A bar is on the screen (to be cleared before other output).
    drawn: bool,
}

impl Progress {
    /// Progress of `label` towards `total`, drawn as standard error allows.
    pub fn new(label: impl Into<String>, total: u64, unit: Unit) -> Progress {
        Progress::with_tty(label, total, unit, stderr_is_tty())
    }

    pub fn with_tty(label: impl Into<String>, total: u64, unit: Unit, tty: bool) -> Progress {
        Progress {
            label: label.into(),
            total,
            unit,
            tty,
            start: Instant::now(),
            last: None,
            drawn: false,
        }
    }

    /// The total the share is of.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// How often a line may be written: redraws on a terminal, plain lines otherwise.
    fn every(&self) -> Duration {
        if self.tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(5)
        }
    }

    /// `done` of the total is done; `what` is shown after the amounts (the current item).
    pub fn set(&mut self, done: u64, what: &str) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now - t < self.every()) {
            return;
        }
        if self.last.is_none() && !self.tty {
            // The first plain line after a pause, not at once.
            self.last = Some(now);
            return;
        }
        self.last = Some(now);
        let line = self.line(done, self.start.elapsed(), what);
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = write!(e, "\r\x1b[2K{line}");
            self.drawn = true;
        } else {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    }

    /// Takes the bar off the screen (before other output, and at the end).
    pub fn clear(&mut self) {
        if self.drawn {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.drawn = false;
        }
    }

    /// The line for `done` after `elapsed`.
    pub fn line(&self, done: u64, elapsed: Duration, what: &str) -> String {
        let frac = if self.total > 0 {
            (done as f64 / self.total as f64).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let secs = elapsed.as_secs_f64();
        let amounts = match self.unit {
            Unit::Bytes => format!(
                "{:.2} of {:.2} GB ({:.0} MB/s)",
                done as f64 / 1e9,
                self.total as f64 / 1e9,
                if secs > 0.0 {
                    done as f64 / 1e6 / secs
                } else {
                    0.0
                }
            ),
            Unit::Items => format!("{done} of {}", self.total),
        };
        let left = if frac > 0.0 && frac < 1.0 && secs >= 1.0 {
            format!(", {} left", clock(secs * (1.0 - frac) / frac))
        } else {
            String::new()
        };
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" {what}")
        };
        if self.tty {
            format!("{}{} {amounts}{left}{what}", self.label, bar(frac))
        } else {
            format!(
                "{}: {:.0}%, {amounts}{left}{what}",
                self.label,
                frac * 100.0
            )
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// A bar of `frac` (0 to 1) with its percentage, for a line that has its own text.
pub fn bar(frac: f64) -> String {
    const W: usize = 24;
    let frac = frac.clamp(0.0, 1.0);
    let full = ((frac * W as f64).round() as usize).min(W);
    format!(
        " [{}{}] {:>3.0}%",
        "#".repeat(full),
        "-".repeat(W - full),
        frac * 100.0
    )
}

/// `s` seconds as `1h02m`, `3m05s` or `42s`.
fn clock(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_the_share_amounts_rate_and_time_left() {
        let p = Progress::with_tty("writing", 4_000_000_000, Unit::Bytes, true);
        assert_eq!(
            p.line(1_000_000_000, Duration::from_secs(10), ""),
            "writing [######------------------]  25% 1.00 of 4.00 GB (100 MB/s), 30s left"
        );
        let p = Progress::with_tty("sluice: gen-model", 4_000_000_000, Unit::Bytes, false);
        assert_eq!(
            p.line(3_000_000_000, Duration::from_secs(100), ""),
            "sluice: gen-model: 75%, 3.00 of 4.00 GB (30 MB/s), 33s left"
        );
        let p = Progress::with_tty("quantize", 700, Unit::Items, false);
        assert_eq!(
            p.line(7, Duration::from_secs(3700), "blk.0.ffn_up"),
            "quantize: 1%, 7 of 700, 101h45m left blk.0.ffn_up"
        );
        // Done, or nothing known yet: no time left shown.
        assert_eq!(
            p.line(700, Duration::from_secs(9), ""),
            "quantize: 100%, 700 of 700"
        );
        let empty = Progress::with_tty("x", 0, Unit::Items, false);
        assert_eq!(empty.line(0, Duration::ZERO, ""), "x: 0%, 0 of 0");
    }

    #[test]
    fn bars_fill_by_share() {
        assert_eq!(bar(0.0), " [------------------------]   0%");
        assert_eq!(bar(0.5), " [############------------]  50%");
        assert_eq!(bar(2.0), " [########################] 100%");
    }

    #[test]
    fn clock_reads_hours_minutes_seconds() {
        assert_eq!(clock(42.4), "42s");
        assert_eq!(clock(185.0), "3m05s");
        assert_eq!(clock(3720.0), "1h02m");
    }
}
