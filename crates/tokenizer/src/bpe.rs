//! Byte-level BPE: a pre-tokenized piece starts as one token per byte, and the adjacent pair
//! with the lowest merge rank (the leftmost among equals) is merged until no pair has a merge.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use lucebox_gguf::Metadata;

use crate::error::Error;
use crate::unicode::byte_to_char;
use crate::vocab::{KEY_MERGES, Vocab};

/// No neighbour.
const NONE: usize = usize::MAX;

/// Stands for a byte whose character is not in the vocabulary (SmolLM2 lacks a few control
/// bytes and bytes that never occur in UTF-8). Like llama.cpp, such a byte takes part in no
/// merge and is left out of the output: the alternative, the unknown token, is `<|endoftext|>`
/// in some vocabularies.
const MISSING: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Bpe {
    /// (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// The token of each byte's byte-level character, or [`MISSING`].
    byte_ids: [u32; 256],
}

/// Buffers reused across the pieces of one text.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    ids: Vec<u32>,
    prev: Vec<usize>,
    next: Vec<usize>,
    heap: BinaryHeap<Reverse<(u32, usize, usize)>>,
}

impl Bpe {
    pub(crate) fn new(meta: &Metadata, vocab: &Vocab, merges: &[String]) -> Result<Self, Error> {
        let mut byte_ids = [MISSING; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let c = byte_to_char(b as u8);
            if let Some(&id) = vocab.by_text.get(c.encode_utf8(&mut [0; 4]) as &str) {
                *slot = id;
            }
        }
        let mut table = HashMap::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            let invalid =
                |why: &str| meta.invalid(KEY_MERGES, format!("merge {rank} {merge:?} {why}"));
            // The separator is the first space after the first character, so that a left part
            // may itself be a space (as in SentencePiece-spelled BPE vocabularies).
            let split = merge
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i)
                .ok_or_else(|| invalid("is not two tokens separated by a space"))?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let id = |text: &str| {
                vocab
                    .by_text
                    .get(text)
                    .copied()
                    .ok_or_else(|| invalid(&format!("uses {text:?}, which is not a token")))
            };
            let pair = (id(left)?, id(right)?);
            let merged = id(&format!("{left}{right}"))?;
            // A pair listed twice keeps its first (best) rank.
            table.entry(pair).or_insert((rank as u32, merged));
        }
        Ok(Self {
            merges: table,
            byte_ids,
        })
    }

    /// Appends the tokens of one piece to `out`.
    pub(crate) fn encode_piece(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        match piece {
            [] => return,
            [byte] => {
                out.extend(Some(self.byte_ids[*byte as usize]).filter(|&id| id != MISSING));
                return;
            }
            _ => {}
        }
        let n = piece.len();
        let Scratch {
            ids,
            prev,
            next,
            heap,
        } = scratch;
        ids.clear();
        ids.extend(piece.iter().map(|&b| self.byte_ids[b as usize]));
        prev.clear();
        prev.extend((0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)));
        next.clear();
        next.extend((1..=n).map(|i| if i < n { i } else { NONE }));
        heap.clear();
        for left in 0..n.saturating_sub(1) {
            self.push_pair(heap, ids, left, left + 1);
        }
        while let Some(Reverse((rank, left, right))) = heap.pop() {
            // Entries go stale when either side has merged since; only a pair that is still
            // adjacent and still has this rank is merged.
            let Some(&(current_rank, merged)) = self.merges.get(&(ids[left], ids[right])) else {
                continue;
            };
            if next[left] != right || current_rank != rank {
                continue;
            }
            ids[left] = merged;
            let after = next[right];
            next[left] = after;
            // A merged-away position points nowhere, so stale pairs naming it fail the check.
            next[right] = NONE;
            if after != NONE {
                prev[after] = left;
                self.push_pair(heap, ids, left, after);
            }
            if prev[left] != NONE {
                self.push_pair(heap, ids, prev[left], left);
            }
        }
        let mut i = 0;
        while i != NONE {
            if ids[i] != MISSING {
                out.push(ids[i]);
            }
            i = next[i];
        }
    }

    fn push_pair(
        &self,
        heap: &mut BinaryHeap<Reverse<(u32, usize, usize)>>,
        ids: &[u32],
        left: usize,
        right: usize,
    ) {
        if let Some(&(rank, _)) = self.merges.get(&(ids[left], ids[right])) {
            heap.push(Reverse((rank, left, right)));
        }
    }
}
