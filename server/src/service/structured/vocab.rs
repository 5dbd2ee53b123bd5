//! The GPT-2 vocabulary as llguidance sees it: a token trie over each
//! token's raw bytes, and the tokenizer for the few strings llguidance
//! tokenizes itself.
//!
//! Special tokens (`<|endoftext|>`) are entered with toktrie's special-token
//! marker byte in front, so no grammar can spell them out as text; the
//! sequence's end-of-sequence token is the one the engine stops on (the
//! model's, which may differ from the tokenizer's).
//!
//! The trie holds the tokens the *model* can emit ([`ModelTokens`]): a model
//! whose embedding has fewer rows than the tokenizer has tokens (the tiny
//! test fixture: 1,000 of GPT-2's 50,257) gets only those, so no grammar
//! plans with a token the engine can never sample; rows past the
//! tokenizer's tokens are special placeholders no grammar allows.

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
        // Text through the real BPE; bytes that are not UTF-8, and text
        // whose BPE uses a token the model cannot emit (past its embedding
        // rows, so past the trie), greedily through the trie. A tokenizer
        // failure (never seen on text) yields nothing rather than a panic.
        let n_vocab = self.trie.vocab_size() as TokenId;
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            let ids = self.tokenizer.encode(text).unwrap_or_default();
            if ids.iter().all(|&t| t < n_vocab) {
                ids
            } else {
                self.trie.greedy_tokenize(text.as_bytes())
            }
        })
    }
}

/// The tokens a model can emit: ids below `vocab_size` (its embedding
/// rows), ending at `eos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelTokens {
    pub eos: u32,
    pub vocab_size: usize,
}

/// The token environment of `tokenizer` restricted to the tokens the model
/// emits (see the module docs).
pub fn tok_env(tokenizer: &Gpt2Tokenizer, model: ModelTokens) -> Result<TokEnv, String> {
    let ModelTokens { eos, vocab_size } = model;
    if eos as usize >= vocab_size {
        return Err(format!(
            "the end-of-sequence token {eos} is outside the model's {vocab_size} tokens"
        ));
    }
    let mut words = tokenizer.token_bytes().to_vec();
    for id in tokenizer.special_token_ids() {
        if let Some(word) = words.get_mut(id as usize) {
            word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }
    words.truncate(vocab_size);
    for id in words.len()..vocab_size {
        let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        word.extend_from_slice(format!("<|row_{id}|>").as_bytes());
        words.push(word);
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
        let gpt2 = ModelTokens {
            eos: 50256,
            vocab_size: 50257,
        };
        let env = tok_env(&tokenizer, gpt2).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), 50257);
        assert_eq!(trie.eos_token(), 50256);
        assert!(trie.is_special_token(50256));
        assert_eq!(trie.token(15496), b"Hello");
        assert_eq!(env.tokenize("Hello world"), vec![15496, 995]);
        let outside = ModelTokens { eos: 50257, ..gpt2 };
        assert!(tok_env(&tokenizer, outside).is_err());
    }

    #[test]
    fn the_trie_holds_the_tokens_the_model_emits() {
        let tokenizer = Gpt2Tokenizer::embedded().unwrap();
        // The tiny fixture: 1,000 embedding rows, EOS 999.
        let small = ModelTokens {
            eos: 999,
            vocab_size: 1000,
        };
        let env = tok_env(&tokenizer, small).unwrap();
        let trie = env.tok_trie();
        assert_eq!((trie.vocab_size(), trie.eos_token()), (1000, 999));
        // "Hello" is one token (15496) to GPT-2's BPE, past the model's rows:
        // spelled with tokens the model has instead.
        let ids = env.tokenize("Hello world");
        assert!(ids.iter().all(|&t| t < 1000), "{ids:?}");
        assert_eq!(trie.decode(&ids), b"Hello world");
        // A padded embedding (rows past the tokenizer's tokens): placeholders.
        let padded = ModelTokens {
            eos: 50256,
            vocab_size: 50304,
        };
        let trie = tok_env(&tokenizer, padded).unwrap().tok_trie().clone();
        assert_eq!(trie.vocab_size(), 50304);
        assert!(trie.is_special_token(50300));
    }
}
