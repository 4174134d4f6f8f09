//! CPU and memory readings from /proc: per process (utime + stime, peak RSS) and for the whole
//! machine.

use std::time::Duration;

/// Clock ticks per second of /proc's CPU counters (`getconf CLK_TCK`, 100 on Linux here).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// CPU time a process has used so far (user + system), or zero if it is gone.
pub fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name may contain spaces; fields after the closing parenthesis are fixed.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 overall, so utime (14) and stime (15) are at 11 and 12 here.
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / ticks_per_second())
}

/// Peak resident memory of a process in bytes (VmHWM).
pub fn peak_rss(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:") * 1024
}

/// Current resident memory of a process in bytes (VmRSS).
pub fn rss(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:") * 1024
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Pids of every running PostgreSQL server process; with `LEDGER_BENCH_POSTMASTER_PID` set, only
/// that server's (the postmaster and its children), so another server sharing the machine is not
/// counted.
pub fn postgres_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let postmaster: Option<u32> = std::env::var("LEDGER_BENCH_POSTMASTER_PID")
        .ok()
        .and_then(|p| p.trim().parse().ok());
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == "postgres")
                .unwrap_or(false)
        })
        .filter(|pid| postmaster.is_none_or(|p| *pid == p || parent(*pid) == Some(p)))
        .collect()
}

/// A process's parent pid (field 4 of `/proc/PID/stat`, after the command in parentheses).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// CPU used by all PostgreSQL processes alive now.
pub fn postgres_cpu() -> Duration {
    postgres_pids().into_iter().map(process_cpu).sum()
}

/// Busy CPU time of the whole machine (all cores; idle and iowait excluded).
pub fn machine_busy() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Duration::ZERO;
    };
    let Some(line) = stat.lines().next() else {
        return Duration::ZERO;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: u64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .take(8)
        .map(|(_, x)| *x)
        .sum();
    Duration::from_secs_f64(busy as f64 / ticks_per_second())
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
