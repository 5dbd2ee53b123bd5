//! Scheduler tests: admission knobs, token budget and chunked prefill,
//! waiting for KV blocks, cancellation, finish events, decode rotation and
//! engine failures run against [`FakeEngine`] (no model, microseconds); the
//! prefix-cache reuse and one end-to-end check run against the real engine
//! on the tiny preset (Flex, CPU).
//!
//! Every test queues all its commands before the worker starts, so the first
//! iteration sees the whole queue and admission is deterministic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_engine::model::{ModelSource, Preset};
use ember_engine::{
    Engine, EngineConfig, EngineDevice, KvBudget, SamplingParams, SequenceRequest, StepEngine,
};
use tokio::sync::{mpsc, Semaphore};

use super::fake_engine::FakeEngine;
use super::worker::Worker;
use super::*;

pub(super) fn knobs(
    max_batch: usize,
    prefill_batch: usize,
    prefill_tokens: usize,
) -> SchedulerKnobs {
    SchedulerKnobs {
        max_batch_size: max_batch,
        prefill_max_batch_size: prefill_batch,
        prefill_max_tokens: prefill_tokens,
        max_pending: 64,
        max_new_tokens_limit: 64,
        policy: SchedulingPolicy::Fcfs,
        async_scheduling: true,
    }
}

/// The fake engine with `num_blocks` blocks of 4 tokens.
pub(super) fn fake(num_blocks: usize) -> FakeEngine {
    FakeEngine::new(num_blocks, 4)
}

/// The real engine on the tiny preset, `num_blocks` blocks of 4 tokens.
pub(super) fn real(num_blocks: usize) -> Engine {
    let config = EngineConfig {
        block_size: 4,
        kv: KvBudget::Blocks(num_blocks),
        max_batch: 64,
        bucketed: Some(false),
        ..EngineConfig::new(ModelSource::Preset {
            preset: Preset::Tiny,
            seed: 7,
        })
    };
    Engine::new(&config, &EngineDevice::cpu().expect("cpu")).expect("engine")
}

/// A queued request plus the receiving end of its events.
pub(super) struct Harness {
    pub(super) tx: mpsc::UnboundedSender<Command>,
    rx: Option<mpsc::UnboundedReceiver<Command>>,
    permits: Arc<Semaphore>,
    events: HashMap<SeqId, mpsc::UnboundedReceiver<Event>>,
    pub(super) stats: Arc<SchedulerStats>,
}

impl Harness {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            tx,
            rx: Some(rx),
            permits: Arc::new(Semaphore::new(1000)),
            events: HashMap::new(),
            stats: Arc::new(SchedulerStats::default()),
        }
    }

    pub(super) fn submit(&mut self, id: SeqId, prompt_len: usize, max_new_tokens: usize) {
        self.submit_with(id, prompt_len, max_new_tokens, None);
    }

    /// [`Harness::submit`] asking for `logprobs`.
    fn submit_with(
        &mut self,
        id: SeqId,
        prompt_len: usize,
        max_new_tokens: usize,
        logprobs: Option<usize>,
    ) {
        let seq = {
            let mut r = SequenceRequest::greedy(
                id,
                (0..prompt_len as u32).map(|i| 100 + i).collect(),
                max_new_tokens,
            );
            r.params.outputs.logprobs = logprobs;
            r.params.sampling = SamplingParams::greedy();
            r
        };
        let (cmd, events) = self.queued(seq, 0);
        self.tx.send(cmd).unwrap();
        self.events.insert(id, events);
    }

    /// A `Submit` of `seq` at `priority`, and the receiving end of its
    /// events (the caller keeps it, or hands it to [`Harness::expect`]).
    pub(super) fn queued(
        &self,
        seq: SequenceRequest,
        priority: i32,
    ) -> (Command, mpsc::UnboundedReceiver<Event>) {
        let (etx, erx) = mpsc::unbounded_channel();
        let permit = Arc::clone(&self.permits).try_acquire_owned().unwrap();
        let cmd = Command::Submit(Box::new(QueuedRequest {
            seq,
            priority,
            follows: None,
            enqueued_at: Instant::now(),
            events: etx,
            pending_permit: permit,
            span: tracing::Span::none(),
        }));
        (cmd, erx)
    }

    /// Collects request `id`'s events in [`Harness::run`]'s outcome.
    pub(super) fn expect(&mut self, id: SeqId, events: mpsc::UnboundedReceiver<Event>) {
        self.events.insert(id, events);
    }

    /// Starts the worker; returns once every request ended, then stops it.
    pub(super) fn run<E: StepEngine + Send + 'static>(
        mut self,
        engine: E,
        knobs: SchedulerKnobs,
    ) -> Outcome {
        let worker = Worker::new(
            engine,
            knobs,
            self.rx.take().unwrap(),
            Arc::clone(&self.stats),
        );
        let thread = std::thread::spawn(move || worker.run());
        let mut per_request = HashMap::new();
        for (id, mut rx) in self.events.drain() {
            let mut events = Vec::new();
            loop {
                let ev = rx
                    .blocking_recv()
                    .expect("a terminal event before the channel closes");
                let terminal = matches!(ev, Event::Finished { .. } | Event::Failed { .. });
                events.push(ev);
                if terminal {
                    break;
                }
            }
            per_request.insert(id, events);
        }
        drop(self.tx);
        thread.join().unwrap();
        Outcome {
            per_request,
            stats: self.stats,
        }
    }
}

pub(super) struct Outcome {
    pub(super) per_request: HashMap<SeqId, Vec<Event>>,
    pub(super) stats: Arc<SchedulerStats>,
}

impl Outcome {
    pub(super) fn admission(&self, id: SeqId) -> Option<Admission> {
        self.per_request[&id].iter().find_map(|e| match e {
            Event::Admitted(a) => Some(*a),
            _ => None,
        })
    }

    pub(super) fn finish(&self, id: SeqId) -> (FinishKind, u32) {
        match self.per_request[&id].last() {
            Some(Event::Finished {
                kind,
                completion_tokens,
            }) => (*kind, *completion_tokens),
            other => panic!("request {id} ended with {other:?}"),
        }
    }

    /// The `chunks` of the request's `Prefilled` event.
    fn prefill_chunks(&self, id: SeqId) -> Option<u32> {
        self.per_request[&id].iter().find_map(|e| match e {
            Event::Prefilled { chunks } => Some(*chunks),
            _ => None,
        })
    }

    /// The request's tokens as `(index, token id)`, in stream order.
    pub(super) fn tokens(&self, id: SeqId) -> Vec<(u32, u32)> {
        self.per_request[&id]
            .iter()
            .filter_map(|e| match e {
                Event::Token {
                    index, token_id, ..
                } => Some((*index, *token_id)),
                _ => None,
            })
            .collect()
    }

    /// When each token of the request was sampled.
    pub(super) fn token_times(&self, id: SeqId) -> Vec<Instant> {
        self.per_request[&id]
            .iter()
            .filter_map(|e| match e {
                Event::Token { at, .. } => Some(*at),
                _ => None,
            })
            .collect()
    }

    /// Decode-step token counts: tokens with index > 0 grouped by step instant.
    fn decode_group_sizes(&self) -> Vec<usize> {
        let mut groups: HashMap<Instant, usize> = HashMap::new();
        for events in self.per_request.values() {
            for e in events {
                if let Event::Token { index, at, .. } = e {
                    if *index > 0 {
                        *groups.entry(*at).or_default() += 1;
                    }
                }
            }
        }
        groups.into_values().collect()
    }

    pub(super) fn assert_all_free(&self) {
        assert_eq!(SchedulerStats::get(&self.stats.kv_blocks_used), 0);
        assert_eq!(SchedulerStats::get(&self.stats.active_sequences), 0);
        assert_eq!(SchedulerStats::get(&self.stats.queue_depth), 0);
    }
}

#[test]
fn prefill_knob_and_decode_knob_are_independent() {
    let mut h = Harness::new();
    for id in 1..=10 {
        h.submit(id, 3, 6);
    }
    // Prefill up to 4 per iteration, decode 2 per step, running cap 4.
    let out = h.run(fake(64), knobs(2, 4, 1000));
    let mut batches: HashMap<u64, u32> = HashMap::new();
    for id in 1..=10 {
        let a = out.admission(id).expect("admitted");
        assert!(a.prefill_batch_size <= 4);
        batches.insert(a.iteration, a.prefill_batch_size);
        assert_eq!(out.finish(id), (FinishKind::Length, 6));
    }
    assert_eq!(
        out.admission(1).unwrap().prefill_batch_size,
        4,
        "first prefill takes 4"
    );
    assert_eq!(batches.values().sum::<u32>(), 10);
    let groups = out.decode_group_sizes();
    assert!(
        groups.iter().all(|g| *g <= 2),
        "decode steps larger than 2: {groups:?}"
    );
    assert!(groups.contains(&2));
    out.assert_all_free();
}

#[test]
fn larger_prefill_knob_admits_in_fewer_iterations() {
    let iterations = |prefill: usize| {
        let mut h = Harness::new();
        for id in 1..=8 {
            h.submit(id, 2, 1);
        }
        let out = h.run(fake(64), knobs(2, prefill, 1000));
        let mut its: Vec<u64> = (1..=8)
            .map(|id| out.admission(id).unwrap().iteration)
            .collect();
        its.dedup();
        its.len()
    };
    assert_eq!(iterations(2), 4);
    assert_eq!(iterations(8), 1);
}

#[test]
fn token_budget_limits_a_prefill_step_and_chunks_the_rest() {
    let mut h = Harness::new();
    for id in 1..=4 {
        h.submit(id, 4, 2);
    }
    // 10 tokens per iteration: 4 + 4 + 2 of request 3, then its last 2 + 4.
    let out = h.run(fake(64), knobs(8, 8, 10));
    for id in 1..=3 {
        let a = out.admission(id).unwrap();
        assert_eq!((a.prefill_batch_size, a.iteration), (3, 1), "request {id}");
    }
    let a = out.admission(4).unwrap();
    assert_eq!((a.prefill_batch_size, a.iteration), (1, 2));
    assert_eq!(
        [1, 2, 3, 4].map(|id| out.prefill_chunks(id)),
        [Some(1), Some(1), Some(2), Some(1)]
    );
    out.assert_all_free();
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_between_decode_steps() {
    let mut h = Harness::new();
    h.submit(1, 3, 30); // a running stream
    h.submit(2, 50, 2); // a prompt six times the budget
    let out = h.run(fake(64), knobs(8, 8, 8));
    assert_eq!(out.finish(1), (FinishKind::Length, 30));
    assert_eq!(out.finish(2), (FinishKind::Length, 2));
    // Iteration 1: 3 tokens of request 1, 5 of request 2; then 8 a step.
    assert_eq!(out.prefill_chunks(2), Some(1 + 45usize.div_ceil(8) as u32));
    // The stream got a token in every iteration of request 2's prefill.
    let admitted = out.admission(2).unwrap().admitted_at;
    let first = out.token_times(2)[0];
    let between = out
        .token_times(1)
        .iter()
        .filter(|&&t| t > admitted && t < first)
        .count();
    assert!(
        between >= 6,
        "{between} tokens of the stream during the prefill"
    );
    out.assert_all_free();
}

#[test]
fn a_later_request_reuses_the_cached_prefix() {
    let mut h = Harness::new();
    // The same 20-token prompt twice; one admission per iteration, so the
    // second comes after the first's prompt is in the cache.
    h.submit(1, 20, 3);
    h.submit(2, 20, 3);
    let stats = Arc::clone(&h.stats);
    let out = h.run(real(64), knobs(8, 1, 1000));
    assert_eq!(out.admission(1).unwrap().cached_prompt_tokens, 0);
    // 4 full blocks of 4 before the last token's block.
    assert_eq!(out.admission(2).unwrap().cached_prompt_tokens, 16);
    let ids = |id| -> Vec<u32> {
        out.per_request[&id]
            .iter()
            .filter_map(|e| match e {
                Event::Token { token_id, .. } => Some(*token_id),
                _ => None,
            })
            .collect()
    };
    assert_eq!(ids(1), ids(2));
    assert_eq!(SchedulerStats::get(&stats.prefix_cache_queried_tokens), 40);
    assert_eq!(SchedulerStats::get(&stats.prefix_cache_hit_tokens), 16);
    out.assert_all_free();
}

#[test]
fn requests_share_scarce_kv_blocks_by_preemption_and_all_finish() {
    let mut h = Harness::new();
    // 3 prompt + 5 new: 1 block of 4 at admission (the prompt and the next
    // token), 2 once they grow; 4 blocks cannot hold five of them at once.
    for id in 1..=5 {
        h.submit(id, 3, 5);
    }
    let out = h.run(fake(4), knobs(8, 8, 1000));
    for id in 1..=5 {
        assert_eq!(out.finish(id), (FinishKind::Length, 5), "request {id}");
        // Every token once, in order (the fake's token at position p is p).
        assert_eq!(
            out.tokens(id),
            (0..5).map(|i| (i, 3 + i)).collect::<Vec<_>>()
        );
    }
    assert!(SchedulerStats::get(&out.stats.preemptions) > 0);
    assert_eq!(SchedulerStats::get(&out.stats.failed), 0);
    out.assert_all_free();
}

#[test]
fn cancel_before_and_after_admission_frees_everything() {
    // Synchronous: the held third step's token was streamed before the
    // cancel is taken; overlapped: that step was queued, not judged, so its
    // token is dropped with the sequence.
    for (async_scheduling, streamed) in [(false, 3), (true, 2)] {
        cancel_mid_decode(async_scheduling, streamed);
    }
}

fn cancel_mid_decode(async_scheduling: bool, streamed: u32) {
    let mut h = Harness::new();
    h.submit(1, 3, 40); // runs; cancelled mid-decode below
    h.submit(2, 3, 40); // waits: the cache holds one request
                        // Cancel the queued one first, then the running one while its third
                        // step (the decode step of iteration 2) is held.
    h.tx.send(Command::Cancel {
        id: 2,
        reason: CancelReason::ClientGone,
    })
    .unwrap();
    let (go, hold) = std::sync::mpsc::channel();
    let mut engine = fake(11);
    engine.hold_at_step = Some((3, hold));
    let tx = h.tx.clone();
    let stats = Arc::clone(&h.stats);
    let canceller = std::thread::spawn(move || {
        // Iteration 1 runs steps 1 (prefill) and 2; iteration 2 holds step 3.
        wait_for_iterations(&stats, 2);
        tx.send(Command::Cancel {
            id: 1,
            reason: CancelReason::ClientGone,
        })
        .unwrap();
        go.send(()).unwrap();
    });
    let k = SchedulerKnobs {
        async_scheduling,
        ..knobs(8, 8, 1000)
    };
    let out = h.run(engine, k);
    canceller.join().unwrap();
    assert!(
        out.admission(2).is_none(),
        "a cancelled queued request is never admitted"
    );
    assert_eq!(out.finish(2), (FinishKind::Cancelled, 0));
    // Cancelled during its third step.
    assert_eq!(out.finish(1), (FinishKind::Cancelled, streamed));
    assert_eq!(out.tokens(1).len(), streamed as usize);
    assert_eq!(SchedulerStats::get(&out.stats.cancelled), 2);
    out.assert_all_free();
}

/// Waits (up to 30 s) until the scheduler has started `n` iterations.
pub(super) fn wait_for_iterations(stats: &SchedulerStats, n: u64) {
    let start = Instant::now();
    while SchedulerStats::get(&stats.iterations) < n && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn finish_events_carry_each_requests_own_length() {
    let mut h = Harness::new();
    for (id, n) in [(1, 1), (2, 3), (3, 7)] {
        h.submit(id, 2, n);
    }
    let out = h.run(fake(64), knobs(8, 8, 1000));
    for (id, n) in [(1, 1), (2, 3), (3, 7)] {
        assert_eq!(out.finish(id), (FinishKind::Length, n));
        let tokens = out.per_request[&id]
            .iter()
            .filter(|e| matches!(e, Event::Token { .. }))
            .count();
        assert_eq!(tokens, n as usize);
    }
    assert_eq!(SchedulerStats::get(&out.stats.finished), 3);
    out.assert_all_free();
}

#[test]
fn a_closed_client_is_dropped_before_admission() {
    let mut h = Harness::new();
    h.submit(1, 2, 2);
    h.submit(2, 2, 2);
    // Client 2 leaves without a cancel command (the receiver is dropped).
    drop(h.events.remove(&2));
    let stats = Arc::clone(&h.stats);
    let out = h.run(fake(64), knobs(8, 8, 1000));
    assert_eq!(out.finish(1), (FinishKind::Length, 2));
    assert_eq!(SchedulerStats::get(&stats.cancelled), 1);
    assert_eq!(SchedulerStats::get(&stats.admitted), 1);
    out.assert_all_free();
}

#[test]
fn a_stop_string_cancel_frees_the_sequence_and_counts_as_finished() {
    // As `cancel_before_and_after_admission_frees_everything`: the
    // overlapped loop had the held step queued, not judged.
    for (async_scheduling, streamed) in [(false, 3), (true, 2)] {
        stop_string_mid_decode(async_scheduling, streamed);
    }
}

fn stop_string_mid_decode(async_scheduling: bool, streamed: u32) {
    let mut h = Harness::new();
    h.submit_with(1, 2, 40, Some(2));
    h.submit(2, 2, 3);
    let (go, hold) = std::sync::mpsc::channel();
    let mut engine = fake(64);
    engine.hold_at_step = Some((3, hold));
    let (tx, stats) = (h.tx.clone(), Arc::clone(&h.stats));
    let stopper = std::thread::spawn(move || {
        // Iteration 1 runs steps 1 (prefill) and 2; iteration 2 holds step 3.
        wait_for_iterations(&stats, 2);
        tx.send(Command::Cancel {
            id: 1,
            reason: CancelReason::StopString,
        })
        .unwrap();
        go.send(()).unwrap();
    });
    let k = SchedulerKnobs {
        async_scheduling,
        ..knobs(8, 8, 1000)
    };
    let out = h.run(engine, k);
    stopper.join().unwrap();
    assert_eq!(out.finish(1), (FinishKind::Cancelled, streamed));
    assert_eq!(out.finish(2), (FinishKind::Length, 3));
    assert_eq!(SchedulerStats::get(&out.stats.finished), 2);
    assert_eq!(SchedulerStats::get(&out.stats.cancelled), 0);
    // Logprobs travel with the tokens of the request that asked, only.
    let logprobs = |id: SeqId| -> Vec<Option<usize>> {
        out.per_request[&id]
            .iter()
            .filter_map(|e| match e {
                Event::Token { logprobs, .. } => Some(logprobs.as_ref().map(|l| l.top.len())),
                _ => None,
            })
            .collect()
    };
    assert_eq!(logprobs(1), vec![Some(2); streamed as usize]);
    assert_eq!(logprobs(2), [None; 3]);
    out.assert_all_free();
}

#[test]
fn the_real_engine_runs_a_mixed_batch_to_the_end() {
    let mut h = Harness::new();
    h.submit(1, 3, 5);
    h.submit(2, 30, 2); // chunked: 8 tokens a step
    h.submit_with(3, 5, 4, Some(1));
    let out = h.run(real(64), knobs(2, 2, 8));
    assert_eq!(out.finish(1), (FinishKind::Length, 5));
    assert_eq!(out.finish(2), (FinishKind::Length, 2));
    assert_eq!(out.finish(3), (FinishKind::Length, 4));
    assert!(out.prefill_chunks(2).unwrap() > 1);
    out.assert_all_free();
}

#[test]
fn decode_takes_turns_when_more_sequences_decode_than_a_step_holds() {
    let mut h = Harness::new();
    for id in 1..=5 {
        h.submit(id, 2, 4);
    }
    // All five admitted at once; decode steps of at most 2 rotate.
    let out = h.run(fake(64), knobs(2, 8, 1000));
    for id in 1..=5 {
        assert_eq!(out.finish(id), (FinishKind::Length, 4));
    }
    let groups = out.decode_group_sizes();
    assert!(groups.iter().all(|&g| g <= 2), "{groups:?}");
    // 5 sequences x 3 decode tokens = 15 tokens in steps of 2: 8 steps, the
    // odd one out never waiting more than two steps for its turn.
    assert_eq!(groups.iter().sum::<usize>(), 15);
    let turns = |id| out.token_times(id);
    for id in 1..=5 {
        assert_eq!(turns(id).len(), 4);
    }
    out.assert_all_free();
}

#[test]
fn a_failed_engine_step_fails_its_requests_and_frees_their_blocks() {
    let mut h = Harness::new();
    h.submit(1, 2, 10);
    h.submit(2, 2, 10);
    let mut engine = fake(64);
    // The prefill step succeeds, the first decode step fails.
    engine.fail_after_steps = Some(1);
    let out = h.run(engine, knobs(8, 8, 1000));
    for id in [1, 2] {
        assert!(
            matches!(out.per_request[&id].last(), Some(Event::Failed { message }) if message.contains("injected")),
            "{:?}",
            out.per_request[&id]
        );
    }
    assert_eq!(SchedulerStats::get(&out.stats.failed), 2);
    out.assert_all_free();
}

#[test]
fn a_request_the_engine_refuses_fails_alone() {
    let mut h = Harness::new();
    h.submit(1, 2, 3);
    h.submit(2, 2, 3);
    h.submit(3, 2, 3);
    let mut engine = fake(64);
    engine.refuse = Some(2);
    let out = h.run(engine, knobs(8, 8, 1000));
    assert!(matches!(
        out.per_request[&2].last(),
        Some(Event::Failed { .. })
    ));
    assert!(out.admission(2).is_none());
    assert_eq!(out.finish(1), (FinishKind::Length, 3));
    assert_eq!(out.finish(3), (FinishKind::Length, 3));
    assert_eq!(SchedulerStats::get(&out.stats.failed), 1);
    out.assert_all_free();
}
