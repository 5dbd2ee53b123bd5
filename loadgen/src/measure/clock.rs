//! The clocks a run reads besides its monotonic one (every request timestamp
//! is on `Instant`, see `record`):
//!
//! - the wall clock, to start several loadgen processes at one instant
//!   (`--start-at`: a Unix time becomes an `Instant` here) and to say on the
//!   common clock when each run's t0 was (`t0_unix_s`), so that a merge of
//!   several processes' reports can line their runs up. On one host both
//!   clocks tick together (the wall clock is only slewed, by parts per
//!   million), so a conversion made seconds ahead is good to microseconds;
//! - the process's CPU clock (user + system time of every thread, from
//!   `getrusage(RUSAGE_SELF)`), read before and after a run: its growth over
//!   the run's wall time is how many cores loadgen kept busy. Children (a
//!   `--mock-process` mock, a spawned server) are not in it; a calibration's
//!   in-process mock is.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch now, on the wall clock.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The `Instant` at which the wall clock reads `unix_s` (in the past if it
/// already did).
pub fn instant_at(unix_s: f64) -> Instant {
    let now = Instant::now();
    let ahead = unix_s - unix_now();
    let d = Duration::from_secs_f64(ahead.abs().min(1e9));
    if ahead >= 0.0 {
        now + d
    } else {
        now.checked_sub(d).unwrap_or(now)
    }
}

/// The wall-clock reading (Unix seconds) at `t`, a nearby instant.
pub fn unix_at(t: Instant) -> f64 {
    let now = Instant::now();
    let wall = unix_now();
    match t.checked_duration_since(now) {
        Some(ahead) => wall + ahead.as_secs_f64(),
        None => wall - now.duration_since(t).as_secs_f64(),
    }
}

/// The process's CPU time so far (user + system, every thread), or `None`
/// where it cannot be read.
#[cfg(unix)]
pub fn process_cpu() -> Option<Duration> {
    // SAFETY: getrusage only writes the struct we pass; all-zero is a valid
    // `rusage` (plain integers).
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return None;
        }
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec).ok()?))
    };
    tv(usage.ru_utime)?.checked_add(tv(usage.ru_stime)?)
}

/// No CPU clock off Unix.
#[cfg(not(unix))]
pub fn process_cpu() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_and_monotonic_agree() {
        let target = unix_now() + 2.0;
        let at = instant_at(target);
        let ahead = at.duration_since(Instant::now()).as_secs_f64();
        assert!((1.9..=2.0).contains(&ahead), "{ahead}");
        assert!((unix_at(at) - target).abs() < 1e-3, "round trip");
        let past = instant_at(unix_now() - 1.0);
        let behind = Instant::now().duration_since(past).as_secs_f64();
        assert!((1.0..1.1).contains(&behind), "{behind}");
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let Some(before) = process_cpu() else {
            return; // no CPU clock on this platform
        };
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = process_cpu().expect("read twice") - before;
        // 50 ms of spinning: at least some of it on the CPU clock (its
        // resolution is a scheduler tick at worst), never more than the
        // wall time times the threads running meanwhile.
        assert!(used >= Duration::from_millis(10), "{used:?}");
    }
}
