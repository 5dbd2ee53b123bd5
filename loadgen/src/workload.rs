//! The requests of one run, built (and with `--pretok`, tokenized) before the
//! run's clock starts, so prompt preparation never shows up as submit lag.
//!
//! Prompts come from `--prompt` (the default), a `--dataset` file (entry
//! `index % len`), or are synthetic: `--input-len` random GPT-2 token ids.
//! Output lengths: the entry's `max_new_tokens`, else a draw from
//! `--output-len`, else `--max-new-tokens`. Draws are seeded by `--seed` and
//! the run's label, so every run is reproducible.

use ember_common::pb::{GenerateRequest, SamplingParams};
use ember_common::tokenizer::Gpt2Tokenizer;
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::cli::Args;
use crate::dataset::{self, Entry, PromptSpec};
use crate::error::Error;
use crate::lengths::LenDist;

/// GPT-2's end-of-text id; synthetic prompts draw ids below it.
const EOS_ID: u32 = 50256;

/// Builds the Generate requests of each run from the workload flags.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The prompt text after `--prompt-repeats`.
    base_prompt: String,
    /// `--dataset` entries (never empty when present).
    entries: Option<Vec<Entry>>,
    /// `--input-len`: synthetic prompts of this many token ids.
    input_len: Option<LenDist>,
    /// `--output-len`: per-request max_new_tokens.
    output_len: Option<LenDist>,
    /// `--unique-prompts`: prefix each prompt with its run and index.
    unique: bool,
    /// `--pretok`: the client-side tokenizer; `None` sends text.
    tokenizer: Option<Gpt2Tokenizer>,
    /// `--max-new-tokens`, where neither the entry nor `--output-len` says.
    max_new_tokens: u32,
    /// `--no-stop-on-eos`.
    ignore_eos: bool,
    /// Sampling flags; `None` when none was given (greedy, no message sent).
    sampling: Option<SamplingParams>,
    /// Base of each request's sampling seed (`seed + index`) and of the draws.
    seed: u64,
    /// Distinguishes this loadgen process in request ids.
    id_prefix: String,
}

/// One request ready to send, with what the client knows about it.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    /// The message sent.
    pub request: GenerateRequest,
    /// Prompt length when known client-side (token ids sent).
    pub prompt_tokens: Option<u32>,
}

impl Workload {
    /// Reads the workload flags; loads the dataset and, for `--pretok`, the
    /// tokenizer (a bad dataset fails here, before anything connects).
    pub fn from_args(args: &Args) -> Result<Self, Error> {
        let base_prompt = vec![args.prompt.as_str(); args.prompt_repeats].join(" ");
        let tokenizer = if args.pretok {
            Some(Gpt2Tokenizer::embedded()?)
        } else {
            None
        };
        let entries = match &args.data.dataset {
            Some(path) => Some(dataset::load(path, args.data.dataset_format)?),
            None => None,
        };
        let sampling = (args.temperature.is_some() || args.top_k.is_some() || args.top_p.is_some())
            .then_some(SamplingParams {
                temperature: args.temperature,
                top_k: args.top_k,
                top_p: args.top_p,
                seed: None,
            });
        Ok(Workload {
            base_prompt,
            entries,
            input_len: args.data.input_len,
            output_len: args.data.output_len,
            unique: args.unique_prompts,
            tokenizer,
            max_new_tokens: args.max_new_tokens,
            ignore_eos: args.no_stop_on_eos,
            sampling,
            seed: args.seed,
            id_prefix: format!("lg{}", std::process::id()),
        })
    }

    /// The dataset entries, if a `--dataset` was given.
    pub fn entries(&self) -> Option<&[Entry]> {
        self.entries.as_deref()
    }

    /// The `n` requests of one run. `label` is `w<k>` for warmup run k and
    /// `r<k>` for measured run k; it goes into request ids and unique prompts.
    pub fn build(&self, label: &str, n: usize) -> Result<Vec<PreparedRequest>, Error> {
        let label_hash = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut rng = StdRng::seed_from_u64(self.seed ^ label_hash);
        (0..n)
            .map(|index| self.one(label, index, &mut rng))
            .collect()
    }

    fn one(&self, label: &str, index: usize, rng: &mut StdRng) -> Result<PreparedRequest, Error> {
        let entry = self.entries.as_ref().map(|e| &e[index % e.len()]);
        let spec = match (entry, self.input_len) {
            (Some(e), _) => e.prompt.clone(),
            (None, Some(d)) => PromptSpec::Length(d.sample(rng)),
            (None, None) => PromptSpec::Text(self.base_prompt.clone()),
        };
        let max_new_tokens = entry
            .and_then(|e| e.max_new_tokens)
            .or_else(|| self.output_len.map(|d| d.sample(rng)))
            .unwrap_or(self.max_new_tokens);
        let (prompt, prompt_token_ids) = match spec {
            PromptSpec::Text(base) => {
                let text = if self.unique {
                    format!("[{label}.{index}] {base}")
                } else {
                    base
                };
                match &self.tokenizer {
                    Some(tok) => (String::new(), tok.encode(&text)?),
                    None => (text, Vec::new()),
                }
            }
            PromptSpec::Ids(ids) => (String::new(), ids),
            PromptSpec::Length(n) => (
                String::new(),
                (0..n).map(|_| rng.random_range(0..EOS_ID)).collect(),
            ),
        };
        let prompt_tokens = (!prompt_token_ids.is_empty())
            .then(|| u32::try_from(prompt_token_ids.len()).unwrap_or(u32::MAX));
        let sampling = self.sampling.map(|s| SamplingParams {
            seed: Some(self.seed.wrapping_add(index as u64)),
            ..s
        });
        Ok(PreparedRequest {
            request: GenerateRequest {
                request_id: format!("{}-{label}-{index}", self.id_prefix),
                prompt,
                prompt_token_ids,
                max_new_tokens,
                ignore_eos: self.ignore_eos,
                sampling,
                ..Default::default()
            },
            prompt_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn workload(extra: &[&str]) -> Workload {
        let mut argv = vec!["loadgen", "--target", "x:1"];
        argv.extend_from_slice(extra);
        Workload::from_args(&Args::try_parse_from(argv).expect("parses")).expect("builds")
    }

    #[test]
    fn text_prompts_repeat_and_unique() {
        let w = workload(&[
            "--prompt",
            "hi",
            "--prompt-repeats",
            "3",
            "--unique-prompts",
        ]);
        let reqs = w.build("r0", 2).expect("builds");
        assert_eq!(reqs[0].request.prompt, "[r0.0] hi hi hi");
        assert_eq!(reqs[1].request.prompt, "[r0.1] hi hi hi");
        assert_ne!(reqs[0].request.request_id, reqs[1].request.request_id);
        assert!(reqs[0].request.prompt_token_ids.is_empty());
        assert!(
            reqs[0].request.sampling.is_none(),
            "greedy sends no sampling"
        );
        assert_eq!(reqs[0].request.max_new_tokens, 32);
        assert!(!reqs[0].request.ignore_eos);
    }

    #[test]
    fn pretok_sends_ids_and_sampling_seeds_differ() {
        let w = workload(&[
            "--pretok",
            "--prompt",
            "Hello world",
            "--temperature",
            "0.8",
            "--seed",
            "10",
            "--no-stop-on-eos",
        ]);
        let reqs = w.build("w0", 2).expect("builds");
        // GPT-2: "Hello" = 15496, " world" = 995.
        assert_eq!(reqs[0].request.prompt_token_ids, vec![15496, 995]);
        assert!(reqs[0].request.prompt.is_empty());
        assert_eq!(reqs[0].prompt_tokens, Some(2));
        assert!(reqs[0].request.ignore_eos);
        let seeds: Vec<_> = reqs
            .iter()
            .map(|r| r.request.sampling.and_then(|s| s.seed))
            .collect();
        assert_eq!(seeds, vec![Some(10), Some(11)]);
    }

    #[test]
    fn synthetic_lengths_are_drawn_and_seeded() {
        let w = workload(&[
            "--input-len",
            "uniform:5..9",
            "--output-len",
            "normal:20,3",
            "--seed",
            "4",
        ]);
        let a = w.build("r0", 200).expect("builds");
        let b = w.build("r0", 200).expect("builds");
        let ids = |r: &[PreparedRequest]| {
            r.iter()
                .map(|p| p.request.prompt_token_ids.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b), "same seed and run: same prompts");
        assert_ne!(
            ids(&a),
            ids(&w.build("r1", 200).expect("builds")),
            "other run: other prompts"
        );
        assert!(a
            .iter()
            .all(|p| (5..=9).contains(&p.request.prompt_token_ids.len())));
        assert!(a
            .iter()
            .all(|p| p.request.prompt_token_ids.iter().all(|&t| t < EOS_ID)));
        assert!(a
            .iter()
            .all(|p| p.prompt_tokens == Some(p.request.prompt_token_ids.len() as u32)));
        let mean = a
            .iter()
            .map(|p| f64::from(p.request.max_new_tokens))
            .sum::<f64>()
            / 200.0;
        assert!((mean - 20.0).abs() < 1.5, "mean output length {mean}");
        assert!(
            a.iter().any(|p| p.request.max_new_tokens != 20),
            "drawn, not fixed"
        );
    }

    #[test]
    fn dataset_entries_cycle_and_set_lengths() {
        let path = std::env::temp_dir().join(format!("lg-wl-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            "{\"prompt\":\"a b\",\"max_new_tokens\":3}\n{\"prompt_token_ids\":[7,8]}\n",
        )
        .expect("write");
        let w = workload(&[
            "--dataset",
            path.to_str().expect("utf-8"),
            "--max-new-tokens",
            "9",
        ]);
        let r = w.build("r0", 3).expect("builds");
        let _ = std::fs::remove_file(&path);
        assert_eq!(r[0].request.prompt, "a b");
        assert_eq!(r[0].request.max_new_tokens, 3);
        assert_eq!(r[1].request.prompt_token_ids, vec![7, 8]);
        assert_eq!(
            r[1].request.max_new_tokens, 9,
            "no max_new_tokens: the flag"
        );
        assert_eq!(r[2].request.prompt, "a b", "entries cycle");
    }
}
