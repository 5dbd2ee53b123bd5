//! Each scheduling policy driven through the worker on the fake engine (vLLM
//! v1's scheduler tests do the same with its policies): the order requests
//! are admitted in, aging, and whom a decode step short of blocks preempts.
//! Priority preemption for the front of the queue and preemption's
//! correctness are in `preemption_tests.rs`; the policies' own rules,
//! priority checks included, are unit-tested beside them (`policy/`).

use std::time::{Duration, Instant};

use ember_engine::{SeqId, SequenceRequest};

use super::fake_engine::FakeEngine;
use super::tests::{fake, knobs, Harness, Outcome};
use super::*;

fn with_policy(policy: SchedulingPolicy, max_batch: usize) -> SchedulerKnobs {
    SchedulerKnobs {
        policy,
        ..knobs(max_batch, max_batch, 1000)
    }
}

/// Queues `(id, priority, waited)` requests of a 3-token prompt and `n` new
/// tokens, `waited` before now, and runs them under `k` on `blocks` blocks.
fn run(reqs: &[(SeqId, i32, Duration)], n: usize, blocks: usize, k: SchedulerKnobs) -> Outcome {
    run_on(reqs, n, fake(blocks), k)
}

/// [`run`] on `engine`.
fn run_on(
    reqs: &[(SeqId, i32, Duration)],
    n: usize,
    engine: FakeEngine,
    k: SchedulerKnobs,
) -> Outcome {
    let mut h = Harness::new();
    for &(id, priority, waited) in reqs {
        let seq = SequenceRequest::greedy(id, vec![100, 101, 102], n);
        let (mut cmd, events) = h.queued(seq, priority);
        if let Command::Submit(q) = &mut cmd {
            q.enqueued_at = Instant::now() - waited;
        }
        h.tx.send(cmd).unwrap();
        h.expect(id, events);
    }
    h.run(engine, k)
}

/// Ids in the order of their first token.
fn first_token_order(out: &Outcome, ids: &[SeqId]) -> Vec<SeqId> {
    let mut ids = ids.to_vec();
    ids.sort_by_key(|&id| out.token_times(id)[0]);
    ids
}

/// Ids in the order they were preempted (each once at most here).
fn preemption_order(out: &Outcome, ids: &[SeqId]) -> Vec<SeqId> {
    let at = |id: SeqId| {
        out.per_request[&id].iter().find_map(|e| match e {
            Event::Preempted { at } => Some(*at),
            _ => None,
        })
    };
    let mut preempted: Vec<SeqId> = ids.iter().copied().filter(|&id| at(id).is_some()).collect();
    preempted.sort_by_key(|&id| at(id));
    preempted
}

const NOW: Duration = Duration::ZERO;

#[test]
fn fcfs_admits_in_arrival_order_whatever_the_priority_and_never_preempts_for_the_queue() {
    // One running slot; the priorities (which the service would refuse under
    // fcfs) play no part.
    let reqs = [(1, 5, NOW), (2, 0, NOW), (3, 9, NOW), (4, -1, NOW)];
    let out = run(&reqs, 3, 64, with_policy(SchedulingPolicy::Fcfs, 1));
    assert_eq!(first_token_order(&out, &[1, 2, 3, 4]), [1, 2, 3, 4]);
    assert_eq!(SchedulerStats::get(&out.stats.preemptions), 0);
    out.assert_all_free();
}

#[test]
fn priority_admits_by_priority_then_arrival() {
    let reqs = [(1, 5, NOW), (2, 0, NOW), (3, 9, NOW), (4, 0, NOW)];
    let k = with_policy(SchedulingPolicy::Priority { aging: None }, 1);
    let out = run(&reqs, 3, 64, k);
    assert_eq!(first_token_order(&out, &[1, 2, 3, 4]), [2, 4, 1, 3]);
    out.assert_all_free();
}

#[test]
fn aging_lets_a_request_that_waited_long_go_first() {
    // Request 3 came last but was queued 100 s ago: with 10 s aging its
    // priority 3 counts as -7 and it goes first; without aging, last.
    let reqs = [(1, 3, NOW), (2, 3, NOW), (3, 3, Duration::from_secs(100))];
    let aged = |aging| {
        let k = with_policy(SchedulingPolicy::Priority { aging }, 1);
        let out = run(&reqs, 3, 64, k);
        assert_eq!(SchedulerStats::get(&out.stats.preemptions), 0);
        out.assert_all_free();
        first_token_order(&out, &[1, 2, 3])
    };
    assert_eq!(aged(Some(Duration::from_secs(10))), [3, 1, 2]);
    assert_eq!(aged(None), [1, 2, 3]);
}

#[test]
fn aging_reorders_the_queue_while_requests_wait() {
    // Request 1 (priority 0) takes the one slot; its decode step is held
    // 200 ms. Requests 2 and 3 both ask for priority 1; 3 came later (it is
    // behind 2 when both are queued) but was queued 9.9 s before: by the
    // time the slot frees it has waited a 10 s period, counts as 0 and goes
    // first. (Equal asked priorities, so once running it is not preempted
    // for the other: a running request's own priority counts, unaged.)
    let reqs = [
        (1, 0, NOW),
        (2, 1, NOW),
        (3, 1, Duration::from_millis(9_900)),
    ];
    let (go, hold) = std::sync::mpsc::channel();
    let mut engine = fake(64);
    engine.hold_at_step = Some((2, hold));
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let _ = go.send(());
    });
    let aging = Some(Duration::from_secs(10));
    let k = with_policy(SchedulingPolicy::Priority { aging }, 1);
    let out = run_on(&reqs, 3, engine, k);
    release.join().unwrap();
    assert_eq!(first_token_order(&out, &[1, 2, 3]), [1, 3, 2]);
    assert_eq!(SchedulerStats::get(&out.stats.preemptions), 0);
    out.assert_all_free();
}

/// 3 blocks of 4 tokens; three requests of a 3-token prompt and 8 new
/// tokens are admitted together (a block each) and at position 4 each
/// needs a second: the decode step preempts two of them.
fn short_of_blocks(policy: SchedulingPolicy, priorities: [i32; 3]) -> Outcome {
    let reqs: Vec<_> = (1..=3)
        .zip(priorities)
        .map(|(id, p)| (id, p, NOW))
        .collect();
    let out = run(&reqs, 8, 3, with_policy(policy, 8));
    for id in 1..=3 {
        assert_eq!(out.finish(id), (FinishKind::Length, 8), "request {id}");
        let want: Vec<(u32, u32)> = (0..8).map(|i| (i, 3 + i)).collect();
        assert_eq!(out.tokens(id), want, "request {id}: no gap, no repeat");
    }
    out.assert_all_free();
    out
}

#[test]
fn fcfs_preempts_the_newest_for_a_decode_step() {
    let out = short_of_blocks(SchedulingPolicy::Fcfs, [0, 0, 0]);
    assert_eq!(preemption_order(&out, &[1, 2, 3]), [3, 2]);
}

#[test]
fn priority_preempts_the_lowest_priority_then_the_newest_for_a_decode_step() {
    // Request 1 is the oldest but the least urgent: it goes first, then the
    // newer of the two at priority 0.
    let out = short_of_blocks(SchedulingPolicy::Priority { aging: None }, [9, 0, 0]);
    assert_eq!(preemption_order(&out, &[1, 2, 3]), [1, 3]);
}
