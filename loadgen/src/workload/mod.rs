//! The requests of one run, built (and with `--pretok`, tokenized) before the
//! run's clock starts, so prompt preparation never shows up as submit lag.
//! A [`PreparedRequest`] says what to ask for, not how: each backend
//! (`client::grpc`, `client::openai`) turns it into its own message.
//!
//! Prompts come from `--prompt` (the default), a `--dataset` file (entry
//! `index % len`), or are synthetic: `--input-len` random GPT-2 token ids.
//! Output lengths: the entry's `max_new_tokens`, else a draw from
//! `--output-len`, else `--max-new-tokens`. Draws are seeded by `--seed` and
//! the run's label, so every run is reproducible. The OpenAI chat endpoint
//! takes text only: token-id prompts are decoded with the GPT-2 tokenizer.
//!
//! Layout: [`dataset`] (files), [`lengths`] (length distributions),
//! [`schedule`] (when each request fires), [`feed`] (requests built one at
//! a time, for timed runs).

pub mod dataset;
pub mod feed;
pub mod lengths;
pub mod schedule;

use ember_common::tokenizer::Gpt2Tokenizer;
use rand::{rngs::StdRng, Rng, SeedableRng};

use std::path::PathBuf;

use crate::error::Error;
use crate::workload::dataset::DatasetFormat;
use crate::workload::dataset::{Entry, PromptSpec};
use crate::workload::lengths::LenDist;

/// GPT-2's end-of-text id; synthetic prompts draw ids below it.
const EOS_ID: u32 = 50256;

/// What the prompt is.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids (gRPC `prompt_token_ids`, OpenAI completions' `prompt`
    /// array).
    Ids(Vec<u32>),
}

/// Sampling settings; `None` fields are the server's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sampling {
    /// Temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Top-k (0 = no limit).
    pub top_k: Option<i32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// The request's seed (`--seed + index`).
    pub seed: Option<u64>,
}

/// One request ready to send, with what the client knows about it.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    /// The id sent with it (to find it in the server's logs).
    pub request_id: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate at most; `None`: no limit sent (`--max-new-tokens
    /// none`: the server decides).
    pub max_new_tokens: Option<u32>,
    /// Ask for a streamed response (`--stream`); false: one body at the end.
    pub stream: bool,
    /// Generate exactly `max_new_tokens` (`--no-stop-on-eos`).
    pub ignore_eos: bool,
    /// `None`: no sampling flag was given (greedy).
    pub sampling: Option<Sampling>,
    /// Prompt length when known client-side (token ids sent).
    pub prompt_tokens: Option<u32>,
}

/// What the requests are made of (built by `cli` from the workload flags).
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// The prompt text, already repeated (`--prompt`, `--prompt-repeats`).
    pub base_prompt: String,
    /// `--dataset` and its format.
    pub dataset: Option<(PathBuf, DatasetFormat)>,
    /// `--input-len`: synthetic prompts of this many token ids.
    pub input_len: Option<LenDist>,
    /// `--output-len`: per-request max_new_tokens.
    pub output_len: Option<LenDist>,
    /// `--unique-prompts`.
    pub unique: bool,
    /// `--pretok`.
    pub pretok: bool,
    /// The chat endpoint takes text only: token-id prompts are decoded.
    pub text_only: bool,
    /// `--max-new-tokens` (`None`: `none`).
    pub max_new_tokens: Option<u32>,
    /// `--stream`.
    pub stream: bool,
    /// Count text prompts' tokens client-side (with the GPT-2 tokenizer),
    /// for a backend that must fit the limit to the context itself.
    pub count_prompt_tokens: bool,
    /// `--no-stop-on-eos`.
    pub ignore_eos: bool,
    /// The sampling flags; `None` when none was given (greedy).
    pub sampling: Option<Sampling>,
    /// `--seed`.
    pub seed: u64,
    /// This invocation's nonce (`--nonce`, else drawn at start): in every
    /// unique prompt's prefix, so a second invocation against the same
    /// server does not find the first one's prompts in its prefix cache.
    pub nonce: String,
}

/// Builds the requests of each run from the workload flags.
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
    /// `--pretok`: tokenize text prompts client-side and send ids.
    pretok: bool,
    /// The chat endpoint: token-id prompts are decoded to text.
    text_only: bool,
    /// The GPT-2 tokenizer, loaded when `pretok` or `text_only` need it.
    tokenizer: Option<Gpt2Tokenizer>,
    /// `--max-new-tokens`, where neither the entry nor `--output-len` says
    /// (`None`: no limit sent).
    max_new_tokens: Option<u32>,
    /// `--stream`.
    stream: bool,
    /// Count text prompts' tokens client-side.
    count_prompt_tokens: bool,
    /// The unique prompts' nonce.
    nonce: String,
    /// `--no-stop-on-eos`.
    ignore_eos: bool,
    /// Sampling flags; `None` when none was given.
    sampling: Option<Sampling>,
    /// Base of each request's sampling seed (`seed + index`) and of the draws.
    seed: u64,
    /// Distinguishes this loadgen process in request ids.
    id_prefix: String,
}

impl Workload {
    /// Loads the dataset and, when needed, the tokenizer (a bad dataset
    /// fails here, before anything connects).
    pub fn new(cfg: &WorkloadConfig) -> Result<Self, Error> {
        let entries = match &cfg.dataset {
            Some((path, format)) => Some(dataset::load(path, *format)?),
            None => None,
        };
        let ids_possible = entries.is_some() || cfg.input_len.is_some();
        let tokenizer = if cfg.pretok || (cfg.text_only && ids_possible) || cfg.count_prompt_tokens
        {
            Some(Gpt2Tokenizer::embedded()?)
        } else {
            None
        };
        Ok(Workload {
            base_prompt: cfg.base_prompt.clone(),
            entries,
            input_len: cfg.input_len,
            output_len: cfg.output_len,
            unique: cfg.unique,
            pretok: cfg.pretok,
            text_only: cfg.text_only,
            tokenizer,
            max_new_tokens: cfg.max_new_tokens,
            stream: cfg.stream,
            count_prompt_tokens: cfg.count_prompt_tokens,
            nonce: cfg.nonce.clone(),
            ignore_eos: cfg.ignore_eos,
            sampling: cfg.sampling,
            seed: cfg.seed,
            id_prefix: format!("lg{}", std::process::id()),
        })
    }

    /// The dataset entries, if a `--dataset` was given.
    pub fn entries(&self) -> Option<&[Entry]> {
        self.entries.as_deref()
    }

    /// The `n` requests of one run. `label` is `w<k>` for warmup run k and
    /// `r<k>` for measured run k; it goes into request ids and, after the
    /// nonce, into unique prompts (`[nonce.r0.3] `).
    pub fn build(&self, label: &str, n: usize) -> Result<Vec<PreparedRequest>, Error> {
        let mut rng = self.run_rng(label);
        (0..n)
            .map(|index| self.request(label, index, &mut rng))
            .collect()
    }

    /// The draws of run `label` (seeded by `--seed` and the label).
    pub fn run_rng(&self, label: &str) -> StdRng {
        let label_hash = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        StdRng::seed_from_u64(self.seed ^ label_hash)
    }

    /// Request `index` of run `label`, drawing from the run's `rng` (in
    /// index order, as [`build`](Self::build) does).
    pub fn request(
        &self,
        label: &str,
        index: usize,
        rng: &mut StdRng,
    ) -> Result<PreparedRequest, Error> {
        let entry = self.entries.as_ref().map(|e| &e[index % e.len()]);
        let spec = match (entry, self.input_len) {
            (Some(e), _) => e.prompt.clone(),
            (None, Some(d)) => PromptSpec::Length(d.sample(rng)),
            (None, None) => PromptSpec::Text(self.base_prompt.clone()),
        };
        let max_new_tokens = entry
            .and_then(|e| e.max_new_tokens)
            .or_else(|| self.output_len.map(|d| d.sample(rng)))
            .or(self.max_new_tokens);
        let prompt = self.prompt(spec, label, index, rng)?;
        let count = |n: usize| Some(u32::try_from(n).unwrap_or(u32::MAX));
        let prompt_tokens = match (&prompt, &self.tokenizer) {
            (Prompt::Ids(ids), _) => count(ids.len()),
            (Prompt::Text(t), Some(tok)) if self.count_prompt_tokens => count(tok.encode(t)?.len()),
            (Prompt::Text(_), _) => None,
        };
        let sampling = self.sampling.map(|s| Sampling {
            seed: Some(self.seed.wrapping_add(index as u64)),
            ..s
        });
        Ok(PreparedRequest {
            request_id: format!("{}-{label}-{index}", self.id_prefix),
            prompt,
            max_new_tokens,
            stream: self.stream,
            ignore_eos: self.ignore_eos,
            sampling,
            prompt_tokens,
        })
    }

    /// The prompt of one request: text (made unique, tokenized with
    /// `--pretok`) or ids (decoded for the chat endpoint).
    fn prompt(
        &self,
        spec: PromptSpec,
        label: &str,
        index: usize,
        rng: &mut StdRng,
    ) -> Result<Prompt, Error> {
        let ids = match spec {
            PromptSpec::Text(base) => {
                let text = if self.unique {
                    format!("[{}.{label}.{index}] {base}", self.nonce)
                } else {
                    base
                };
                return match (&self.tokenizer, self.pretok) {
                    (Some(tok), true) => Ok(Prompt::Ids(tok.encode(&text)?)),
                    _ => Ok(Prompt::Text(text)),
                };
            }
            PromptSpec::Ids(ids) => ids,
            PromptSpec::Length(n) => (0..n).map(|_| rng.random_range(0..EOS_ID)).collect(),
        };
        match (&self.tokenizer, self.text_only) {
            (Some(tok), true) => Ok(Prompt::Text(tok.decode(&ids))),
            _ => Ok(Prompt::Ids(ids)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults of the flags, changed by `edit`.
    fn config(edit: impl FnOnce(&mut WorkloadConfig)) -> WorkloadConfig {
        let mut c = WorkloadConfig {
            base_prompt: "The quick brown fox".into(),
            dataset: None,
            input_len: None,
            output_len: None,
            unique: false,
            pretok: false,
            text_only: false,
            max_new_tokens: Some(32),
            stream: true,
            count_prompt_tokens: false,
            ignore_eos: false,
            sampling: None,
            seed: 0,
            nonce: "n1".into(),
        };
        edit(&mut c);
        c
    }

    fn ids(p: &PreparedRequest) -> Vec<u32> {
        match &p.prompt {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(t) => panic!("expected ids, got text {t:?}"),
        }
    }

    fn workload(edit: impl FnOnce(&mut WorkloadConfig)) -> Workload {
        Workload::new(&config(edit)).expect("builds")
    }

    #[test]
    fn text_prompts_repeat_and_unique() {
        let w = workload(|c| {
            c.base_prompt = "hi hi hi".into();
            c.unique = true;
        });
        let reqs = w.build("r0", 2).expect("builds");
        assert_eq!(reqs[0].prompt, Prompt::Text("[n1.r0.0] hi hi hi".into()));
        assert_eq!(reqs[1].prompt, Prompt::Text("[n1.r0.1] hi hi hi".into()));
        assert_ne!(reqs[0].request_id, reqs[1].request_id);
        assert!(reqs[0].sampling.is_none(), "greedy sends no sampling");
        assert_eq!(reqs[0].max_new_tokens, Some(32));
        assert!(!reqs[0].ignore_eos);
        let other = workload(|c| {
            c.base_prompt = "hi hi hi".into();
            c.unique = true;
            c.nonce = "n2".into();
        });
        assert_ne!(
            other.build("r0", 1).expect("builds")[0].prompt,
            reqs[0].prompt,
            "another invocation's nonce: other prompts"
        );
    }

    #[test]
    fn no_limit_and_client_side_counts() {
        let w = workload(|c| {
            c.base_prompt = "Hello world".into();
            c.max_new_tokens = None;
            c.stream = false;
            c.count_prompt_tokens = true;
        });
        let r = &w.build("r0", 1).expect("builds")[0];
        assert_eq!(r.max_new_tokens, None, "no limit sent");
        assert!(!r.stream);
        assert_eq!(r.prompt, Prompt::Text("Hello world".into()), "still text");
        assert_eq!(r.prompt_tokens, Some(2), "counted with the GPT-2 tokenizer");
    }

    #[test]
    fn pretok_sends_ids_and_sampling_seeds_differ() {
        let w = workload(|c| {
            c.pretok = true;
            c.base_prompt = "Hello world".into();
            c.sampling = Some(Sampling {
                temperature: Some(0.8),
                ..Sampling::default()
            });
            c.seed = 10;
            c.ignore_eos = true;
        });
        let reqs = w.build("w0", 2).expect("builds");
        // GPT-2: "Hello" = 15496, " world" = 995.
        assert_eq!(reqs[0].prompt, Prompt::Ids(vec![15496, 995]));
        assert_eq!(reqs[0].prompt_tokens, Some(2));
        assert!(reqs[0].ignore_eos);
        let seeds: Vec<_> = reqs
            .iter()
            .map(|r| r.sampling.and_then(|s| s.seed))
            .collect();
        assert_eq!(seeds, vec![Some(10), Some(11)]);
    }

    #[test]
    fn synthetic_lengths_are_drawn_and_seeded() {
        let w = workload(|c| {
            c.input_len = Some(LenDist::Uniform { lo: 5, hi: 9 });
            c.output_len = Some(LenDist::Normal {
                mean: 20.0,
                stdev: 3.0,
            });
            c.seed = 4;
        });
        let a = w.build("r0", 200).expect("builds");
        let b = w.build("r0", 200).expect("builds");
        let all_ids = |r: &[PreparedRequest]| r.iter().map(ids).collect::<Vec<_>>();
        assert_eq!(all_ids(&a), all_ids(&b), "same seed and run: same prompts");
        assert_ne!(
            all_ids(&a),
            all_ids(&w.build("r1", 200).expect("builds")),
            "other run: other prompts"
        );
        assert!(a.iter().all(|p| (5..=9).contains(&ids(p).len())));
        assert!(a.iter().all(|p| ids(p).iter().all(|&t| t < EOS_ID)));
        assert!(a
            .iter()
            .all(|p| p.prompt_tokens == Some(ids(p).len() as u32)));
        let mean = a
            .iter()
            .map(|p| f64::from(p.max_new_tokens.unwrap_or(0)))
            .sum::<f64>()
            / 200.0;
        assert!((mean - 20.0).abs() < 1.5, "mean output length {mean}");
        assert!(
            a.iter().any(|p| p.max_new_tokens != Some(20)),
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
        let w = workload(|c| {
            c.dataset = Some((path.clone(), DatasetFormat::Jsonl));
            c.max_new_tokens = Some(9);
        });
        let r = w.build("r0", 3).expect("builds");
        let _ = std::fs::remove_file(&path);
        assert_eq!(r[0].prompt, Prompt::Text("a b".into()));
        assert_eq!(r[0].max_new_tokens, Some(3));
        assert_eq!(r[1].prompt, Prompt::Ids(vec![7, 8]));
        assert_eq!(r[1].max_new_tokens, Some(9), "no max_new_tokens: the flag");
        assert_eq!(r[2].prompt, Prompt::Text("a b".into()), "entries cycle");
    }

    #[test]
    fn chat_decodes_token_id_prompts_to_text() {
        let w = workload(|c| {
            c.text_only = true;
            c.input_len = Some(LenDist::Fixed { n: 4 });
        });
        let r = w.build("r0", 2).expect("builds");
        for p in &r {
            match &p.prompt {
                Prompt::Text(t) => assert!(!t.is_empty(), "decoded text"),
                Prompt::Ids(_) => panic!("chat sends text"),
            }
            assert_eq!(p.prompt_tokens, None, "the server counts decoded text");
        }
    }
}
