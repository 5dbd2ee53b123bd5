//! One benchmark session: the connections, the workload and the report
//! header, and [`Bench::measure`], which fires one run (with the live view),
//! writes its `--requests-out` lines, prints its report block and returns its
//! statistics and records. Plain runs, sweeps and each series of `loadgen
//! compare` are all sequences of it. The session's first run starts at
//! `--start-at` if given (the later ones right after the run before).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::client::grpc::ServerLimits;
use crate::client::pool::Pool;
use crate::error::Error;
use crate::measure::clock;
use crate::measure::progress::Progress;
use crate::measure::runner::{run_once, Requests, RunSpec};
use crate::measure::scrape::Sampler;
use crate::measure::session::SessionSpec;
use crate::measure::stats::{Measured, RunStats};
use crate::modes::setup::BenchConfig;
use crate::report::json::RequestsOut;
use crate::report::model::Header;
use crate::report::text;
use crate::workload::feed::RequestFeed;
use crate::workload::schedule::{
    fixed_offsets, offsets_until, requests_per_run, ArrivalConfig, Plan,
};
use crate::workload::Workload;

/// What the benchmark found, for the binary's exit code.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// Requests sent, warmups included.
    pub requests: usize,
    /// Requests that failed, warmups included.
    pub failed: usize,
}

/// The state shared by every run of a session.
#[derive(Debug)]
pub struct Bench<'a> {
    /// The settings.
    pub args: &'a BenchConfig,
    /// The connections, opened once.
    pool: Arc<Pool>,
    /// Builds each run's requests.
    workload: Arc<Workload>,
    /// What every report block says about the setup.
    pub header: Header,
    /// `--requests-out`, appended after each run.
    requests_out: Option<RequestsOut>,
    /// Requests sent and failed so far, for the exit code.
    pub outcome: Outcome,
    /// Requests per run.
    pub requests_per_run: usize,
    /// `loadgen compare`: the series name its records carry.
    series: Option<String>,
    /// `--start-at`, until the first run takes it.
    start_at: Option<f64>,
}

/// How one run is fired.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// Goes into request ids: `w0`, `r1`, `s3`.
    pub label: String,
    /// Run number (warmups and measured runs count separately).
    pub run: usize,
    /// Of how many (for the report's `Run: k/of`).
    pub of: usize,
    /// A warmup run (one report line, not in the statistics).
    pub warmup: bool,
    /// The request rate (None: the flags' own plan).
    pub rate: Option<f64>,
    /// Fire everything at t0, whatever the flags say (sweep baseline and
    /// saturation runs).
    pub burst: bool,
    /// In-flight cap.
    pub max_concurrency: Option<usize>,
    /// Stop firing when the submit lag p99 passes this.
    pub max_submit_lag: Option<Duration>,
}

/// The arrival plan of a run of `n` requests (a timed run: the arrivals
/// before its end, at most `n`).
fn plan(
    arrivals: &ArrivalConfig,
    n: usize,
    rate: Option<f64>,
    entries: Option<&[crate::workload::dataset::Entry]>,
) -> Result<Plan, Error> {
    match arrivals.duration {
        Some(d) => Ok(match Plan::new(arrivals, 0, rate, entries)? {
            Plan::Absolute(_) => Plan::Absolute(offsets_until(arrivals, rate, d, n)),
            relative => relative,
        }),
        None => Plan::new(arrivals, n, rate, entries),
    }
}

/// The schedule in words; a timed run says for how long.
fn describe(plan: &Plan, arrivals: &ArrivalConfig, rate: Option<f64>) -> String {
    let what = plan.describe(arrivals, rate);
    match arrivals.duration {
        Some(d) => format!(
            "{what}, for {:.1} s (then up to {:.1} s for requests in flight, the rest cut)",
            d.as_secs_f64(),
            arrivals.grace.as_secs_f64()
        ),
        None => what,
    }
}

/// What each request asks for, in words (the report's `Request shape`).
pub fn request_shape(args: &BenchConfig, limits: Option<ServerLimits>) -> String {
    let w = &args.workload;
    let mut parts = vec![if w.stream {
        "streaming".to_string()
    } else {
        "non-streaming (one body: TTFT = latency; TPOT from the server's timing)".to_string()
    }];
    if let Some((len, k)) = w.shared_prefix {
        parts.push(format!(
            "shared prefixes: {k} x {len} tokens, then a unique suffix"
        ));
    }
    if let Some(s) = args.sessions {
        parts.push(format!(
            "sessions of {} turns (each with the whole history), {:.0} ms think time, pinned to a target",
            s.turns,
            s.think.as_secs_f64() * 1e3
        ));
    }
    parts.push(match (w.max_new_tokens, limits) {
        (Some(n), _) => format!("max_new_tokens {n}"),
        (None, Some(l)) => format!(
            "max_new_tokens none: the server's limit ({}) fitted to its context ({}) after the prompt",
            l.max_new_tokens, l.context
        ),
        (None, None) => "no max_tokens sent (the server decides)".to_string(),
    });
    parts.join(", ")
}

impl<'a> Bench<'a> {
    /// Loads the workload (a bad dataset fails here) and opens the
    /// connections to `targets`; `series` names the series (compare).
    pub async fn connect(
        args: &'a BenchConfig,
        targets: &[String],
        requests_out: Option<RequestsOut>,
        series: Option<String>,
    ) -> Result<Bench<'a>, Error> {
        let workload = Arc::new(Workload::new(&args.workload)?);
        let arrivals = &args.arrivals;
        let requests_per_run = requests_per_run(arrivals, workload.entries());
        // A trace that cannot be replayed fails before anything connects.
        let plan = plan(
            arrivals,
            requests_per_run,
            arrivals.request_rate,
            workload.entries(),
        )?;
        let pool = Arc::new(Pool::connect(targets, &args.conn).await?);
        let (model, device) = pool.describe().await;
        let header = Header {
            model,
            device,
            backend: args.conn.describe(),
            request_shape: request_shape(args, pool.server_limits()),
            nonce: args.workload.nonce.clone(),
            targets: targets.len(),
            channels: args.conn.channels,
            http1: pool.is_http1(),
            balance: format!("{:?}", args.conn.balance).to_lowercase(),
            schedule: if args.sweep.active() {
                format!("a sweep of {:?} arrivals", arrivals.arrival).to_lowercase()
            } else {
                describe(&plan, arrivals, arrivals.request_rate)
            },
            absolute: matches!(plan, Plan::Absolute(_)),
            max_concurrency: args.max_concurrency,
            slo: args.slo,
        };
        Ok(Bench {
            args,
            pool,
            workload,
            header,
            requests_out,
            outcome: Outcome::default(),
            requests_per_run,
            series,
            start_at: args.start_at,
        })
    }

    /// Gives back the `--requests-out` file (the next series appends to it).
    pub fn into_requests_out(self) -> Option<RequestsOut> {
        self.requests_out
    }

    /// The target URLs.
    pub fn urls(&self) -> Vec<String> {
        self.pool.urls()
    }

    /// Fires one run, prints its block and returns it.
    pub async fn measure(&mut self, o: RunOpts) -> Result<Measured, Error> {
        let n = self.requests_per_run;
        let args = self.args;
        let arrivals = &args.arrivals;
        let plan = if o.burst {
            Plan::Absolute(fixed_offsets(n, Duration::ZERO))
        } else {
            plan(
                arrivals,
                n,
                o.rate.or(arrivals.request_rate),
                self.workload.entries(),
            )?
        };
        let mut header = self.header.clone();
        header.schedule = if o.burst {
            "0 ms / absolute (burst)".to_string()
        } else {
            describe(&plan, arrivals, o.rate.or(arrivals.request_rate))
        };
        header.max_concurrency = o.max_concurrency;
        let timed = arrivals.duration;
        let progress = Progress::start(
            args.progress,
            args.progress_interval,
            (
                n.saturating_mul(args.sessions.map_or(1, |s| s.turns)),
                timed,
            ),
            o.label.clone(),
        );
        let requests = match timed {
            Some(_) => Requests::Fed(Box::new(RequestFeed::new(
                self.workload.clone(),
                &o.label,
                n,
            ))),
            None => Requests::built(self.workload.build(&o.label, n)?),
        };
        let spec = RunSpec {
            run: o.run,
            warmup: o.warmup,
            plan,
            requests,
            until: timed,
            cut_at: timed.map(|d| d + arrivals.grace),
            sessions: args.sessions.map(|sessions| SessionSpec {
                sessions,
                workload: self.workload.clone(),
                label: o.label.clone(),
            }),
            max_concurrency: o.max_concurrency,
            timeout: args.timeout,
            max_submit_lag: o.max_submit_lag,
            live: Some(progress.live.clone()),
            start: self.start_at.take().map(clock::instant_at),
        };
        tracing::info!(run = %o.label, requests = n, "run starting");
        let sampler = Sampler::start(&args.scrape).await;
        let result = run_once(self.pool.clone(), spec).await;
        let series = match sampler {
            Some(s) => Some(s.finish().await),
            None => None,
        };
        progress.finish().await;
        let mut result = result?;
        if let Some(name) = &self.series {
            for r in &mut result.records {
                r.series = Some(name.clone());
            }
        }
        if let Some(out) = self.requests_out.as_mut() {
            out.write(&result.records)?;
        }
        let requested = if o.burst {
            None
        } else {
            o.rate.or_else(|| arrivals.requested_rate_rps())
        };
        let mut stats = RunStats::from_run(&result, requested, args.slo.as_ref());
        stats.server_metrics = series;
        self.outcome.requests += stats.requests;
        self.outcome.failed += stats.failed;
        let mut stdout = std::io::stdout().lock();
        if o.warmup {
            text::warmup(&mut stdout, &stats, o.of)?;
        } else {
            text::run(&mut stdout, &header, &stats, o.of)?;
        }
        stdout.flush()?;
        Ok(Measured {
            label: o.label,
            stats,
            records: result.records,
        })
    }
}
