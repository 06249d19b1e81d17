//! The clock behind the templates' `strftime_now` and a C-style `strftime` over UTC.

use std::time::{SystemTime, UNIX_EPOCH};

/// Where `strftime_now` reads the current time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// The system clock, read at every call, as UTC.
    #[default]
    System,
    /// One fixed instant (seconds since the Unix epoch, read as UTC): reproducible renderings.
    Fixed(i64),
}

impl Clock {
    /// Seconds since the Unix epoch.
    pub fn now_unix(&self) -> i64 {
        match *self {
            Clock::Fixed(t) => t,
            Clock::System => match SystemTime::now().duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
            },
        }
    }
}

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32, // 0 = Sunday
    yday: u32,    // 0-based day of the year
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn civil(t: i64) -> Civil {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        weekday: (days + 4).rem_euclid(7) as u32,
        yday: CUM[(month - 1) as usize] + day - 1 + leap,
    }
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Formats a UTC instant like C's `strftime` in the C locale (what Python's `datetime.strftime`
/// calls on Linux), including glibc's `-` (no padding) flag. Unknown directives are copied.
pub fn strftime(format: &str, unix: i64) -> String {
    let c = civil(unix);
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let mut no_pad = false;
        if chars.peek() == Some(&'-') {
            no_pad = true;
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |v: i64, width: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        let hour12 = if c.hour.is_multiple_of(12) {
            12
        } else {
            c.hour % 12
        };
        let week_sun = (c.yday + 7 - c.weekday) / 7;
        let week_mon = (c.yday + 7 - (c.weekday + 6) % 7) / 7;
        let piece = match d {
            'a' => WEEKDAYS[c.weekday as usize][..3].to_owned(),
            'A' => WEEKDAYS[c.weekday as usize].to_owned(),
            'w' => c.weekday.to_string(),
            'd' => num(c.day.into(), 2),
            'e' => {
                if no_pad {
                    c.day.to_string()
                } else {
                    format!("{:2}", c.day)
                }
            }
            'b' | 'h' => MONTHS[(c.month - 1) as usize][..3].to_owned(),
            'B' => MONTHS[(c.month - 1) as usize].to_owned(),
            'm' => num(c.month.into(), 2),
            'y' => num(c.year.rem_euclid(100), 2),
            'Y' => c.year.to_string(),
            'C' => num(c.year.div_euclid(100), 2),
            'H' => num(c.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'p' => if c.hour < 12 { "AM" } else { "PM" }.to_owned(),
            'M' => num(c.minute.into(), 2),
            'S' => num(c.second.into(), 2),
            'f' => "000000".to_owned(),
            'j' => num(i64::from(c.yday) + 1, 3),
            'U' => num(week_sun.into(), 2),
            'W' => num(week_mon.into(), 2),
            'u' => (if c.weekday == 0 { 7 } else { c.weekday }).to_string(),
            'D' => strftime("%m/%d/%y", unix),
            'F' => strftime("%Y-%m-%d", unix),
            'T' => strftime("%H:%M:%S", unix),
            'R' => strftime("%H:%M", unix),
            'c' => strftime("%a %b %e %H:%M:%S %Y", unix),
            'x' => strftime("%m/%d/%y", unix),
            'X' => strftime("%H:%M:%S", unix),
            'n' => "\n".to_owned(),
            't' => "\t".to_owned(),
            // A naive datetime has no zone: Python prints nothing for these.
            'z' | 'Z' => String::new(),
            '%' => "%".to_owned(),
            other => {
                let mut s = String::from('%');
                if no_pad {
                    s.push('-');
                }
                s.push(other);
                s
            }
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        // 2026-01-15 09:30:00 UTC, a Thursday (date -u -d @1768469400).
        let t = 1_768_469_400;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2026-01-15 09:30:00");
        assert_eq!(strftime("%d %b %Y", t), "15 Jan 2026");
        assert_eq!(strftime("%A, %B %-d, %Y", t), "Thursday, January 15, 2026");
        assert_eq!(strftime("%j %a %I%p %%", t), "015 Thu 09AM %");
        // 2024-02-29 23:59:59 UTC (leap day).
        assert_eq!(
            strftime("%F %T %j", 1_709_251_199),
            "2024-02-29 23:59:59 060"
        );
        // The epoch and a date before it.
        assert_eq!(strftime("%c", 0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(strftime("%F", -86_400), "1969-12-31");
    }
}
