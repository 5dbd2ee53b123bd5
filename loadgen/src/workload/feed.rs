//! Requests built one at a time, for a timed run (`--duration`): how many a
//! run sends is known only when its time is up, so the firing loop asks for
//! the next request right after firing one (building it while it waits for
//! the next target, not after it). The same requests, in the same order, as
//! `Workload::build` makes for a counted run.

use std::sync::Arc;

use rand::rngs::StdRng;

use crate::error::Error;
use crate::workload::{PreparedRequest, Workload};

/// The requests of one timed run, in firing order.
#[derive(Debug)]
pub struct RequestFeed {
    /// Builds each request.
    workload: Arc<Workload>,
    /// The run's label (request ids, unique prompts).
    label: String,
    /// The run's draws.
    rng: StdRng,
    /// Index of the next request.
    next: usize,
    /// At most this many (`--num-requests` with `--duration`).
    cap: usize,
}

impl RequestFeed {
    /// The feed of run `label`, at most `cap` requests.
    pub fn new(workload: Arc<Workload>, label: &str, cap: usize) -> RequestFeed {
        RequestFeed {
            rng: workload.run_rng(label),
            workload,
            label: label.to_string(),
            next: 0,
            cap,
        }
    }

    /// The next request; `None` once the cap is reached.
    pub fn next_request(&mut self) -> Result<Option<PreparedRequest>, Error> {
        if self.next >= self.cap {
            return Ok(None);
        }
        let r = self
            .workload
            .request(&self.label, self.next, &mut self.rng)?;
        self.next += 1;
        Ok(Some(r))
    }
}
