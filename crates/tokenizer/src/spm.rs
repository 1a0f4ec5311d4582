//! SentencePiece BPE (`tokenizer.ggml.model = llama`): text starts as one symbol per character,
//! and the adjacent pair whose concatenation is the best-scoring token (the leftmost among
//! equals) is merged until no pair forms a token. Symbols left that are not tokens are written
//! as byte-fallback tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use lucebox_gguf::Metadata;

use crate::error::Error;
use crate::vocab::{KEY_SCORES, KEY_TOKENS, TokenKind, Vocab, parse_byte_token};

#[derive(Debug)]
pub(crate) struct Spm {
    /// The byte-fallback token of each byte, else the unknown token.
    byte_ids: [Option<u32>; 256],
}

/// A candidate merge of the symbols at `left` and `right`, `len` bytes long together.
#[derive(Debug, PartialEq)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    /// The heap pops the highest score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A run of the text: `start..start + len`, with its neighbours (`None` at the ends).
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    pub(crate) fn new(meta: &Metadata, vocab: &Vocab) -> Result<Self, Error> {
        if vocab.scores.is_none() {
            return Err(meta
                .invalid(KEY_SCORES, "a SentencePiece vocabulary needs scores")
                .into());
        }
        let mut byte_ids = [vocab.special.unk; 256];
        for (id, text) in vocab.tokens.iter().enumerate() {
            if vocab.kinds[id] == TokenKind::Byte
                && let Some(b) = parse_byte_token(text)
            {
                byte_ids[b as usize] = Some(id as u32);
            }
        }
        if let Some(b) = byte_ids.iter().position(Option::is_none) {
            return Err(meta
                .invalid(
                    KEY_TOKENS,
                    format!("no byte token <0x{b:02X}> and no unknown token to stand for it"),
                )
                .into());
        }
        Ok(Self { byte_ids })
    }

    /// Appends the tokens of `text` (spaces already written as `▁`) to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let count = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = i.checked_sub(1);
            symbol.next = Some(i + 1).filter(|&n| n < count);
        }
        let mut heap = BinaryHeap::new();
        for left in 1..count {
            push_candidate(vocab, text, &symbols, &mut heap, left - 1, left);
        }
        while let Some(candidate) = heap.pop() {
            let (left, right) = (symbols[candidate.left], symbols[candidate.right]);
            // Stale when either side has merged since it was queued.
            if left.next != Some(candidate.right)
                || right.len == 0
                || left.len + right.len != candidate.len
            {
                continue;
            }
            symbols[candidate.left].len += right.len;
            symbols[candidate.left].next = right.next;
            symbols[candidate.right].len = 0;
            symbols[candidate.right].next = None;
            if let Some(after) = right.next {
                symbols[after].prev = Some(candidate.left);
                push_candidate(vocab, text, &symbols, &mut heap, candidate.left, after);
            }
            if let Some(before) = left.prev {
                push_candidate(vocab, text, &symbols, &mut heap, before, candidate.left);
            }
        }
        let mut next = (count > 0).then_some(0);
        while let Some(i) = next {
            let symbol = symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match vocab.by_text.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
            next = symbol.next;
        }
    }
}

fn push_candidate(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    heap: &mut BinaryHeap<Candidate>,
    left: usize,
    right: usize,
) {
    let start = symbols[left].start;
    let len = symbols[left].len + symbols[right].len;
    let Some(&id) = vocab.by_text.get(&text[start..start + len]) else {
        return;
    };
    let score = vocab
        .scores
        .as_ref()
        .and_then(|scores| scores.get(id as usize))
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    heap.push(Candidate {
        score,
        left,
        right,
        len,
    });
}
