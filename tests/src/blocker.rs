//! The "blocker": one request that holds every KV block for as long as the
//! test wants, so that requests submitted meanwhile *wait* in the pending
//! queue (the server makes requests wait, not fail, when blocks run out).
//!
//! Start the server with [`FLAGS`] (`--block-size 128 --kv-blocks 8`: 1024
//! tokens, the model's context). The blocker asks for 4 prompt + 1020 new
//! tokens; the server reserves prompt + max_new_tokens at admission, so it
//! holds all 8 blocks. It would run 1020 decode steps (seconds even in a
//! release build), and the test ends it early with [`Blocker::release`],
//! which drops the stream: the server cancels it and frees its blocks at the
//! next iteration. This makes the queueing tests independent of how fast the
//! server decodes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::oneshot;

use crate::client::{self, StreamOutcome};

/// Server flags that make the blocker hold every block.
pub const FLAGS: &[&str] = &["--block-size", "128", "--kv-blocks", "8"];

/// Prompt and new tokens of the blocker (sum = 1024 = 8 x 128).
const PROMPT: [u32; 4] = [464, 2068, 7586, 21831];
const NEW_TOKENS: u32 = 1020;

/// A running blocker.
pub struct Blocker {
    /// Set when its stream ends on its own (it should not, before release).
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<StreamOutcome>,
}

impl Blocker {
    /// Starts the blocker on its own connection and returns once it streams
    /// tokens and the server reports every KV block in use.
    pub async fn start(addr: SocketAddr) -> anyhow::Result<Blocker> {
        let mut c = client::connect(addr).await?;
        let (tx, first) = oneshot::channel();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let task = tokio::spawn(async move {
            let mut tx = Some(tx);
            let req = client::ids_request(PROMPT.to_vec(), NEW_TOKENS);
            let out = client::generate_observed(&mut c, req, None, |o| {
                if !o.tokens.is_empty() || o.status.is_some() {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
            })
            .await;
            d.store(true, Ordering::SeqCst);
            out
        });
        let b = Blocker { done, task };
        first
            .await
            .context("blocker: stream ended without a token")?;
        anyhow::ensure!(!b.is_done(), "blocker: ended right after its first token");
        client::wait_info(
            addr,
            Duration::from_secs(10),
            "premise: the blocker holds every KV block",
            |i| i.kv_blocks_total > 0 && i.kv_blocks_used == i.kv_blocks_total,
        )
        .await?;
        Ok(b)
    }

    /// Whether its stream has ended (before release this breaks the premise).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Fails unless the blocker is still running.
    pub fn ensure_running(&self, when: &str) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_done(), "premise: the blocker ended before {when}");
        Ok(())
    }

    /// Drops the blocker's stream (the client leaves): the server cancels it
    /// and frees its blocks.
    pub async fn release(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
