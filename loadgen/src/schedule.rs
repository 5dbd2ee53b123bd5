//! When each request fires: the arrival plan and the precise wait for a target.
//!
//! An absolute plan is a list of offsets from the run's t0 (fixed gaps or
//! seeded exponential gaps); a relative plan is an interval slept after each
//! submission returned. [`fire_at`] waits for a target instant with better than
//! the tokio timer's 1 ms granularity: the timer until shortly before it, then
//! a high-resolution thread sleep, then a short spin.

use std::time::{Duration, Instant};

use crate::cli::{Args, Arrival, SubmitSchedule};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::Exp;

/// Until this long before a target, wait on the tokio timer (1 ms slots,
/// rounded up, so it may end up to ~1 ms later than asked).
const TIMER_MARGIN: Duration = Duration::from_millis(2);
/// The last stretch is spun; before it, a thread sleep (nanosleep, with ~50 us
/// timer slack on Linux) brings us close without burning a core, which on a
/// small, busy machine would also cost the spinning thread its scheduling
/// priority.
const SPIN_MARGIN: Duration = Duration::from_micros(200);

/// The arrival plan of one run.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Request i fires at t0 + `offsets[i]`, independent of earlier submissions.
    Absolute(Vec<Duration>),
    /// Request i+1 fires `interval` after submission i returned; request 0 at t0.
    Relative { interval: Duration },
}

impl Plan {
    /// The plan the flags ask for (validated flags only).
    pub fn from_args(args: &Args) -> Plan {
        // Whole nanoseconds, so offsets are exact multiples (no float drift).
        let interval = Duration::from_nanos((args.submit_interval_ms * 1e6).round() as u64);
        match (args.arrival, args.submit_schedule, args.request_rate) {
            (Arrival::Poisson, _, Some(rate)) => {
                Plan::Absolute(poisson_offsets(args.num_requests, rate, args.seed))
            }
            (_, SubmitSchedule::Relative, _) => Plan::Relative { interval },
            _ => Plan::Absolute(fixed_offsets(args.num_requests, interval)),
        }
    }

    /// One line for the report, e.g. `250.000 ms / absolute`.
    pub fn describe(&self, args: &Args) -> String {
        match (self, args.arrival) {
            (Plan::Absolute(_), Arrival::Poisson) => format!(
                "poisson {} req/s (seed {}) / absolute",
                args.request_rate.unwrap_or(0.0),
                args.seed
            ),
            (Plan::Absolute(_), _) if args.submit_interval_ms == 0.0 => {
                "0 ms / absolute (burst)".to_string()
            }
            (Plan::Absolute(_), _) => format!("{:.3} ms / absolute", args.submit_interval_ms),
            (Plan::Relative { interval }, _) => {
                format!("{:.3} ms / relative", interval.as_secs_f64() * 1e3)
            }
        }
    }
}

/// Offsets `i * interval` (all zero for a burst).
pub fn fixed_offsets(n: usize, interval: Duration) -> Vec<Duration> {
    (0..n).map(|i| interval.saturating_mul(i as u32)).collect()
}

/// Offsets of a Poisson process with `rate` arrivals per second: request 0 at
/// 0, then exponential gaps with mean 1/rate. The same seed gives the same
/// offsets (`rate` must be > 0; validated by the caller).
pub fn poisson_offsets(n: usize, rate: f64, seed: u64) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed);
    let Ok(exp) = Exp::new(rate) else {
        // Only a non-positive or NaN rate fails; validation rejects both.
        return fixed_offsets(n, Duration::ZERO);
    };
    let mut at = 0.0_f64;
    let mut offsets = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 {
            at += rng.sample(exp);
        }
        offsets.push(Duration::from_secs_f64(at));
    }
    offsets
}

/// Returns at `target` or just after: the tokio timer until [`TIMER_MARGIN`]
/// before it, a blocking thread sleep until [`SPIN_MARGIN`] before it, then a
/// spin. It blocks its thread for up to [`TIMER_MARGIN`], so it is meant for
/// the dedicated firing thread, whose runtime has nothing else to run.
pub async fn fire_at(target: Instant) {
    if let Some(early) = target.checked_sub(TIMER_MARGIN) {
        if Instant::now() < early {
            tokio::time::sleep_until(tokio::time::Instant::from_std(early)).await;
        }
    }
    if let Some(close) = target.checked_sub(SPIN_MARGIN) {
        let now = Instant::now();
        if now < close {
            std::thread::sleep(close - now);
        }
    }
    while Instant::now() < target {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_offsets_are_multiples() {
        let o = fixed_offsets(4, Duration::from_millis(250));
        assert_eq!(
            o,
            vec![
                Duration::ZERO,
                Duration::from_millis(250),
                Duration::from_millis(500),
                Duration::from_millis(750)
            ]
        );
        assert!(fixed_offsets(3, Duration::ZERO).iter().all(|d| d.is_zero()));
    }

    #[test]
    fn poisson_is_seeded_and_monotonic() {
        let a = poisson_offsets(100, 20.0, 7);
        assert_eq!(a, poisson_offsets(100, 20.0, 7), "same seed, same offsets");
        assert_ne!(
            a,
            poisson_offsets(100, 20.0, 8),
            "other seed, other offsets"
        );
        assert_eq!(a[0], Duration::ZERO);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_mean_rate_matches() {
        // 4000 gaps: the mean of n exponential gaps has a relative standard
        // deviation of 1/sqrt(n) = 1.6%, so 6% is ~4 sigma (seeded: deterministic).
        for (rate, seed) in [(5.0, 1), (50.0, 2), (1000.0, 3)] {
            let n = 4001;
            let o = poisson_offsets(n, rate, seed);
            let achieved = (n - 1) as f64 / o[n - 1].as_secs_f64();
            let err = (achieved - rate).abs() / rate;
            println!(
                "poisson rate {rate}: achieved {achieved:.3} (error {:.2}%)",
                err * 100.0
            );
            assert!(err < 0.06, "rate {rate}: achieved {achieved}");
            // The gaps are exponential, not fixed: their coefficient of
            // variation is ~1 (fixed gaps would give 0).
            let gaps: Vec<f64> = o.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            let cv = var.sqrt() / mean;
            assert!((0.9..1.1).contains(&cv), "coefficient of variation {cv}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn fire_at_is_never_early_and_beats_a_plain_sleep() {
        // Pairs of waits, fire_at and a plain timer sleep in alternating
        // order, so both see the same machine load. On a quiet machine fire_at
        // is within microseconds and the timer alone up to ~1 ms late (its
        // 1 ms slots); on a busy one both also wait for the OS scheduler, so
        // the check is statistical: fire_at must win most pairs (a sign test;
        // a fire_at no better than the timer would win about half).
        let pairs = 200;
        let (mut wins, mut precise, mut plain) = (0, Vec::new(), Vec::new());
        for i in 0..pairs {
            let mut late = [Duration::ZERO; 2];
            for k in 0..2 {
                let use_fire_at = (k == 0) == (i % 2 == 0);
                let target = Instant::now() + Duration::from_micros(3000 + 37 * i as u64);
                if use_fire_at {
                    fire_at(target).await;
                    assert!(Instant::now() >= target, "fired early");
                } else {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(target)).await;
                }
                late[usize::from(!use_fire_at)] = Instant::now().saturating_duration_since(target);
            }
            wins += usize::from(late[0] < late[1]);
            precise.push(late[0]);
            plain.push(late[1]);
        }
        precise.sort();
        plain.sort();
        println!(
            "fire_at won {wins}/{pairs} pairs; median lateness: fire_at {:?}, plain timer {:?}",
            precise[pairs / 2],
            plain[pairs / 2]
        );
        assert!(
            wins * 100 >= pairs * 58,
            "fire_at won only {wins}/{pairs} pairs"
        );
    }
}
