//! [`Translator`]: what turns a request's events into its response's
//! pieces, in both modes: the response's shape, each choice's text offset
//! for logprobs, and what each choice's prompt adds ([`PromptView`]): its
//! text with `echo`, its tokens' logprobs with `echo` and `logprobs` (the
//! first token has none), and vLLM's `prompt_logprobs` when asked.
//!
//! A prompt's logprobs come from its first choice's prefill (the others
//! share its prompt through the prefix cache), as `PromptLogprobs` messages
//! before that choice's first token; every choice of the prompt shows them.

use std::collections::HashMap;

use ember_common::pb;
use ember_common::tokenizer::Gpt2Tokenizer;
use serde_json::Value;

use super::shapes::{vllm_prompt_logprobs, Api, PromptLogprob, Shape, TokenLogprob, Usage};

/// What the request asked its prompts to add to the response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptOptions {
    /// Completions' `echo`.
    pub echo: bool,
    /// vLLM's `prompt_logprobs` was asked.
    pub prompt_logprobs: bool,
    /// Choices per prompt.
    pub n: u32,
    /// Each prompt's text (decoded when it came as token ids).
    pub texts: Vec<String>,
}

/// What a choice's prompt adds to its response.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptView {
    /// The prompt's text with `echo`, else empty.
    pub text: String,
    /// With `echo` and `logprobs`: each prompt token's entry.
    pub entries: Option<Vec<TokenLogprob>>,
    /// vLLM's `prompt_logprobs`, when asked.
    pub vllm: Option<Value>,
}

/// One scored prompt token: its id, and its logprobs (none for the first).
#[derive(Debug, Clone, PartialEq)]
struct Scored {
    id: u32,
    logprob: Option<PromptLogprob>,
}

/// See the module docs.
pub struct Translator {
    pub api: Api,
    /// For the text of each token in logprobs.
    pub tokenizer: Gpt2Tokenizer,
    /// The request asked for logprobs of its generated tokens.
    pub logprobs: bool,
    prompts: PromptOptions,
    /// Per prompt: its tokens scored so far.
    scored: Vec<Vec<Scored>>,
    shape: Shape,
    /// Per choice: characters of its text so far (logprobs' `text_offset`).
    chars: HashMap<u32, usize>,
}

impl Translator {
    pub fn new(
        (api, created, model): (Api, u64, &str),
        tokenizer: Gpt2Tokenizer,
        logprobs: bool,
        prompts: PromptOptions,
    ) -> Self {
        Self {
            api,
            tokenizer,
            logprobs,
            scored: vec![Vec::new(); prompts.texts.len()],
            prompts,
            shape: Shape::new(api, "ember-unknown", created, model),
            chars: HashMap::new(),
        }
    }

    /// Every choice of every prompt: how many `Finished` end the response.
    pub fn expected(&self) -> usize {
        self.prompts.texts.len().max(1) * self.prompts.n.max(1) as usize
    }

    pub fn shape(&mut self) -> &Shape {
        &self.shape
    }

    pub fn shape_ref(&self) -> &Shape {
        &self.shape
    }

    /// A prompt's `Started` (its id is the request id's): chat's role chunk
    /// of each choice.
    pub fn started(&mut self, request_id: &str) -> Vec<Value> {
        let (api, created) = (self.api, self.shape.created);
        let model = self.shape.model.clone();
        self.shape = Shape::new(api, request_id, created, &model);
        match api {
            Api::Chat => (0..self.prompts.n.max(1))
                .map(|i| self.shape.role_chunk(i))
                .collect(),
            Api::Completions => Vec::new(),
        }
    }

    fn prompt_of(&self, choice: u32) -> usize {
        (choice / self.prompts.n.max(1)) as usize
    }

    /// Files a prompt's scored tokens.
    pub fn prompt_logprobs(&mut self, p: &pb::PromptLogprobs) {
        let prompt = self.prompt_of(p.choice);
        let Some(scored) = self.scored.get_mut(prompt) else {
            return;
        };
        if p.first == 1 {
            scored.push(Scored {
                id: p.first_token_id,
                logprob: None,
            });
        }
        for t in &p.tokens {
            let logprob = PromptLogprob {
                text: self.tokenizer.decode(&[t.token_id]),
                logprob: t.logprob,
                top: t
                    .top_logprobs
                    .iter()
                    .map(|a| (a.token_id, a.text.clone(), a.logprob))
                    .collect(),
            };
            scored.push(Scored {
                id: t.token_id,
                logprob: Some(logprob),
            });
        }
    }

    /// What choice `choice`'s prompt adds (module docs).
    pub fn prompt_view(&self, choice: u32) -> PromptView {
        let prompt = self.prompt_of(choice);
        let scored = self.scored.get(prompt).map_or(&[][..], Vec::as_slice);
        let text = match (self.prompts.echo, self.prompts.texts.get(prompt)) {
            (true, Some(t)) => t.clone(),
            _ => String::new(),
        };
        let entries = (self.prompts.echo && self.logprobs).then(|| {
            let mut offset = 0;
            scored
                .iter()
                .map(|s| {
                    let token = self.tokenizer.decode(&[s.id]);
                    let entry = TokenLogprob {
                        logprob: s.logprob.as_ref().map(|l| l.logprob),
                        top: s.logprob.as_ref().map_or_else(Vec::new, |l| {
                            l.top.iter().map(|(_, t, lp)| (t.clone(), *lp)).collect()
                        }),
                        text_offset: offset,
                        token,
                    };
                    offset += entry.token.chars().count();
                    entry
                })
                .collect()
        });
        let vllm = self.prompts.prompt_logprobs.then(|| {
            let tokens: Vec<(u32, PromptLogprob)> = scored
                .iter()
                .filter_map(|s| Some((s.id, s.logprob.clone()?)))
                .collect();
            vllm_prompt_logprobs(&tokens)
        });
        PromptView {
            text,
            entries,
            vllm,
        }
    }

    /// Streaming: choice `choice`'s prompt chunk, if its prompt adds
    /// anything (its text then counts toward the choice's offsets).
    pub fn prompt_chunk(&mut self, choice: u32) -> Option<Value> {
        if !self.prompts.echo && !self.prompts.prompt_logprobs {
            return None;
        }
        let view = self.prompt_view(choice);
        *self.chars.entry(choice).or_default() += view.text.chars().count();
        Some(
            self.shape
                .prompt_chunk(choice, &view.text, view.entries.as_deref(), view.vllm),
        )
    }

    /// The token's logprobs (if asked), then its text counted as sent.
    pub fn token(&mut self, t: &pb::Token) -> Option<TokenLogprob> {
        let chars = self.chars.entry(t.choice).or_default();
        let entry = t
            .logprob
            .filter(|_| self.logprobs)
            .map(|logprob| TokenLogprob {
                token: self.tokenizer.decode(&[t.token_id]),
                logprob: Some(logprob),
                top: t
                    .top_logprobs
                    .iter()
                    .map(|a| (a.text.clone(), a.logprob))
                    .collect(),
                text_offset: *chars,
            });
        *chars += t.text.chars().count();
        entry
    }

    /// `usage` with a finished choice counted: its tokens, and its prompt's
    /// once (by the prompt's first choice).
    pub fn add_usage(&self, usage: Usage, f: &pb::Finished) -> Usage {
        let first_of_prompt = f.choice.is_multiple_of(self.prompts.n.max(1));
        Usage {
            prompt_tokens: usage.prompt_tokens + if first_of_prompt { f.prompt_tokens } else { 0 },
            completion_tokens: usage.completion_tokens + f.completion_tokens,
        }
    }
}
