//! Preemption and priority, driven through the worker: a preempted request
//! loses no token and repeats none (its output equals its solo run on the
//! real engine, greedy and sampled), priority orders admission and preempts
//! lower-priority running requests, and a preempted request that waits can
//! be cancelled or time out like any waiting one; no block leaks.

use std::time::Instant;

use ember_engine::{SamplingParams, SeqId, SequenceRequest, StepEngine};

use super::tests::{fake, knobs, real, wait_for_iterations, Harness, Outcome};
use super::*;

/// Request `id`: a prompt of `len` tokens (distinct per id), `n` new tokens.
fn request(id: SeqId, len: usize, n: usize, sampling: SamplingParams) -> SequenceRequest {
    let prompt = (0..len as u32).map(|i| 200 + 7 * id as u32 + i).collect();
    let mut r = SequenceRequest::greedy(id, prompt, n);
    r.params.sampling = sampling;
    r
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 30,
        top_p: 0.95,
        seed: Some(seed),
        min_p: 0.0,
    }
}

fn priority(aging: Option<std::time::Duration>, max_batch: usize) -> SchedulerKnobs {
    SchedulerKnobs {
        policy: SchedulingPolicy::Priority { aging },
        ..knobs(max_batch, max_batch, 1000)
    }
}

/// Runs `reqs` (at priority 0) through a worker on `engine` under `k`.
fn run_all<E: StepEngine + Send + 'static>(
    reqs: &[SequenceRequest],
    engine: E,
    k: SchedulerKnobs,
) -> Outcome {
    let mut h = Harness::new();
    for r in reqs {
        let (cmd, events) = h.queued(r.clone(), 0);
        h.tx.send(cmd).unwrap();
        h.expect(r.id, events);
    }
    h.run(engine, k)
}

fn preempted(out: &Outcome, id: SeqId) -> usize {
    out.per_request[&id]
        .iter()
        .filter(|e| matches!(e, Event::Preempted { .. }))
        .count()
}

#[test]
fn preempted_requests_emit_exactly_their_solo_runs_on_the_real_engine() {
    let reqs: Vec<SequenceRequest> = (1..=6)
        .map(|id| {
            let sampling = if id % 2 == 0 {
                sampled(id)
            } else {
                SamplingParams::greedy()
            };
            request(id, 3 + id as usize, 24, sampling)
        })
        .collect();
    // 4-token blocks: each request comes to hold 8 or 9; 24 hold fewer
    // than three of them.
    let pressed = run_all(&reqs, real(24), knobs(8, 8, 1000));
    assert!(SchedulerStats::get(&pressed.stats.preemptions) > 0);
    let mut preempted_any = false;
    for r in &reqs {
        let solo = run_all(std::slice::from_ref(r), real(256), knobs(8, 8, 1000));
        assert_eq!(preempted(&solo, r.id), 0);
        let want: Vec<(u32, u32)> = solo.tokens(r.id);
        assert_eq!(want.len(), 24);
        assert_eq!(pressed.tokens(r.id), want, "request {}", r.id);
        assert_eq!(pressed.finish(r.id), (FinishKind::Length, 24));
        preempted_any |= preempted(&pressed, r.id) > 0;
    }
    assert!(preempted_any);
    pressed.assert_all_free();
}

#[test]
fn priority_orders_admission_and_preempts_a_lower_priority_request() {
    // Waiting together: served by priority, then arrival.
    let mut h = Harness::new();
    for (id, p) in [(1, 5), (2, 1), (3, 3), (4, 1)] {
        let (cmd, events) = h.queued(request(id, 3, 4, SamplingParams::greedy()), p);
        h.tx.send(cmd).unwrap();
        h.expect(id, events);
    }
    let out = h.run(fake(64), priority(None, 1));
    let first = |id| out.token_times(id)[0];
    assert!(first(2) < first(4) && first(4) < first(3) && first(3) < first(1));

    // Two long priority-10 requests fill both slots; a priority-0 one comes
    // while they decode and preempts the newer of them.
    let mut h = Harness::new();
    for id in [1, 2] {
        let (cmd, events) = h.queued(request(id, 3, 30, SamplingParams::greedy()), 10);
        h.tx.send(cmd).unwrap();
        h.expect(id, events);
    }
    let (urgent, events) = h.queued(request(3, 3, 5, SamplingParams::greedy()), 0);
    h.expect(3, events);
    let (go, hold) = std::sync::mpsc::channel();
    let mut engine = fake(64);
    engine.hold_at_step = Some((4, hold));
    let (tx, stats) = (h.tx.clone(), std::sync::Arc::clone(&h.stats));
    let sender = std::thread::spawn(move || {
        wait_for_iterations(&stats, 3);
        tx.send(urgent).unwrap();
        go.send(()).unwrap();
    });
    let out = h.run(engine, priority(None, 2));
    sender.join().unwrap();
    assert_eq!((preempted(&out, 1), preempted(&out, 2)), (0, 1));
    assert_eq!(out.finish(3), (FinishKind::Length, 5));
    for id in [1, 2] {
        assert_eq!(out.finish(id), (FinishKind::Length, 30));
        let want: Vec<(u32, u32)> = (0..30).map(|i| (i, 3 + i)).collect();
        assert_eq!(out.tokens(id), want, "request {id}: no gap, no repeat");
    }
    // Request 2 made no progress while the urgent one ran.
    let resumed = out.per_request[&2]
        .iter()
        .skip_while(|e| !matches!(e, Event::Preempted { .. }))
        .find_map(|e| match e {
            Event::Token { at, .. } => Some(*at),
            _ => None,
        })
        .expect("a token after the preemption");
    assert!(out.token_times(3)[0] < resumed);
    assert_eq!(SchedulerStats::get(&out.stats.preemptions), 1);
    out.assert_all_free();
}

#[test]
fn a_preempted_request_can_be_cancelled_or_time_out_while_it_waits() {
    // 3 blocks of 4: all three are admitted (a block each); at position 4
    // each needs a second, so 3 and then 2 are preempted and wait.
    let mut h = Harness::new();
    for id in 1..=3 {
        h.submit(id, 3, 8);
    }
    let (go, hold) = std::sync::mpsc::channel();
    let mut engine = fake(3);
    // Steps: 1 prefill, 2 decode (iteration 1); 3 decode after the
    // preemptions (iteration 2); 4 is iteration 3's decode: held.
    engine.hold_at_step = Some((4, hold));
    let (tx, stats) = (h.tx.clone(), std::sync::Arc::clone(&h.stats));
    let canceller = std::thread::spawn(move || {
        wait_for_iterations(&stats, 3);
        for (id, reason) in [
            (2, CancelReason::ClientGone),
            (3, CancelReason::DeadlineExceeded),
        ] {
            tx.send(Command::Cancel { id, reason }).unwrap();
        }
        go.send(()).unwrap();
    });
    let started = Instant::now();
    let out = h.run(engine, knobs(8, 8, 1000));
    canceller.join().unwrap();
    assert!(started.elapsed().as_secs() < 30, "the hold was released");
    assert_eq!(out.finish(1), (FinishKind::Length, 8));
    for id in [2, 3] {
        assert_eq!(preempted(&out, id), 1, "request {id}");
        // Its first token (prefill) and one decode step were streamed.
        assert_eq!(out.finish(id), (FinishKind::Cancelled, 2), "request {id}");
    }
    assert_eq!(SchedulerStats::get(&out.stats.cancelled), 1);
    assert_eq!(SchedulerStats::get(&out.stats.deadline_exceeded), 1);
    out.assert_all_free();
}
