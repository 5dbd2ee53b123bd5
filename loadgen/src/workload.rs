//! The requests of one run, built (and with `--pretok`, tokenized) before the
//! run's clock starts, so prompt preparation never shows up as submit lag.

use ember_common::pb::{GenerateRequest, SamplingParams};
use ember_common::tokenizer::Gpt2Tokenizer;

use crate::cli::Args;
use crate::error::Error;

/// Builds the Generate requests of each run from the workload flags.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The prompt text after `--prompt-repeats`.
    base_prompt: String,
    /// `--unique-prompts`: prefix each prompt with its run and index.
    unique: bool,
    /// `--pretok`: the client-side tokenizer; `None` sends text.
    tokenizer: Option<Gpt2Tokenizer>,
    /// Copied into every request.
    max_new_tokens: u32,
    /// `--no-stop-on-eos`.
    ignore_eos: bool,
    /// Sampling flags; `None` when none was given (greedy, no message sent).
    sampling: Option<SamplingParams>,
    /// Base of each request's sampling seed (`seed + index`).
    seed: u64,
    /// Distinguishes this loadgen process in request ids.
    id_prefix: String,
}

/// One request ready to send, with what the client knows about it.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    /// The message sent.
    pub request: GenerateRequest,
    /// Prompt length when tokenized client-side (`--pretok`).
    pub prompt_tokens: Option<u32>,
}

impl Workload {
    /// Reads the workload flags; loads the tokenizer for `--pretok`.
    pub fn from_args(args: &Args) -> Result<Self, Error> {
        let base_prompt = vec![args.prompt.as_str(); args.prompt_repeats].join(" ");
        let tokenizer = if args.pretok {
            Some(Gpt2Tokenizer::embedded()?)
        } else {
            None
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
            unique: args.unique_prompts,
            tokenizer,
            max_new_tokens: args.max_new_tokens,
            ignore_eos: args.no_stop_on_eos,
            sampling,
            seed: args.seed,
            id_prefix: format!("lg{}", std::process::id()),
        })
    }

    /// The `n` requests of one run. `label` is `w<k>` for warmup run k and
    /// `r<k>` for measured run k; it goes into request ids and unique prompts.
    pub fn build(&self, label: &str, n: usize) -> Result<Vec<PreparedRequest>, Error> {
        (0..n).map(|index| self.one(label, index)).collect()
    }

    fn one(&self, label: &str, index: usize) -> Result<PreparedRequest, Error> {
        let text = if self.unique {
            format!("[{label}.{index}] {}", self.base_prompt)
        } else {
            self.base_prompt.clone()
        };
        let (prompt, prompt_token_ids) = match &self.tokenizer {
            Some(tok) => (String::new(), tok.encode(&text)?),
            None => (text, Vec::new()),
        };
        let prompt_tokens = self
            .tokenizer
            .as_ref()
            .map(|_| u32::try_from(prompt_token_ids.len()).unwrap_or(u32::MAX));
        let sampling = self.sampling.map(|s| SamplingParams {
            seed: Some(self.seed.wrapping_add(index as u64)),
            ..s
        });
        Ok(PreparedRequest {
            request: GenerateRequest {
                request_id: format!("{}-{label}-{index}", self.id_prefix),
                prompt,
                prompt_token_ids,
                max_new_tokens: self.max_new_tokens,
                ignore_eos: self.ignore_eos,
                sampling,
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
}
