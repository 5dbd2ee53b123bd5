//! The gRPC request's generation fields as the engine's
//! [`GenerationParams`]: a thin mapping, one line a field, with the defaults
//! the proto documents (the HTTP door fills the same message from OpenAI's
//! fields). Nothing is checked here: every value is checked once, by
//! [`GenerationParams::validate`], which names the field at fault. The
//! structured-output constraint is compiled later, per choice, by
//! `super::structured`.

use ember_common::pb;
use ember_engine::{
    GenerationParams, LogitTransforms, Outputs, Penalties, SamplingParams, StopRules,
};

/// `req`'s generation parameters (its prompt, id, `n`, priority and
/// response format stay with the request).
pub fn generation_params(req: &mut pb::GenerateRequest) -> GenerationParams {
    let s = req.sampling.take().unwrap_or_default();
    let mut logit_bias: Vec<(u32, f32)> = s.logit_bias.into_iter().collect();
    logit_bias.sort_unstable_by_key(|e| e.0);
    GenerationParams {
        sampling: SamplingParams {
            temperature: s.temperature.unwrap_or(0.0),
            top_k: s.top_k.unwrap_or(0),
            top_p: s.top_p.unwrap_or(1.0),
            min_p: s.min_p.unwrap_or(0.0),
            seed: s.seed,
        },
        transforms: LogitTransforms {
            logit_bias,
            penalties: Penalties {
                repetition: s.repetition_penalty.unwrap_or(1.0),
                frequency: s.frequency_penalty.unwrap_or(0.0),
                presence: s.presence_penalty.unwrap_or(0.0),
            },
        },
        stop: StopRules {
            max_new_tokens: req.max_new_tokens as usize,
            min_tokens: s.min_tokens as usize,
            ignore_eos: req.ignore_eos,
            stop_token_ids: std::mem::take(&mut req.stop_token_ids),
            stop_strings: std::mem::take(&mut req.stop),
        },
        constraint: None,
        outputs: Outputs {
            logprobs: req.logprobs.map(|n| n as usize),
            prompt_logprobs: req.prompt_logprobs.map(|n| n as usize),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_take_the_protos_defaults() {
        let p = generation_params(&mut pb::GenerateRequest {
            max_new_tokens: 4,
            ..Default::default()
        });
        assert_eq!(p.sampling, SamplingParams::greedy());
        assert_eq!(p.transforms, LogitTransforms::default());
        assert_eq!(p.stop, StopRules::new(4));
        assert_eq!(p.outputs, Outputs::default());
    }

    #[test]
    fn every_field_is_mapped() {
        let mut req = pb::GenerateRequest {
            max_new_tokens: 9,
            ignore_eos: true,
            stop: vec!["\n".into()],
            stop_token_ids: vec![7],
            logprobs: Some(2),
            prompt_logprobs: Some(1),
            sampling: Some(pb::SamplingParams {
                temperature: Some(0.5),
                top_k: Some(-1),
                top_p: Some(0.9),
                min_p: Some(0.05),
                seed: Some(3),
                repetition_penalty: Some(1.1),
                frequency_penalty: Some(0.5),
                presence_penalty: Some(-0.5),
                logit_bias: [(9, 1.0), (3, -2.0)].into_iter().collect(),
                min_tokens: 2,
            }),
            ..Default::default()
        };
        let p = generation_params(&mut req);
        let s = p.sampling;
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p, s.seed),
            (0.5, -1, 0.9, 0.05, Some(3))
        );
        assert_eq!(p.transforms.logit_bias, [(3, -2.0), (9, 1.0)], "sorted");
        assert_eq!(
            p.transforms.penalties,
            Penalties {
                repetition: 1.1,
                frequency: 0.5,
                presence: -0.5
            }
        );
        let st = &p.stop;
        assert_eq!(
            (st.max_new_tokens, st.min_tokens, st.ignore_eos),
            (9, 2, true)
        );
        assert_eq!(
            (&st.stop_strings[..], &st.stop_token_ids[..]),
            (&["\n".to_string()][..], &[7][..])
        );
        assert_eq!(
            (p.outputs.logprobs, p.outputs.prompt_logprobs),
            (Some(2), Some(1))
        );
    }
}
