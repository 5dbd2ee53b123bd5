//! The one timeline both of the mock's doors follow, so a request costs the
//! same on gRPC and on HTTP and `loadgen calibrate` measures the transport,
//! not two different mocks.
//!
//! Per request, on the mock's monotonic clock from `received` (the handler
//! was entered): the body is parsed (`tokenized`), the handler sleeps the
//! configured submit delay (`enqueued`), waits for a slot if the mock has
//! `slots` (`admitted`), then emits token i at exactly `ttft + i * itl` after
//! `received` (after `admitted` with slots), with absolute sleeps so jitter
//! never accumulates. [`Marks::timing`] is the `ServerTiming` of what it
//! actually did, which both doors send back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::ServerTiming;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::mock::config::MockConfig;
use crate::mock::prefix::PrefixCache;

/// State shared by both doors of one mock server.
#[derive(Debug)]
pub(crate) struct Shared {
    /// What the mock does with each request.
    pub cfg: MockConfig,
    /// Requests received so far, both doors together (1-based arrival numbers
    /// decide which request `fail_every` rejects).
    pub received: Arc<AtomicUsize>,
    /// `slots` permits, if limited; held from admission to the last token.
    pub slots: Option<Arc<Semaphore>>,
    /// Whether health says SERVING (gRPC health and HTTP `/health` alike).
    pub serving: AtomicBool,
    /// Requests generating now (`vllm:num_requests_running` on `/metrics`).
    pub running: AtomicUsize,
    /// Requests waiting for a slot (`vllm:num_requests_waiting`).
    pub waiting: AtomicUsize,
    /// The prompts seen, in blocks.
    pub prefix: PrefixCache,
}

/// Counts a request in one state for as long as it lives.
struct InState<'a>(&'a AtomicUsize);

impl<'a> InState<'a> {
    fn enter(count: &'a AtomicUsize) -> InState<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        InState(count)
    }
}

impl Drop for InState<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    /// The state of a mock with this configuration (not yet serving).
    pub fn new(cfg: MockConfig) -> Shared {
        Shared {
            slots: cfg.slots.map(|n| Arc::new(Semaphore::new(n))),
            cfg,
            received: Arc::new(AtomicUsize::new(0)),
            serving: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            prefix: PrefixCache::default(),
        }
    }

    /// The mock's state in Prometheus' text format, with vLLM's names (as
    /// Ember exports them): running, waiting, a KV usage of running / slots,
    /// no preemptions.
    pub fn metrics(&self) -> String {
        let running = self.running.load(Ordering::Acquire);
        let waiting = self.waiting.load(Ordering::Acquire);
        let capacity = self.cfg.slots.unwrap_or(1000).max(1);
        let kv = (running as f64 / capacity as f64).min(1.0);
        format!(
            "# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"mock\"}} {running}\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"mock\"}} {waiting}\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{model_name=\"mock\"}} {kv}\n\
             # TYPE vllm:num_preemptions_total counter\n\
             vllm:num_preemptions_total{{model_name=\"mock\"}} 0\n\
             # TYPE vllm:prefix_cache_queries_total counter\n\
             vllm:prefix_cache_queries_total{{model_name=\"mock\"}} {queries}\n\
             # TYPE vllm:prefix_cache_hits_total counter\n\
             vllm:prefix_cache_hits_total{{model_name=\"mock\"}} {hits}\n",
            queries = self.prefix.queries.load(Ordering::Relaxed),
            hits = self.prefix.hits.load(Ordering::Relaxed),
        )
    }

    /// Counts a request in; its 1-based arrival number.
    pub fn arrive(&self) -> usize {
        self.received.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether request number `n` is one `fail_every` rejects.
    pub fn rejects(&self, n: usize) -> bool {
        self.cfg.fail_every.is_some_and(|k| n.is_multiple_of(k))
    }

    /// Tokens a request asking for `max` actually streams before the mock's
    /// engine "fails" (`fail_after_tokens`), and whether it fails.
    pub fn tokens_for(&self, max: u32) -> (u32, bool) {
        match self.cfg.fail_after_tokens {
            Some(k) if k < max => (k, true),
            _ => (max, false),
        }
    }
}

/// Nanoseconds of a duration (saturating).
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// When (since it was received) a mock request passed each stage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marks {
    /// Body parsed, prompt counted.
    pub tokenized: Duration,
    /// After the submit delay: the request is "queued".
    pub enqueued: Duration,
    /// A slot was free (= enqueued without slots).
    pub admitted: Duration,
    /// Token 0 was handed to the transport.
    pub first: Duration,
    /// The last token was handed to the transport.
    pub last: Duration,
    /// The final message was built.
    pub finished: Duration,
    /// Leading prompt tokens found in the prefix cache.
    pub cached: u32,
}

impl Marks {
    /// The breakdown the real server would report for these moments.
    pub fn timing(&self, iteration: u64) -> ServerTiming {
        ServerTiming {
            tokenize_ns: ns(self.tokenized),
            enqueue_ns: ns(self.enqueued.saturating_sub(self.tokenized)),
            queue_wait_ns: ns(self.admitted.saturating_sub(self.enqueued)),
            prefill_to_first_token_ns: ns(self.first.saturating_sub(self.admitted)),
            server_ttft_ns: ns(self.first),
            decode_ns: ns(self.last.saturating_sub(self.first)),
            total_ns: ns(self.finished),
            prefill_batch_size: 1,
            admitted_iteration: iteration,
            tokenized_at_ns: ns(self.tokenized),
            enqueued_at_ns: ns(self.enqueued),
            admitted_at_ns: ns(self.admitted),
            first_token_at_ns: ns(self.first),
            finished_at_ns: ns(self.finished),
            cached_prompt_tokens: self.cached,
            prefill_chunks: 1,
            // The mock never runs short of KV: nothing is preempted.
            preemptions: 0,
            preempted_ns: 0,
        }
    }
}

/// What the producer of a request tells its door, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A slot was free this long after `received`.
    Admitted(Duration),
    /// Token i is due now.
    Token(u32),
    /// Every token was sent: finish normally.
    Done,
    /// The engine "failed" after this many tokens.
    Failed(u32),
}

/// Runs one request's timeline: waits for a slot, then sends `Token(i)` when
/// token i is due, then `Done` (or `Failed` with `fails`). Returns early
/// when the door's receiver is gone (the client left).
pub(crate) async fn drive(
    shared: &Shared,
    received: Instant,
    tokens: u32,
    fails: bool,
    tx: mpsc::Sender<Step>,
) {
    // Held until the last token is sent; the semaphore never closes.
    let waiting = InState::enter(&shared.waiting);
    let _slot = match &shared.slots {
        Some(s) => s.clone().acquire_owned().await.ok(),
        None => None,
    };
    drop(waiting);
    let _running = InState::enter(&shared.running);
    let admitted = received.elapsed();
    if tx.send(Step::Admitted(admitted)).await.is_err() {
        return;
    }
    // Without slots the timeline runs from `received`, exactly as configured.
    let base = if shared.slots.is_some() {
        received + admitted
    } else {
        received
    };
    let cfg = &shared.cfg;
    for i in 0..tokens {
        tokio::time::sleep_until(base + cfg.ttft + cfg.itl * i).await;
        if tx.send(Step::Token(i)).await.is_err() {
            return;
        }
    }
    let last = if fails {
        Step::Failed(tokens)
    } else {
        Step::Done
    };
    let _ = tx.send(last).await;
}

/// A request's marks as its door hands each token to the transport: a token
/// is stamped when the door takes it for the socket (hyper polls the SSE
/// body, tonic polls the response stream), so the time a busy mock spends
/// between "due" and "written" is the mock's own and never shows up as the
/// client's error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamps {
    /// The handler was entered.
    pub received: Instant,
    /// tokenized, enqueued (the handler's own marks).
    pub handler: (Duration, Duration),
    /// From `Step::Admitted`.
    pub admitted: Duration,
    /// The first token's stamp.
    pub first: Option<Duration>,
    /// The last token's stamp.
    pub last: Duration,
    /// Leading prompt tokens found in the prefix cache.
    pub cached: u32,
}

impl Stamps {
    /// Marks of a request received at `received` with the handler's marks.
    pub fn new(received: Instant, handler: (Duration, Duration)) -> Stamps {
        Stamps {
            received,
            handler,
            admitted: handler.1,
            first: None,
            last: Duration::ZERO,
            cached: 0,
        }
    }

    /// Stamps a token handed to the transport now; its time since received.
    pub fn token(&mut self) -> Duration {
        let t = self.received.elapsed();
        self.first.get_or_insert(t);
        self.last = t;
        t
    }

    /// The marks so far, finished now.
    pub fn marks(&self) -> Marks {
        Marks {
            tokenized: self.handler.0,
            enqueued: self.handler.1,
            admitted: self.admitted,
            first: self.first.unwrap_or_default(),
            last: self.last,
            finished: self.received.elapsed(),
            cached: self.cached,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_adds_up() {
        let ms = Duration::from_millis;
        let m = Marks {
            tokenized: ms(1),
            enqueued: ms(3),
            admitted: ms(7),
            first: ms(20),
            last: ms(50),
            finished: ms(51),
            cached: 16,
        };
        let t = m.timing(4);
        assert_eq!(
            t.tokenize_ns + t.enqueue_ns + t.queue_wait_ns + t.prefill_to_first_token_ns,
            t.server_ttft_ns
        );
        assert_eq!(t.decode_ns, ns(ms(30)));
        assert_eq!((t.enqueued_at_ns, t.admitted_iteration), (ns(ms(3)), 4));
    }

    #[tokio::test]
    async fn steps_come_on_their_due_times() {
        let shared = Shared::new(MockConfig {
            ttft: Duration::from_millis(30),
            itl: Duration::from_millis(10),
            ..MockConfig::default()
        });
        let received = Instant::now();
        let (tx, mut rx) = mpsc::channel(8);
        drive(&shared, received, 3, true, tx).await;
        assert!(matches!(rx.recv().await, Some(Step::Admitted(_))));
        let mut stamps = Stamps::new(received, Default::default());
        for i in 0..3u32 {
            assert_eq!(rx.recv().await, Some(Step::Token(i)));
            let t = stamps.token();
            let due = Duration::from_millis(30 + 10 * u64::from(i));
            assert!(t >= due, "{i}: {t:?}");
        }
        assert_eq!(rx.recv().await, Some(Step::Failed(3)));
        let m = stamps.marks();
        assert!(m.first >= Duration::from_millis(30) && m.last >= m.first);
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        drive(&shared, Instant::now(), 3, false, tx).await; // returns at once
    }
}
