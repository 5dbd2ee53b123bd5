//! The generation options beyond sampling, read from a `GenerateRequest` (both
//! doors: the HTTP door translates OpenAI's and vLLM's fields into these):
//! penalties, `logit_bias`, `min_tokens`, `prompt_logprobs`, `n`, and the
//! structured-output `response_format`. Their limits are the engine's
//! (`ember_engine::limits::check_options`), checked here with the field named
//! before anything is queued, and again by the engine.

use ember_common::pb;
use ember_engine::limits::{self, LimitViolation, Options};
use ember_engine::Penalties;

use super::error::ServiceError;
use super::structured::ResponseFormat;

/// Most sequences one request may ask for (`n`).
pub const MAX_N: u32 = 16;

/// A request's generation options beyond sampling (see the module docs).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationOptions {
    pub penalties: Penalties,
    /// Sorted by token id, one entry per token.
    pub logit_bias: Vec<(u32, f32)>,
    pub min_tokens: usize,
    pub prompt_logprobs: Option<usize>,
    /// Sequences to generate from the prompt (1 or more).
    pub n: u32,
    /// Structured output ([`ResponseFormat::Text`] when not asked).
    pub response_format: ResponseFormat,
}

/// Reads the options of `req` (shape checks only; [`check`] needs the model).
pub fn read(req: &pb::GenerateRequest) -> Result<GenerationOptions, ServiceError> {
    let s = req.sampling.clone().unwrap_or_default();
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
    let mut logit_bias: Vec<(u32, f32)> = s.logit_bias.iter().map(|(&t, &b)| (t, b)).collect();
    logit_bias.sort_unstable_by_key(|e| e.0);
    let response_format = match &req.response_format {
        Some(f) => ResponseFormat::from_pb(f)?,
        None => ResponseFormat::Text,
    };
    Ok(GenerationOptions {
        penalties: Penalties {
            repetition: s.repetition_penalty.unwrap_or(1.0),
            frequency: s.frequency_penalty.unwrap_or(0.0),
            presence: s.presence_penalty.unwrap_or(0.0),
        },
        logit_bias,
        min_tokens: s.min_tokens as usize,
        prompt_logprobs: req.prompt_logprobs.map(|n| n as usize),
        n,
        response_format,
    })
}

/// Checks `o` against the engine's limits for a vocabulary of `vocab_size`
/// and `max_new_tokens`; errors name the field (`logit_bias[50256]`).
pub fn check(
    o: &GenerationOptions,
    max_new_tokens: usize,
    vocab_size: usize,
) -> Result<(), ServiceError> {
    let options = Options {
        max_new_tokens,
        penalties: o.penalties,
        logit_bias: &o.logit_bias,
        min_tokens: o.min_tokens,
        prompt_logprobs: o.prompt_logprobs,
    };
    limits::check_options(&options, vocab_size).map_err(invalid)
}

fn invalid(v: LimitViolation) -> ServiceError {
    ServiceError::invalid(v.field.name("prompt"), v.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn options_are_read_with_their_defaults_and_checked_naming_the_field() {
        let plain = read(&pb::GenerateRequest::default()).unwrap();
        assert_eq!(plain.penalties, Penalties::OFF);
        assert_eq!(
            (plain.n, plain.min_tokens, plain.prompt_logprobs),
            (1, 0, None)
        );
        let req = pb::GenerateRequest {
            n: 3,
            prompt_logprobs: Some(2),
            sampling: Some(pb::SamplingParams {
                repetition_penalty: Some(1.1),
                frequency_penalty: Some(0.5),
                logit_bias: [(9, 1.0), (3, -2.0)].into_iter().collect(),
                min_tokens: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = read(&req).unwrap();
        assert_eq!(o.logit_bias, [(3, -2.0), (9, 1.0)]);
        assert_eq!((o.n, o.min_tokens, o.prompt_logprobs), (3, 2, Some(2)));
        assert!(check(&o, 4, 100).is_ok());
        assert_eq!(field(check(&o, 1, 100).unwrap_err()), "min_tokens");
        assert_eq!(field(check(&o, 4, 5).unwrap_err()), "logit_bias[9]");
        let too_many = pb::GenerateRequest {
            n: 17,
            ..Default::default()
        };
        assert_eq!(field(read(&too_many).unwrap_err()), "n");
        let zero = GenerationOptions {
            prompt_logprobs: None,
            ..o
        };
        assert_eq!(field(check(&zero, 0, 100).unwrap_err()), "max_new_tokens");
    }
}
