//! Compiled grammars, kept so each distinct schema is compiled once.
//!
//! Two levels, both bounded, both behind short-held locks:
//! - per vocabulary (a tokenizer and the model's tokens: how many, which
//!   ends a sequence): llguidance's
//!   [`ParserFactory`] (the token trie and its precomputed slices, tens of
//!   milliseconds to build), at most [`MAX_VOCABULARIES`], keyed on the
//!   tokenizer's shared tables ([`Gpt2Tokenizer::shares_vocabulary`]: the
//!   entry holds a clone, so the tables cannot be freed and reused under it);
//! - per schema, within a vocabulary: a fresh [`Matcher`] for the compiled
//!   grammar (no token consumed), at most [`MAX_GRAMMARS`], keyed by the
//!   grammar's JSON text, least recently used evicted first.
//!
//! A sequence gets a clone of the cached matcher: its own parser state, the
//! grammar and the lazily built lexer shared with the other clones. A schema
//! is compiled outside the locks, so a slow compile delays no other request
//! (two requests racing on one new schema may both compile it; one copy is
//! kept).

use std::sync::{Arc, Mutex, MutexGuard};

use ember_common::tokenizer::Gpt2Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

use super::vocab::{self, ModelTokens};

/// Vocabularies kept (a server has one; tests build a few).
pub const MAX_VOCABULARIES: usize = 4;
/// Compiled grammars kept per vocabulary.
pub const MAX_GRAMMARS: usize = 64;

/// One vocabulary's factory and its compiled grammars.
struct Vocabulary {
    /// Holds the tables the key compares by identity.
    tokenizer: Gpt2Tokenizer,
    model: ModelTokens,
    factory: ParserFactory,
    /// `(grammar JSON, fresh matcher)`, most recently used last.
    grammars: Mutex<Vec<(String, Matcher)>>,
}

/// Every vocabulary seen, most recently used last.
static VOCABULARIES: Mutex<Vec<Arc<Vocabulary>>> = Mutex::new(Vec::new());

/// A lock whose holder panicked is still usable: the lists it guards are
/// whole after every statement.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fresh matcher for `grammar` over `tokenizer`'s vocabulary as `model`
/// emits it; `Err` carries llguidance's message (a schema it cannot
/// compile).
pub fn matcher(
    tokenizer: &Gpt2Tokenizer,
    model: ModelTokens,
    grammar: &TopLevelGrammar,
) -> Result<Matcher, String> {
    let vocabulary = vocabulary(tokenizer, model)?;
    let key = serde_json::to_string(grammar).map_err(|e| e.to_string())?;
    if let Some(hit) = vocabulary.cached(&key) {
        return Ok(hit);
    }
    let parser = vocabulary
        .factory
        .create_parser(grammar.clone())
        .map_err(|e| e.to_string())?;
    let fresh = Matcher::new(Ok(parser));
    if let Some(e) = fresh.get_error() {
        return Err(e);
    }
    vocabulary.insert(key, fresh.clone());
    Ok(fresh)
}

/// Builds the vocabulary's factory now (the first structured request then
/// pays only for its schema).
pub fn prepare(tokenizer: &Gpt2Tokenizer, model: ModelTokens) -> Result<(), String> {
    vocabulary(tokenizer, model).map(drop)
}

fn vocabulary(tokenizer: &Gpt2Tokenizer, model: ModelTokens) -> Result<Arc<Vocabulary>, String> {
    let mut all = lock(&VOCABULARIES);
    if let Some(i) = all
        .iter()
        .position(|v| v.model == model && v.tokenizer.shares_vocabulary(tokenizer))
    {
        let found = all.remove(i);
        all.push(Arc::clone(&found));
        return Ok(found);
    }
    let env = vocab::tok_env(tokenizer, model)?;
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    let built = Arc::new(Vocabulary {
        tokenizer: tokenizer.clone(),
        model,
        factory,
        grammars: Mutex::new(Vec::new()),
    });
    if all.len() >= MAX_VOCABULARIES {
        all.remove(0);
    }
    all.push(Arc::clone(&built));
    Ok(built)
}

impl Vocabulary {
    fn cached(&self, key: &str) -> Option<Matcher> {
        let mut grammars = lock(&self.grammars);
        let i = grammars.iter().position(|(k, _)| k == key)?;
        let entry = grammars.remove(i);
        let fresh = entry.1.clone();
        grammars.push(entry);
        Some(fresh)
    }

    fn insert(&self, key: String, fresh: Matcher) {
        let mut grammars = lock(&self.grammars);
        if grammars.iter().any(|(k, _)| *k == key) {
            return;
        }
        if grammars.len() >= MAX_GRAMMARS {
            grammars.remove(0);
        }
        grammars.push((key, fresh));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.grammars).len()
    }
}

/// How many grammars are cached for this vocabulary (tests).
#[cfg(test)]
pub fn cached_grammars(tokenizer: &Gpt2Tokenizer, model: ModelTokens) -> usize {
    vocabulary(tokenizer, model).map_or(0, |v| v.len())
}
