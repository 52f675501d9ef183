//! `strftime_now(fmt)` for templates that print today's date (Llama 3.x and
//! others). Time is UTC: there is no time-zone database in a pure-Rust, no-C
//! build, and a date in a prompt does not need more.

use std::time::{SystemTime, UNIX_EPOCH};

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
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A broken-down UTC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday.
    weekday: u32,
    /// 1-based day of the year.
    yday: u32,
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

impl Civil {
    /// Break down seconds since the Unix epoch.
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let before = cumulative.get(month.saturating_sub(1) as usize).copied().unwrap_or(0);
        let leap = u32::from(month > 2 && is_leap(year));
        Self {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            // 1970-01-01 was a Thursday (3 with Monday = 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: before + day + leap,
        }
    }

    /// Now, in UTC.
    pub fn now() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
        Self::from_unix(secs)
    }

    /// Format with the C/Python `strftime` directives most templates use
    /// (%Y %y %m %d %e %B %b %h %A %a %H %I %M %S %p %j %w %u %F %D %T %%);
    /// unknown directives are written as is.
    pub fn format(&self, fmt: &str) -> String {
        let month_name = MONTHS.get(self.month.saturating_sub(1) as usize).copied().unwrap_or("");
        let day_name = DAYS.get(self.weekday as usize).copied().unwrap_or("");
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let piece = match d {
                'Y' => self.year.to_string(),
                'y' => format!("{:02}", self.year.rem_euclid(100)),
                'm' => format!("{:02}", self.month),
                'd' => format!("{:02}", self.day),
                'e' => format!("{:>2}", self.day),
                'B' => month_name.to_string(),
                'b' | 'h' => month_name.chars().take(3).collect(),
                'A' => day_name.to_string(),
                'a' => day_name.chars().take(3).collect(),
                'H' => format!("{:02}", self.hour),
                'I' => format!("{hour12:02}"),
                'M' => format!("{:02}", self.minute),
                'S' => format!("{:02}", self.second),
                'p' => if self.hour < 12 { "AM" } else { "PM" }.to_string(),
                'j' => format!("{:03}", self.yday),
                'w' => ((self.weekday + 1) % 7).to_string(),
                'u' => (self.weekday + 1).to_string(),
                'F' => format!("{}-{:02}-{:02}", self.year, self.month, self.day),
                'D' => format!("{:02}/{:02}/{:02}", self.month, self.day, self.year.rem_euclid(100)),
                'T' => format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second),
                '%' => "%".to_string(),
                other => format!("%{other}"),
            };
            out.push_str(&piece);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-02-29T13:05:09Z, a Thursday (Unix time 1709211909).
        let t = Civil::from_unix(1_709_211_909);
        assert_eq!(t.format("%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
        assert_eq!(t.format("%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            t.format("%A %B %e, %I%p, day %j, %%"),
            "Thursday February 29, 01PM, day 060, %"
        );
        let epoch = Civil::from_unix(0);
        assert_eq!(epoch.format("%F %a %w %u"), "1970-01-01 Thu 4 4");
        let end = Civil::from_unix(1_735_689_599); // 2024-12-31T23:59:59Z
        assert_eq!(end.format("%D %T %j"), "12/31/24 23:59:59 366");
        assert_eq!(end.format("%Q"), "%Q");
    }
}
