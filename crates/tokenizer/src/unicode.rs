//! Character classes of the pre-tokenizer patterns, and GPT-2's byte-to-character mapping.

use unicode_general_category::{GeneralCategory, get_general_category};

/// `\p{L}`: general categories Lu, Ll, Lt, Lm and Lo.
pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches!(
        get_general_category(c),
        GeneralCategory::UppercaseLetter
            | GeneralCategory::LowercaseLetter
            | GeneralCategory::TitlecaseLetter
            | GeneralCategory::ModifierLetter
            | GeneralCategory::OtherLetter
    )
}

/// `\p{N}`: general categories Nd, Nl and No (also what Rust's `char::is_numeric` tests, which
/// Hugging Face's `Digits` pre-tokenizer uses).
pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches!(
        get_general_category(c),
        GeneralCategory::DecimalNumber
            | GeneralCategory::LetterNumber
            | GeneralCategory::OtherNumber
    )
}

/// `\s`: the White_Space property, as Oniguruma (Hugging Face's regex engine) defines it.
pub(crate) fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// Neither whitespace, letter nor number: `[^\s\p{L}\p{N}]`.
pub(crate) fn is_other(c: char) -> bool {
    !is_whitespace(c) && !is_letter(c) && !is_number(c)
}

/// Whether GPT-2's mapping keeps byte `b` as the character of the same code point.
const fn is_printable_byte(b: u8) -> bool {
    matches!(b, 33..=126 | 161..=172 | 174..=255)
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the other 68 bytes are
/// moved, in order, to U+0100 and up, so that every byte has a visible, non-space character.
const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut moved = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let code = if is_printable_byte(b as u8) {
            b as u32
        } else {
            moved += 1;
            255 + moved
        };
        // Every code computed here is below U+0200, so none is a surrogate.
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
};

/// The bytes that GPT-2's mapping moves, in the order of the characters they move to.
const MOVED_BYTES: [u8; 68] = {
    let mut table = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable_byte(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

/// The character that stands for byte `b` in byte-level BPE token texts.
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte that character `c` stands for in byte-level BPE token texts, if any.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    match u8::try_from(code) {
        Ok(b) if is_printable_byte(b) => Some(b),
        Ok(_) => None,
        Err(_) => code
            .checked_sub(256)
            .and_then(|i| MOVED_BYTES.get(i as usize).copied()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_mapping_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "byte {b} maps to a taken character");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(char_to_byte('\u{0143}'), Some(0xad));
        assert_eq!(char_to_byte('\u{0144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn classes() {
        assert!(is_letter('é') && is_letter('中') && is_letter('ʰ') && !is_letter('1'));
        assert!(is_number('٣') && is_number('Ⅻ') && is_number('½') && !is_number('a'));
        assert!(is_whitespace('\u{3000}') && is_whitespace('\u{85}') && !is_whitespace('\u{200b}'));
        assert!(is_other('!') && is_other('\u{301}') && is_other('🦙') && !is_other(' '));
    }
}
