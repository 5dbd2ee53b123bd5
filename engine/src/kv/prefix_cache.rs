//! The prefix cache's index: full KV blocks addressed by their content.
//!
//! A full block's key is a chained hash, `hash(parent key, block tokens)`, so
//! it names the block's tokens *and everything before them*: two sequences
//! share a block only if their whole prefixes up to its end are equal. The
//! key is 128 bits, two SipHash-1-3 digests under independent random keys
//! drawn per process ([`RandomState`]): an accidental collision is out of
//! reach and a client cannot craft one to read another prompt's K/V.
//!
//! The index holds every block whose content is known and valid, whether
//! sequences still hold it or not. Blocks no sequence holds sit in an LRU
//! order (the clock tick of their release) and are the only ones eviction may
//! take; [`PrefixCache::evict`] takes the least recently released and forgets
//! its key. The refcounts themselves live in the block pool
//! ([`super::blocks::BlockPool`]), which tells the index when a block becomes
//! unreferenced ([`PrefixCache::park`]) or referenced again
//! ([`PrefixCache::unpark`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};

/// Content key of a full block: the chained hash of its prefix.
pub type BlockHash = u128;

/// Content-addressed full blocks and the LRU order of the unreferenced ones.
#[derive(Debug)]
pub struct PrefixCache {
    /// Two independently keyed hashers, one per half of a [`BlockHash`].
    hashers: [RandomState; 2],
    /// Key -> block holding that content.
    by_hash: HashMap<BlockHash, u32>,
    /// Block -> its key (the inverse of `by_hash`).
    hash_of: HashMap<u32, BlockHash>,
    /// Unreferenced cached blocks by release tick: the first is evicted first.
    lru: BTreeMap<u64, u32>,
    /// Block -> its tick in `lru` (only for unreferenced blocks).
    lru_tick: HashMap<u32, u64>,
    /// Monotonic release clock.
    clock: u64,
}

impl Default for PrefixCache {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixCache {
    pub fn new() -> Self {
        Self {
            hashers: [RandomState::new(), RandomState::new()],
            by_hash: HashMap::new(),
            hash_of: HashMap::new(),
            lru: BTreeMap::new(),
            lru_tick: HashMap::new(),
            clock: 0,
        }
    }

    /// Keys of the full blocks of `tokens` (a trailing partial block has none),
    /// each chained to the one before.
    pub fn block_hashes(&self, tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        self.extend_hashes(None, tokens, block_size)
    }

    /// Keys of the full blocks of `tokens`, chained after `parent`: the key
    /// of the block just before `tokens[0]`, None at a sequence's start.
    pub fn extend_hashes(
        &self,
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_size: usize,
    ) -> Vec<BlockHash> {
        let mut parent = parent;
        tokens
            .chunks_exact(block_size.max(1))
            .map(|block| {
                let [lo, hi] = &self.hashers;
                let h = (u128::from(hi.hash_one((parent, block))) << 64)
                    | u128::from(lo.hash_one((parent, block)));
                parent = Some(h);
                h
            })
            .collect()
    }

    /// The block holding `hash`'s content, if cached.
    pub fn get(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// The blocks of the longest cached prefix of `hashes`, in order.
    pub fn longest_prefix(&self, hashes: &[BlockHash]) -> Vec<u32> {
        hashes.iter().map_while(|h| self.get(*h)).collect()
    }

    /// The key of a cached block.
    pub fn hash_of(&self, block: u32) -> Option<BlockHash> {
        self.hash_of.get(&block).copied()
    }

    /// Makes `block` (referenced, full, its K/V computed) findable by `hash`.
    /// False, and nothing changes, if that content is already cached (in
    /// another block) or `block` already has a key.
    pub fn insert(&mut self, hash: BlockHash, block: u32) -> bool {
        if self.by_hash.contains_key(&hash) || self.hash_of.contains_key(&block) {
            return false;
        }
        self.by_hash.insert(hash, block);
        self.hash_of.insert(block, hash);
        true
    }

    /// A cached block lost its last holder: it becomes evictable, the most
    /// recently released. Returns false for a block with no key (not cached).
    pub fn park(&mut self, block: u32) -> bool {
        if !self.hash_of.contains_key(&block) {
            return false;
        }
        self.clock += 1;
        self.lru.insert(self.clock, block);
        self.lru_tick.insert(block, self.clock);
        true
    }

    /// A parked block is held again: it leaves the eviction order.
    pub fn unpark(&mut self, block: u32) {
        if let Some(tick) = self.lru_tick.remove(&block) {
            self.lru.remove(&tick);
        }
    }

    /// Whether `block` is cached and unreferenced.
    pub fn is_parked(&self, block: u32) -> bool {
        self.lru_tick.contains_key(&block)
    }

    /// Takes the least recently released unreferenced block and forgets its
    /// content. None if every cached block is referenced.
    pub fn evict(&mut self) -> Option<u32> {
        let (_, block) = self.lru.pop_first()?;
        self.lru_tick.remove(&block);
        if let Some(hash) = self.hash_of.remove(&block) {
            self.by_hash.remove(&hash);
        }
        Some(block)
    }

    /// Unreferenced cached blocks (what eviction can give back).
    pub fn evictable(&self) -> usize {
        self.lru.len()
    }

    /// Blocks with a key, referenced or not.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_over_the_whole_prefix() {
        let c = PrefixCache::new();
        let a = c.block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        assert_eq!(a.len(), 3, "the partial block has no key");
        // Same prefix, same keys; a different first block changes every key
        // after it, even where the block's own tokens are equal.
        assert_eq!(c.block_hashes(&[1, 2, 3, 4], 2), a[..2]);
        let b = c.block_hashes(&[9, 2, 3, 4, 5, 6], 2);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y), "{a:?} {b:?}");
        // A block's key depends on its position in the chain.
        let d = c.block_hashes(&[3, 4], 2);
        assert_ne!(d[0], a[1]);
        // Extending from a parent continues the same chain.
        assert_eq!(c.extend_hashes(Some(a[0]), &[3, 4, 5, 6], 2), a[1..]);
    }

    #[test]
    fn longest_prefix_stops_at_the_first_miss() {
        let mut c = PrefixCache::new();
        let h = c.block_hashes(&[1, 2, 3, 4, 5, 6], 2);
        assert!(c.insert(h[0], 7));
        assert!(c.insert(h[2], 9));
        assert_eq!(c.longest_prefix(&h), [7]);
        assert!(c.insert(h[1], 8));
        assert_eq!(c.longest_prefix(&h), [7, 8, 9]);
        // The same content twice, or a block twice, is refused.
        assert!(!c.insert(h[0], 5));
        assert!(!c.insert(12345, 7));
        assert_eq!((c.len(), c.hash_of(7)), (3, Some(h[0])));
    }

    #[test]
    fn eviction_takes_the_least_recently_parked_and_forgets_it() {
        let mut c = PrefixCache::new();
        for (hash, block) in [(10, 0), (11, 1), (12, 2)] {
            c.insert(hash, block);
        }
        assert!(!c.park(5), "an uncached block is not parked");
        c.park(1);
        c.park(0);
        c.park(2);
        c.unpark(0); // held again: not evictable
        assert_eq!((c.evictable(), c.is_parked(0)), (2, false));
        assert_eq!(c.evict(), Some(1));
        assert_eq!(c.get(11), None);
        assert_eq!(c.evict(), Some(2));
        assert_eq!(c.evict(), None, "block 0 is held");
        assert_eq!((c.len(), c.get(10)), (1, Some(0)));
    }
}
