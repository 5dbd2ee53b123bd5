//! [`GenerationParams::validate`]: each parameter out of range is named as
//! the gRPC request spells it; the edges that are allowed pass.

use super::*;
use crate::limits::MAX_STOP_STRINGS;

const LIMITS: ParamLimits = ParamLimits {
    vocab_size: 100,
    max_new_tokens: 256,
};

fn ok() -> GenerationParams {
    let mut p = GenerationParams::greedy(4);
    p.stop.min_tokens = 4;
    p.stop.stop_token_ids = vec![0, 99];
    p.stop.stop_strings = vec!["\n".into()];
    p.transforms.logit_bias = vec![(3, 100.0), (4, -100.0)];
    p.outputs.logprobs = Some(20);
    p
}

fn field(p: &GenerationParams) -> Option<String> {
    p.validate(&LIMITS).err().map(|v| v.field.name("prompt"))
}

/// One bad edit of valid params and the field its error must name.
type Case = (fn(&mut GenerationParams), &'static str);

#[test]
fn each_parameter_out_of_range_is_named() {
    assert_eq!(field(&ok()), None);
    let cases: Vec<Case> = vec![
        (|p| p.stop.max_new_tokens = 0, "max_new_tokens"),
        (|p| p.stop.max_new_tokens = 257, "max_new_tokens"),
        (|p| p.stop.min_tokens = 5, "sampling.min_tokens"),
        (
            |p| p.stop.stop_strings = vec!["a".into(), "".into()],
            "stop[1]",
        ),
        (|p| p.stop.stop_strings = vec!["x".repeat(257)], "stop[0]"),
        (|p| p.stop.stop_strings = vec!["s".into(); 17], "stop"),
        (
            |p| p.stop.stop_token_ids = vec![5, 100],
            "stop_token_ids[1]",
        ),
        (|p| p.stop.stop_token_ids = vec![1; 65], "stop_token_ids"),
        (|p| p.sampling.temperature = -1.0, "sampling.temperature"),
        (
            |p| p.sampling.temperature = f32::NAN,
            "sampling.temperature",
        ),
        (|p| p.sampling.top_k = -2, "sampling.top_k"),
        (|p| p.sampling.top_p = 0.0, "sampling.top_p"),
        (|p| p.sampling.top_p = 1.5, "sampling.top_p"),
        (|p| p.sampling.min_p = -0.1, "sampling.min_p"),
        (|p| p.sampling.min_p = 1.5, "sampling.min_p"),
        (|p| p.sampling.min_p = f32::NAN, "sampling.min_p"),
        (
            |p| p.transforms.penalties.repetition = 0.0,
            "sampling.repetition_penalty",
        ),
        (
            |p| p.transforms.penalties.frequency = 2.5,
            "sampling.frequency_penalty",
        ),
        (
            |p| p.transforms.penalties.presence = f32::NAN,
            "sampling.presence_penalty",
        ),
        (
            |p| p.transforms.logit_bias = vec![(100, 1.0)],
            "sampling.logit_bias[100]",
        ),
        (
            |p| p.transforms.logit_bias = vec![(7, 1.0), (7, 2.0)],
            "sampling.logit_bias[7]",
        ),
        (
            |p| p.transforms.logit_bias = vec![(7, -100.5)],
            "sampling.logit_bias[7]",
        ),
        (|p| p.outputs.logprobs = Some(21), "logprobs"),
        (|p| p.outputs.prompt_logprobs = Some(21), "prompt_logprobs"),
    ];
    for (edit, want) in cases {
        let mut p = ok();
        edit(&mut p);
        assert_eq!(field(&p).as_deref(), Some(want), "{p:?}");
    }
}

#[test]
fn edges_that_are_allowed() {
    let mut p = ok();
    // vLLM's -1 is no limit, as 0 is; min_p 0 and 1 are in range.
    for (k, min_p) in [(-1, 0.0), (0, 1.0), (50, 0.05)] {
        p.sampling = SamplingParams {
            temperature: 1.0,
            top_k: k,
            top_p: 1.0,
            min_p,
            seed: Some(1),
        };
        assert_eq!(field(&p), None);
    }
    // max_new_tokens 0 scores the prompt.
    let mut scoring = GenerationParams::greedy(0);
    scoring.outputs.prompt_logprobs = Some(0);
    assert_eq!(field(&scoring), None);
    p.transforms.penalties = Penalties {
        repetition: 1.5,
        frequency: -2.0,
        presence: 2.0,
    };
    p.stop.stop_strings = vec!["s".into(); MAX_STOP_STRINGS];
    assert_eq!(field(&p), None);
    let msg = GenerationParams::greedy(300)
        .validate(&LIMITS)
        .unwrap_err()
        .message;
    assert!(msg.contains("--max-new-tokens-limit"), "{msg}");
}
