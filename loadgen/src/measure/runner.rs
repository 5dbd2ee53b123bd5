//! One run: fire the requests on their schedule, run each as its own task, and
//! collect the records.
//!
//! The firing loop runs on a dedicated thread with its own current-thread
//! runtime, so the tasks reading hundreds of streams on the main runtime never
//! delay a firing, and the spin before each target takes no one's turn. The
//! requests themselves are spawned onto the main runtime: with the absolute
//! schedule a slow submission never delays the next target; with the relative
//! schedule the loop waits for the submission to return, then sleeps the
//! interval. A `--max-concurrency` permit is taken after the target is reached,
//! so waiting for one shows up as submit lag.
//!
//! With a submit lag limit the loop stops firing once the submit lag p99 is
//! beyond it (more than 1% of at least [`LAG_MIN_SAMPLES`] submissions late):
//! the client, not the server, is then the bottleneck, and the run says so.
//!
//! With a start instant (`--start-at`, for several loadgen processes that
//! must start together) t0 is that instant instead, or as soon after it as
//! the loop is ready. The run's t0 on the wall clock and the process's CPU
//! time over the run (`measure::clock`) go into its result.
//!
//! A timed run (`--duration`) stops firing at t0 + duration: a request whose
//! target (or concurrency permit) comes later is not sent. Requests in
//! flight then run on, for at most the grace period: one still running at
//! t0 + duration + grace is cancelled (its deadline is set to that instant
//! when fired) and recorded with status `CUT`, which the statistics count
//! apart from failures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::client::call::execute;
use crate::client::pool::{ConnPeak, Pool};
use crate::error::Error;
use crate::measure::clock;
use crate::measure::progress::Live;
use crate::measure::session::{SessionRun, SessionSpec};
use crate::record::{RequestRecord, Slot};
use crate::workload::feed::RequestFeed;
use crate::workload::schedule::{fire_at, precise_sleeps, Plan};
use crate::workload::PreparedRequest;

/// The status of a request cut at the end of a timed run.
pub const CUT: &str = "CUT";

/// A run's requests: built before it (a counted run) or one at a time (a
/// timed run).
#[derive(Debug)]
pub enum Requests {
    /// Every request, in firing order.
    Built(std::vec::IntoIter<PreparedRequest>),
    /// Built as the run goes.
    Fed(Box<RequestFeed>),
}

impl Requests {
    /// Every request of a counted run.
    pub fn built(requests: Vec<PreparedRequest>) -> Requests {
        Requests::Built(requests.into_iter())
    }

    /// The next request, or why none can be built.
    fn next_request(&mut self) -> Result<Option<PreparedRequest>, String> {
        match self {
            Requests::Built(it) => Ok(it.next()),
            Requests::Fed(feed) => feed.next_request().map_err(|e| e.to_string()),
        }
    }

    /// Requests left unsent (a counted run; a timed run has no such count).
    fn left(&self) -> usize {
        match self {
            Requests::Built(it) => it.len(),
            Requests::Fed(_) => 0,
        }
    }
}

/// t0 is this far after the firing loop starts, so request 0 is fired on the
/// same precise path as every other request.
const START_LEAD: Duration = Duration::from_millis(5);
/// Submissions seen before the submit lag limit can stop a run.
pub const LAG_MIN_SAMPLES: usize = 50;

/// Counts submissions later than a limit, to stop a run whose client cannot
/// keep up (submit lag p99 beyond the limit).
#[derive(Debug)]
pub struct LagWatch {
    /// The limit.
    limit: Duration,
    /// Submissions observed.
    seen: AtomicUsize,
    /// Of those, later than `limit`.
    late: AtomicUsize,
}

impl LagWatch {
    /// A watch with this limit.
    pub fn new(limit: Duration) -> LagWatch {
        LagWatch {
            limit,
            seen: AtomicUsize::new(0),
            late: AtomicUsize::new(0),
        }
    }

    /// Counts one submission's lag.
    pub fn observe(&self, lag: Duration) {
        if lag > self.limit {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
    }

    /// The reason to stop, once the p99 is beyond the limit.
    pub fn tripped(&self) -> Option<String> {
        let seen = self.seen.load(Ordering::Relaxed);
        let late = self.late.load(Ordering::Relaxed);
        (seen >= LAG_MIN_SAMPLES && late * 100 > seen).then(|| {
            format!(
                "stopped early: submit lag p99 above {:.1} ms ({late} of {seen} submissions late); \
                 the client is the bottleneck at this rate",
                self.limit.as_secs_f64() * 1e3
            )
        })
    }
}

/// What one run does.
#[derive(Debug)]
pub struct RunSpec {
    /// Run number.
    pub run: usize,
    /// Warmup (unmeasured) or measured.
    pub warmup: bool,
    /// When each request fires.
    pub plan: Plan,
    /// The requests, in firing order.
    pub requests: Requests,
    /// A timed run: fire until t0 + this.
    pub until: Option<Duration>,
    /// A timed run: cut requests still running at t0 + this.
    pub cut_at: Option<Duration>,
    /// `--turns`: each fired request opens a session.
    pub sessions: Option<SessionSpec>,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--timeout` per request.
    pub timeout: Duration,
    /// Stop firing when the submit lag p99 passes this.
    pub max_submit_lag: Option<Duration>,
    /// Live counters for the progress view.
    pub live: Option<Arc<Live>>,
    /// Fire request 0 at this instant (`--start-at`) rather than right away.
    pub start: Option<Instant>,
}

/// The outcome of one run.
#[derive(Debug)]
pub struct RunResult {
    /// Run number.
    pub run: usize,
    /// Warmup or measured.
    pub warmup: bool,
    /// One record per request, in firing order.
    pub records: Vec<RequestRecord>,
    /// The target URLs, in the order given (for the per-target figures).
    pub targets: Vec<String>,
    /// Peak in-flight streams of each connection.
    pub conn_peaks: Vec<ConnPeak>,
    /// Why the run stopped before firing every request, if it did.
    pub stopped_early: Option<String>,
    /// Requests not fired because of that.
    pub unsent: usize,
    /// A timed run's duration.
    pub duration: Option<Duration>,
    /// The run's t0 on the wall clock, Unix seconds.
    pub t0_unix_s: f64,
    /// The process's CPU time (user + system) from the run's start to its
    /// end, if the platform tells.
    pub client_cpu: Option<Duration>,
}

/// Runs one run to its end (every request finished or failed).
pub async fn run_once(pool: Arc<Pool>, spec: RunSpec) -> Result<RunResult, Error> {
    let (run, warmup, duration) = (spec.run, spec.warmup, spec.until);
    pool.reset_peaks();
    let handle = Handle::current();
    let cpu_before = clock::process_cpu();
    let (tx, rx) = oneshot::channel();
    let fire_pool = pool.clone();
    std::thread::Builder::new()
        .name("loadgen-fire".into())
        .spawn(move || {
            precise_sleeps();
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map(|rt| rt.block_on(fire(handle, fire_pool, spec)));
            // The receiver only goes away if the benchmark was dropped.
            let _ = tx.send(result);
        })
        .map_err(|e| Error::Internal(format!("cannot start the firing thread: {e}")))?;
    let fired = rx
        .await
        .map_err(|_| Error::Internal("the firing thread ended without a result".into()))?
        .map_err(|e| Error::Internal(format!("cannot build the firing runtime: {e}")))?;

    let mut records = Vec::with_capacity(fired.tasks.len());
    for task in fired.tasks {
        let done = task
            .await
            .map_err(|e| Error::Internal(format!("a request task failed: {e}")))?;
        records.extend(done);
    }
    let client_cpu = clock::process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    Ok(RunResult {
        run,
        warmup,
        records,
        targets: pool.urls(),
        conn_peaks: pool.peaks(),
        stopped_early: fired.stopped_early,
        unsent: fired.unsent,
        duration,
        t0_unix_s: fired.t0_unix_s,
        client_cpu,
    })
}

/// What the firing loop started.
struct Fired {
    /// One task per fired request (or session), with its records.
    tasks: Vec<JoinHandle<Vec<RequestRecord>>>,
    /// Set when the lag watch stopped the loop.
    stopped_early: Option<String>,
    /// Requests not fired.
    unsent: usize,
    /// t0 on the wall clock.
    t0_unix_s: f64,
}

/// The firing loop (on the dedicated thread): waits for each request's target,
/// takes a concurrency permit, spawns the request on the main runtime.
async fn fire(handle: Handle, pool: Arc<Pool>, spec: RunSpec) -> Fired {
    let semaphore = spec.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let watch = spec.max_submit_lag.map(|l| Arc::new(LagWatch::new(l)));
    let mut requests = spec.requests;
    let mut stopped_early = None;
    let t0 = start_instant(spec.start, spec.run);
    let t0_unix_s = clock::unix_at(t0);
    let until = spec.until.map(|d| t0 + d);
    let cut_at = spec.cut_at.map(|d| t0 + d);
    let mut next_relative = t0;
    let mut tasks = Vec::new();
    let sessions = spec.sessions.map(|s| {
        Arc::new(SessionRun {
            spec: s,
            pool: pool.clone(),
            until,
            live: spec.live.clone(),
        })
    });
    for index in 0.. {
        if let Some(reason) = watch.as_ref().and_then(|w| w.tripped()) {
            tracing::warn!(run = spec.run, fired = index, "{reason}");
            stopped_early = Some(reason);
            break;
        }
        let prepared = match requests.next_request() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                stopped_early = Some(format!("stopped: request {index} could not be built: {e}"));
                break;
            }
        };
        let intended = match &spec.plan {
            Plan::Absolute(offsets) => match offsets.get(index) {
                Some(o) => t0 + *o,
                // A timed burst: every request at t0, as permits allow.
                None if offsets.is_empty() => t0,
                // A timed run's arrivals are over.
                None => break,
            },
            Plan::Relative { .. } => next_relative,
        };
        if until.is_some_and(|u| intended >= u) {
            break;
        }
        fire_at(intended).await;
        // acquire_owned fails only on a closed semaphore; this one never closes.
        let permit = match &semaphore {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let slot = Slot {
            run: spec.run,
            warmup: spec.warmup,
            index,
            t0,
            intended,
            fired: Instant::now(),
        };
        let lease = pool.pick(index);
        let (submitted_tx, submitted_rx) = match spec.plan {
            Plan::Relative { .. } => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            Plan::Absolute(_) => (None, None),
        };
        let ctx = TaskCtx {
            watch: watch.clone(),
            live: spec.live.clone(),
            sessions: sessions.clone(),
            limits: (spec.timeout, cut_at),
        };
        tasks.push(handle.spawn(ctx.run(lease, prepared, slot, submitted_tx, permit)));
        if let (Plan::Relative { interval }, Some(rx)) = (&spec.plan, submitted_rx) {
            // The sender is dropped without sending only if the task died.
            let submit_end = rx.await.unwrap_or_else(|_| Instant::now());
            next_relative = submit_end + *interval;
        }
    }
    Fired {
        tasks,
        stopped_early,
        unsent: requests.left(),
        t0_unix_s,
    }
}

/// The run's t0: [`START_LEAD`] from now, or the start instant asked for if
/// that is later (one already too close or past is missed, with a warning).
fn start_instant(start: Option<Instant>, run: usize) -> Instant {
    let soonest = Instant::now() + START_LEAD;
    match start {
        Some(s) if s >= soonest => s,
        Some(s) => {
            let late = soonest.duration_since(s).as_secs_f64() * 1e3;
            tracing::warn!(
                run,
                late_ms = late,
                "--start-at missed: the run was ready {late:.1} ms too late; it starts now"
            );
            soonest
        }
        None => soonest,
    }
}

/// What each request task shares with the firing loop.
struct TaskCtx {
    /// The submit lag limit's counters.
    watch: Option<Arc<LagWatch>>,
    /// The live view's counters.
    live: Option<Arc<Live>>,
    /// `--turns`: the request opens a session.
    sessions: Option<Arc<SessionRun>>,
    /// `--timeout` and the timed run's cut.
    limits: (Duration, Option<Instant>),
}

impl TaskCtx {
    /// The request (or session) fired at `slot`, to its end; the permit is
    /// held until then.
    async fn run(
        self,
        lease: crate::client::pool::Lease,
        prepared: PreparedRequest,
        slot: Slot,
        submitted: Option<oneshot::Sender<Instant>>,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Vec<RequestRecord> {
        if let Some(w) = &self.watch {
            w.observe(slot.intended.elapsed());
        }
        let limits = self.limits;
        let records = match &self.sessions {
            Some(s) => {
                let mut submitted = submitted;
                let send = |lease, prepared, slot| {
                    send_one(lease, prepared, slot, limits, submitted.take())
                };
                s.run(lease, prepared, slot, send).await
            }
            None => {
                let r = send_one(lease, prepared, slot, limits, submitted).await;
                if let Some(l) = &self.live {
                    l.finished(&r);
                }
                vec![r]
            }
        };
        drop(permit);
        records
    }
}

/// Sends one request with its deadline (`--timeout`, or the timed run's
/// cut when that comes first); a request ended by the cut is `CUT`.
async fn send_one(
    lease: crate::client::pool::Lease,
    prepared: PreparedRequest,
    slot: Slot,
    (timeout, cut_at): (Duration, Option<Instant>),
    submitted: Option<oneshot::Sender<Instant>>,
) -> RequestRecord {
    let (timeout, cut) = deadline(timeout, cut_at);
    let mut record = execute(lease, prepared, slot, timeout, submitted).await;
    if cut && !record.ok && record.status == "DEADLINE_EXCEEDED" {
        record.status = CUT.to_string();
    }
    record
}

/// A request's timeout from now, and whether it is the timed run's cut
/// (earlier than `--timeout` would end it) rather than its own deadline.
fn deadline(timeout: Duration, cut_at: Option<Instant>) -> (Duration, bool) {
    let now = Instant::now();
    match cut_at {
        Some(c) if c < now + timeout => (c.saturating_duration_since(now), true),
        _ => (timeout, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_wins_only_when_it_comes_first() {
        let t = Duration::from_secs(300);
        assert_eq!(deadline(t, None), (t, false));
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(deadline(t, Some(far)), (t, false));
        let (left, cut) = deadline(t, Some(Instant::now() + Duration::from_secs(2)));
        assert!(cut && left <= Duration::from_secs(2));
    }

    #[test]
    fn lag_watch_trips_on_the_p99() {
        let w = LagWatch::new(Duration::from_millis(10));
        for _ in 0..49 {
            w.observe(Duration::from_millis(50));
        }
        assert!(w.tripped().is_none(), "too few samples");
        let w = LagWatch::new(Duration::from_millis(10));
        for i in 0..200 {
            // 2 of 200 late = 1%: the p99 is not beyond the limit yet.
            w.observe(Duration::from_millis(if i < 2 { 11 } else { 10 }));
        }
        assert!(w.tripped().is_none());
        w.observe(Duration::from_millis(11));
        let reason = w.tripped().expect("3 of 201 late is over 1%");
        assert!(reason.contains("client is the bottleneck"), "{reason}");
    }
}
