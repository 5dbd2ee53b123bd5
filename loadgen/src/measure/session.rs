//! Multi-turn sessions (`--turns`): a fired request opens a session, whose
//! task then sends its later turns itself, each after the previous reply
//! and the think time, each carrying the whole history (every message and
//! reply so far) plus a new message, all on the first turn's target. A
//! session ends early when a turn fails, or (a timed run) when the run's
//! time is up before its next turn. With `--max-concurrency`, a permit is
//! held for the whole session: the limit counts sessions.
//!
//! Later turns' messages come from the workload like any request's (the
//! prompt source, unique with the nonce), as turn `t` of session `s`:
//! label `<run>.t<t>`, index `s`, so request ids stay distinct.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::pool::{Lease, Pool};
use crate::measure::progress::Live;
use crate::record::{RequestRecord, Slot};
use crate::workload::turns::Message;
use crate::workload::{PreparedRequest, Prompt, Workload};

/// `--turns` and `--think-time-ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sessions {
    /// Turns per session (> 1).
    pub turns: usize,
    /// The wait after a reply before the next turn.
    pub think: Duration,
}

/// The sessions of one run, as the session layer gets them.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// Turns and think time.
    pub sessions: Sessions,
    /// Builds the later turns' messages.
    pub workload: Arc<Workload>,
    /// The run's label.
    pub label: String,
}

/// What every session of a run shares.
#[derive(Debug, Clone)]
pub struct SessionRun {
    /// Turns, think time, the workload, the label.
    pub spec: SessionSpec,
    /// The connections (later turns pick on the session's target).
    pub pool: Arc<Pool>,
    /// A timed run's end: no turn starts after it.
    pub until: Option<Instant>,
    /// The live view's counters.
    pub live: Option<Arc<Live>>,
}

impl SessionRun {
    /// Runs session `slot.index` from its first request on `lease`; `send`
    /// sends one turn. Returns every turn's record, in order.
    pub async fn run<F, Fut>(
        &self,
        lease: Lease,
        first: PreparedRequest,
        slot: Slot,
        mut send: F,
    ) -> Vec<RequestRecord>
    where
        F: FnMut(Lease, PreparedRequest, Slot) -> Fut,
        Fut: std::future::Future<Output = RequestRecord>,
    {
        let (s, turns) = (slot.index, self.spec.sessions.turns);
        let target = lease.target_index;
        let mut history = match &first.prompt {
            Prompt::Turns(m) => m.clone(),
            _ => Vec::new(),
        };
        let mut rng = self
            .spec
            .workload
            .run_rng(&format!("{}.s{s}", self.spec.label));
        let (mut lease, mut prepared) = (Some(lease), first);
        let mut records = Vec::with_capacity(turns);
        for t in 0..turns {
            let index = s * turns + t;
            let at = if t == 0 {
                Slot { index, ..slot }
            } else {
                let now = Instant::now();
                Slot {
                    index,
                    intended: now,
                    fired: now,
                    ..slot
                }
            };
            let l = lease
                .take()
                .unwrap_or_else(|| self.pool.pick_on(target, index));
            let mut record = send(l, prepared, at).await;
            let reply = record.reply.take().unwrap_or_default();
            let ok = record.ok;
            if let Some(live) = &self.live {
                live.finished(&record);
            }
            records.push(record);
            if !ok || t + 1 == turns {
                break;
            }
            tokio::time::sleep(self.spec.sessions.think).await;
            if self.until.is_some_and(|u| Instant::now() >= u) {
                break;
            }
            let label = format!("{}.t{}", self.spec.label, t + 1);
            let next = match self.spec.workload.request(&label, s, &mut rng) {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(session = s, turn = t + 1, error = %e, "a turn could not be built");
                    break;
                }
            };
            history.push(Message::assistant(reply));
            if let Prompt::Turns(new) = &next.prompt {
                history.extend(new.iter().cloned());
            }
            prepared = PreparedRequest {
                prompt: Prompt::Turns(history.clone()),
                // The server counts the whole history.
                prompt_tokens: None,
                ..next
            };
        }
        records
    }
}
