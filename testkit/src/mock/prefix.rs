//! The mock's prefix cache, so a client's prefix-cache figures have
//! something to measure: prompts are cut into blocks of [`BLOCK`] tokens
//! (token ids, or a text prompt's whitespace words), each block known by the
//! hash of everything up to its end; a request's cached tokens are its
//! leading blocks seen before (at most all but its last token, as Ember
//! computes the last one for its logits), then its own blocks are added.
//! Counted as vLLM counts: every prompt token queried, the cached ones hit.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Tokens per block (Ember's default block size).
pub const BLOCK: usize = 16;

/// Blocks seen so far and the counters `/metrics` exports.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    /// Hashes of every block prefix seen.
    blocks: Mutex<HashSet<u64>>,
    /// Prompt tokens looked up (`vllm:prefix_cache_queries_total`).
    pub queries: AtomicU64,
    /// Of those, found cached (`vllm:prefix_cache_hits_total`).
    pub hits: AtomicU64,
}

/// A text prompt's tokens: its whitespace words, hashed.
pub(crate) fn words(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.split_whitespace().map(|w| {
        let mut h = DefaultHasher::new();
        w.hash(&mut h);
        h.finish()
    })
}

impl PrefixCache {
    /// The leading tokens of `tokens` found cached; remembers its blocks.
    pub fn lookup(&self, tokens: &[u64]) -> u32 {
        let mut h = DefaultHasher::new();
        let mut keys = Vec::with_capacity(tokens.len() / BLOCK);
        for block in tokens.chunks_exact(BLOCK) {
            block.hash(&mut h);
            keys.push(h.finish());
        }
        let limit = tokens.len().saturating_sub(1);
        let cached = match self.blocks.lock() {
            Ok(mut seen) => {
                let found = keys.iter().take_while(|k| seen.contains(k)).count();
                seen.extend(keys);
                (found * BLOCK).min(limit / BLOCK * BLOCK)
            }
            Err(_) => 0,
        };
        self.queries
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        self.hits.fetch_add(cached as u64, Ordering::Relaxed);
        cached as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_blocks_seen_before_are_cached() {
        let c = PrefixCache::default();
        let a: Vec<u64> = (0..40).collect();
        assert_eq!(c.lookup(&a), 0, "cold");
        let mut b: Vec<u64> = (0..32).collect();
        b.extend(100..110);
        assert_eq!(c.lookup(&b), 32, "two shared blocks");
        assert_eq!(c.lookup(&a[..32]), 16, "all but the last token");
        assert_eq!(c.queries.load(Ordering::Relaxed), 40 + 42 + 32);
        assert_eq!(c.hits.load(Ordering::Relaxed), 48);
        assert_eq!(words("a b  a").count(), 3);
    }
}
