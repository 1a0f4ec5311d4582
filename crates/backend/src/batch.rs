use crate::{Error, KvLayout};

/// One forward pass's worth of tokens from one or more sequences: the single input shape that
/// serves prefill, decode and speculative verification alike.
///
/// Each token belongs to a sequence, has a position in it, and attends to that sequence's KV
/// entries at positions `0..=position`. The KV entries of the batch's own tokens are written
/// before attention, so a sequence may contribute one token (decode), many consecutive tokens
/// (prefill, or the k+1 tokens of a verify step), or any mix across sequences.
///
/// Built on the host by the engine; backends copy it to the device in
/// [`Backend::set_batch`](crate::Backend::set_batch). All vectors keep their capacity across
/// [`clear`](Self::clear), so a reused batch does not allocate in the decode loop.
#[derive(Clone, Debug, Default)]
pub struct RaggedBatch {
    /// The leading tokens pushed as [`TokenRole::Prompt`].
    prompt_tokens: usize,
    /// The first prompt token pushed after a generated one, which [`validate`](Self::validate)
    /// refuses.
    misplaced_prompt: Option<usize>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    pub(crate) token_seq: Vec<u32>,
    pub(crate) seqs: Vec<BatchSequence>,
    pub(crate) block_ids: Vec<u32>,
    pub(crate) logits_rows: Vec<u32>,
}

/// What a token of a batch is to its sequence. A backend may multiply prompt tokens' rows
/// another way than the others ([`Rows`](crate::Rows)), so a batch holds its prompt tokens
/// first, and a token keeps its role whenever it is computed again (a recomputed sequence, a
/// cached prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRole {
    /// A token of the request's prompt.
    Prompt,
    /// A generated token: a decode step's, a draft's, a verify step's.
    Generated,
}

/// A sequence's KV view within a batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchSequence {
    /// Where the sequence's block table starts in `block_ids`.
    pub(crate) blocks_start: u32,
    /// How many blocks the table holds.
    pub(crate) blocks_len: u32,
}

impl RaggedBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes this batch a copy of `other`, reusing this batch's allocations.
    pub fn copy_from(&mut self, other: &RaggedBatch) {
        self.prompt_tokens = other.prompt_tokens;
        self.misplaced_prompt = other.misplaced_prompt;
        self.tokens.clone_from(&other.tokens);
        self.positions.clone_from(&other.positions);
        self.token_seq.clone_from(&other.token_seq);
        self.seqs.clone_from(&other.seqs);
        self.block_ids.clone_from(&other.block_ids);
        self.logits_rows.clone_from(&other.logits_rows);
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.prompt_tokens = 0;
        self.misplaced_prompt = None;
        self.tokens.clear();
        self.positions.clear();
        self.token_seq.clear();
        self.seqs.clear();
        self.block_ids.clear();
        self.logits_rows.clear();
    }

    /// Adds a sequence whose KV lives in `block_table` (block ids in position order) and returns
    /// its index for [`push_token`](Self::push_token).
    pub fn push_sequence(&mut self, block_table: &[u32]) -> usize {
        self.seqs.push(BatchSequence {
            blocks_start: self.block_ids.len() as u32,
            blocks_len: block_table.len() as u32,
        });
        self.block_ids.extend_from_slice(block_table);
        self.seqs.len() - 1
    }

    /// Adds a token of sequence `seq` at `position` in `role`; `wants_logits` asks for its
    /// logits row. Prompt tokens come before every generated token of the batch.
    pub fn push_token(
        &mut self,
        seq: usize,
        token: u32,
        position: u32,
        role: TokenRole,
        wants_logits: bool,
    ) {
        if role == TokenRole::Prompt {
            if self.prompt_tokens == self.tokens.len() {
                self.prompt_tokens += 1;
            } else {
                self.misplaced_prompt.get_or_insert(self.tokens.len());
            }
        }
        if wants_logits {
            self.logits_rows.push(self.tokens.len() as u32);
        }
        self.tokens.push(token);
        self.positions.push(position);
        self.token_seq.push(seq as u32);
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token ids, in batch order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The positions, in batch order.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// How many tokens, all before the others, are prompt tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The number of sequences.
    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// The indices of the tokens whose logits are wanted, in batch order. Logits come back in
    /// this order, one row each.
    pub fn logits_rows(&self) -> &[u32] {
        &self.logits_rows
    }

    /// The block table of sequence `seq`.
    pub(crate) fn block_table(&self, seq: usize) -> &[u32] {
        let s = self.seqs[seq];
        &self.block_ids[s.blocks_start as usize..(s.blocks_start + s.blocks_len) as usize]
    }

    /// The sequence index of each token.
    pub(crate) fn token_seqs(&self) -> &[u32] {
        &self.token_seq
    }

    /// Checks that every token has a valid sequence, a token id below `vocab`, and a position
    /// whose KV slot lies inside its sequence's block table and below `max_positions`, that
    /// every block id is below `n_blocks`, and that no prompt token follows a generated one.
    pub fn validate(
        &self,
        vocab: usize,
        block_tokens: usize,
        n_blocks: usize,
        max_positions: usize,
    ) -> Result<(), Error> {
        if let Some(i) = self.misplaced_prompt {
            return Err(Error::Batch(format!(
                "token {i}: a prompt token after a generated one (prompt tokens come first)"
            )));
        }
        if let Some(&b) = self.block_ids.iter().find(|&&b| b as usize >= n_blocks) {
            return Err(Error::Batch(format!(
                "block id {b} is not below the pool size {n_blocks}"
            )));
        }
        for (i, ((&token, &pos), &seq)) in self
            .tokens
            .iter()
            .zip(&self.positions)
            .zip(&self.token_seq)
            .enumerate()
        {
            if token as usize >= vocab {
                return Err(Error::Batch(format!(
                    "token {i}: id {token} is not below the vocabulary size {vocab}"
                )));
            }
            if pos as usize >= max_positions {
                return Err(Error::Batch(format!(
                    "token {i}: position {pos} is not below the context length {max_positions}"
                )));
            }
            let Some(s) = self.seqs.get(seq as usize) else {
                return Err(Error::Batch(format!(
                    "token {i}: sequence {seq} was not added"
                )));
            };
            if pos as usize / block_tokens >= s.blocks_len as usize {
                return Err(Error::Batch(format!(
                    "token {i}: position {pos} needs block {} but sequence {seq} has {} blocks",
                    pos as usize / block_tokens,
                    s.blocks_len
                )));
            }
        }
        Ok(())
    }
}

/// Checks that every block id of the batch lies in the pool and every token's position lies
/// inside its sequence's block table, so that the kernels index only valid slots.
pub(crate) fn check_kv_positions(batch: &RaggedBatch, layout: &KvLayout) -> Result<(), Error> {
    if let Some(&b) = batch
        .block_ids
        .iter()
        .find(|&&b| b as usize >= layout.blocks)
    {
        return Err(Error::Batch(format!(
            "block {b} is not below the pool size {}",
            layout.blocks
        )));
    }
    for (t, (&pos, &seq)) in batch.positions().iter().zip(batch.token_seqs()).enumerate() {
        if seq as usize >= batch.sequences() {
            return Err(Error::Batch(format!(
                "token {t}: sequence {seq} was not added"
            )));
        }
        let blocks = batch.block_table(seq as usize).len();
        if pos as usize / layout.block_tokens >= blocks {
            return Err(Error::Batch(format!(
                "token {t}: position {pos} is beyond its sequence's {blocks} blocks"
            )));
        }
    }
    Ok(())
}

/// The KV slot (block * block_tokens + offset) of batch token `t`; valid after
/// [`check_kv_positions`].
pub(crate) fn slot_of(batch: &RaggedBatch, layout: &KvLayout, t: usize) -> usize {
    let pos = batch.positions()[t] as usize;
    let block =
        batch.block_table(batch.token_seqs()[t] as usize)[pos / layout.block_tokens] as usize;
    block * layout.block_tokens + pos % layout.block_tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_come_first_and_a_late_one_is_refused() {
        let mut batch = RaggedBatch::new();
        let a = batch.push_sequence(&[0]);
        let b = batch.push_sequence(&[1]);
        batch.push_token(a, 1, 0, TokenRole::Prompt, false);
        batch.push_token(b, 2, 0, TokenRole::Prompt, false);
        batch.push_token(a, 3, 1, TokenRole::Generated, true);
        assert_eq!(batch.prompt_tokens(), 2);
        batch.validate(10, 16, 2, 64).unwrap();
        batch.push_token(b, 4, 1, TokenRole::Prompt, true);
        assert_eq!(batch.prompt_tokens(), 2);
        assert_eq!(
            batch.validate(10, 16, 2, 64).unwrap_err().to_string(),
            "batch: token 3: a prompt token after a generated one (prompt tokens come \
             first)"
        );
        let mut copy = RaggedBatch::new();
        copy.copy_from(&batch);
        assert!(copy.validate(10, 16, 2, 64).is_err());
        batch.clear();
        let c = batch.push_sequence(&[0]);
        batch.push_token(c, 1, 0, TokenRole::Generated, true);
        assert_eq!(batch.prompt_tokens(), 0);
        batch.validate(10, 16, 2, 64).unwrap();
    }
}
