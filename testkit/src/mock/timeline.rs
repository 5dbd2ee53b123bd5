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

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::ServerTiming;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::mock::config::MockConfig;

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
}

impl Shared {
    /// The state of a mock with this configuration (not yet serving).
    pub fn new(cfg: MockConfig) -> Shared {
        Shared {
            slots: cfg.slots.map(|n| Arc::new(Semaphore::new(n))),
            cfg,
            received: Arc::new(AtomicUsize::new(0)),
            serving: AtomicBool::new(false),
        }
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
            cached_prompt_tokens: 0,
            prefill_chunks: 1,
        }
    }
}

/// Runs one request's tokens: waits for a slot, then calls `emit(i, t)` for
/// token i at its due time (`t` = since `received`). `emit` returns false
/// when the client is gone; then this returns `None`. `tokenized` and
/// `enqueued` are the handler's own marks.
pub(crate) async fn run_tokens<F, Fut>(
    shared: &Shared,
    received: Instant,
    (tokenized, enqueued): (Duration, Duration),
    tokens: u32,
    mut emit: F,
) -> Option<Marks>
where
    F: FnMut(u32, Duration) -> Fut,
    Fut: Future<Output = bool>,
{
    // Held until the last token is sent; the semaphore never closes.
    let _slot = match &shared.slots {
        Some(s) => s.clone().acquire_owned().await.ok(),
        None => None,
    };
    let admitted = received.elapsed();
    // Without slots the timeline runs from `received`, exactly as configured.
    let base = if shared.slots.is_some() {
        received + admitted
    } else {
        received
    };
    let cfg = &shared.cfg;
    let (mut first, mut last) = (None, Duration::ZERO);
    for i in 0..tokens {
        tokio::time::sleep_until(base + cfg.ttft + cfg.itl * i).await;
        let t = received.elapsed();
        if !emit(i, t).await {
            return None;
        }
        first.get_or_insert(t);
        last = t;
    }
    Some(Marks {
        tokenized,
        enqueued,
        admitted,
        first: first.unwrap_or_default(),
        last,
        finished: received.elapsed(),
    })
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
    async fn tokens_come_on_their_due_times() {
        let shared = Shared::new(MockConfig {
            ttft: Duration::from_millis(30),
            itl: Duration::from_millis(10),
            ..MockConfig::default()
        });
        let received = Instant::now();
        let mut seen = Vec::new();
        let marks = run_tokens(&shared, received, Default::default(), 3, |i, t| {
            seen.push((i, t));
            async { true }
        })
        .await
        .expect("not cancelled");
        assert_eq!(seen.len(), 3);
        for (i, t) in &seen {
            let due = Duration::from_millis(30 + 10 * u64::from(*i));
            assert!(
                *t >= due && *t < due + Duration::from_millis(50),
                "{i}: {t:?}"
            );
        }
        assert_eq!(marks.first, seen[0].1);
        let gone = run_tokens(
            &shared,
            Instant::now(),
            Default::default(),
            3,
            |_, _| async { false },
        )
        .await;
        assert!(gone.is_none(), "a gone client stops the timeline");
    }
}
