//! The overlapped loop (`--async-scheduling`, the default) against the
//! synchronous one, driven through the worker: every request gets the same
//! tokens, indices and finish whether each decode step is queued ahead or
//! not, with stop tokens found a step late, lengths planned exactly, decode
//! rotation, and preemption for lack of blocks; no block leaks. On the fake
//! engine (which queues its steps like the real one) and on the real one.

use ember_engine::{SamplingParams, SeqId, SequenceRequest, StepEngine};

use super::tests::{fake, knobs, real, Harness, Outcome};
use super::*;

/// Request `id`: a prompt of `len` tokens, `n` new tokens, ending early at
/// the token `stop_after` positions past the prompt when given.
fn request(id: SeqId, len: usize, n: usize, stop_after: Option<usize>) -> SequenceRequest {
    let prompt: Vec<u32> = (0..len as u32).map(|i| 300 + 11 * id as u32 + i).collect();
    let mut r = SequenceRequest::greedy(id, prompt, n);
    // The fake's token at position p is p.
    r.params.stop.stop_token_ids = stop_after.map(|k| (len + k) as u32).into_iter().collect();
    r
}

fn run_both<E: StepEngine + Send + 'static>(
    reqs: &[SequenceRequest],
    engine: impl Fn() -> E,
    k: SchedulerKnobs,
) -> (Outcome, Outcome) {
    let run = |async_scheduling| {
        let mut h = Harness::new();
        for r in reqs {
            let (cmd, events) = h.queued(r.clone(), 0);
            h.tx.send(cmd).unwrap();
            h.expect(r.id, events);
        }
        h.run(
            engine(),
            SchedulerKnobs {
                async_scheduling,
                ..k.clone()
            },
        )
    };
    (run(true), run(false))
}

fn assert_same(overlapped: &Outcome, sync: &Outcome, reqs: &[SequenceRequest]) {
    for r in reqs {
        assert_eq!(
            overlapped.tokens(r.id),
            sync.tokens(r.id),
            "request {}",
            r.id
        );
        assert_eq!(
            overlapped.finish(r.id),
            sync.finish(r.id),
            "request {}",
            r.id
        );
    }
    overlapped.assert_all_free();
    sync.assert_all_free();
}

#[test]
fn the_overlapped_loop_sends_what_the_synchronous_one_sends() {
    let reqs: Vec<SequenceRequest> = (1..=12)
        .map(|id| {
            let stop = (id % 3 == 0).then_some(id as usize % 5 + 1);
            request(id, 2 + id as usize % 4, 3 + id as usize % 7, stop)
        })
        .collect();
    // Decode 4 at a time from up to 8 running (rotation); plenty of blocks.
    let (overlapped, sync) = run_both(&reqs, || fake(256), knobs(4, 8, 1000));
    assert_same(&overlapped, &sync, &reqs);
    // Request 3: a 5-token prompt, its stop token 4 positions past it.
    let stopped = overlapped.finish(3);
    assert_eq!(stopped.0, FinishKind::StopToken(5 + 4));
    assert_eq!(stopped.1, 4, "the tokens before the stop, not one more");
    // Few blocks: decode steps preempt (the queued step judged first).
    let (overlapped, sync) = run_both(&reqs, || fake(12), knobs(8, 8, 1000));
    assert!(SchedulerStats::get(&overlapped.stats.preemptions) > 0);
    assert_same(&overlapped, &sync, &reqs);
}

#[test]
fn the_real_engine_overlapped_matches_its_synchronous_self_greedy_and_sampled() {
    let reqs: Vec<SequenceRequest> = (1..=6)
        .map(|id| {
            let mut r = request(id, 3 + id as usize, 10 + id as usize, None);
            r.params.stop.stop_token_ids.clear();
            if id % 2 == 0 {
                r.params.sampling = SamplingParams {
                    temperature: 0.8,
                    top_k: 40,
                    top_p: 0.9,
                    seed: Some(id),
                    min_p: 0.0,
                };
            }
            r
        })
        .collect();
    let (overlapped, sync) = run_both(&reqs, || real(256), knobs(4, 4, 1000));
    assert_same(&overlapped, &sync, &reqs);
    // Under block pressure, preempting and resuming.
    let (overlapped, sync) = run_both(&reqs, || real(20), knobs(6, 6, 1000));
    assert!(SchedulerStats::get(&overlapped.stats.preemptions) > 0);
    assert_same(&overlapped, &sync, &reqs);
}
