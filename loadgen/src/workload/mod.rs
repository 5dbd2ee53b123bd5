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
//! a time, for timed runs), [`turns`] (multi-turn sessions' history).
//!
//! Shared prefixes (`--shared-prefix-len L --num-prefixes K`): K prefixes of
//! L random token ids, drawn from the seed and the nonce (the same for every
//! run of an invocation, new for the next invocation); request i is prefix
//! i % K, then its own prompt, made unique by the nonce marker (as token
//! ids; the chat endpoint gets the decoded text).

pub mod dataset;
pub mod feed;
pub mod lengths;
pub mod schedule;
pub mod turns;

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
    /// A session's history (`--turns`): chat's `messages`, else their
    /// flattened text.
    Turns(Vec<turns::Message>),
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
    /// min-p (0 = off).
    pub min_p: Option<f32>,
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
    /// Keep the output text (a session's next turn carries it).
    pub keep_reply: bool,
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
    /// `--shared-prefix-len` and `--num-prefixes`.
    pub shared_prefix: Option<(u32, usize)>,
    /// `--turns`: each prompt is a session's first message (text).
    pub turns: usize,
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
    /// The shared prefixes (`--shared-prefix-len`), token ids.
    prefixes: Option<Vec<Vec<u32>>>,
    /// `--turns` above 1: prompts are a session's first message.
    sessions: bool,
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
        let ids_possible =
            entries.is_some() || cfg.input_len.is_some() || cfg.shared_prefix.is_some();
        let sessions = cfg.turns > 1;
        let tokenizer = if cfg.pretok
            || ((cfg.text_only || sessions) && ids_possible)
            || cfg.count_prompt_tokens
            || cfg.shared_prefix.is_some()
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
            prefixes: cfg
                .shared_prefix
                .map(|(len, k)| draw_prefixes(len, k, cfg.seed, &cfg.nonce)),
            sessions,
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
            (Prompt::Turns(m), Some(tok)) if self.count_prompt_tokens => {
                count(tok.encode(&turns::flatten(m))?.len())
            }
            (Prompt::Text(_) | Prompt::Turns(_), _) => None,
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
            keep_reply: self.sessions,
            ignore_eos: self.ignore_eos,
            sampling,
            prompt_tokens,
        })
    }

    /// The prompt of one request: its own part (text made unique, or ids),
    /// after its shared prefix if any, in the form the door takes (ids for
    /// `--pretok`, text for the chat endpoint, a session's first message).
    fn prompt(
        &self,
        spec: PromptSpec,
        label: &str,
        index: usize,
        rng: &mut StdRng,
    ) -> Result<Prompt, Error> {
        let marker = self
            .unique
            .then(|| format!("[{}.{label}.{index}] ", self.nonce));
        let own = match spec {
            PromptSpec::Text(base) => {
                Prompt::Text(format!("{}{base}", marker.clone().unwrap_or_default()))
            }
            PromptSpec::Ids(ids) => Prompt::Ids(ids),
            PromptSpec::Length(n) => {
                Prompt::Ids((0..n).map(|_| rng.random_range(0..EOS_ID)).collect())
            }
        };
        let prefix = self.prefixes.as_ref().map(|p| &p[index % p.len()]);
        let prompt = match (own, prefix, &self.tokenizer) {
            (own, Some(prefix), Some(tok)) => {
                let mut ids = prefix.clone();
                match own {
                    Prompt::Text(t) => ids.extend(tok.encode(&t)?),
                    Prompt::Ids(own) => {
                        if let Some(m) = &marker {
                            ids.extend(tok.encode(m)?);
                        }
                        ids.extend(own);
                    }
                    Prompt::Turns(_) => {}
                }
                self.form_of_ids(ids)
            }
            (Prompt::Text(t), _, Some(tok)) if self.pretok => Prompt::Ids(tok.encode(&t)?),
            (Prompt::Ids(ids), _, _) => self.form_of_ids(ids),
            (own, _, _) => own,
        };
        Ok(match prompt {
            Prompt::Text(t) if self.sessions => Prompt::Turns(vec![turns::Message::user(t)]),
            other => other,
        })
    }

    /// Token ids as the door takes them: decoded to text for the chat
    /// endpoint and for sessions, else as they are.
    fn form_of_ids(&self, ids: Vec<u32>) -> Prompt {
        match &self.tokenizer {
            Some(tok) if self.text_only || self.sessions => Prompt::Text(tok.decode(&ids)),
            _ => Prompt::Ids(ids),
        }
    }
}

/// `count` prefixes of `len` token ids below end-of-text, drawn from the
/// seed and the nonce: the same for every run of one invocation.
fn draw_prefixes(len: u32, count: usize, seed: u64, nonce: &str) -> Vec<Vec<u32>> {
    let nonce_hash = nonce.bytes().fold(0x8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = StdRng::seed_from_u64(seed ^ nonce_hash ^ 0x5052_4546);
    (0..count)
        .map(|_| (0..len).map(|_| rng.random_range(0..EOS_ID)).collect())
        .collect()
}

#[cfg(test)]
mod tests;
