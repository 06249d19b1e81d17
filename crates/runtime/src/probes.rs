//! Probes of the running machine and process: the memory the machine and this process's cgroup
//! still allow (/proc/meminfo, cgroup v1 and v2), this process's CPU time, faults and memory
//! (`getrusage`, /proc/self/status), and the residency of the dense weights (`mincore`).
//! Each reads what it measures and nothing else; deciding from the figures is for their callers
//! ([`crate::budget`], the per-token rows).

use std::time::Instant;

/// This process's CPU time and major faults so far (`getrusage`); zeros where unavailable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    pub majflt: u64,
}

impl Usage {
    pub fn now() -> Usage {
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer is valid for a write of one rusage for the duration of the call.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return Usage::default();
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        Usage {
            cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
            majflt: ru.ru_majflt as u64,
        }
    }

    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            majflt: self.majflt.saturating_sub(earlier.majflt),
        }
    }
}

/// The memory picture of a CSV row, in bytes: this process (`/proc/self/status`) and the
/// machine (`/proc/meminfo`). Zeros where unreadable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemPicture {
    pub rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub swap: u64,
    pub mem_available: u64,
    pub mem_free: u64,
    pub swap_free: u64,
}

/// `Key:   123 kB` → bytes.
fn kib_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

impl MemPicture {
    pub fn now() -> MemPicture {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemPicture {
            rss: kib_field(&status, "VmRSS"),
            rss_anon: kib_field(&status, "RssAnon"),
            rss_file: kib_field(&status, "RssFile"),
            swap: kib_field(&status, "VmSwap"),
            mem_available: kib_field(&meminfo, "MemAvailable"),
            mem_free: kib_field(&meminfo, "MemFree"),
            swap_free: kib_field(&meminfo, "SwapFree"),
        }
    }
}

/// The share of the dense weights in RAM, by `mincore` over the pages that hold them (our own
/// buffers under `--dense-weights anon`, the model's map otherwise), sampled at most once a
/// second.
pub struct DenseProbe {
    /// Page-aligned (address, length) ranges.
    ranges: Vec<(usize, usize)>,
    last: Option<(Instant, f64)>,
    page: usize,
}

impl DenseProbe {
    /// A probe of the byte slices `dense` (they must stay mapped while the probe is used).
    pub fn new<'a>(dense: impl IntoIterator<Item = &'a [u8]>) -> DenseProbe {
        // SAFETY: sysconf only reads its argument.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let mut ranges: Vec<(usize, usize)> = dense
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let start = s.as_ptr() as usize;
                let begin = start - start % page;
                let end = (start + s.len()).next_multiple_of(page);
                (begin, end)
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (b, e) in ranges {
            match merged.last_mut() {
                Some(m) if b <= m.1 => m.1 = m.1.max(e),
                _ => merged.push((b, e)),
            }
        }
        DenseProbe {
            ranges: merged.into_iter().map(|(b, e)| (b, e - b)).collect(),
            last: None,
            page,
        }
    }

    /// The resident share (0 to 1), or -1 when nothing can be measured.
    pub fn sample(&mut self) -> f64 {
        if let Some((t, v)) = self.last
            && t.elapsed().as_secs_f64() < 1.0
        {
            return v;
        }
        let v = self.measure();
        self.last = Some((Instant::now(), v));
        v
    }

    fn measure(&self) -> f64 {
        let (mut resident, mut total) = (0usize, 0usize);
        let mut vec = Vec::new();
        for &(addr, len) in &self.ranges {
            let pages = len / self.page;
            vec.clear();
            vec.resize(pages, 0u8);
            // SAFETY: `addr` is page-aligned and `addr..addr + len` lies within mappings the
            // caller keeps alive (the model's map or our dense buffers); `vec` has one byte per
            // page of it, as mincore requires. mincore only reports residency.
            let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
            if rc != 0 {
                return -1.0;
            }
            resident += vec.iter().filter(|&&b| b & 1 == 1).count();
            total += pages;
        }
        if total == 0 {
            -1.0
        } else {
            resident as f64 / total as f64
        }
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_kib(&text, "MemAvailable:")?.checked_mul(1024)
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A `key value` line of a cgroup `memory.stat`.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// What this process's memory cgroup still allows (limit minus usage, counting its inactive
/// page cache as free, as `MemAvailable` does), when it has a limit.
fn cgroup_available() -> Option<u64> {
    let me = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in me.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            // cgroup v1
            let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path);
            let read = |n: &str| -> Option<u64> {
                std::fs::read_to_string(dir.join(n))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let limit = read("memory.limit_in_bytes")?;
            if limit >= 1 << 60 {
                return None;
            }
            let usage = read("memory.usage_in_bytes")?;
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
            return Some(limit.saturating_sub(usage.saturating_sub(inactive)));
        }
        if controllers.is_empty() {
            // cgroup v2
            let dir = std::path::Path::new("/sys/fs/cgroup").join(path);
            let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
            let limit: u64 = max.trim().parse().ok()?;
            let usage: u64 = std::fs::read_to_string(dir.join("memory.current"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "inactive_file").unwrap_or(0);
            return Some(limit.saturating_sub(usage.saturating_sub(inactive)));
        }
    }
    None
}

/// Memory this process may still use: `MemAvailable`, or less under a cgroup limit.
pub fn available_memory() -> Option<u64> {
    MemoryFacts::probe().available()
}

/// The memory figures a run's budget is decided from ([`crate::budget::decide`]), as probed:
/// each `None` where it could not be read (or, for the cgroup, where there is no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFacts {
    /// `MemAvailable` of /proc/meminfo, in bytes.
    pub mem_available: Option<u64>,
    /// What this process's memory cgroup still allows, in bytes.
    pub cgroup_available: Option<u64>,
}

impl MemoryFacts {
    /// The machine's and the cgroup's figures now.
    pub fn probe() -> MemoryFacts {
        MemoryFacts {
            mem_available: mem_available(),
            cgroup_available: cgroup_available(),
        }
    }

    /// Memory this process may still use: `MemAvailable`, or less under a cgroup limit.
    pub fn available(&self) -> Option<u64> {
        match (self.mem_available, self.cgroup_available) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes() {
        let text = "Name:\tx\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n";
        assert_eq!(kib_field(text, "VmRSS"), 2048 * 1024);
        assert_eq!(kib_field(text, "RssAnon"), 1024 * 1024);
        assert_eq!(kib_field(text, "VmSwap"), 0);
    }

    #[test]
    fn the_dense_probe_sees_touched_anonymous_pages() {
        let mut v = vec![1u8; 64 << 10];
        v[0] = 2;
        let mut p = DenseProbe::new([v.as_slice()]);
        let f = p.sample();
        assert!(f > 0.9 && f <= 1.0, "{f}");
        assert_eq!(DenseProbe::new([]).sample(), -1.0);
    }

    #[test]
    fn meminfo_and_cgroup_stat_lines_are_read_by_their_key() {
        let meminfo =
            "MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(meminfo_kib(meminfo, "MemAvailable:"), Some(8_000_000));
        assert_eq!(meminfo_kib(meminfo, "MemFree:"), Some(1000));
        assert_eq!(meminfo_kib(meminfo, "SwapFree:"), None);
        let stat = "active_file 10\ninactive_file 4096\ntotal_inactive_file 8192\n";
        assert_eq!(stat_value(stat, "inactive_file"), Some(4096));
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(8192));
        assert_eq!(stat_value(stat, "file"), None);
        assert_eq!(stat_value("inactive_file x\n", "inactive_file"), None);
    }

    #[test]
    fn the_memory_available_is_the_smaller_of_the_machine_and_the_cgroup() {
        let facts = |m, c| MemoryFacts {
            mem_available: m,
            cgroup_available: c,
        };
        assert_eq!(facts(Some(8), Some(3)).available(), Some(3));
        assert_eq!(facts(Some(2), Some(3)).available(), Some(2));
        assert_eq!(facts(None, Some(3)).available(), Some(3));
        assert_eq!(facts(Some(8), None).available(), Some(8));
        assert_eq!(facts(None, None).available(), None);
    }
}
