//! Request validation: every check that can fail names the field it is about.
//!
//! Three steps, each once: [`check_request`] before tokenization (the shape
//! of the input, the request id, `n`, the priority, the response format; the
//! generation fields are mapped into [`GenerationParams`] by
//! `super::proto_params`, unchecked), [`check_params`] once the prompt is
//! tokenized and the generation budget final (the one
//! [`GenerationParams::validate`], against the model's vocabulary and the
//! server's `--max-new-tokens-limit`), [`check_prompt`] with it (token ids,
//! context length, KV capacity). A prompt longer than `--prefill-max-tokens`
//! is fine: it is prefilled in chunks. The engine runs the same checks
//! again when it admits a sequence.

use ember_common::pb;

use super::error::ServiceError;
use super::proto_params::generation_params;
use super::structured::ResponseFormat;
use crate::scheduler::policy;
use crate::scheduler::ModelInfo;
use crate::scheduler::{SchedulerKnobs, SchedulingPolicy};
use ember_engine::limits::LimitViolation;
use ember_engine::{GenerationParams, ParamLimits};

/// Longest accepted client request id.
pub const MAX_REQUEST_ID_LEN: usize = 256;
/// Most sequences one request may ask for (`n`).
pub const MAX_N: u32 = 16;

/// The request's input before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A request that passed [`check_request`].
#[derive(Debug, Clone)]
pub struct CheckedRequest {
    pub request_id: String,
    pub input: PromptInput,
    /// What it asks of generation, checked by [`check_params`]; its seed is
    /// still the client's (`None` when unset) and its constraint unset.
    pub params: GenerationParams,
    /// Scheduling priority (lower first); 0 unless the policy is `priority`.
    pub priority: i32,
    /// Sequences to generate from the prompt (1 or more).
    pub n: u32,
    /// Structured output ([`ResponseFormat::Text`] when not asked).
    pub response_format: ResponseFormat,
}

pub fn check_request(
    mut req: pb::GenerateRequest,
    knobs: &SchedulerKnobs,
) -> Result<CheckedRequest, ServiceError> {
    if req.request_id.len() > MAX_REQUEST_ID_LEN {
        return Err(ServiceError::invalid(
            "request_id",
            format!("longer than {MAX_REQUEST_ID_LEN} bytes"),
        ));
    }
    let n = match req.n {
        0 => 1,
        n if n > MAX_N => {
            return Err(ServiceError::invalid(
                "n",
                format!("at most {MAX_N} sequences per request, got {n}"),
            ))
        }
        n => n,
    };
    let response_format = match &req.response_format {
        Some(f) => ResponseFormat::from_pb(f)?,
        None => ResponseFormat::Text,
    };
    let priority = check_priority(req.priority, knobs.policy)?;
    let params = generation_params(&mut req);
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
    Ok(CheckedRequest {
        request_id: req.request_id,
        input,
        params,
        priority,
        n,
        response_format,
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

/// Checks the generation parameters (the one [`GenerationParams::validate`])
/// against the model's vocabulary and the server's `--max-new-tokens-limit`.
pub fn check_params(
    params: &GenerationParams,
    model: &ModelInfo,
    knobs: &SchedulerKnobs,
) -> Result<(), ServiceError> {
    let limits = ParamLimits {
        vocab_size: model.limits.vocab_size,
        max_new_tokens: knobs.max_new_tokens_limit,
    };
    params
        .validate(&limits)
        .map_err(|v| invalid_limit(v, "prompt"))
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
            async_scheduling: true,
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

    /// The field the whole check (request, then parameters) names.
    fn refused(r: pb::GenerateRequest) -> Option<String> {
        let checked = match check_request(r, &knobs()) {
            Ok(c) => c,
            Err(e) => return Some(field_of(e)),
        };
        check_params(&checked.params, &model(), &knobs())
            .err()
            .map(field_of)
    }

    #[test]
    fn each_bad_request_field_is_named() {
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
                pb::GenerateRequest {
                    n: MAX_N + 1,
                    ..req()
                },
                "n",
            ),
            (
                pb::GenerateRequest {
                    priority: 3,
                    ..req()
                },
                "priority",
            ),
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
            assert_eq!(refused(r.clone()).as_deref(), Some(field), "{r:?}");
        }
    }

    #[test]
    fn each_bad_generation_field_is_named_as_the_grpc_request_spells_it() {
        let sampling = |s: pb::SamplingParams| pb::GenerateRequest {
            sampling: Some(s),
            ..req()
        };
        let stop = |stop: &[&str]| pb::GenerateRequest {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..req()
        };
        let sp = pb::SamplingParams::default;
        let cases: Vec<(pb::GenerateRequest, &str)> = vec![
            (
                sampling(pb::SamplingParams {
                    temperature: Some(-1.0),
                    ..sp()
                }),
                "sampling.temperature",
            ),
            (
                sampling(pb::SamplingParams {
                    temperature: Some(f32::NAN),
                    ..sp()
                }),
                "sampling.temperature",
            ),
            (
                sampling(pb::SamplingParams {
                    top_k: Some(-2),
                    ..sp()
                }),
                "sampling.top_k",
            ),
            (
                sampling(pb::SamplingParams {
                    top_p: Some(0.0),
                    ..sp()
                }),
                "sampling.top_p",
            ),
            (
                sampling(pb::SamplingParams {
                    min_p: Some(1.5),
                    ..sp()
                }),
                "sampling.min_p",
            ),
            (
                sampling(pb::SamplingParams {
                    frequency_penalty: Some(3.0),
                    ..sp()
                }),
                "sampling.frequency_penalty",
            ),
            (
                sampling(pb::SamplingParams {
                    logit_bias: [(50257, 1.0)].into_iter().collect(),
                    ..sp()
                }),
                "sampling.logit_bias[50257]",
            ),
            (
                sampling(pb::SamplingParams {
                    min_tokens: 5,
                    ..sp()
                }),
                "sampling.min_tokens",
            ),
            (stop(&["ok", "also", "", "fine"]), "stop[2]"),
            (stop(&[&"x".repeat(257)]), "stop[0]"),
            (stop(&["s"; 17]), "stop"),
        ];
        for (r, field) in cases {
            assert_eq!(refused(r.clone()).as_deref(), Some(field), "{r:?}");
        }
        let fine = pb::GenerateRequest {
            stop: vec!["\n".into()],
            stop_token_ids: vec![0, 50256],
            logprobs: Some(20),
            sampling: Some(pb::SamplingParams {
                temperature: Some(1.0),
                top_k: Some(-1),
                min_p: Some(0.1),
                ..sp()
            }),
            ..req()
        };
        assert_eq!(refused(fine), None);
    }

    #[test]
    fn unset_sampling_is_greedy_and_n_defaults_to_one() {
        let c = check_request(req(), &knobs()).unwrap();
        assert_eq!(c.params.sampling, ember_engine::SamplingParams::greedy());
        assert_eq!((c.n, c.priority), (1, 0));
        assert_eq!(c.response_format, ResponseFormat::Text);
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
