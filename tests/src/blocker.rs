//! The "blocker": requests that hold every KV block for as long as the test
//! wants, so that requests submitted meanwhile *wait* in the pending queue
//! (the server makes requests wait, not fail, when blocks run out).
//!
//! The server takes a request's blocks as it grows (at admission, those of
//! its prompt and next token), so a request can hold a block for long only
//! if the block is big: with [`FLAGS`] (`--block-size 1024 --kv-blocks 1`)
//! the one block spans the model's whole context, and the blocker (4 prompt
//! and 1020 new tokens) holds it from its admission through 1020 decode steps
//! (seconds even in a release build). The test ends it early with
//! [`Blocker::release`], which drops the stream: the server cancels it and
//! frees its block at the next iteration. This makes the queueing tests
//! independent of how fast the server computes.
//!
//! A test that needs several blocks freed at once (a burst admitted
//! together) starts [`Blocker::start_many`] on a server with
//! [`many_flags`]: one blocker request per block.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use crate::client::{self, StreamOutcome};

/// Server flags that make one blocker hold every block.
pub const FLAGS: &[&str] = &["--block-size", "1024", "--kv-blocks", "1"];

/// Server flags for [`Blocker::start_many`] with `n` blockers: `n` blocks,
/// each the model's whole context.
pub fn many_flags(n: usize) -> Vec<String> {
    ["--block-size", "1024", "--kv-blocks"]
        .iter()
        .map(|s| s.to_string())
        .chain([n.to_string()])
        .collect()
}

/// Prompt and new tokens of one blocker (1024 tokens: one block).
const PROMPT: [u32; 4] = [464, 2068, 7586, 21831];
const NEW_TOKENS: u32 = 1020;

/// Running blocker requests.
pub struct Blocker {
    /// Blocker streams that ended on their own (none should, before release).
    done: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<StreamOutcome>>,
}

impl Blocker {
    /// Starts one blocker and returns once it streams tokens and the server
    /// reports every KV block in use (server started with [`FLAGS`]).
    pub async fn start(addr: SocketAddr) -> anyhow::Result<Blocker> {
        let b = Self::spawn(addr, 1).await?;
        client::wait_info(
            addr,
            Duration::from_secs(10),
            "premise: the blocker holds every KV block",
            |i| i.kv_blocks_total > 0 && i.kv_blocks_used == i.kv_blocks_total,
        )
        .await?;
        Ok(b)
    }

    /// Starts `n` blockers, one block each (server started with
    /// [`many_flags`]`(n)`), and returns once each is running or queued and
    /// the running ones hold every block they can: all `n` when the running
    /// cap allows, else the cap's worth, with the rest queued ahead of
    /// anything the test sends next.
    pub async fn start_many(addr: SocketAddr, n: usize) -> anyhow::Result<Blocker> {
        let b = Self::spawn(addr, n).await?;
        client::wait_info(
            addr,
            Duration::from_secs(10),
            "premise: every blocker is running or queued, the running ones holding a block each",
            |i| {
                (i.active_sequences + i.queue_depth) as usize == n
                    && i.kv_blocks_used == i.active_sequences
                    && i.active_sequences > 0
            },
        )
        .await?;
        Ok(b)
    }

    /// Sends `n` blocker requests (each on its own connection) and waits
    /// until each is accepted (its `Started`); the first must stream tokens.
    async fn spawn(addr: SocketAddr, n: usize) -> anyhow::Result<Blocker> {
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, mut started) = mpsc::unbounded_channel();
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let mut c = client::connect(addr).await?;
            let (tx, d) = (tx.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut tx = Some(tx);
                let req = client::ids_request(PROMPT.to_vec(), NEW_TOKENS);
                let out = client::generate_observed(&mut c, req, None, |o| {
                    // The first blocker must get going; the others may queue.
                    let ready = if i == 0 {
                        !o.tokens.is_empty()
                    } else {
                        o.started.is_some()
                    };
                    if ready || o.status.is_some() {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                })
                .await;
                d.fetch_add(1, Ordering::SeqCst);
                out
            }));
            started
                .recv()
                .await
                .context("blocker: a stream ended before it started")?;
        }
        let b = Blocker { done, tasks };
        anyhow::ensure!(!b.is_done(), "blocker: ended right after it started");
        Ok(b)
    }

    /// Whether a blocker stream has ended (before release this breaks the
    /// premise).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst) > 0
    }

    /// Fails unless every blocker is still running.
    pub fn ensure_running(&self, when: &str) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_done(), "premise: the blocker ended before {when}");
        Ok(())
    }

    /// Drops the blockers' streams (the clients leave): the server cancels
    /// them and frees their blocks.
    pub async fn release(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
