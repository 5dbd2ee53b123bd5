//! The checks of the request-shape, timed-run and observation flags
//! (`cli::shape`), each error naming its flag: what cannot be combined,
//! and values out of range.

use crate::cli::Args;
use crate::config::{Arrival, Backend, SubmitSchedule};
use crate::error::Error;

impl Args {
    /// Every check of `shape` and `observe`.
    pub(crate) fn validate_shape(&self) -> Result<(), Error> {
        let shape = &self.shape;
        if !shape.stream && self.conn.backend == Backend::Ember {
            return Err(Error::invalid(
                "--stream",
                "Ember's gRPC API has only the streaming Generate call; --stream false applies to --backend openai",
            ));
        }
        if let Some(n) = &shape.nonce {
            if n.is_empty() || n.chars().any(|c| c.is_whitespace() || c == ']') {
                return Err(Error::invalid(
                    "--nonce",
                    "must be non-empty, without spaces or `]`",
                ));
            }
        }
        self.validate_workload_kind()?;
        self.validate_duration()?;
        self.validate_observe()
    }

    fn validate_workload_kind(&self) -> Result<(), Error> {
        let shape = &self.shape;
        if shape.shared_prefix_len == Some(0) {
            return Err(Error::invalid(
                "--shared-prefix-len",
                "must be >= 1 (got 0)",
            ));
        }
        if shape.num_prefixes == 0 {
            return Err(Error::invalid("--num-prefixes", "must be >= 1 (got 0)"));
        }
        if shape.num_prefixes != 1 && shape.shared_prefix_len.is_none() {
            return Err(Error::invalid(
                "--num-prefixes",
                "applies to a shared-prefix workload; give --shared-prefix-len",
            ));
        }
        if shape.turns == 0 {
            return Err(Error::invalid("--turns", "must be >= 1 (got 0)"));
        }
        if !(shape.think_time_ms.is_finite() && shape.think_time_ms >= 0.0) {
            return Err(Error::invalid(
                "--think-time-ms",
                format!("must be a finite number >= 0 (got {})", shape.think_time_ms),
            ));
        }
        if shape.think_time_ms > 0.0 && shape.turns == 1 {
            return Err(Error::invalid(
                "--think-time-ms",
                "is the wait between turns; give --turns 2 or more",
            ));
        }
        if shape.turns > 1 && (self.sweep.active() || self.arrival == Arrival::Trace) {
            return Err(Error::invalid(
                "--turns",
                "sessions start on the plain schedule: not with a sweep or --arrival trace",
            ));
        }
        if shape.turns > 1 && self.pretok {
            return Err(Error::invalid(
                "--pretok",
                "a session's history is text (each reply is text): not with --turns",
            ));
        }
        Ok(())
    }

    fn validate_duration(&self) -> Result<(), Error> {
        if self.shape.duration.is_none() {
            return Ok(());
        }
        if self.sweep.active() {
            return Err(Error::invalid(
                "--duration",
                "a sweep sets its own runs; not with --sweep or --sweep-rates",
            ));
        }
        if self.arrival == Arrival::Trace {
            return Err(Error::invalid(
                "--duration",
                "--arrival trace replays a fixed list; not with a timed run",
            ));
        }
        let burst = self.arrival == Arrival::Fixed
            && self.submit_schedule == SubmitSchedule::Absolute
            && self.submit_interval_ms == 0.0;
        if burst && self.max_concurrency.is_none() {
            return Err(Error::invalid(
                "--duration",
                "a burst would fire without end: give a rate (--submit-interval-ms, --arrival poisson) or a closed loop (--max-concurrency N)",
            ));
        }
        Ok(())
    }

    fn validate_observe(&self) -> Result<(), Error> {
        let o = &self.observe;
        if let Some(url) = &o.scrape_metrics {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(Error::invalid(
                    "--scrape-metrics",
                    format!("{url}: the scheme must be http:// or https://"),
                ));
            }
        }
        if !(o.scrape_interval_ms.is_finite() && o.scrape_interval_ms > 0.0) {
            return Err(Error::invalid(
                "--scrape-interval-ms",
                format!("must be > 0 (got {})", o.scrape_interval_ms),
            ));
        }
        Ok(())
    }
}
