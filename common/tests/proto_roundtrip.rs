//! Every message of `ember.v1` survives a prost encode/decode round trip with
//! every field set to a non-default value, and the descriptor set names the
//! service (what reflection serves).

use ember_common::pb;
use prost::Message;

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(msg: M) {
    let bytes = msg.encode_to_vec();
    assert!(
        !bytes.is_empty(),
        "{msg:?} encoded to nothing: a field is left at its default"
    );
    let back = M::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(back, msg);
}

fn timing() -> pb::ServerTiming {
    pb::ServerTiming {
        tokenize_ns: 1,
        enqueue_ns: 2,
        queue_wait_ns: 3,
        prefill_to_first_token_ns: 4,
        server_ttft_ns: 10,
        decode_ns: 5,
        total_ns: 16,
        prefill_batch_size: 7,
        admitted_iteration: 8,
        tokenized_at_ns: 1,
        enqueued_at_ns: 3,
        admitted_at_ns: 6,
        first_token_at_ns: 10,
        finished_at_ns: 16,
        cached_prompt_tokens: 32,
        prefill_chunks: 2,
        preemptions: 1,
        preempted_ns: 9,
    }
}

#[test]
fn every_message_round_trips() {
    let sampling = pb::SamplingParams {
        temperature: Some(0.7),
        top_k: Some(40),
        top_p: Some(0.9),
        min_p: Some(0.05),
        seed: Some(42),
        repetition_penalty: Some(1.1),
        frequency_penalty: Some(0.5),
        presence_penalty: Some(-0.5),
        logit_bias: [(50256, -100.0), (13, 2.5)].into_iter().collect(),
        min_tokens: 3,
    };
    round_trip(sampling.clone());
    // Explicitly-set zeros are distinguishable from unset (proto3 optional).
    let zero = pb::SamplingParams {
        temperature: Some(0.0),
        ..Default::default()
    };
    round_trip(zero.clone());
    assert_ne!(zero, pb::SamplingParams::default());

    round_trip(pb::GenerateRequest {
        request_id: "r-1".into(),
        prompt: "Hello".into(),
        prompt_token_ids: vec![15496, 995],
        max_new_tokens: 16,
        ignore_eos: true,
        sampling: Some(sampling),
        stop: vec!["\n\n".into(), "END".into()],
        stop_token_ids: vec![50256, 13],
        logprobs: Some(0),
        priority: -3,
        n: 2,
        prompt_logprobs: Some(0),
        response_format: Some(pb::ResponseFormat {
            format: Some(pb::response_format::Format::JsonSchema(
                r#"{"type":"object"}"#.into(),
            )),
        }),
    });
    let started = pb::Started {
        request_id: "r-1".into(),
        prompt_tokens: 2,
        server_time_ns: 1234,
    };
    let token = pb::Token {
        index: 3,
        token_id: 995,
        text: " world".into(),
        server_time_ns: 99,
        logprob: Some(-0.25),
        top_logprobs: vec![pb::TopLogprob {
            token_id: 995,
            text: " world".into(),
            logprob: -0.25,
        }],
        choice: 1,
    };
    let finished = pb::Finished {
        request_id: "r-1".into(),
        finish_reason: pb::FinishReason::Length as i32,
        prompt_tokens: 2,
        completion_tokens: 16,
        timing: Some(timing()),
        stop: Some(pb::StopMatch {
            matched: Some(pb::stop_match::Matched::Stop("END".into())),
        }),
        trailing_text: "\n".into(),
        choice: 1,
    };
    let scored = pb::PromptLogprobs {
        first: 1,
        tokens: vec![pb::PromptTokenLogprob {
            token_id: 995,
            logprob: -3.5,
            top_logprobs: Vec::new(),
        }],
        choice: 0,
        first_token_id: 15496,
    };
    round_trip(pb::StopMatch {
        matched: Some(pb::stop_match::Matched::TokenId(0)),
    });
    round_trip(started.clone());
    round_trip(token.clone());
    round_trip(finished.clone());
    round_trip(timing());
    for event in [
        pb::generate_response::Event::Started(started),
        pb::generate_response::Event::Token(token),
        pb::generate_response::Event::Finished(finished),
        pb::generate_response::Event::PromptLogprobs(scored),
    ] {
        round_trip(pb::GenerateResponse { event: Some(event) });
    }
    round_trip(pb::ServerInfo {
        model: "gpt2".into(),
        device: "cpu".into(),
        knobs: Some(pb::SchedulerKnobs {
            max_batch_size: 64,
            prefill_max_batch_size: 16,
            prefill_max_tokens: 4096,
            max_pending: 1024,
            block_size: 16,
            max_new_tokens_limit: 1024,
        }),
        queue_depth: 1,
        active_sequences: 2,
        kv_blocks_total: 100,
        kv_blocks_used: 3,
        counters: Some(pb::Counters {
            received: 1,
            admitted: 2,
            finished: 3,
            cancelled: 4,
            rejected: 5,
            failed: 6,
            deadline_exceeded: 7,
            scheduler_iterations: 8,
            preemptions: 9,
        }),
        n_layer: 12,
        n_head: 12,
        n_embd: 768,
        n_positions: 1024,
        vocab_size: 50257,
        version: "0.1.0".into(),
        prefix_cache_enabled: true,
        prefix_cache_queried_tokens: 420,
        prefix_cache_hit_tokens: 192,
    });
    // An empty message encodes to nothing and still decodes.
    assert_eq!(
        pb::GetServerInfoRequest::decode(&[][..]).unwrap(),
        pb::GetServerInfoRequest {}
    );
}

#[test]
fn finish_reasons_are_stable() {
    assert_eq!(pb::FinishReason::Eos as i32, 1);
    assert_eq!(pb::FinishReason::Length as i32, 2);
    assert_eq!(pb::FinishReason::Cancelled as i32, 3);
    assert_eq!(pb::FinishReason::Stop as i32, 4);
}

#[test]
fn descriptor_set_names_the_service() {
    let set = prost_types_free_check(ember_common::FILE_DESCRIPTOR_SET);
    assert!(set.contains("ember.v1") && set.contains("Inference") && set.contains("ServerTiming"));
}

/// The descriptor set is protobuf bytes; its names appear verbatim in it.
fn prost_types_free_check(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
