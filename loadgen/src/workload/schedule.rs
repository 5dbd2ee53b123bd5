//! When each request fires: the arrival plan and the precise wait for a target.
//!
//! An absolute plan is a list of offsets from the run's t0 (fixed gaps,
//! seeded exponential or gamma gaps, or a trace's timestamps); a relative plan is an interval slept after each
//! submission returned. [`fire_at`] waits for a target instant with better than
//! the tokio timer's 1 ms granularity: the timer until shortly before it, then
//! a high-resolution thread sleep, then a short spin.

use std::time::{Duration, Instant};

use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Exp, Gamma};

use crate::config::{Arrival, SubmitSchedule};
use crate::error::Error;
use crate::workload::dataset::Entry;

/// Until this long before a target, wait on the tokio timer (1 ms slots,
/// rounded up, so it may end up to ~1 ms later than asked).
const TIMER_MARGIN: Duration = Duration::from_millis(2);
/// The last stretch is spun; before it, a thread sleep brings us close
/// without burning a core. The firing thread's timer slack is 1 ns
/// ([`precise_sleeps`]), so the sleep ends within the OS's wake-up latency
/// (tens of us), not up to 50 us of default slack later; the spin covers
/// that latency. Spinning is most of the thread's time at high rates (a
/// request every 100 us at 10,000/s): a 200 us margin kept a whole core
/// busy, which on a 2-core machine took it from the runtime's workers and
/// the submit lag grew in the worker pickup (issue 40).
const SPIN_MARGIN: Duration = Duration::from_micros(60);

/// Cuts the calling thread's timer slack to 1 ns (Linux `PR_SET_TIMERSLACK`;
/// elsewhere nothing), so its thread sleeps end when asked, not up to 50 us
/// later. For the firing thread, whose sleeps [`fire_at`] times.
pub fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK only sets the calling thread's slack value.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}

/// When requests fire (built by `cli` from the schedule flags).
#[derive(Debug, Clone)]
pub struct ArrivalConfig {
    /// `--arrival`.
    pub arrival: Arrival,
    /// `--submit-schedule`.
    pub submit_schedule: SubmitSchedule,
    /// `--submit-interval-ms`.
    pub submit_interval_ms: f64,
    /// `--request-rate` (Poisson and gamma arrivals).
    pub request_rate: Option<f64>,
    /// `--burstiness` (gamma arrivals).
    pub burstiness: f64,
    /// `--trace-time-scale`.
    pub trace_time_scale: f64,
    /// `--seed`.
    pub seed: u64,
    /// `--num-requests` (a timed run without it: `usize::MAX`, no cap).
    pub num_requests: usize,
    /// `--duration`: fire until this long after t0.
    pub duration: Option<Duration>,
    /// `--duration-grace`: requests in flight at the end may run this much
    /// longer before they are cut.
    pub grace: Duration,
}

impl ArrivalConfig {
    /// The requested arrival rate in requests/s, where one is defined: Poisson's
    /// R, or 1000 / interval for a fixed absolute schedule. `None` for a burst
    /// and for the relative schedule (its rate depends on the submit time).
    pub fn requested_rate_rps(&self) -> Option<f64> {
        match (self.arrival, self.submit_schedule) {
            (Arrival::Poisson | Arrival::Gamma, _) => self.request_rate,
            (Arrival::Fixed, SubmitSchedule::Absolute) if self.submit_interval_ms > 0.0 => {
                Some(1000.0 / self.submit_interval_ms)
            }
            _ => None,
        }
    }
}

/// The arrival plan of one run.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Request i fires at t0 + `offsets[i]`, independent of earlier submissions.
    Absolute(Vec<Duration>),
    /// Request i+1 fires `interval` after submission i returned; request 0 at t0.
    Relative { interval: Duration },
}

impl Plan {
    /// The plan of `n` requests the (validated) flags ask for. `rate` is the
    /// request rate (--request-rate, or a sweep's rate: with fixed arrivals it
    /// becomes gaps of 1/rate); `entries` are the --dataset entries, whose
    /// timestamps --arrival trace replays.
    pub fn new(
        args: &ArrivalConfig,
        n: usize,
        rate: Option<f64>,
        entries: Option<&[Entry]>,
    ) -> Result<Plan, Error> {
        // Whole nanoseconds, so offsets are exact multiples (no float drift).
        let interval = match (args.arrival, rate) {
            (Arrival::Fixed, Some(r)) => Duration::from_nanos((1e9 / r).round() as u64),
            _ => Duration::from_nanos((args.submit_interval_ms * 1e6).round() as u64),
        };
        Ok(match (args.arrival, args.submit_schedule, rate) {
            (Arrival::Poisson, _, Some(r)) => Plan::Absolute(poisson_offsets(n, r, args.seed)),
            (Arrival::Gamma, _, Some(r)) => {
                Plan::Absolute(gamma_offsets(n, r, args.burstiness, args.seed))
            }
            (Arrival::Trace, _, _) => Plan::Absolute(trace_offsets(
                entries.unwrap_or_default(),
                n,
                args.trace_time_scale,
            )?),
            (_, SubmitSchedule::Relative, _) => Plan::Relative { interval },
            _ => Plan::Absolute(fixed_offsets(n, interval)),
        })
    }

    /// One line for the report, e.g. `250.000 ms / absolute`.
    pub fn describe(&self, args: &ArrivalConfig, rate: Option<f64>) -> String {
        let r = rate.unwrap_or(0.0);
        match (self, args.arrival) {
            (Plan::Absolute(_), Arrival::Poisson) => {
                format!("poisson {r} req/s (seed {}) / absolute", args.seed)
            }
            (Plan::Absolute(_), Arrival::Gamma) => format!(
                "gamma {r} req/s, burstiness {} (seed {}) / absolute",
                args.burstiness, args.seed
            ),
            (Plan::Absolute(o), Arrival::Trace) => format!(
                "trace replay of {} timestamps x {} / absolute",
                o.len(),
                args.trace_time_scale
            ),
            (Plan::Absolute(_), _) if rate.is_some() => format!("fixed {r} req/s / absolute"),
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

/// Offsets of `plan`'s kind of arrivals from t0 up to `until` (a timed
/// run): as many as fall before it, at most `cap`. A burst's offsets (all 0)
/// come back empty: the run fires on, as permits allow, until time is up.
pub fn offsets_until(
    args: &ArrivalConfig,
    rate: Option<f64>,
    until: Duration,
    cap: usize,
) -> Vec<Duration> {
    let mut n = match rate.or(args.requested_rate_rps()) {
        Some(r) => ((r * until.as_secs_f64() * 1.5) as usize).saturating_add(16),
        None => return Vec::new(),
    };
    loop {
        let n_now = n.min(cap);
        let offsets = match Plan::new(args, n_now, rate, None) {
            Ok(Plan::Absolute(o)) => o,
            _ => return Vec::new(),
        };
        let last_inside = offsets.last().is_some_and(|o| *o < until);
        if !last_inside || n_now == cap {
            return offsets.into_iter().take_while(|o| *o < until).collect();
        }
        n = n.saturating_mul(2);
    }
}

/// Requests per run: --num-requests, capped by the trace's length when
/// replaying one.
pub fn requests_per_run(args: &ArrivalConfig, entries: Option<&[Entry]>) -> usize {
    match (args.arrival, entries) {
        (Arrival::Trace, Some(e)) => args.num_requests.min(e.len()),
        _ => args.num_requests,
    }
}

/// Offsets of the first `n` entries' timestamps, relative to the first one and
/// multiplied by `scale`. Every entry needs a timestamp, in order.
pub fn trace_offsets(entries: &[Entry], n: usize, scale: f64) -> Result<Vec<Duration>, Error> {
    let mut out = Vec::with_capacity(n);
    let mut prev = f64::NEG_INFINITY;
    let mut first = None;
    for (i, e) in entries.iter().take(n).enumerate() {
        let Some(ts) = e.timestamp_ms else {
            return Err(Error::invalid(
                "--arrival",
                format!("trace: dataset entry {i} has no `timestamp`"),
            ));
        };
        if ts < prev {
            return Err(Error::invalid(
                "--arrival",
                format!(
                    "trace: dataset entry {i}'s timestamp {ts} is before the previous one ({prev})"
                ),
            ));
        }
        prev = ts;
        let base = *first.get_or_insert(ts);
        out.push(Duration::from_secs_f64((ts - base) * scale / 1e3));
    }
    Ok(out)
}

/// Offsets with gamma-distributed gaps (vLLM's `--burstiness`): shape
/// `burstiness`, scale `1 / (rate * burstiness)`, so the mean gap is 1/rate
/// and the coefficient of variation 1/sqrt(burstiness). Seeded.
pub fn gamma_offsets(n: usize, rate: f64, burstiness: f64, seed: u64) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed);
    let Ok(gamma) = Gamma::new(burstiness, 1.0 / (rate * burstiness)) else {
        // Only non-positive or NaN parameters fail; validation rejects both.
        return fixed_offsets(n, Duration::ZERO);
    };
    let mut at = 0.0_f64;
    (0..n)
        .map(|i| {
            if i > 0 {
                at += rng.sample(gamma);
            }
            Duration::from_secs_f64(at)
        })
        .collect()
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

    #[test]
    fn gamma_rate_and_burstiness() {
        // Mean gap 1/rate whatever the shape; CV = 1/sqrt(burstiness).
        for (b, seed) in [(0.25, 1), (1.0, 2), (4.0, 3)] {
            let n = 8001;
            let o = gamma_offsets(n, 20.0, b, seed);
            assert_eq!(o, gamma_offsets(n, 20.0, b, seed), "seeded");
            let achieved = (n - 1) as f64 / o[n - 1].as_secs_f64();
            assert!(
                (achieved - 20.0).abs() / 20.0 < 0.08,
                "burstiness {b}: rate {achieved}"
            );
            let gaps: Vec<f64> = o.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            let cv = var.sqrt() / mean;
            let want = 1.0 / b.sqrt();
            assert!(
                (cv - want).abs() / want < 0.12,
                "burstiness {b}: cv {cv}, want {want}"
            );
        }
    }

    #[test]
    fn trace_offsets_are_scaled_and_checked() {
        let e = |ts: Option<f64>| Entry {
            prompt: crate::workload::dataset::PromptSpec::Length(1),
            max_new_tokens: None,
            timestamp_ms: ts,
        };
        let entries = vec![
            e(Some(1000.0)),
            e(Some(1000.0)),
            e(Some(1500.0)),
            e(Some(3000.0)),
        ];
        let o = trace_offsets(&entries, 3, 0.5).expect("valid");
        assert_eq!(
            o,
            vec![Duration::ZERO, Duration::ZERO, Duration::from_millis(250)]
        );
        assert!(trace_offsets(&[e(Some(5.0)), e(None)], 2, 1.0).is_err());
        assert!(trace_offsets(&[e(Some(5.0)), e(Some(4.0))], 2, 1.0).is_err());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn fire_at_is_never_early_and_beats_a_plain_sleep() {
        precise_sleeps(); // as the firing thread does
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
