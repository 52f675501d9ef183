//! GPT-2 byte-level alphabet: every byte maps to one printable char, so BPE
//! vocabularies can be stored as text. Used to turn vocabulary entries back into bytes.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Whether `b` is one of the bytes that stand for themselves in the GPT-2 alphabet.
fn is_direct(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte → char table of GPT-2's `bytes_to_unicode`.
pub fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let byte = b as u8;
            let code = if is_direct(byte) {
                u32::from(byte)
            } else {
                let c = next;
                next += 1;
                c
            };
            *slot = char::from_u32(code).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// The inverse table: char of the byte-level alphabet → byte.
fn char_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| byte_to_char().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect())
}

/// Bytes a byte-level vocabulary entry stands for. An entry with a char outside
/// the alphabet (e.g. a user-defined token stored as plain text) is taken as its
/// own UTF-8 bytes, as Hugging Face's ByteLevel decoder does.
pub fn decode_piece(piece: &str) -> Vec<u8> {
    let table = char_to_byte();
    let mapped: Option<Vec<u8>> = piece.chars().map(|c| table.get(&c).copied()).collect();
    mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection_with_known_points() {
        let t = byte_to_char();
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[usize::from(b'A')], 'A');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn decode_maps_every_byte_back() {
        let t = byte_to_char();
        let all: String = t.iter().collect();
        let bytes: Vec<u8> = (0..=255u8).collect();
        assert_eq!(decode_piece(&all), bytes);
        assert_eq!(decode_piece("Ġhello"), b" hello");
        // A plain-text entry (contains a real space) is kept as is.
        assert_eq!(decode_piece("a b"), b"a b");
    }
}
