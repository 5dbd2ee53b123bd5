//! What the mock does with each request ([`MockConfig`]) and the identity it
//! serves TLS with ([`TlsIdentity`]): the settings every part of the mock
//! reads, below all of them.

use std::time::Duration;

/// A certificate chain and its key, PEM, for serving TLS.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    /// The server certificate (then any intermediates).
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// What the mock does with each request.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Sleep in the handler before returning the stream.
    pub submit_delay: Duration,
    /// received -> first token.
    pub ttft: Duration,
    /// Between tokens.
    pub itl: Duration,
    /// Every k-th request received (1-based, both doors) fails: gRPC
    /// RESOURCE_EXHAUSTED, HTTP 429 with an error body.
    pub fail_every: Option<usize>,
    /// After this many tokens the stream ends with an engine failure (gRPC
    /// INTERNAL; HTTP an `error` event, then `[DONE]`).
    pub fail_after_tokens: Option<u32>,
    /// Health reports NOT_SERVING for this long after start.
    pub health_delay: Duration,
    /// Never report SERVING.
    pub never_serve: bool,
    /// At most this many requests generate at once; the others wait in a
    /// queue (reported as `queue_wait_ns`), so latency grows with load.
    pub slots: Option<usize>,
    /// Both doors require `authorization: Bearer KEY` (gRPC metadata, HTTP
    /// header); without it: UNAUTHENTICATED / 401.
    pub api_key: Option<String>,
    /// Serve both doors over TLS with this identity.
    pub tls: Option<TlsIdentity>,
    /// HTTP: send Ember's extension (`ember` per token, `ember_timing` on the
    /// last content chunk). Off: a plain OpenAI server.
    pub ember_fields: bool,
    /// HTTP: honour `stream_options.include_usage`. Off: never send usage
    /// (the client must count chunks).
    pub usage: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            submit_delay: Duration::ZERO,
            ttft: Duration::from_millis(5),
            itl: Duration::from_millis(2),
            fail_every: None,
            fail_after_tokens: None,
            health_delay: Duration::ZERO,
            never_serve: false,
            slots: None,
            api_key: None,
            tls: None,
            ember_fields: true,
            usage: true,
        }
    }
}
