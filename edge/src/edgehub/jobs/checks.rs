//! A job's `checkItems` on this node, before it pulls or upgrades (KubeEdge's names and limits):
//! `cpu` (busy share over 100 ms of `/proc/stat`), `mem` (`MemTotal - MemAvailable` of
//! `/proc/meminfo`) and `disk` (the data directory's file system, used as `df` counts it), each
//! at most 80 %. An item not known is refused by name.

use super::super::usage::{cpu_ticks, memory_in_use};
use std::path::Path;
use std::time::Duration;

/// KubeEdge's limit for each item, percent.
pub(crate) const MAX_PERCENT: f64 = 80.0;

/// Why a job's checks refuse it on this node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum CheckError {
    #[error("{item} usage is {used:.1}%, more than the {MAX_PERCENT:.0}% a job allows")]
    Over { item: String, used: f64 },
    #[error("{item} usage cannot be read from {from}")]
    Unreadable { item: &'static str, from: String },
    #[error("check item {0:?} is not supported (cpu, mem, disk)")]
    Unknown(String),
}

/// Whether `used` percent of `what` is within the limit; the error says by how much not.
fn within(what: &str, used: f64) -> Result<f64, CheckError> {
    if used > MAX_PERCENT {
        Err(CheckError::Over {
            item: what.to_string(),
            used,
        })
    } else {
        Ok(used)
    }
}

/// The busy share between two `/proc/stat` readings, percent.
fn cpu_percent(before: &str, after: &str) -> Option<f64> {
    let (b0, t0) = cpu_ticks(before)?;
    let (b1, t1) = cpu_ticks(after)?;
    let total = t1.checked_sub(t0).filter(|t| *t > 0)?;
    Some(b1.saturating_sub(b0) as f64 * 100.0 / total as f64)
}

fn mem_percent(meminfo: &str) -> Option<f64> {
    let total = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?
        * 1024;
    (total > 0).then(|| memory_in_use(meminfo).unwrap_or(0) as f64 * 100.0 / total as f64)
}

fn disk_percent(dir: &Path) -> Option<f64> {
    let s = rustix::fs::statvfs(dir).ok()?;
    let used = s.f_blocks.saturating_sub(s.f_bfree);
    let whole = used + s.f_bavail;
    (whole > 0).then(|| used as f64 * 100.0 / whole as f64)
}

/// Runs `items`; what each found, or the first that failed.
pub(crate) async fn run(items: &[String], data_dir: &Path) -> Result<String, CheckError> {
    let unreadable = |item, from: &str| CheckError::Unreadable {
        item,
        from: from.to_string(),
    };
    let mut found = Vec::new();
    for item in items {
        let used = match item.as_str() {
            "cpu" => {
                let before = std::fs::read_to_string("/proc/stat").unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let after = std::fs::read_to_string("/proc/stat").unwrap_or_default();
                cpu_percent(&before, &after).ok_or_else(|| unreadable("cpu", "/proc/stat"))?
            }
            "mem" => mem_percent(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
                .ok_or_else(|| unreadable("mem", "/proc/meminfo"))?,
            "disk" => disk_percent(data_dir)
                .ok_or_else(|| unreadable("disk", &data_dir.display().to_string()))?,
            other => return Err(CheckError::Unknown(other.to_string())),
        };
        found.push(format!("{item} {:.1}%", within(item, used)?));
    }
    Ok(found.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_as_the_kernel_writes_it_and_held_to_80_percent() {
        let before = "cpu  100 0 100 800 0 0 0 0 0 0\n";
        let after = "cpu  190 0 190 820 0 0 0 0 0 0\n";
        // 180 busy of 200 ticks.
        assert_eq!(cpu_percent(before, after), Some(90.0));
        assert_eq!(cpu_percent(after, after), None);
        let mem = "MemTotal:       1000 kB\nMemFree: 10 kB\nMemAvailable:    300 kB\n";
        assert_eq!(mem_percent(mem), Some(70.0));
        assert_eq!(within("mem", 70.0), Ok(70.0));
        assert_eq!(
            within("cpu", 90.0).map_err(|e| e.to_string()),
            Err("cpu usage is 90.0%, more than the 80% a job allows".into())
        );
        assert!(disk_percent(Path::new("/")).is_some_and(|p| (0.0..=100.0).contains(&p)));
    }

    #[tokio::test]
    async fn an_item_not_known_is_refused_by_name() {
        let e = run(&["gpu".into()], Path::new("/"))
            .await
            .expect_err("refused");
        assert_eq!(
            e.to_string(),
            "check item \"gpu\" is not supported (cpu, mem, disk)"
        );
        assert_eq!(run(&[], Path::new("/")).await, Ok(String::new()));
    }
}
