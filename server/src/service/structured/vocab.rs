//! The GPT-2 vocabulary as llguidance sees it: a token trie over each
//! token's raw bytes, and the tokenizer for the few strings llguidance
//! tokenizes itself.
//!
//! Special tokens (`<|endoftext|>`) are entered with toktrie's special-token
//! marker byte in front, so no grammar can spell them out as text; the
//! sequence's end-of-sequence token is the one the engine stops on (the
//! model's, which may differ from the tokenizer's).

use std::sync::Arc;

use ember_common::tokenizer::Gpt2Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// [`TokenizerEnv`] over a [`Gpt2Tokenizer`].
struct Gpt2TokEnv {
    tokenizer: Gpt2Tokenizer,
    trie: TokTrie,
}

impl TokenizerEnv for Gpt2TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text through the real BPE; bytes that are not UTF-8 greedily
        // through the trie. A tokenizer failure (never seen on text) yields
        // nothing rather than a panic.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text).unwrap_or_default()
        })
    }
}

/// The token environment of `tokenizer` with `eos` as the end of sequence.
pub fn tok_env(tokenizer: &Gpt2Tokenizer, eos: u32) -> Result<TokEnv, String> {
    let mut words = tokenizer.token_bytes().to_vec();
    let vocab_size = words.len();
    if eos as usize >= vocab_size {
        return Err(format!(
            "the end-of-sequence token {eos} is outside the tokenizer's {vocab_size} tokens"
        ));
    }
    for id in tokenizer.special_token_ids() {
        if let Some(word) = words.get_mut(id as usize) {
            word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }
    let info = TokRxInfo::new(vocab_size as u32, eos);
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(Gpt2TokEnv {
        tokenizer: tokenizer.clone(),
        trie,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_tokens_are_marked_and_text_tokenizes_as_the_bpe_does() {
        let tokenizer = Gpt2Tokenizer::embedded().unwrap();
        let env = tok_env(&tokenizer, 50256).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), 50257);
        assert_eq!(trie.eos_token(), 50256);
        assert!(trie.is_special_token(50256));
        assert_eq!(trie.token(15496), b"Hello");
        assert_eq!(env.tokenize("Hello world"), vec![15496, 995]);
        assert!(tok_env(&tokenizer, 50257).is_err());
    }
}
