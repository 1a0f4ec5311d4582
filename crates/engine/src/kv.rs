/// The free list of a KV pool: which of its fixed-size blocks are in use.
#[derive(Debug)]
pub struct BlockPool {
    free: Vec<u32>,
    blocks: usize,
    block_tokens: usize,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_tokens` positions, all free.
    pub fn new(blocks: usize, block_tokens: usize) -> Self {
        Self {
            free: (0..blocks as u32).rev().collect(),
            blocks,
            block_tokens,
        }
    }

    /// Positions per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks in the pool.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }
}

/// The KV blocks of one sequence and how many positions of them are filled.
#[derive(Debug, Default)]
pub struct SequenceBlocks {
    table: Vec<u32>,
    len: usize,
}

impl SequenceBlocks {
    /// An empty sequence.
    pub fn new() -> Self {
        Self::default()
    }

    /// The block table, in position order.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// Filled positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room for `extra` more positions; `false` (and nothing taken) when the pool has too
    /// few free blocks.
    pub fn reserve(&mut self, pool: &mut BlockPool, extra: usize) -> bool {
        let needed = (self.len + extra).div_ceil(pool.block_tokens);
        let missing = needed.saturating_sub(self.table.len());
        if missing > pool.free.len() {
            return false;
        }
        let at = pool.free.len() - missing;
        self.table.extend(pool.free.drain(at..).rev());
        true
    }

    /// Marks `count` more positions as filled; they must have been reserved.
    pub fn advance(&mut self, pool: &BlockPool, count: usize) {
        assert!(
            self.len + count <= self.table.len() * pool.block_tokens,
            "advance past the reserved blocks"
        );
        self.len += count;
    }

    /// Forgets every position from `len` on and returns blocks no longer needed to the pool.
    /// Rejected speculative tokens are dropped this way, without touching the device.
    pub fn truncate(&mut self, pool: &mut BlockPool, len: usize) {
        self.len = self.len.min(len);
        let keep = self.len.div_ceil(pool.block_tokens);
        pool.free.extend(self.table.drain(keep..).rev());
    }

    /// Returns every block to the pool.
    pub fn release(&mut self, pool: &mut BlockPool) {
        self.truncate(pool, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_advance_truncate_release() {
        let mut pool = BlockPool::new(4, 16);
        let mut a = SequenceBlocks::new();
        assert!(a.reserve(&mut pool, 17));
        assert_eq!(a.table().len(), 2);
        a.advance(&pool, 17);
        assert!(a.reserve(&mut pool, 15), "fits in the second block");
        assert_eq!(pool.free_blocks(), 2);
        let mut b = SequenceBlocks::new();
        assert!(!b.reserve(&mut pool, 33), "needs 3 blocks, 2 free");
        assert_eq!(pool.free_blocks(), 2, "a failed reserve takes nothing");
        a.truncate(&mut pool, 16);
        assert_eq!((a.len(), a.table().len(), pool.free_blocks()), (16, 1, 3));
        a.release(&mut pool);
        assert_eq!(pool.free_blocks(), 4);
        let mut seen: Vec<u32> = pool.free.clone();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3], "every block returned exactly once");
    }
}
