//! [`GrammarPass`]: the grammar's share of judging a decode step, run on
//! the rayon pool while the engine thread goes on.
//!
//! Each constrained row's token goes to its constraint (llguidance's
//! matcher: `accept`), which then computes the next step's allowed set (its
//! token mask, tens to hundreds of microseconds a row). Both follow the
//! step's tokens, so they cannot start before the ids are back; but nothing
//! else the engine thread does next needs them: in the overlapped loop it
//! queues the next step's forward pass meanwhile
//! (`super::decode::Engine::decode_async_split`), and only the next step's
//! sampling table waits for the masks.
//!
//! The pass holds no sequence: each job is a row's constraint (shared, behind
//! its mutex) and token; the results come back through a channel and are
//! recorded on the sequences by the engine thread
//! (`super::sequence::Sequence::took_ahead`). A pass whose task died (a
//! panicking constraint) hands back nothing: each row is then judged as
//! without a pass (the constraint takes the token in the judging), never lost.

use std::sync::mpsc;

use rayon::prelude::*;

use super::sequence::{take_ahead, Ahead};
use crate::params::SharedConstraint;
use crate::types::SeqId;

/// One row's result: its sequence, the token, what the constraint made of it.
pub(super) type Took = (SeqId, u32, Ahead);

/// A grammar pass under way (module docs).
pub(super) struct GrammarPass {
    results: mpsc::Receiver<Vec<Took>>,
}

impl GrammarPass {
    /// Starts giving each `(sequence, constraint, token)` of `jobs` its token
    /// and computing its allowed set over `vocab_size` tokens, in parallel on
    /// the rayon pool; `None` without jobs.
    pub fn start(jobs: Vec<(SeqId, SharedConstraint, u32)>, vocab_size: usize) -> Option<Self> {
        if jobs.is_empty() {
            return None;
        }
        let (send, results) = mpsc::channel();
        rayon::spawn(move || {
            let took: Vec<Took> = jobs
                .into_par_iter()
                .map(|(id, constraint, token)| {
                    (id, token, take_ahead(&constraint, token, vocab_size))
                })
                .collect();
            // The engine may have gone (dropped mid-step): nothing to tell.
            let _ = send.send(took);
        });
        Some(Self { results })
    }

    /// Waits for the pass's results (empty if its task died).
    pub fn finish(self) -> Vec<Took> {
        self.results.recv().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::params::TokenConstraint;

    /// Allows `{last + 1}` after taking `last`; refuses token 0.
    #[derive(Debug, Default)]
    struct Counting {
        last: u32,
    }

    impl TokenConstraint for Counting {
        fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
            let next = self.last + 1;
            let mut bits = vec![0u32; 4];
            bits[next as usize / 32] |= 1 << (next % 32);
            Ok(Some(bits))
        }

        fn accept(&mut self, token: u32) -> Result<(), String> {
            if token == 0 {
                return Err("zero".into());
            }
            self.last = token;
            Ok(())
        }
    }

    #[test]
    fn each_row_takes_its_token_and_gets_its_next_mask() {
        let shared = |c: Counting| -> SharedConstraint { Arc::new(Mutex::new(c)) };
        let jobs = vec![
            (1, shared(Counting::default()), 7),
            (2, shared(Counting::default()), 0),
            (3, shared(Counting::default()), 40),
        ];
        let mut took = GrammarPass::start(jobs, 64).unwrap().finish();
        took.sort_by_key(|t| t.0);
        assert!(matches!(&took[0], (1, 7, Ahead::Allowed(Ok(Some(bits)))) if bits == &[1 << 8, 0]));
        assert!(matches!(&took[1], (2, 0, Ahead::Refused(e)) if e == "zero"));
        assert!(
            matches!(&took[2], (3, 40, Ahead::Allowed(Ok(Some(bits)))) if bits == &[0, 1 << 9])
        );
        assert!(GrammarPass::start(Vec::new(), 64).is_none());
    }
}
