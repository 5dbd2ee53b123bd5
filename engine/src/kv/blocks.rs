//! The KV block pool: reference-counted blocks, shared through the prefix cache.
//!
//! A block id `b` owns cache slots `b * block_size .. (b + 1) * block_size`.
//! Every block is in exactly one of three states:
//! - **empty**: holds nothing reusable; on the `empty` list;
//! - **held**: `refs[b] > 0` sequences have it in their block tables (a full
//!   block of a shared prefix can be in many tables at once, read-only);
//! - **parked**: no sequence holds it but its content is cached
//!   ([`PrefixCache`]): a later request with the same prefix takes it back,
//!   and allocation may evict it (least recently released first).
//!
//! Free blocks, what admission can count on, are the empty plus the parked
//! ones. Allocation takes empty blocks first and evicts parked ones only when
//! none is left, so cached content lives as long as memory allows. It is
//! all-or-nothing and failure is an ordinary
//! [`EngineError::OutOfBlocks`](crate::error::EngineError::OutOfBlocks), so the
//! scheduler can keep a request waiting. A sequence's table is released tail
//! first, so of one sequence's blocks the last ones are evicted first: a
//! chain's head, which more requests share, outlives its tail.
//!
//! With prefix caching off the pool is a plain free list: nothing is keyed
//! and a released block is empty at once.
//!
//! The cache holds one block more than the pool hands out: the padding block
//! ([`BlockPool::padding_block`]). Rows that only pad a batch up to its bucket
//! write and read there, so they never touch a sequence's K/V.

use super::prefix_cache::{BlockHash, PrefixCache};
use crate::error::EngineError;

/// Reference-counted KV blocks with a content index.
#[derive(Debug)]
pub struct BlockPool {
    /// Blocks holding nothing reusable; allocation pops from the end.
    empty: Vec<u32>,
    /// How many block tables hold each block.
    refs: Vec<u32>,
    /// Content index of full blocks; None with prefix caching off.
    cache: Option<PrefixCache>,
}

impl BlockPool {
    /// All `total` blocks empty.
    pub fn new(total: usize, prefix_caching: bool) -> Self {
        Self {
            // Reversed so that the first allocations get the lowest ids.
            empty: (0..total as u32).rev().collect(),
            refs: vec![0; total],
            cache: prefix_caching.then(PrefixCache::new),
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks admission can count on: empty plus parked (evictable).
    pub fn free(&self) -> usize {
        self.empty.len() + self.cache.as_ref().map_or(0, PrefixCache::evictable)
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.total() - self.free()
    }

    /// Blocks whose content is cached, held or parked.
    pub fn cached(&self) -> usize {
        self.cache.as_ref().map_or(0, PrefixCache::len)
    }

    pub fn prefix_caching(&self) -> bool {
        self.cache.is_some()
    }

    /// Sequences holding `block`.
    pub fn refs(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// Content keys of the full blocks of `tokens` (none with caching off).
    pub fn block_hashes(&self, tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        self.cache
            .as_ref()
            .map_or_else(Vec::new, |c| c.block_hashes(tokens, block_size))
    }

    /// Content keys of the full blocks of `tokens`, chained after `parent`
    /// (None at a sequence's start).
    pub fn extend_hashes(
        &self,
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_size: usize,
    ) -> Vec<BlockHash> {
        self.cache
            .as_ref()
            .map_or_else(Vec::new, |c| c.extend_hashes(parent, tokens, block_size))
    }

    /// The blocks of the longest cached prefix of `hashes`.
    pub fn lookup(&self, hashes: &[BlockHash]) -> Vec<u32> {
        self.cache
            .as_ref()
            .map_or_else(Vec::new, |c| c.longest_prefix(hashes))
    }

    /// Free blocks a table of the cached `hits` plus `fresh` new blocks would
    /// take: the fresh ones and the hits that are parked (held ones cost nothing).
    pub fn cost(&self, hits: &[u32], fresh: usize) -> usize {
        let parked = match &self.cache {
            Some(c) => hits.iter().filter(|&&b| c.is_parked(b)).count(),
            None => 0,
        };
        fresh + parked
    }

    /// A block table: the cached `hits` (now held once more) followed by
    /// `fresh` newly allocated blocks. All or nothing.
    pub fn acquire(&mut self, hits: &[u32], fresh: usize) -> Result<Vec<u32>, EngineError> {
        let needed = self.cost(hits, fresh);
        let free = self.free();
        if needed > free {
            return Err(EngineError::OutOfBlocks { needed, free });
        }
        // Hits first, so that allocating the fresh blocks cannot evict them.
        let mut table = Vec::with_capacity(hits.len() + fresh);
        for &b in hits {
            self.hold(b);
            table.push(b);
        }
        for _ in 0..fresh {
            let b = match self.empty.pop() {
                Some(b) => b,
                // `needed <= free` guarantees a parked block is left.
                None => match self.cache.as_mut().and_then(PrefixCache::evict) {
                    Some(b) => b,
                    None => {
                        self.release(&table);
                        return Err(EngineError::OutOfBlocks { needed, free });
                    }
                },
            };
            self.hold(b);
            table.push(b);
        }
        Ok(table)
    }

    /// Fresh tables of `counts[i]` blocks for several sequences, all or none.
    pub fn reserve_tables(&mut self, counts: &[usize]) -> Result<Vec<Vec<u32>>, EngineError> {
        let needed = counts.iter().sum();
        let free = self.free();
        if needed > free {
            return Err(EngineError::OutOfBlocks { needed, free });
        }
        counts.iter().map(|&n| self.acquire(&[], n)).collect()
    }

    /// Keys a held, full block whose K/V are computed, so later requests find
    /// it. False (the block stays private) with caching off, or if that
    /// content is already cached in another block.
    pub fn register(&mut self, block: u32, hash: BlockHash) -> bool {
        debug_assert!(self.refs(block) > 0);
        self.cache.as_mut().is_some_and(|c| c.insert(hash, block))
    }

    /// The key of a cached block.
    pub fn hash_of(&self, block: u32) -> Option<BlockHash> {
        self.cache.as_ref().and_then(|c| c.hash_of(block))
    }

    /// Drops one hold on each block of `table`, tail first. A block nobody
    /// holds any more is parked if its content is cached, else empty.
    pub fn release(&mut self, table: &[u32]) {
        for &b in table.iter().rev() {
            let Some(r) = self.refs.get_mut(b as usize) else {
                continue;
            };
            debug_assert!(*r > 0, "block {b} released more often than held");
            *r = r.saturating_sub(1);
            if *r == 0 && !self.cache.as_mut().is_some_and(|c| c.park(b)) {
                self.empty.push(b);
            }
        }
    }

    /// The block that padding rows use: never allocated, one past the last
    /// allocatable block.
    pub fn padding_block(&self) -> u32 {
        self.total() as u32
    }

    fn hold(&mut self, block: u32) {
        let r = &mut self.refs[block as usize];
        if *r == 0 {
            if let Some(c) = self.cache.as_mut() {
                c.unpark(block);
            }
        }
        *r += 1;
    }
}

/// Cache slot of token `pos` of a sequence whose blocks are `table`.
pub fn slot_of(table: &[u32], block_size: usize, pos: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut a = BlockPool::new(4, false);
        let x = a.acquire(&[], 3).unwrap();
        assert_eq!(x, [0, 1, 2]);
        assert_eq!((a.free(), a.used()), (1, 3));
        assert!(matches!(
            a.acquire(&[], 2),
            Err(EngineError::OutOfBlocks { needed: 2, free: 1 })
        ));
        assert_eq!(a.free(), 1);
        a.release(&x);
        assert_eq!((a.free(), a.used(), a.total()), (4, 0, 4));
    }

    #[test]
    fn tables_are_reserved_all_or_nothing() {
        let mut a = BlockPool::new(5, true);
        let tables = a.reserve_tables(&[2, 0, 3]).unwrap();
        assert_eq!(tables.iter().map(Vec::len).collect::<Vec<_>>(), [2, 0, 3]);
        assert_eq!(sorted(tables.concat()), [0, 1, 2, 3, 4]);
        a.release(&tables.concat());
        assert!(matches!(
            a.reserve_tables(&[4, 2]),
            Err(EngineError::OutOfBlocks { needed: 6, free: 5 })
        ));
        assert_eq!((a.free(), a.padding_block()), (5, 5));
    }

    #[test]
    fn shared_blocks_are_counted_once_and_freed_by_the_last_holder() {
        let mut a = BlockPool::new(6, true);
        let h = a.block_hashes(&[1, 2, 3, 4, 5], 2); // two full blocks
        let first = a.acquire(&[], 3).unwrap();
        assert!(a.register(first[0], h[0]) && a.register(first[1], h[1]));
        // A second sequence with the same prefix holds the same two blocks.
        let hits = a.lookup(&h);
        assert_eq!(hits, first[..2]);
        assert_eq!(a.cost(&hits, 2), 2, "held hits cost nothing");
        let second = a.acquire(&hits, 2).unwrap();
        assert_eq!((a.refs(first[0]), a.used(), a.free()), (2, 5, 1));
        a.release(&first);
        // Still held by the second: nothing is free or evictable beyond the
        // first's private tail block.
        assert_eq!((a.refs(first[0]), a.used(), a.free()), (1, 4, 2));
        a.release(&second);
        assert_eq!((a.used(), a.free(), a.cached()), (0, 6, 2));
        // Parked hits are found again and cost a free block each.
        assert_eq!(a.lookup(&h), first[..2]);
        assert_eq!(a.cost(&first[..2], 1), 3);
    }

    #[test]
    fn empty_blocks_go_first_then_the_least_recently_released_tail_first() {
        let mut a = BlockPool::new(4, true);
        let h = a.block_hashes(&[1, 2, 3, 4, 5, 6], 2);
        let t = a.acquire(&[], 3).unwrap();
        for (b, key) in t.iter().zip(&h) {
            a.register(*b, *key);
        }
        a.release(&t);
        assert_eq!((a.free(), a.cached()), (4, 3));
        // The one empty block is taken before any cached one is evicted.
        let x = a.acquire(&[], 1).unwrap();
        assert_eq!(a.cached(), 3);
        // Then the chain's tail goes first, its head last.
        let y = a.acquire(&[], 1).unwrap();
        assert_eq!((y[0], a.lookup(&h)), (t[2], t[..2].to_vec()));
        let z = a.acquire(&[], 1).unwrap();
        assert_eq!((z[0], a.lookup(&h)), (t[1], t[..1].to_vec()));
        a.release(&x);
        a.release(&y);
        a.release(&z);
        assert_eq!((a.free(), a.cached()), (4, 1));
    }

    #[test]
    fn older_releases_are_evicted_before_newer_ones() {
        let mut a = BlockPool::new(2, true);
        let ha = a.block_hashes(&[1, 1], 2);
        let hb = a.block_hashes(&[2, 2], 2);
        let ta = a.acquire(&[], 1).unwrap();
        let tb = a.acquire(&[], 1).unwrap();
        a.register(ta[0], ha[0]);
        a.register(tb[0], hb[0]);
        a.release(&ta);
        a.release(&tb);
        // Touching A again (a hit) makes it the most recent.
        let hits = a.lookup(&ha);
        let again = a.acquire(&hits, 0).unwrap();
        a.release(&again);
        let fresh = a.acquire(&[], 1).unwrap();
        assert_eq!(fresh, tb, "B was released least recently");
        assert_eq!((a.lookup(&ha), a.lookup(&hb)), (ta, vec![]));
    }

    #[test]
    fn held_blocks_are_never_evicted() {
        let mut a = BlockPool::new(3, true);
        let h = a.block_hashes(&[7, 7, 8, 8], 2);
        let t = a.acquire(&[], 2).unwrap();
        a.register(t[0], h[0]);
        a.register(t[1], h[1]);
        // Cached but held: not free, not evictable.
        assert_eq!(a.free(), 1);
        let err = a.acquire(&[], 2).unwrap_err();
        assert!(matches!(
            err,
            EngineError::OutOfBlocks { needed: 2, free: 1 }
        ));
        assert_eq!((a.lookup(&h), a.used()), (t.clone(), 2));
        // Content already cached elsewhere is not keyed twice.
        let other = a.acquire(&[], 1).unwrap();
        assert!(!a.register(other[0], h[0]));
        a.release(&other);
        assert_eq!(a.cached(), 2);
    }

    #[test]
    fn without_prefix_caching_nothing_is_keyed() {
        let mut a = BlockPool::new(2, false);
        assert!(a.block_hashes(&[1, 2], 2).is_empty());
        let t = a.acquire(&[], 1).unwrap();
        assert!(!a.register(t[0], 42));
        a.release(&t);
        assert_eq!((a.free(), a.cached(), a.prefix_caching()), (2, 0, false));
    }

    #[test]
    fn slots_follow_the_block_table() {
        let table = [5, 2];
        assert_eq!(slot_of(&table, 4, 0), 20);
        assert_eq!(slot_of(&table, 4, 3), 23);
        assert_eq!(slot_of(&table, 4, 4), 8);
        assert_eq!(slot_of(&table, 4, 6), 10);
    }
}
