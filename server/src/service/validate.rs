//! Request validation: every check that can fail names the field it is about.
//!
//! Three checks: [`check_request`] before tokenization (shape of the input,
//! limits, sampling, stop strings), [`check_controls`] once the model is known,
//! still before tokenization (stop token ids against the vocabulary, the
//! logprobs count), [`check_prompt`] after it (token ids, context length, KV
//! capacity). A prompt longer than `--prefill-max-tokens` is fine: it is
//! prefilled in chunks. The limits themselves live in
//! [`ember_engine::limits`], which the engine checks again.

use ember_common::pb;

use super::error::ServiceError;
use super::options::{self, GenerationOptions};
use crate::scheduler::policy;
use crate::scheduler::ModelInfo;
use crate::scheduler::{SchedulerKnobs, SchedulingPolicy};
use ember_engine::limits::{self, LimitViolation};
use ember_engine::SamplingParams;

/// Longest accepted client request id.
pub const MAX_REQUEST_ID_LEN: usize = 256;

/// The request's input before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A request that passed [`check_request`].
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRequest {
    pub request_id: String,
    pub input: PromptInput,
    pub max_new_tokens: usize,
    pub ignore_eos: bool,
    /// Sampling with the seed still to be filled in when unset.
    pub sampling: SamplingParams,
    pub seed_given: bool,
    /// Stop strings, matched by the stream task on the detokenized text.
    pub stop: Vec<String>,
    /// Stop token ids, judged by the engine.
    pub stop_token_ids: Vec<u32>,
    /// Top-n of the logprobs to return; `None` = no logprobs.
    pub logprobs: Option<usize>,
    /// Scheduling priority (lower first); 0 unless the policy is `priority`.
    pub priority: i32,
    /// Penalties, logit bias, min_tokens, prompt logprobs, n, response format.
    pub options: GenerationOptions,
}

pub fn check_request(
    req: pb::GenerateRequest,
    knobs: &SchedulerKnobs,
) -> Result<CheckedRequest, ServiceError> {
    let options = options::read(&req)?;
    if req.request_id.len() > MAX_REQUEST_ID_LEN {
        return Err(ServiceError::invalid(
            "request_id",
            format!("longer than {MAX_REQUEST_ID_LEN} bytes"),
        ));
    }
    let input = match (req.prompt.is_empty(), req.prompt_token_ids.is_empty()) {
        (false, false) => {
            return Err(ServiceError::invalid(
                "prompt",
                "set either prompt or prompt_token_ids, not both",
            ))
        }
        (true, true) => {
            return Err(ServiceError::invalid(
                "prompt",
                "empty input: set prompt (text) or prompt_token_ids",
            ))
        }
        (false, true) => PromptInput::Text(req.prompt),
        (true, false) => PromptInput::Ids(req.prompt_token_ids),
    };
    let max_new_tokens = req.max_new_tokens as usize;
    if max_new_tokens == 0 && options.prompt_logprobs.is_none() {
        return Err(ServiceError::invalid(
            "max_new_tokens",
            "must be at least 1 (0 only with prompt_logprobs, to score the prompt)",
        ));
    }
    if max_new_tokens > knobs.max_new_tokens_limit {
        return Err(ServiceError::invalid(
            "max_new_tokens",
            format!(
                "{max_new_tokens} is above the server's --max-new-tokens-limit {}",
                knobs.max_new_tokens_limit
            ),
        ));
    }
    let s = req.sampling.unwrap_or_default();
    let temperature = s.temperature.unwrap_or(0.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ServiceError::invalid(
            "sampling.temperature",
            format!("must be a finite number >= 0, got {temperature}"),
        ));
    }
    let top_k = s.top_k.unwrap_or(0);
    if top_k < 0 {
        return Err(ServiceError::invalid(
            "sampling.top_k",
            format!("must be >= 0, got {top_k}"),
        ));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ServiceError::invalid(
            "sampling.top_p",
            format!("must be in (0, 1], got {top_p}"),
        ));
    }
    limits::check_stop_strings(&req.stop).map_err(|v| invalid_limit(v, "prompt"))?;
    let priority = check_priority(req.priority, knobs.policy)?;
    Ok(CheckedRequest {
        request_id: req.request_id,
        input,
        max_new_tokens,
        ignore_eos: req.ignore_eos,
        sampling: SamplingParams {
            temperature,
            top_k: top_k as usize,
            top_p,
            seed: s.seed.unwrap_or(0),
        },
        seed_given: s.seed.is_some(),
        stop: req.stop,
        stop_token_ids: req.stop_token_ids,
        logprobs: req.logprobs.map(|n| n as usize),
        priority,
        options,
    })
}

/// A request's priority under the server's policy, which decides
/// ([`policy::Policy::check_priority`]: any under `priority`, only 0 under
/// `fcfs`, as vLLM).
fn check_priority(priority: i32, config: SchedulingPolicy) -> Result<i32, ServiceError> {
    policy::build(config)
        .check_priority(priority)
        .map(|()| priority)
        .map_err(|refused| ServiceError::invalid("priority", refused.to_string()))
}

/// Checks the stop token ids, the logprobs count and the generation options
/// against the model.
pub fn check_controls(req: &CheckedRequest, model: &ModelInfo) -> Result<(), ServiceError> {
    model
        .limits
        .check_controls(&req.stop_token_ids, req.logprobs)
        .map_err(|v| invalid_limit(v, "prompt"))?;
    options::check(&req.options, req.max_new_tokens, model.limits.vocab_size)
}

/// A broken limit as INVALID_ARGUMENT naming its field; `prompt_field` is the
/// field the prompt came in.
fn invalid_limit(v: LimitViolation, prompt_field: &str) -> ServiceError {
    ServiceError::invalid(v.field.name(prompt_field), v.message)
}

/// Checks the prompt's token ids against the model and the server's capacity.
/// `field` is the request field the ids came from.
pub fn check_prompt(
    ids: &[u32],
    field: &'static str,
    max_new_tokens: usize,
    model: &ModelInfo,
) -> Result<(), ServiceError> {
    model
        .limits
        .check(ids, max_new_tokens)
        .map_err(|v| invalid_limit(v, field))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_engine::limits::RequestLimits;
    use ember_engine::model::Gpt2Config;

    fn knobs() -> SchedulerKnobs {
        SchedulerKnobs {
            max_batch_size: 8,
            prefill_max_batch_size: 8,
            prefill_max_tokens: 512,
            max_pending: 16,
            max_new_tokens_limit: 256,
            policy: SchedulingPolicy::Fcfs,
        }
    }

    fn model() -> ModelInfo {
        let config = Gpt2Config::tiny();
        ModelInfo {
            name: "test".into(),
            device: "cpu".into(),
            limits: RequestLimits {
                vocab_size: config.vocab_size,
                context: config.n_positions,
                block_size: 16,
                kv_blocks_total: 64,
            },
            config,
            prefix_caching: true,
            load_seconds: 0.0,
        }
    }

    fn req() -> pb::GenerateRequest {
        pb::GenerateRequest {
            prompt: "Hello".into(),
            max_new_tokens: 4,
            ..Default::default()
        }
    }

    fn field_of(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("not a validation error: {other}"),
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let sampling = |s: pb::SamplingParams| pb::GenerateRequest {
            sampling: Some(s),
            ..req()
        };
        let stop = |stop: &[&str]| pb::GenerateRequest {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..req()
        };
        let cases: Vec<(pb::GenerateRequest, &str)> = vec![
            (
                pb::GenerateRequest {
                    prompt: String::new(),
                    ..req()
                },
                "prompt",
            ),
            (
                pb::GenerateRequest {
                    prompt_token_ids: vec![1],
                    ..req()
                },
                "prompt",
            ),
            (
                pb::GenerateRequest {
                    max_new_tokens: 0,
                    ..req()
                },
                "max_new_tokens",
            ),
            (
                pb::GenerateRequest {
                    max_new_tokens: 257,
                    ..req()
                },
                "max_new_tokens",
            ),
            (
                pb::GenerateRequest {
                    request_id: "x".repeat(300),
                    ..req()
                },
                "request_id",
            ),
            (
                sampling(pb::SamplingParams {
                    temperature: Some(-1.0),
                    ..Default::default()
                }),
                "sampling.temperature",
            ),
            (
                sampling(pb::SamplingParams {
                    temperature: Some(f32::NAN),
                    ..Default::default()
                }),
                "sampling.temperature",
            ),
            (
                sampling(pb::SamplingParams {
                    top_k: Some(-1),
                    ..Default::default()
                }),
                "sampling.top_k",
            ),
            (
                sampling(pb::SamplingParams {
                    top_p: Some(0.0),
                    ..Default::default()
                }),
                "sampling.top_p",
            ),
            (
                sampling(pb::SamplingParams {
                    top_p: Some(1.5),
                    ..Default::default()
                }),
                "sampling.top_p",
            ),
            (stop(&["ok", "also", "", "fine"]), "stop[2]"),
            (stop(&[&"x".repeat(257)]), "stop[0]"),
            (stop(&["s"; 17]), "stop"),
        ];
        for (r, field) in cases {
            let err = check_request(r.clone(), &knobs()).expect_err(field);
            assert_eq!(field_of(err), field, "{r:?}");
        }
    }

    #[test]
    fn controls_are_checked_against_the_model() {
        let m = model();
        let checked = |r: pb::GenerateRequest| check_request(r, &knobs()).unwrap();
        let ok = checked(pb::GenerateRequest {
            stop: vec!["\n".into()],
            stop_token_ids: vec![0, 50256],
            logprobs: Some(20),
            ..req()
        });
        assert!(check_controls(&ok, &m).is_ok());
        assert_eq!((ok.logprobs, ok.stop.len()), (Some(20), 1));
        let cases = [
            (
                pb::GenerateRequest {
                    stop_token_ids: vec![50257],
                    ..req()
                },
                "stop_token_ids[0]",
            ),
            (
                pb::GenerateRequest {
                    stop_token_ids: vec![1; 65],
                    ..req()
                },
                "stop_token_ids",
            ),
            (
                pb::GenerateRequest {
                    logprobs: Some(21),
                    ..req()
                },
                "logprobs",
            ),
        ];
        for (r, field) in cases {
            let err = check_controls(&checked(r), &m).expect_err(field);
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn unset_sampling_is_greedy() {
        let c = check_request(req(), &knobs()).unwrap();
        assert_eq!(c.sampling.temperature, 0.0);
        assert_eq!(c.sampling.top_p, 1.0);
        assert_eq!(c.sampling.top_k, 0);
        assert!(!c.seed_given);
    }

    #[test]
    fn prompt_checks() {
        let m = model();
        assert!(check_prompt(&[1, 2, 3], "prompt", 4, &m).is_ok());
        assert_eq!(
            field_of(check_prompt(&[], "prompt", 4, &m).unwrap_err()),
            "prompt"
        );
        assert_eq!(
            field_of(check_prompt(&[50257], "prompt_token_ids", 4, &m).unwrap_err()),
            "prompt_token_ids"
        );
        let long = vec![1u32; 1000];
        assert_eq!(
            field_of(check_prompt(&long, "prompt", 100, &m).unwrap_err()),
            "max_new_tokens"
        );
        // Longer than --prefill-max-tokens (512): prefilled in chunks.
        assert!(check_prompt(&long[..600], "prompt", 10, &m).is_ok());
        let mut small = model();
        small.limits.kv_blocks_total = 1;
        assert_eq!(
            field_of(check_prompt(&[1; 10], "prompt", 10, &small).unwrap_err()),
            "max_new_tokens"
        );
    }
}
