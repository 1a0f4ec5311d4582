//! KV block bookkeeping: which blocks of a pool each sequence holds, and which full blocks are
//! kept as a prefix cache for later sequences.
//!
//! The prefix cache shares only *full* blocks whose positions are final, so a shared block is
//! never written again and no copy-on-write is needed: a sequence that diverges from a cached
//! prefix writes its first differing position into a block of its own. (vLLM's V1 block
//! manager makes the same choice.) A cached block is found by its exact content and its
//! parent's identity, never by a hash alone, so two prefixes can never be confused. Where the
//! backend gives prompt tokens' rows other arithmetic than generated ones'
//! (`Backend::prompt_rows_from`), a block is also found by how many of its positions were fed
//! in the prompt role (a prompt too short for the backend's prompt kernels feeds none): a later
//! prompt that contains an earlier request's output computes those positions again as prompt
//! tokens, as a fresh server would.

use std::collections::{BTreeMap, HashMap};

/// The identity of a full block's content: the block before it (id and the generation of
/// that id, which changes whenever the block is reused), its own tokens and, where the pool
/// keys roles, how many of them are prompt tokens. Equal keys mean equal token prefixes
/// computed alike, hence equal KV.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BlockKey {
    parent: Option<(u32, u64)>,
    tokens: Box<[u32]>,
    prompt: usize,
}

/// Positions per KV block unless a caller chooses otherwise: vLLM's default, small enough that
/// a prefix shared by whole blocks loses little, large enough that block tables stay short.
pub const DEFAULT_BLOCK_TOKENS: usize = 16;

/// Full blocks kept after their sequences ended, found by content.
#[derive(Debug, Default)]
struct PrefixCache {
    index: HashMap<BlockKey, u32>,
    /// The key each block is registered under, if any.
    keys: Vec<Option<BlockKey>>,
    /// Bumped when a block is evicted, so keys naming it as a parent stop matching.
    generation: Vec<u64>,
    /// Registered blocks no sequence holds, by when they were last released: the eviction
    /// order.
    idle: BTreeMap<u64, u32>,
    idle_since: Vec<u64>,
    clock: u64,
    /// Whether keys count a block's prompt tokens.
    roles: bool,
}

/// A pool of fixed-size KV blocks: which are free, how many sequences hold each, and
/// (optionally) a prefix cache of full blocks.
#[derive(Debug)]
pub struct BlockPool {
    /// Blocks holding nothing worth keeping.
    free: Vec<u32>,
    /// Sequences holding each block.
    holders: Vec<u32>,
    blocks: usize,
    block_tokens: usize,
    cache: Option<PrefixCache>,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_tokens` positions, all free, without a prefix cache.
    pub fn new(blocks: usize, block_tokens: usize) -> Self {
        Self {
            free: (0..blocks as u32).rev().collect(),
            holders: vec![0; blocks],
            blocks,
            block_tokens,
            cache: None,
        }
    }

    /// A pool that keeps full blocks for reuse by later sequences with the same prefix, and
    /// evicts them least recently used first when it runs out of free blocks. With `roles`, a
    /// block is shared only where its prompt tokens are the same many (for a backend whose
    /// prompt rows get other arithmetic).
    pub fn with_prefix_cache(blocks: usize, block_tokens: usize, roles: bool) -> Self {
        Self {
            cache: Some(PrefixCache {
                keys: vec![None; blocks],
                generation: vec![0; blocks],
                idle_since: vec![0; blocks],
                roles,
                ..PrefixCache::default()
            }),
            ..Self::new(blocks, block_tokens)
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

    /// Blocks no sequence holds: free ones and cached ones that may be evicted.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.cache.as_ref().map_or(0, |c| c.idle.len())
    }

    /// Takes a block: a free one, else the least recently used cached one.
    fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let cache = self.cache.as_mut()?;
                let (_, block) = cache.idle.pop_first()?;
                let key = cache.keys[block as usize]
                    .take()
                    .expect("idle blocks are cached");
                cache.index.remove(&key);
                cache.generation[block as usize] += 1;
                block
            }
        };
        self.holders[block as usize] = 1;
        Some(block)
    }

    /// Drops one holder of `block`; a block nobody holds becomes free, or idle in the cache.
    fn release(&mut self, block: u32) {
        let holders = &mut self.holders[block as usize];
        *holders -= 1;
        if *holders > 0 {
            return;
        }
        match &mut self.cache {
            Some(cache) if cache.keys[block as usize].is_some() => {
                cache.clock += 1;
                cache.idle.insert(cache.clock, block);
                cache.idle_since[block as usize] = cache.clock;
            }
            _ => self.free.push(block),
        }
    }

    /// Adds a holder to a cached block, taking it out of the eviction order if idle.
    fn hold(&mut self, block: u32) {
        let holders = &mut self.holders[block as usize];
        if *holders == 0
            && let Some(cache) = &mut self.cache
        {
            cache.idle.remove(&cache.idle_since[block as usize]);
        }
        *holders += 1;
    }
}

impl PrefixCache {
    /// The key of block `i` of a sequence, after `parent`, holding `tokens`, when the
    /// sequence's first `prompt_tokens` tokens are fed in the prompt role.
    fn key(&self, parent: Option<u32>, i: usize, tokens: &[u32], prompt_tokens: usize) -> BlockKey {
        let prompt = if self.roles {
            prompt_tokens
                .saturating_sub(i * tokens.len())
                .min(tokens.len())
        } else {
            0
        };
        BlockKey {
            parent: parent.map(|p| (p, self.generation[p as usize])),
            tokens: tokens.into(),
            prompt,
        }
    }
}

/// The KV blocks of one sequence and how many positions of them are filled.
#[derive(Debug, Default)]
pub struct SequenceBlocks {
    table: Vec<u32>,
    len: usize,
    /// Leading blocks that are full, final and known to the prefix cache.
    cached: usize,
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
        if missing > pool.free_blocks() {
            return false;
        }
        for _ in 0..missing {
            let block = pool.allocate().expect("counted as free");
            self.table.push(block);
        }
        true
    }

    /// Positions in leading blocks registered with the prefix cache: final, so the sequence
    /// may be truncated to fewer only by releasing it whole.
    pub fn final_len(&self, pool: &BlockPool) -> usize {
        self.cached * pool.block_tokens
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
    /// Rejected speculative tokens are dropped this way, without touching the device. Blocks
    /// registered with the prefix cache hold final positions and must be kept whole.
    pub fn truncate(&mut self, pool: &mut BlockPool, len: usize) {
        self.len = self.len.min(len);
        let keep = self.len.div_ceil(pool.block_tokens);
        assert!(
            len == 0 || self.cached * pool.block_tokens <= self.len,
            "truncating into a block of the prefix cache"
        );
        self.cached = self.cached.min(keep);
        for block in self.table.drain(keep..).rev() {
            pool.release(block);
        }
    }

    /// Returns every block to the pool (cached ones stay findable until evicted).
    pub fn release(&mut self, pool: &mut BlockPool) {
        self.truncate(pool, 0);
    }

    /// Starts an empty sequence that will hold `tokens`, the first `prompt_tokens` of them fed in
    /// the prompt role, with the longest cached prefix of them, in whole blocks, and returns how
    /// many positions that prefix fills. The last token is never taken from the cache: it must
    /// be fed for its logits.
    pub fn share_cached_prefix(
        &mut self,
        pool: &mut BlockPool,
        tokens: &[u32],
        prompt_tokens: usize,
    ) -> usize {
        assert!(self.table.is_empty(), "sharing into a non-empty sequence");
        let mut parent = None;
        let blocks = tokens[..tokens.len().saturating_sub(1)].chunks_exact(pool.block_tokens);
        for (i, block_tokens) in blocks.enumerate() {
            let Some(cache) = &pool.cache else {
                break;
            };
            let key = cache.key(parent, i, block_tokens, prompt_tokens);
            let Some(&block) = cache.index.get(&key) else {
                break;
            };
            pool.hold(block);
            self.table.push(block);
            parent = Some(block);
        }
        self.cached = self.table.len();
        self.len = self.cached * pool.block_tokens;
        self.len
    }

    /// Registers with the prefix cache every full block of the filled positions (whose tokens
    /// are `tokens`, the first `prompt_tokens` of them fed in the prompt role) not registered
    /// yet. Those positions become final: they must never be truncated while the sequence holds
    /// them. A block whose content another block already caches is swapped for that one, its
    /// own returned to the pool: equal prefixes computed alike have bitwise equal KV, the
    /// kernels being deterministic.
    pub fn cache_full_blocks(
        &mut self,
        pool: &mut BlockPool,
        tokens: &[u32],
        prompt_tokens: usize,
    ) {
        let bt = pool.block_tokens;
        while self.cached < self.len / bt {
            let i = self.cached;
            let parent = i.checked_sub(1).map(|p| self.table[p]);
            let Some(cache) = &mut pool.cache else {
                return;
            };
            let key = cache.key(parent, i, &tokens[i * bt..(i + 1) * bt], prompt_tokens);
            match cache.index.get(&key) {
                Some(&cached) => {
                    let own = std::mem::replace(&mut self.table[i], cached);
                    pool.hold(cached);
                    pool.release(own);
                }
                None => {
                    cache.index.insert(key.clone(), self.table[i]);
                    cache.keys[self.table[i] as usize] = Some(key);
                }
            }
            self.cached += 1;
        }
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

    /// Fills a sequence with `tokens` as the engine would, registering its full blocks.
    fn fill(pool: &mut BlockPool, tokens: &[u32]) -> SequenceBlocks {
        let mut seq = SequenceBlocks::new();
        let shared = seq.share_cached_prefix(pool, tokens, tokens.len());
        assert!(seq.reserve(pool, tokens.len() - shared));
        seq.advance(pool, tokens.len() - shared);
        seq.cache_full_blocks(pool, tokens, tokens.len());
        seq
    }

    #[test]
    fn a_cached_prefix_is_shared_by_whole_blocks_and_never_its_last_token() {
        let mut pool = BlockPool::with_prefix_cache(8, 4, false);
        let prompt: Vec<u32> = (0..10).collect();
        let mut a = fill(&mut pool, &prompt);
        assert_eq!(a.table().len(), 3);

        // The same prompt shares the 2 full blocks, while `a` still holds them.
        let mut b = SequenceBlocks::new();
        assert_eq!(b.share_cached_prefix(&mut pool, &prompt, prompt.len()), 8);
        assert_eq!(b.table(), &a.table()[..2]);

        // Exactly 8 tokens: the second block holds the last token, which must be fed.
        let mut c = SequenceBlocks::new();
        assert_eq!(c.share_cached_prefix(&mut pool, &prompt[..8], 8), 4);

        // A prompt differing in its first block shares nothing, even with the same later
        // blocks: the key names the parent.
        let mut other = prompt.clone();
        other[0] = 99;
        let mut d = SequenceBlocks::new();
        assert_eq!(d.share_cached_prefix(&mut pool, &other, other.len()), 0);

        for seq in [&mut a, &mut b, &mut c, &mut d] {
            seq.release(&mut pool);
        }
        assert_eq!(pool.free_blocks(), 8, "cached blocks count as free");
    }

    #[test]
    fn cached_blocks_outlive_their_sequence_until_evicted_least_recently_used_first() {
        let mut pool = BlockPool::with_prefix_cache(4, 2, false);
        let old: Vec<u32> = vec![1, 2, 3, 4, 5];
        let new: Vec<u32> = vec![7, 8, 9, 10, 11];
        let mut a = fill(&mut pool, &old);
        a.release(&mut pool);
        let mut b = fill(&mut pool, &new);
        b.release(&mut pool);
        // 4 blocks, 2 full blocks cached per prompt: the newer prompt's are found.
        let mut probe = SequenceBlocks::new();
        assert_eq!(probe.share_cached_prefix(&mut pool, &new, new.len()), 4);
        // A sequence needing every other block evicts the older prompt's blocks.
        let mut big = SequenceBlocks::new();
        assert!(big.reserve(&mut pool, 4));
        assert!(!big.reserve(&mut pool, 5), "the shared blocks are held");
        big.release(&mut pool);
        let mut again = SequenceBlocks::new();
        assert_eq!(
            again.share_cached_prefix(&mut pool, &old, old.len()),
            0,
            "evicted"
        );
        again.release(&mut pool);
        probe.release(&mut pool);
        assert_eq!(pool.free_blocks(), 4);
    }

    #[test]
    fn eviction_goes_tail_first_and_an_evicted_parent_hides_its_children() {
        let mut pool = BlockPool::with_prefix_cache(3, 2, false);
        let prompt = [1, 2, 3, 4, 5];
        let mut a = fill(&mut pool, &prompt);
        let (parent, child) = (a.table()[0], a.table()[1]);
        a.release(&mut pool);
        // The partial third block is plainly free; then the child is evicted before its parent.
        let mut b = SequenceBlocks::new();
        assert!(b.reserve(&mut pool, 4));
        assert!(b.table().contains(&child) && !b.table().contains(&parent));
        assert!(b.reserve(&mut pool, 6));
        b.release(&mut pool);
        let mut c = SequenceBlocks::new();
        assert_eq!(c.share_cached_prefix(&mut pool, &prompt, prompt.len()), 0);
    }

    #[test]
    fn a_block_whose_content_is_cached_already_is_swapped_for_the_cached_one() {
        let mut pool = BlockPool::with_prefix_cache(8, 2, false);
        let prompt = [1, 2, 3];
        // Two sequences fill the same content side by side before either registers it.
        let mut a = SequenceBlocks::new();
        let mut b = SequenceBlocks::new();
        for seq in [&mut a, &mut b] {
            assert!(seq.reserve(&mut pool, 3));
            seq.advance(&pool, 3);
        }
        assert_eq!(pool.free_blocks(), 4);
        a.cache_full_blocks(&mut pool, &prompt, prompt.len());
        b.cache_full_blocks(&mut pool, &prompt, prompt.len());
        assert_eq!(b.table()[0], a.table()[0]);
        assert_eq!(pool.free_blocks(), 5, "b's duplicate went back to the pool");
        a.release(&mut pool);
        b.release(&mut pool);
        assert_eq!(pool.free_blocks(), 8);
    }

    #[test]
    fn where_roles_are_keyed_only_blocks_of_as_many_prompt_tokens_are_shared() {
        let mut pool = BlockPool::with_prefix_cache(8, 2, true);
        // A sequence of prompt [1, 2, 3] that generated 4, 5: its second block holds a prompt
        // token and a generated one.
        let tokens = [1, 2, 3, 4, 5];
        let mut a = SequenceBlocks::new();
        assert_eq!(a.share_cached_prefix(&mut pool, &tokens[..3], 3), 0);
        assert!(a.reserve(&mut pool, 5));
        a.advance(&pool, 5);
        a.cache_full_blocks(&mut pool, &tokens, 3);
        // A later prompt of the same five tokens shares only the all-prompt first block.
        let mut b = SequenceBlocks::new();
        assert_eq!(b.share_cached_prefix(&mut pool, &tokens, 5), 2);
        b.release(&mut pool);
        // The same sequence, recomputed after a preemption, finds both.
        let mut again = SequenceBlocks::new();
        assert_eq!(again.share_cached_prefix(&mut pool, &tokens, 3), 4);
        again.release(&mut pool);
        // Without role keys, the prompt finds both.
        let mut plain = BlockPool::with_prefix_cache(8, 2, false);
        let mut c = SequenceBlocks::new();
        assert!(c.reserve(&mut plain, 5));
        c.advance(&plain, 5);
        c.cache_full_blocks(&mut plain, &tokens, 3);
        let mut d = SequenceBlocks::new();
        assert_eq!(d.share_cached_prefix(&mut plain, &tokens, 5), 4);
    }
}
