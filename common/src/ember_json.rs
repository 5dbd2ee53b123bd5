//! Ember's extension fields on the OpenAI-compatible HTTP API, written one
//! way for every producer: the server's HTTP door and the test kit's mock
//! (loadgen reads them back by these names).
//!
//! `ember_timing` is gRPC's `ServerTiming`, field for field, under the proto
//! names, as integers.

use serde_json::{json, Value};

use crate::pb::ServerTiming;

/// `ember_timing`: every [`ServerTiming`] field under its proto name.
pub fn timing(t: &ServerTiming) -> Value {
    json!({
        "tokenize_ns": t.tokenize_ns,
        "enqueue_ns": t.enqueue_ns,
        "queue_wait_ns": t.queue_wait_ns,
        "prefill_to_first_token_ns": t.prefill_to_first_token_ns,
        "server_ttft_ns": t.server_ttft_ns,
        "decode_ns": t.decode_ns,
        "total_ns": t.total_ns,
        "prefill_batch_size": t.prefill_batch_size,
        "admitted_iteration": t.admitted_iteration,
        "tokenized_at_ns": t.tokenized_at_ns,
        "enqueued_at_ns": t.enqueued_at_ns,
        "admitted_at_ns": t.admitted_at_ns,
        "first_token_at_ns": t.first_token_at_ns,
        "finished_at_ns": t.finished_at_ns,
        "cached_prompt_tokens": t.cached_prompt_tokens,
        "prefill_chunks": t.prefill_chunks,
        "preemptions": t.preemptions,
        "preempted_ns": t.preempted_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_written_under_its_proto_name() {
        let t = ServerTiming {
            server_ttft_ns: 9,
            prefill_chunks: 2,
            ..Default::default()
        };
        let v = timing(&t);
        assert_eq!(v["server_ttft_ns"], 9);
        assert_eq!(v["prefill_chunks"], 2);
        assert_eq!(v.as_object().map(|o| o.len()), Some(18));
    }
}
