//! The pre-tokenizers of byte-level BPE vocabularies: each splits text into the pieces that BPE
//! then encodes one by one.
//!
//! The patterns are Hugging Face's, matched by hand rather than by a regex engine: the Rust regex
//! crate has no look-ahead (`\s+(?!\S)`), and a direct scanner is faster. Each `match_*` function
//! returns where the leftmost-first alternative that matches at `start` ends, which is what
//! Oniguruma's backtracking produces for these patterns.

use crate::unicode::{is_letter, is_number, is_other, is_whitespace};

/// A pre-tokenizer, named by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// Qwen2: NFC, then
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Qwen2,
    /// Llama 3: as Qwen2 without NFC and with `\p{N}{1,3}`; its BPE ignores merges for pieces
    /// that are whole tokens.
    Llama3,
    /// SmolLM, StarCoder, Refact: every `\p{N}` is its own piece, and the text between them is
    /// split by the GPT-2 pattern.
    DigitsThenGpt2,
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
}

/// The `tokenizer.ggml.pre` names understood, with the pre-tokenizer each selects.
pub(crate) const PRE_TOKENIZERS: &[(&str, PreTokenizer)] = &[
    ("qwen2", PreTokenizer::Qwen2),
    ("deepseek-r1-qwen", PreTokenizer::Qwen2),
    ("llama-bpe", PreTokenizer::Llama3),
    ("llama3", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("smollm", PreTokenizer::DigitsThenGpt2),
    ("starcoder", PreTokenizer::DigitsThenGpt2),
    ("refact", PreTokenizer::DigitsThenGpt2),
    ("gpt-2", PreTokenizer::Gpt2),
];

impl PreTokenizer {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        PRE_TOKENIZERS
            .iter()
            .find(|(known, _)| *known == name)
            .map(|&(_, pre)| pre)
    }

    /// Whether text is put in Unicode normalization form C before it is split.
    pub(crate) fn normalizes_nfc(self) -> bool {
        self == Self::Qwen2
    }

    /// Whether a piece that is itself a vocabulary token is emitted as that token without
    /// merging (Hugging Face's `ignore_merges`).
    pub(crate) fn ignores_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Calls `emit` with each piece of `text`, in order; the pieces cover `text` exactly.
    pub(crate) fn split<'a>(self, text: &'a str, mut emit: impl FnMut(&'a str)) {
        match self {
            Self::Qwen2 => split_with(text, &mut emit, |s, i| match_llama3_family(s, i, 1)),
            Self::Llama3 => split_with(text, &mut emit, |s, i| match_llama3_family(s, i, 3)),
            Self::Gpt2 => split_with(text, &mut emit, match_gpt2),
            Self::DigitsThenGpt2 => {
                let mut rest_start = 0;
                for (i, c) in text.char_indices() {
                    if is_number(c) {
                        // The text between numbers is split on its own: its end is the end of
                        // the text for the look-ahead, as in Hugging Face's pre-tokenizer sequence.
                        split_with(&text[rest_start..i], &mut emit, match_gpt2);
                        let end = i + c.len_utf8();
                        emit(&text[i..end]);
                        rest_start = end;
                    }
                }
                split_with(&text[rest_start..], &mut emit, match_gpt2);
            }
        }
    }
}

fn split_with<'a>(
    text: &'a str,
    emit: &mut impl FnMut(&'a str),
    match_at: impl Fn(&str, usize) -> usize,
) {
    let mut start = 0;
    while start < text.len() {
        let end = match_at(text, start);
        emit(&text[start..end]);
        start = end;
    }
}

fn char_at(s: &str, i: usize) -> Option<char> {
    s.get(i..).and_then(|rest| rest.chars().next())
}

/// The end of the run of characters satisfying `class` that starts at `i`.
fn run_end(s: &str, i: usize, class: impl Fn(char) -> bool) -> usize {
    s[i..]
        .char_indices()
        .find(|&(_, c)| !class(c))
        .map_or(s.len(), |(offset, _)| i + offset)
}

/// Where an English contraction suffix (`s t re ve m ll d`) following an apostrophe at `i - 1`
/// ends, if one starts at `i`.
fn contraction_end(s: &str, i: usize, ignore_case: bool) -> Option<usize> {
    const SUFFIXES: [&str; 7] = ["s", "t", "re", "ve", "m", "ll", "d"];
    let rest = s.get(i..)?;
    SUFFIXES.iter().find_map(|suffix| {
        let mut chars = rest.chars();
        let mut len = 0;
        for want in suffix.chars() {
            let c = chars.next()?;
            let same = if ignore_case {
                c.to_ascii_lowercase() == want || (want == 's' && c == 'ſ')
            } else {
                c == want
            };
            if !same {
                return None;
            }
            len += c.len_utf8();
        }
        Some(i + len)
    })
}

/// The whitespace alternatives shared by both patterns: `\s+(?!\S)|\s+`, for a whitespace
/// run from `start` to `end`.
fn whitespace_end(s: &str, start: usize, end: usize) -> usize {
    if end == s.len() {
        return end;
    }
    // `\s+(?!\S)` backs off one character so that whitespace, not `\S`, follows; a single
    // whitespace character before a non-space falls through to `\s+`.
    let last = s[start..end]
        .char_indices()
        .last()
        .map_or(start, |(offset, _)| start + offset);
    if last > start { last } else { end }
}

/// The Qwen2 / Llama 3 pattern, with numbers in runs of at most `max_digits`.
fn match_llama3_family(s: &str, start: usize, max_digits: usize) -> usize {
    let Some(first) = char_at(s, start) else {
        return s.len();
    };
    let after_first = start + first.len_utf8();

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if first == '\''
        && let Some(end) = contraction_end(s, after_first, true)
    {
        return end;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    let letters_from = if first != '\r' && first != '\n' && !is_letter(first) && !is_number(first) {
        after_first
    } else {
        start
    };
    if char_at(s, letters_from).is_some_and(is_letter) {
        return run_end(s, letters_from, is_letter);
    }
    // \p{N}{1,max_digits}
    if is_number(first) {
        return s[start..]
            .char_indices()
            .take(max_digits)
            .take_while(|&(_, c)| is_number(c))
            .last()
            .map_or(after_first, |(offset, c)| start + offset + c.len_utf8());
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let others_from = if first == ' ' { after_first } else { start };
    if char_at(s, others_from).is_some_and(is_other) {
        let end = run_end(s, others_from, is_other);
        return run_end(s, end, |c| c == '\r' || c == '\n');
    }
    // \s*[\r\n]+ : the whitespace run up to and including its last line break.
    let ws_end = run_end(s, start, is_whitespace);
    if let Some((offset, _)) = s[start..ws_end]
        .char_indices()
        .rev()
        .find(|&(_, c)| c == '\r' || c == '\n')
    {
        return start + offset + 1;
    }
    if ws_end > start {
        return whitespace_end(s, start, ws_end);
    }
    after_first
}

/// The GPT-2 pattern.
fn match_gpt2(s: &str, start: usize) -> usize {
    let Some(first) = char_at(s, start) else {
        return s.len();
    };
    let after_first = start + first.len_utf8();

    // 's|'t|'re|'ve|'m|'ll|'d
    if first == '\''
        && let Some(end) = contraction_end(s, after_first, false)
    {
        return end;
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`
    let class_from = if first == ' ' { after_first } else { start };
    if let Some(c) = char_at(s, class_from) {
        for class in [is_letter as fn(char) -> bool, is_number, is_other] {
            if class(c) {
                return run_end(s, class_from, class);
            }
        }
    }
    // \s+(?!\S)|\s+
    let ws_end = run_end(s, start, is_whitespace);
    if ws_end > start {
        return whitespace_end(s, start, ws_end);
    }
    after_first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, |p| out.push(p));
        assert_eq!(out.concat(), text, "pieces must cover the text");
        out
    }

    #[test]
    fn qwen2_pattern() {
        use PreTokenizer::Qwen2;
        assert_eq!(pieces(Qwen2, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(Qwen2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(Qwen2, "end   "), ["end", "   "]);
        assert_eq!(pieces(Qwen2, "x\tb"), ["x", "\tb"]);
        assert_eq!(pieces(Qwen2, "x \tb"), ["x", " ", "\tb"]);
        assert_eq!(pieces(Qwen2, "a\n\nb"), ["a", "\n\n", "b"]);
        assert_eq!(pieces(Qwen2, "a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(pieces(Qwen2, "12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(
            pieces(Qwen2, "I'M they'Ll 'ſ"),
            ["I", "'M", " they", "'Ll", " '", "ſ"]
        );
        // Oniguruma's case folding makes the long s match `'s`.
        assert_eq!(pieces(Qwen2, "x'ſa"), ["x", "'ſ", "a"]);
        assert_eq!(pieces(Qwen2, " ...\n\nx"), [" ...\n\n", "x"]);
        assert_eq!(pieces(Qwen2, "!!x"), ["!!", "x"]);
        assert_eq!(pieces(Qwen2, "(x"), ["(x"]);
        assert_eq!(pieces(Qwen2, "\u{3000}c"), ["\u{3000}c"]);
        assert_eq!(pieces(Qwen2, ""), Vec::<&str>::new());
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(
            pieces(PreTokenizer::Llama3, "1234567 x1"),
            ["123", "456", "7", " x", "1"]
        );
    }

    #[test]
    fn gpt2_pattern() {
        use PreTokenizer::Gpt2;
        assert_eq!(
            pieces(Gpt2, "I'm here  now"),
            ["I", "'m", " here", " ", " now"]
        );
        assert_eq!(pieces(Gpt2, "I'M"), ["I", "'", "M"]);
        assert_eq!(pieces(Gpt2, " 123abc"), [" 123", "abc"]);
        assert_eq!(pieces(Gpt2, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(pieces(Gpt2, "x\t"), ["x", "\t"]);
    }

    #[test]
    fn digits_are_isolated_before_gpt2() {
        assert_eq!(
            pieces(PreTokenizer::DigitsThenGpt2, "a  12 b"),
            ["a", "  ", "1", "2", " b"]
        );
    }

    #[test]
    fn names() {
        assert_eq!(PreTokenizer::from_name("qwen2"), Some(PreTokenizer::Qwen2));
        assert_eq!(
            PreTokenizer::from_name("smollm"),
            Some(PreTokenizer::DigitsThenGpt2)
        );
        assert_eq!(PreTokenizer::from_name("bogus"), None);
    }
}
