//! The live view on stderr: a progress bar when stderr is a terminal
//! (requests done/failed, tokens/s, elapsed, ETA), a periodic one-line status
//! otherwise. The request tasks count into [`Live`]; a ticker task renders it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::ProgressMode;
use crate::record::RequestRecord;

/// How often the bar is redrawn.
const BAR_TICK: Duration = Duration::from_millis(200);
/// Width of the bar in characters.
const BAR_WIDTH: usize = 24;

/// Counters the request tasks update as they finish.
#[derive(Debug)]
pub struct Live {
    /// Requests in the run (a timed run: its cap).
    total: usize,
    /// A timed run's duration (the bar then shows time, not requests).
    duration: Option<Duration>,
    /// Requests finished (OK or not).
    done: AtomicUsize,
    /// Requests that failed.
    failed: AtomicUsize,
    /// Completion tokens received so far by finished requests.
    tokens: AtomicU64,
    /// When the run started.
    start: Instant,
}

/// A consistent-enough copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Requests in the run.
    pub total: usize,
    /// A timed run's duration.
    pub duration: Option<Duration>,
    /// Finished.
    pub done: usize,
    /// Failed.
    pub failed: usize,
    /// Completion tokens.
    pub tokens: u64,
    /// Since the run started.
    pub elapsed: Duration,
}

impl Live {
    /// Counters for a run of `total` requests (or of `duration`) starting
    /// now.
    pub fn new(total: usize, duration: Option<Duration>) -> Live {
        Live {
            total,
            duration,
            done: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            tokens: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// Counts a finished request.
    pub fn finished(&self, r: &RequestRecord) {
        self.tokens
            .fetch_add(u64::from(r.completion_tokens), Ordering::Relaxed);
        if !r.ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            total: self.total,
            duration: self.duration,
            done: self.done.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            elapsed: self.start.elapsed(),
        }
    }
}

impl Snapshot {
    fn tokens_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.tokens as f64 / s
        } else {
            0.0
        }
    }

    /// Remaining time at the rate so far (a timed run: until its end);
    /// `None` before the first finish.
    pub fn eta(&self) -> Option<Duration> {
        if let Some(d) = self.duration {
            return Some(d.saturating_sub(self.elapsed));
        }
        (self.done > 0).then(|| {
            let left = self.total.saturating_sub(self.done) as f64;
            Duration::from_secs_f64(self.elapsed.as_secs_f64() * left / self.done as f64)
        })
    }

    fn counts(&self) -> String {
        let eta = self
            .eta()
            .map_or("?".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
        if let Some(d) = self.duration {
            return format!(
                "{} done, {} failed | {:.1} tok/s | {:.1} of {:.1} s",
                self.done,
                self.failed,
                self.tokens_per_s(),
                self.elapsed.as_secs_f64(),
                d.as_secs_f64()
            );
        }
        format!(
            "{}/{} done, {} failed | {:.1} tok/s | {:.1} s elapsed | ETA {eta}",
            self.done,
            self.total,
            self.failed,
            self.tokens_per_s(),
            self.elapsed.as_secs_f64()
        )
    }

    /// The bar line (no newline), e.g. `r0 [#####-----] 5/10 done, ...`.
    pub fn bar(&self, label: &str) -> String {
        let filled = match self.duration {
            Some(d) => {
                (self.elapsed.as_secs_f64() / d.as_secs_f64().max(1e-9) * BAR_WIDTH as f64) as usize
            }
            None => (self.done * BAR_WIDTH)
                .checked_div(self.total)
                .unwrap_or(BAR_WIDTH),
        }
        .min(BAR_WIDTH);
        format!(
            "{label} [{}{}] {}",
            "#".repeat(filled),
            "-".repeat(BAR_WIDTH - filled),
            self.counts()
        )
    }

    /// The periodic status line.
    pub fn line(&self, label: &str) -> String {
        format!("loadgen {label}: {}", self.counts())
    }
}

/// The ticker of one run; [`finish`](Progress::finish) draws the last state.
#[derive(Debug)]
pub struct Progress {
    /// Shared with the request tasks.
    pub live: Arc<Live>,
    /// Stops the ticker.
    stop: Option<oneshot::Sender<()>>,
    /// The ticker task.
    join: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts the view of a run of `total` requests named `label`.
    pub fn start(
        mode: ProgressMode,
        interval: Duration,
        (total, duration): (usize, Option<Duration>),
        label: String,
    ) -> Progress {
        let live = Arc::new(Live::new(total, duration));
        let bar = match mode {
            ProgressMode::Off => None,
            ProgressMode::Bar => Some(true),
            ProgressMode::Line => Some(false),
            ProgressMode::Auto => Some(std::io::stderr().is_terminal()),
        };
        let Some(bar) = bar else {
            return Progress {
                live,
                stop: None,
                join: None,
            };
        };
        let (tx, mut rx) = oneshot::channel();
        let tick = if bar { BAR_TICK } else { interval };
        let l = live.clone();
        let join = tokio::spawn(async move {
            let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
            loop {
                tokio::select! {
                    _ = &mut rx => break,
                    _ = timer.tick() => draw(&l.snapshot(), &label, bar, false),
                }
            }
            draw(&l.snapshot(), &label, bar, true);
        });
        Progress {
            live,
            stop: Some(tx),
            join: Some(join),
        }
    }

    /// Stops the ticker after drawing the final state.
    pub async fn finish(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.await;
        }
    }
}

/// Writes one frame: the bar redraws its line in place, the status appends.
fn draw(s: &Snapshot, label: &str, bar: bool, last: bool) {
    let mut err = std::io::stderr().lock();
    // A failed write to stderr has nowhere to be reported.
    let _ = if bar {
        write!(
            err,
            "\r\x1b[2K{}{}",
            s.bar(label),
            if last { "\n" } else { "" }
        )
    } else {
        writeln!(err, "{}", s.line(label))
    };
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(done: usize, failed: usize) -> Snapshot {
        Snapshot {
            total: 10,
            duration: None,
            done,
            failed,
            tokens: 500,
            elapsed: Duration::from_secs(5),
        }
    }

    #[test]
    fn bar_and_line_show_counts_rate_and_eta() {
        let s = snap(5, 1);
        assert_eq!(s.eta(), Some(Duration::from_secs(5)));
        let bar = s.bar("r0");
        assert!(
            bar.starts_with("r0 [############------------] 5/10 done, 1 failed"),
            "{bar}"
        );
        assert!(
            bar.contains("100.0 tok/s")
                && bar.contains("5.0 s elapsed")
                && bar.contains("ETA 5.0 s"),
            "{bar}"
        );
        assert_eq!(snap(0, 0).eta(), None);
        assert!(snap(0, 0).line("r1").contains("ETA ?"));
        assert!(snap(10, 0).bar("x").contains(&"#".repeat(BAR_WIDTH)));
        let timed = Snapshot {
            duration: Some(Duration::from_secs(20)),
            ..snap(3, 0)
        };
        assert_eq!(timed.eta(), Some(Duration::from_secs(15)));
        assert!(
            timed
                .bar("r0")
                .contains("[######------------------] 3 done")
                && timed.bar("r0").contains("5.0 of 20.0 s"),
            "{}",
            timed.bar("r0")
        );
    }

    #[test]
    fn live_counts_finished_requests() {
        let live = Live::new(3, None);
        let mut r = crate::record::tests::record(vec![1, 2, 3], Some(1));
        live.finished(&r);
        r.ok = false;
        r.completion_tokens = 1;
        live.finished(&r);
        let s = live.snapshot();
        assert_eq!((s.done, s.failed, s.tokens), (2, 1, 4));
    }
}
