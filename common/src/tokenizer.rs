//! The GPT-2 byte-level BPE tokenizer and an incremental detokenizer.
//!
//! The default vocabulary (`assets/gpt2/`, see its SOURCE.md) is embedded in the
//! binary so the server and `loadgen --pretok` work with no files on disk. A model
//! directory with its own `tokenizer.json`, or `vocab.json` + `merges.txt`,
//! overrides it.
//!
//! Detokenization is byte-exact: every token id maps to the raw bytes it stands
//! for (GPT-2's byte-to-unicode table, inverted), and [`IncrementalDetokenizer`]
//! emits the longest valid UTF-8 prefix of what it has seen, so a multi-byte
//! character split across tokens is never cut in half.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Tokenizer;

/// GPT-2's end-of-text token in the standard vocabulary.
pub const GPT2_EOS_TOKEN: &str = "<|endoftext|>";

const EMBEDDED_VOCAB: &str = include_str!("../assets/gpt2/vocab.json");
const EMBEDDED_MERGES: &str = include_str!("../assets/gpt2/merges.txt");

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Build(String),
    #[error("tokenizer: cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("tokenizer: encoding failed: {0}")]
    Encode(String),
    #[error("tokenizer: the vocabulary has no end-of-text token {0:?}")]
    NoEos(&'static str),
}

/// A GPT-2 style byte-level BPE tokenizer plus each token's raw bytes.
///
/// Cheap to clone (the tables are shared).
#[derive(Clone)]
pub struct Gpt2Tokenizer {
    inner: Arc<Tokenizer>,
    /// Raw bytes of every token id, for exact incremental detokenization.
    token_bytes: Arc<Vec<Vec<u8>>>,
    eos_token_id: u32,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpt2Tokenizer")
            .field("vocab_size", &self.token_bytes.len())
            .field("eos_token_id", &self.eos_token_id)
            .finish()
    }
}

impl Gpt2Tokenizer {
    /// The standard GPT-2 vocabulary embedded in the binary.
    pub fn embedded() -> Result<Self, TokenizerError> {
        Self::from_vocab_merges(EMBEDDED_VOCAB, EMBEDDED_MERGES)
    }

    /// A tokenizer from a model directory: `tokenizer.json` if present, else
    /// `vocab.json` + `merges.txt`. `Ok(None)` when the directory has neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, TokenizerError> {
        let tokenizer_json = dir.join("tokenizer.json");
        if tokenizer_json.is_file() {
            let tok = Tokenizer::from_file(&tokenizer_json)
                .map_err(|e| TokenizerError::Build(format!("{}: {e}", tokenizer_json.display())))?;
            let vocab = tok.get_vocab(true);
            return Self::from_parts(tok, vocab).map(Some);
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab.is_file() && merges.is_file() {
            let read = |p: &Path| {
                std::fs::read_to_string(p).map_err(|source| TokenizerError::Io {
                    path: p.display().to_string(),
                    source,
                })
            };
            return Self::from_vocab_merges(&read(&vocab)?, &read(&merges)?).map(Some);
        }
        Ok(None)
    }

    /// Build from the text of a `vocab.json` and a `merges.txt`.
    pub fn from_vocab_merges(vocab_json: &str, merges_txt: &str) -> Result<Self, TokenizerError> {
        let vocab: HashMap<String, u32> = parse_vocab(vocab_json)?;
        let merges = parse_merges(merges_txt)?;
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut tok = Tokenizer::new(bpe);
        // GPT-2: ByteLevel pre-tokenizer (add_prefix_space = false, trim_offsets =
        // true, GPT-2's split regex) and the ByteLevel decoder.
        tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        Self::from_parts(tok, vocab)
    }

    fn from_parts(mut tok: Tokenizer, vocab: HashMap<String, u32>) -> Result<Self, TokenizerError> {
        let eos_token_id = *vocab
            .get(GPT2_EOS_TOKEN)
            .ok_or(TokenizerError::NoEos(GPT2_EOS_TOKEN))?;
        // `<|endoftext|>` in a prompt is the special token, as in HF's GPT-2.
        tok.add_special_tokens(&[tokenizers::AddedToken::from(GPT2_EOS_TOKEN, true)]);
        let size = vocab.values().max().map_or(0, |m| *m as usize + 1);
        let unicode_to_byte = unicode_to_byte();
        let mut token_bytes = vec![Vec::new(); size];
        for (piece, id) in &vocab {
            token_bytes[*id as usize] = if piece == GPT2_EOS_TOKEN {
                piece.as_bytes().to_vec()
            } else {
                // Byte-level pieces are made only of the 256 mapped characters;
                // anything else (added tokens) stands for its own UTF-8 text.
                piece
                    .chars()
                    .map(|c| unicode_to_byte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| piece.as_bytes().to_vec())
            };
        }
        Ok(Self {
            inner: Arc::new(tok),
            token_bytes: Arc::new(token_bytes),
            eos_token_id,
        })
    }

    /// Token ids of `text` (no special tokens added; `<|endoftext|>` in the text is
    /// the EOS token).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The text of `ids` (invalid UTF-8 replaced by U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(b) = self.token_bytes.get(id as usize) {
                bytes.extend_from_slice(b);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }

    /// Number of token ids (largest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The raw bytes of every token id (index = id), as detokenization
    /// uses them: what a token-level grammar (structured output) matches
    /// against.
    pub fn token_bytes(&self) -> &[Vec<u8>] {
        &self.token_bytes
    }

    /// The vocabulary's own spelling of token `id` (byte-level: `Ġworld`
    /// for " world"), as HF's `convert_ids_to_tokens` gives it.
    pub fn token_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The ids of the added special tokens (`<|endoftext|>` for GPT-2):
    /// tokens that stand for no text of their own.
    pub fn special_token_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Whether `other` is a clone of this tokenizer (same tables, shared):
    /// what a cache built from one tokenizer's vocabulary is keyed on.
    pub fn shares_vocabulary(&self, other: &Gpt2Tokenizer) -> bool {
        Arc::ptr_eq(&self.token_bytes, &other.token_bytes)
    }

    /// A fresh detokenizer for one request's stream.
    pub fn detokenizer(&self) -> IncrementalDetokenizer {
        IncrementalDetokenizer {
            token_bytes: Arc::clone(&self.token_bytes),
            pending: Vec::new(),
        }
    }
}

/// Turns a stream of token ids into text pieces without ever splitting a
/// multi-byte UTF-8 character: bytes of an incomplete character are held back
/// until the token that completes it arrives.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    token_bytes: Arc<Vec<Vec<u8>>>,
    /// Bytes received but not yet emitted (an incomplete UTF-8 sequence).
    pending: Vec<u8>,
}

impl IncrementalDetokenizer {
    /// Text completed by `token_id` (may be empty).
    pub fn push(&mut self, token_id: u32) -> String {
        if let Some(b) = self.token_bytes.get(token_id as usize) {
            self.pending.extend_from_slice(b);
        }
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: from_utf8 validated these bytes.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that can never become valid: emit U+FFFD, go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still pending at the end of the stream (lossy).
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

fn parse_vocab(vocab_json: &str) -> Result<HashMap<String, u32>, TokenizerError> {
    serde_json::from_str(vocab_json).map_err(|e| TokenizerError::Build(format!("vocab.json: {e}")))
}

fn parse_merges(merges_txt: &str) -> Result<Vec<(String, String)>, TokenizerError> {
    merges_txt
        .lines()
        .enumerate()
        .filter(|(i, l)| (*i != 0 || !l.starts_with("#version")) && !l.trim().is_empty())
        .map(|(i, l)| {
            let mut parts = l.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => Ok((a.to_string(), b.to_string())),
                _ => Err(TokenizerError::Build(format!(
                    "merges.txt line {}: expected two space-separated pieces",
                    i + 1
                ))),
            }
        })
        .collect()
}

/// GPT-2's `bytes_to_unicode`, inverted: the printable character each byte was
/// mapped to -> the byte.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter()
        .zip(cs)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Gpt2Tokenizer {
        Gpt2Tokenizer::embedded().expect("embedded tokenizer builds")
    }

    #[test]
    fn known_ids() {
        let t = tok();
        assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
        assert_eq!(t.eos_token_id(), 50256);
        assert_eq!(t.vocab_size(), 50257);
        assert_eq!(t.encode("<|endoftext|>").unwrap(), vec![50256]);
        assert_eq!(t.decode(&[15496, 995]), "Hello world");
        assert_eq!(t.special_token_ids(), vec![50256]);
        assert_eq!(t.token_piece(995).as_deref(), Some("Ġworld"));
        assert_eq!(t.token_bytes()[15496], b"Hello");
        assert!(t.shares_vocabulary(&t.clone()));
        assert!(!t.shares_vocabulary(&tok()));
    }

    #[test]
    fn round_trip_text() {
        let t = tok();
        for s in [
            "The quick brown fox.",
            "  leading spaces",
            "naïve café",
            "日本語のテキスト",
            "🦀🔥 emoji",
        ] {
            let ids = t.encode(s).unwrap();
            assert_eq!(t.decode(&ids), s);
        }
    }

    #[test]
    fn incremental_never_splits_characters() {
        let t = tok();
        for s in [
            "🦀🔥 emoji 👩‍👩‍👧",
            "日本語のテキスト",
            "mixed ascii and 中文 and ü",
        ] {
            let ids = t.encode(s).unwrap();
            let mut d = t.detokenizer();
            let mut pieces = Vec::new();
            for id in &ids {
                let p = d.push(*id);
                assert!(
                    !p.contains(char::REPLACEMENT_CHARACTER),
                    "split char in {p:?}"
                );
                pieces.push(p);
            }
            assert_eq!(d.flush(), "");
            assert_eq!(pieces.concat(), s);
            // At least one token of these strings completes no character on its
            // own, so the detokenizer must have held bytes back.
            if s.contains('🦀') {
                assert!(pieces.iter().any(|p| p.is_empty()));
            }
        }
    }

    #[test]
    fn invalid_bytes_do_not_stall() {
        let t = tok();
        // Token 188 is the single byte 0x80 (a lone continuation byte).
        let lone: Vec<u32> = (0..t.vocab_size() as u32)
            .filter(|id| t.token_bytes[*id as usize] == [0x80])
            .collect();
        assert_eq!(lone.len(), 1);
        let mut d = t.detokenizer();
        assert_eq!(d.push(lone[0]), "\u{FFFD}");
        assert_eq!(d.push(15496), "Hello");
    }
}
