//! End-to-end: the built `ember-server` and `loadgen` over real sockets.
//!
//! Tolerances (also in docs/testing.md):
//! - client TTFT >= server TTFT for every request: no tolerance (the client
//!   interval strictly contains the server's).
//! - tokenize + enqueue + queue wait + prefill->first token == server TTFT:
//!   exact (0 ns); the server computes all five from the same instants.
//! - token counts exact (`--no-stop-on-eos`); prompt token count equals the
//!   GPT-2 tokenizer's count of the prompt.

use std::collections::BTreeSet;
use std::time::Duration;

use ember_common::pb::{FinishReason, ServerTiming};
use ember_common::tokenizer::Gpt2Tokenizer;
use ember_tests::blocker::{self, Blocker};
use ember_tests::client::{self, StreamOutcome};
use ember_tests::loadgen;
use ember_tests::server::Server;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog";

/// loadgen with an absolute schedule: every request succeeds with the right
/// token counts, client TTFT >= server TTFT, the server's TTFT breakdown adds
/// up exactly, and the server ends idle (0 KV blocks, 0 active).
#[test]
fn loadgen_absolute_schedule_reconciles() {
    const N: u64 = 16;
    const MAX_NEW: u64 = 8;
    let server = Server::tiny("e2e-loadgen", &[]);
    let before = server.info();
    let run = loadgen::run(
        &server.url(),
        &[
            "--num-requests",
            &N.to_string(),
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            &MAX_NEW.to_string(),
            "--no-stop-on-eos",
            "--submit-interval-ms",
            "20",
            "--submit-schedule",
            "absolute",
        ],
        None,
        "e2e-loadgen-run",
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("loadgen: {e:#}\n{}", server.stderr_tail(30)));
    assert!(
        run.status.success(),
        "loadgen exited {}\n{}",
        run.status,
        run.output()
    );

    let run0 = loadgen::run0(&run);
    assert_eq!(run0["requests"].as_u64(), Some(N), "summary: {run0}");
    assert_eq!(run0["ok"].as_u64(), Some(N), "summary: {run0}");
    assert_eq!(run0["failed"].as_u64(), Some(0), "summary: {run0}");

    let expected_prompt_tokens = Gpt2Tokenizer::embedded()
        .unwrap()
        .encode(PROMPT)
        .unwrap()
        .len() as u64;
    let reqs = loadgen::measured(&run);
    assert_eq!(reqs.len() as u64, N, "one --requests-out line per request");
    let indices: BTreeSet<u64> = reqs.iter().map(|r| r.u64("index")).collect();
    assert_eq!(indices, (0..N).collect(), "every index once");
    for r in &reqs {
        let j = r.json();
        assert!(r.ok(), "request failed: {j}");
        assert_eq!(
            r.u64("prompt_tokens"),
            expected_prompt_tokens,
            "prompt_tokens: {j}"
        );
        assert_eq!(
            r.u64("completion_tokens"),
            MAX_NEW,
            "completion_tokens: {j}"
        );
        assert_eq!(r.finish_reason(), "length", "finish_reason: {j}");
        let recv = r.f64s("token_recv_ns");
        let srv = r.f64s("server.token_server_time_ns");
        assert_eq!(recv.len() as u64, MAX_NEW, "token_recv_ns: {j}");
        assert_eq!(srv.len() as u64, MAX_NEW, "token_server_time_ns: {j}");
        assert!(
            recv.windows(2).all(|w| w[0] <= w[1]),
            "client receive times ordered: {j}"
        );
        assert!(
            srv.windows(2).all(|w| w[0] <= w[1]),
            "server token times ordered: {j}"
        );

        let client_ttft = r.u64("client_ttft_ns");
        let server_ttft = r.u64("server.server_ttft_ns");
        assert!(
            client_ttft >= server_ttft,
            "client TTFT {client_ttft} < server TTFT {server_ttft}: {j}"
        );
        let parts = r.u64("server.tokenize_ns")
            + r.u64("server.enqueue_ns")
            + r.u64("server.queue_wait_ns")
            + r.u64("server.prefill_to_first_token_ns");
        assert_eq!(
            parts, server_ttft,
            "tokenize+enqueue+queue_wait+prefill != server TTFT: {j}"
        );
        assert!(
            server_ttft <= r.u64("server.total_ns"),
            "server TTFT > total: {j}"
        );
        assert!(
            r.u64("server.prefill_batch_size") >= 1,
            "prefill_batch_size: {j}"
        );
    }

    let idle = server.assert_idle_and_serving();
    let (b, a) = (
        before.counters.unwrap_or_default(),
        idle.counters.unwrap_or_default(),
    );
    assert_eq!(
        a.finished - b.finished,
        N,
        "finished counter: before {b:?} after {a:?}"
    );
    assert_eq!(
        a.admitted - b.admitted,
        N,
        "admitted counter: before {b:?} after {a:?}"
    );
}

/// What the knob experiment saw for the burst: (prefill_batch_size,
/// admitted_iteration) per request.
fn admissions(prefill_max_batch_size: u32) -> Vec<(u32, u64)> {
    const BURST: usize = 8;
    // Blockers hold the KV blocks (or queue ahead) while the burst queues;
    // releasing them frees all 8 blocks at once, so the burst (one block
    // each) is admitted as fast as the prefill knob allows.
    let knob = prefill_max_batch_size.to_string();
    let many = blocker::many_flags(BURST);
    let mut flags = vec!["--max-batch-size", "2", "--prefill-max-batch-size", &knob];
    flags.extend(many.iter().map(String::as_str));
    let server = Server::tiny(&format!("e2e-knob-{prefill_max_batch_size}"), &flags);
    let addr = server.addr();
    let result = server.block_on(move || async move {
        let mut clients = Vec::new();
        for _ in 0..BURST {
            clients.push(client::connect(addr).await?);
        }
        let blocker = Blocker::start_many(addr, BURST).await?;
        let mut started_rx = Vec::new();
        let mut burst = Vec::new();
        for (i, mut c) in clients.into_iter().enumerate() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            started_rx.push(rx);
            burst.push(tokio::spawn(async move {
                let mut tx = Some(tx);
                let req = client::ids_request(vec![40 + i as u32, 41, 42], 4);
                client::generate_observed(&mut c, req, None, |o| {
                    if o.started.is_some() || o.status.is_some() {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                })
                .await
            }));
        }
        for rx in started_rx {
            rx.await?;
        }
        client::wait_info(
            addr,
            Duration::from_secs(10),
            "premise: the whole burst is queued",
            |i| (i.queue_depth + i.active_sequences) as usize == 2 * BURST,
        )
        .await?;
        blocker.ensure_running("the burst was queued")?;
        blocker.release().await;
        let mut outs: Vec<StreamOutcome> = Vec::new();
        for b in burst {
            outs.push(b.await?);
        }
        anyhow::Ok(outs)
    });
    let outs =
        result.unwrap_or_else(|e| panic!("knob experiment: {e:#}\n{}", server.stderr_tail(30)));
    let mut adm = Vec::new();
    for o in &outs {
        assert_eq!(o.code(), tonic::Code::Ok, "burst request: {}", o.summary());
        assert_eq!(o.finish_reason(), Some(FinishReason::Length));
        let t: &ServerTiming = o
            .finished
            .as_ref()
            .unwrap()
            .0
            .timing
            .as_ref()
            .expect("timing");
        adm.push((t.prefill_batch_size, t.admitted_iteration));
    }
    server.assert_idle_and_serving();
    adm
}

/// The seeds' knob experiment: with `--prefill-max-batch-size` (8) above
/// `--max-batch-size` (2), a queued burst of 8 is admitted in fewer scheduler
/// iterations, visible in `prefill_batch_size` / `admitted_iteration` of the
/// streams' timing.
#[test]
fn prefill_batch_knob_admits_in_fewer_iterations() {
    // The two servers are independent: run them side by side.
    let (narrow, wide) = std::thread::scope(|s| {
        let n = s.spawn(|| admissions(2));
        let w = s.spawn(|| admissions(8));
        (n.join().expect("knob 2"), w.join().expect("knob 8"))
    });
    let iters = |a: &[(u32, u64)]| a.iter().map(|x| x.1).collect::<BTreeSet<_>>().len();
    let max_batch = |a: &[(u32, u64)]| a.iter().map(|x| x.0).max().unwrap();
    eprintln!(
        "prefill-max-batch-size 2: {} iterations {narrow:?}\nprefill-max-batch-size 8: {} iterations {wide:?}",
        iters(&narrow),
        iters(&wide)
    );
    assert!(
        max_batch(&narrow) <= 2,
        "knob 2 admitted a prefill batch > 2: {narrow:?}"
    );
    assert!(
        iters(&narrow) >= 4,
        "8 requests, 2 per prefill: at least 4 iterations: {narrow:?}"
    );
    assert!(
        max_batch(&wide) > 2,
        "knob 8 never batched more than 2: {wide:?}"
    );
    assert!(
        iters(&wide) < iters(&narrow),
        "knob 8 needed {} iterations, knob 2 needed {}",
        iters(&wide),
        iters(&narrow)
    );
}
