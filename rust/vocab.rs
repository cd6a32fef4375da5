//! Vocabulary tables the tokenizer needs at every load: the raw bytes of
//! byte-level BPE tokens and the split merge rules. SmolLM2 has 49,152
//! tokens and 48,900 merges; done per item in Python they were most of
//! `Engine(path)`'s time.

/// GPT-2's byte-level alphabet, inverted: `BYTE_OF[c]` is the byte that the
/// character with code point `c` stands for, or -1. Printable Latin-1 bytes
/// stand for themselves; the other 68 bytes map, in order, to U+0100...
const fn byte_of_table() -> [i16; 324] {
    let mut t = [-1i16; 324];
    let mut extra = 0usize;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        if printable {
            t[b] = b as i16;
        } else {
            t[256 + extra] = b as i16;
            extra += 1;
        }
        b += 1;
    }
    t
}

static BYTE_OF: [i16; 324] = byte_of_table();

/// The raw bytes of a byte-level BPE token: each character of GPT-2's
/// alphabet is its byte; any other character is kept as its UTF-8.
pub fn byte_level_piece(token: &str, out: &mut Vec<u8>) {
    out.clear();
    for c in token.chars() {
        match BYTE_OF.get(c as usize) {
            Some(&b) if b >= 0 => out.push(b as u8),
            _ => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// Where a merge rule `"a b"` splits: at the first space after its first
/// character (so a merge whose first part is a space still splits), as
/// llama.cpp reads them. `None`: not two parts.
pub fn merge_split(rule: &str) -> Option<usize> {
    let first = rule.chars().next()?.len_utf8();
    rule[first..].find(' ').map(|i| first + i)
}

/// llama.cpp's token attribute bits (`llama_token_attr`) that decide a
/// token's piece; the Python side (`gguf_vocab.py`) names the same bits.
const A_UNKNOWN: i64 = 1 << 0;
const A_NORMAL: i64 = 1 << 2;
const A_CONTROL: i64 = 1 << 3;
const A_USER_DEFINED: i64 = 1 << 4;
const A_BYTE: i64 = 1 << 5;

/// How a byte-level BPE token becomes bytes, by its attributes.
#[derive(Debug, PartialEq, Eq)]
pub enum PieceKind {
    /// Control, unknown and user-defined tokens render their text as UTF-8.
    Text,
    /// Normal tokens: GPT-2's alphabet back to bytes.
    ByteLevel,
    /// `<0xXX>` byte tokens, rare enough to leave to the caller.
    Byte,
    /// Unused or untyped tokens render nothing.
    Empty,
}

/// The order of the tests is llama.cpp's `token_to_piece`: a token with
/// several bits set goes by the first that matches.
pub fn piece_kind(attr: i64) -> PieceKind {
    if attr & (A_CONTROL | A_UNKNOWN | A_USER_DEFINED) != 0 {
        PieceKind::Text
    } else if attr & A_NORMAL != 0 {
        PieceKind::ByteLevel
    } else if attr & A_BYTE != 0 {
        PieceKind::Byte
    } else {
        PieceKind::Empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_is_gpt2s() {
        let mut out = Vec::new();
        byte_level_piece("Ġhello", &mut out);
        assert_eq!(out, b" hello");
        byte_level_piece("Ċ", &mut out);
        assert_eq!(out, b"\n");
        // U+0100 is byte 0; U+0143 (the 68th) is byte 0xAD.
        byte_level_piece("\u{100}\u{143}", &mut out);
        assert_eq!(out, [0x00, 0xad]);
        let mapped = BYTE_OF.iter().filter(|&&b| b >= 0).count();
        assert_eq!(mapped, 256);
    }

    #[test]
    fn characters_outside_the_alphabet_stay_utf8() {
        let mut out = Vec::new();
        byte_level_piece("a\u{80}中", &mut out);
        assert_eq!(out, "a\u{80}中".as_bytes());
        byte_level_piece(" ", &mut out);
        assert_eq!(out, b" ");
    }

    #[test]
    fn merges_split_after_the_first_character() {
        assert_eq!(merge_split("a b"), Some(1));
        assert_eq!(merge_split("  x"), Some(1));
        assert_eq!(merge_split("é b"), Some(2));
        assert_eq!(merge_split("ab"), None);
        assert_eq!(merge_split(" "), None);
        assert_eq!(merge_split(""), None);
    }

    #[test]
    fn pieces_go_by_the_first_matching_attribute() {
        assert_eq!(piece_kind(A_NORMAL), PieceKind::ByteLevel);
        assert_eq!(piece_kind(A_NORMAL | A_CONTROL), PieceKind::Text);
        assert_eq!(piece_kind(A_USER_DEFINED | (1 << 8)), PieceKind::Text);
        assert_eq!(piece_kind(A_BYTE), PieceKind::Byte);
        assert_eq!(piece_kind(A_BYTE | A_NORMAL), PieceKind::ByteLevel);
        assert_eq!(piece_kind(0), PieceKind::Empty);
        assert_eq!(piece_kind(1 << 1), PieceKind::Empty);
    }
}
