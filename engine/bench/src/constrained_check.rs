//! `--reference DIR`, third part: structured rows (a token constraint whose
//! allowed set follows each accepted token, as a grammar's does) decoded
//! beside plain rows, synchronously and in the overlapped step loop, with
//! every decode step replayed from captured graphs when asked.
//!
//! In the overlapped loop a step with a constrained row in flight is queued
//! in two halves (`Engine::decode_async`): the forward first, then the
//! allowed sets computed from the tokens of the step before (in the same
//! parallel pass that gives the grammars their tokens), then the choice: on
//! CUDA the bucket's captured choice graph. The check: both loops emit the
//! same tokens, row for row (greedy and seeded sampled rows alike), and
//! every constrained token is one its constraint allowed.

use std::sync::{Arc, Mutex};

use ember_engine::{
    Engine, EngineConfig, EngineDevice, KvBudget, SamplingParams, SeqId, SequenceRequest,
    SharedConstraint, TokenConstraint,
};
use serde_json::{json, Value};

use crate::controls_check::generate;

/// Constrained rows in the batch (more than one: their grammar work runs in
/// parallel).
const CONSTRAINED: usize = 6;
/// Plain rows beside them.
const PLAIN: usize = 2;
/// Tokens each row generates.
const NEW_TOKENS: usize = 12;

/// A constraint whose allowed set is three tokens that follow from the last
/// accepted one (a toy grammar with state): `next(t)`.
#[derive(Debug)]
struct Follows {
    last: u32,
    vocab: u32,
    /// Tokens taken that were not allowed (must stay empty).
    refused: Arc<Mutex<Vec<u32>>>,
}

/// The tokens allowed after `last` in a vocabulary of `vocab`.
fn next(last: u32, vocab: u32) -> [u32; 3] {
    let base = (last.wrapping_mul(7) + 11) % (vocab - 3);
    [base, base + 1, base + 2]
}

impl TokenConstraint for Follows {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        let mut bits = vec![0u32; self.vocab.div_ceil(32) as usize];
        for t in next(self.last, self.vocab) {
            bits[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(Some(bits))
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        if !next(self.last, self.vocab).contains(&token) {
            if let Ok(mut refused) = self.refused.lock() {
                refused.push(token);
            }
        }
        self.last = token;
        Ok(())
    }
}

/// Runs the check on the reference model in `dir` (see the module docs).
pub fn check_constrained(
    dir: &std::path::Path,
    device: EngineDevice,
    graphs: bool,
) -> anyhow::Result<Value> {
    let config = EngineConfig {
        kv: KvBudget::Blocks(128),
        max_batch: 16,
        prefix_caching: false,
        ..EngineConfig::new(ember_engine::model::ModelSource::Dir(dir.to_path_buf()))
    };
    let mut engine = Engine::new(&config, &device)?;
    let vocab = engine.model_config().vocab_size as u32;
    if graphs {
        engine.capture_decode_graphs(&[1, 2, 4, 8, 16]);
    }
    let refused = Arc::new(Mutex::new(Vec::new()));
    let mut runs = Vec::new();
    for (pass, overlapped) in [false, true].into_iter().enumerate() {
        let base = 5000 + 100 * pass as SeqId;
        let reqs = requests(base, vocab, &refused);
        runs.push(generate(
            &mut engine,
            reqs,
            base,
            CONSTRAINED + PLAIN,
            overlapped,
        )?);
    }
    let differing: Vec<usize> = (0..CONSTRAINED + PLAIN)
        .filter(|&i| runs[0][i] != runs[1][i])
        .collect();
    let refused: Vec<u32> = refused.lock().map(|r| r.clone()).unwrap_or_default();
    let full = runs
        .iter()
        .flatten()
        .all(|tokens| tokens.len() == NEW_TOKENS);
    println!(
        "  constrained rows: {} of {} rows equal in the synchronous and the overlapped loop, {} tokens outside their allowed set, every row {} tokens: {}",
        CONSTRAINED + PLAIN - differing.len(),
        CONSTRAINED + PLAIN,
        refused.len(),
        NEW_TOKENS,
        if full { "yes" } else { "no" }
    );
    Ok(json!({
        "rows": CONSTRAINED + PLAIN,
        "differing_rows": differing,
        "refused_tokens": refused,
        "all_full_length": full,
        "tokens": runs,
    }))
}

/// The batch: `CONSTRAINED` constrained rows (every other one sampled with a
/// seed) and `PLAIN` plain greedy ones, ids from `base`.
fn requests(base: SeqId, vocab: u32, refused: &Arc<Mutex<Vec<u32>>>) -> Vec<SequenceRequest> {
    (0..CONSTRAINED + PLAIN)
        .map(|i| {
            let prompt: Vec<u32> = (0..5 + i as u32)
                .map(|k| (k * 13 + i as u32) % vocab)
                .collect();
            let mut r = SequenceRequest::greedy(base + i as SeqId, prompt, NEW_TOKENS);
            r.params.stop.ignore_eos = true;
            if i < CONSTRAINED {
                let follows = Follows {
                    last: i as u32,
                    vocab,
                    refused: Arc::clone(refused),
                };
                let shared: SharedConstraint = Arc::new(Mutex::new(follows));
                r.params.constraint = Some(shared);
                if i % 2 == 1 {
                    r.params.sampling = SamplingParams {
                        temperature: 1.0,
                        seed: Some(42 + i as u64),
                        ..SamplingParams::greedy()
                    };
                }
            }
            r
        })
        .collect()
}
