//! The KV block allocator: a free list over `num_blocks` fixed-size blocks.
//!
//! Allocation is all-or-nothing and failure is an ordinary `None` the engine
//! turns into [`EngineError::OutOfBlocks`](super::EngineError::OutOfBlocks), so
//! the scheduler can keep a request waiting. A block id `b` owns cache slots
//! `b * block_size .. (b + 1) * block_size`.
//!
//! The cache holds one block more than the allocator hands out: the padding
//! block ([`BlockAllocator::padding_block`]). Rows that only pad a decode batch
//! up to its bucket write and read there, so they never touch a sequence's K/V.

use super::EngineError;

/// Free list of KV blocks.
#[derive(Debug)]
pub struct BlockAllocator {
    /// Ids of free blocks; allocation pops from the end.
    free: Vec<u32>,
    /// Blocks in the cache.
    total: usize,
}

impl BlockAllocator {
    /// All `total` blocks free.
    pub fn new(total: usize) -> Self {
        // Reversed so that the first allocations get the lowest ids.
        let free = (0..total as u32).rev().collect();
        Self { free, total }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Takes `n` blocks, or none at all if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let at = self.free.len() - n;
        Some(self.free.split_off(at))
    }

    /// Reserves `counts[i]` blocks for each of several sequences, all or none.
    pub fn reserve_tables(&mut self, counts: &[usize]) -> Result<Vec<Vec<u32>>, EngineError> {
        let needed = counts.iter().sum();
        let free = self.free();
        let mut pool = self
            .allocate(needed)
            .ok_or(EngineError::OutOfBlocks { needed, free })?;
        Ok(counts
            .iter()
            .map(|&n| pool.split_off(pool.len() - n))
            .collect())
    }

    /// The block that padding rows use: never allocated, one past the last
    /// allocatable block.
    pub fn padding_block(&self) -> u32 {
        self.total as u32
    }

    /// Returns blocks to the free list.
    pub fn release(&mut self, blocks: Vec<u32>) {
        debug_assert!(self.free.len() + blocks.len() <= self.total);
        self.free.extend(blocks);
    }
}

/// Cache slot of token `pos` of a sequence whose blocks are `table`.
pub fn slot_of(table: &[u32], block_size: usize, pos: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut a = BlockAllocator::new(4);
        let x = a.allocate(3).unwrap();
        assert_eq!(x.len(), 3);
        assert_eq!((a.free(), a.used()), (1, 3));
        assert!(a.allocate(2).is_none());
        assert_eq!(a.free(), 1);
        a.release(x);
        assert_eq!((a.free(), a.used(), a.total()), (4, 0, 4));
    }

    #[test]
    fn tables_are_reserved_all_or_nothing() {
        let mut a = BlockAllocator::new(5);
        let tables = a.reserve_tables(&[2, 0, 3]).unwrap();
        assert_eq!(tables.iter().map(Vec::len).collect::<Vec<_>>(), [2, 0, 3]);
        let mut all: Vec<u32> = tables.concat();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3, 4]);
        a.release(tables.concat());
        assert!(matches!(
            a.reserve_tables(&[4, 2]),
            Err(EngineError::OutOfBlocks { needed: 6, free: 5 })
        ));
        assert_eq!((a.free(), a.padding_block()), (5, 5));
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
