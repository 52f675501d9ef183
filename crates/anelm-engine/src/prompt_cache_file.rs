//! The file format of one prompt cache entry, and reading it back with every check.
//!
//! Layout (little endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `ANELM-PC` |
//! | 4 | format version ([`FORMAT_VERSION`]) |
//! | 4 | flags (bit 0: the state may be restored at any shorter length) |
//! | 4 | model identity key length `k` |
//! | 4 | prefix token count `n` |
//! | 8 | payload length `p` |
//! | k | model identity key |
//! | 4·n | prefix token ids (u32) |
//! | 4 | CRC32 of everything above (the header) |
//! | p | payload: session state ([`Session::encode_prefix`](crate::Session::encode_prefix)) |
//! | 4 | CRC32 of everything above (header, header CRC and payload) |
//!
//! The header CRC lets the store rebuild its index from headers alone and trust the tokens it
//! reads; the final CRC covers the payload, checked before an entry is used.

use std::io::Read;

use crate::byte_codec::{Reader, put_u32, put_u32s, put_u64};

/// First bytes of every entry file.
pub const MAGIC: &[u8; 8] = b"ANELM-PC";
/// The entry layout this build writes and reads; any other is discarded.
pub const FORMAT_VERSION: u32 = 1;
/// Extension of entry files.
pub const EXTENSION: &str = "anelm-prompt";
/// Flag bit: the saved state may be restored at any shorter length.
const FLAG_REWINDABLE: u32 = 1;
/// Bytes before the key.
const FIXED: usize = 32;
/// Longest model identity key accepted.
pub const MAX_KEY_BYTES: usize = 64 * 1024;
/// Most prefix tokens an entry may hold.
pub const MAX_TOKENS: usize = 1 << 24;

/// Why an entry file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// It could not be read.
    #[error("could not read the entry: {0}")]
    Io(#[from] std::io::Error),
    /// It is not an entry, or a version this build does not read.
    #[error("not a prompt cache entry of format {FORMAT_VERSION} ({0})")]
    Format(String),
    /// It is shorter or longer than its header says (a write that never finished).
    #[error("the entry is {found} bytes, its header says {expected}: torn or truncated")]
    Length {
        /// Size on disk.
        found: u64,
        /// Size the header implies.
        expected: u64,
    },
    /// A checksum does not match (the bytes changed after they were written).
    #[error("the entry's {0} checksum does not match: corrupted")]
    Checksum(&'static str),
}

/// What an entry's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// The state may be restored at any shorter length.
    pub rewindable: bool,
    /// The model identity it was written for.
    pub key: Vec<u8>,
    /// The prompt prefix it holds the state of.
    pub tokens: Vec<u32>,
    /// Payload bytes.
    pub payload_len: u64,
    /// Header bytes, its CRC included (where the payload starts).
    pub header_len: usize,
}

impl EntryHeader {
    /// The size the whole file must have.
    pub fn file_len(&self) -> u64 {
        self.header_len as u64 + self.payload_len + 4
    }
}

/// The header bytes (its CRC included) of an entry.
pub fn header_bytes(key: &[u8], tokens: &[u32], rewindable: bool, payload_len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(FIXED + key.len() + 4 * tokens.len() + 4);
    h.extend_from_slice(MAGIC);
    put_u32(&mut h, FORMAT_VERSION);
    put_u32(&mut h, if rewindable { FLAG_REWINDABLE } else { 0 });
    put_u32(&mut h, key.len() as u32);
    put_u32(&mut h, tokens.len() as u32);
    put_u64(&mut h, payload_len as u64);
    h.extend_from_slice(key);
    put_u32s(&mut h, tokens);
    let crc = crc32fast::hash(&h);
    put_u32(&mut h, crc);
    h
}

/// Bytes of a whole entry file: the header for `key_len` key bytes and `n_tokens` tokens (with
/// its CRC), the payload, and the final CRC.
pub fn entry_len(key_len: usize, n_tokens: usize, payload_len: usize) -> u64 {
    (FIXED + key_len + 4 * n_tokens + 4 + payload_len + 4) as u64
}

/// The file name of the entry for the prefix `tokens` under the model identity `key`: a 64-bit
/// FNV-1a of both, in hex, with [`EXTENSION`]. Never derived from anything but these hashes, so
/// no input reaches the file system as a path.
pub fn file_name(key: &[u8], tokens: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    key.iter().for_each(|&b| eat(b));
    eat(0xff);
    tokens.iter().flat_map(|t| t.to_le_bytes()).for_each(&mut eat);
    format!("{h:016x}.{EXTENSION}")
}

/// The CRC that ends an entry: over its header bytes and payload.
pub fn final_crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut c = crc32fast::Hasher::new();
    c.update(header);
    c.update(payload);
    c.finalize()
}

/// Key and token byte counts from the fixed part, bounded.
fn variable_len(fixed: &[u8]) -> Result<usize, EntryError> {
    let mut r = Reader::new(fixed);
    let bad = |m: &str| EntryError::Format(m.to_string());
    if r.take(8).map_err(|_| bad("too short"))? != MAGIC {
        return Err(bad("bad magic"));
    }
    let version = r.u32().map_err(|_| bad("too short"))?;
    if version != FORMAT_VERSION {
        return Err(EntryError::Format(format!("version {version}")));
    }
    let _flags = r.u32().map_err(|_| bad("too short"))?;
    let key_len = r.u32().map_err(|_| bad("too short"))? as usize;
    let n = r.u32().map_err(|_| bad("too short"))? as usize;
    if key_len > MAX_KEY_BYTES || n > MAX_TOKENS {
        return Err(bad("key or token count out of range"));
    }
    Ok(key_len + 4 * n + 4)
}

/// Parse and check a complete header (`bytes` starts with it; more may follow).
pub fn parse_header(bytes: &[u8]) -> Result<EntryHeader, EntryError> {
    let short = || EntryError::Format("header too short".into());
    let fixed = bytes.get(..FIXED).ok_or_else(short)?;
    let header_len = FIXED + variable_len(fixed)?;
    let header = bytes.get(..header_len).ok_or_else(short)?;
    let (body, crc) = header.split_at(header_len - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err(EntryError::Checksum("header"));
    }
    let mut r = Reader::new(body);
    let fail = |_| short();
    r.take(12).map_err(fail)?;
    let flags = r.u32().map_err(fail)?;
    let key_len = r.u32().map_err(fail)? as usize;
    let n = r.u32().map_err(fail)? as usize;
    let payload_len = r.u64().map_err(fail)?;
    let key = r.take(key_len).map_err(fail)?.to_vec();
    let tokens = r.u32s(n).map_err(fail)?;
    if flags & !FLAG_REWINDABLE != 0 {
        return Err(EntryError::Format(format!("unknown flags {flags:#x}")));
    }
    Ok(EntryHeader {
        rewindable: flags & FLAG_REWINDABLE != 0,
        key,
        tokens,
        payload_len,
        header_len,
    })
}

/// Read only the header of the entry `file` of `file_len` bytes, checking its CRC and that the
/// file has the length the header implies (a torn write is caught here).
pub fn read_header(file: &mut impl Read, file_len: u64) -> Result<EntryHeader, EntryError> {
    let mut fixed = [0u8; FIXED];
    if file_len < FIXED as u64 {
        return Err(EntryError::Length {
            found: file_len,
            expected: FIXED as u64,
        });
    }
    file.read_exact(&mut fixed)?;
    let rest = variable_len(&fixed)?;
    if file_len < (FIXED + rest) as u64 {
        return Err(EntryError::Length {
            found: file_len,
            expected: (FIXED + rest) as u64,
        });
    }
    let mut bytes = fixed.to_vec();
    bytes.resize(FIXED + rest, 0);
    file.read_exact(&mut bytes[FIXED..])?;
    let header = parse_header(&bytes)?;
    if header.file_len() != file_len {
        return Err(EntryError::Length {
            found: file_len,
            expected: header.file_len(),
        });
    }
    Ok(header)
}

/// A whole entry, checked: its header and its payload bytes.
pub struct Entry {
    /// The header.
    pub header: EntryHeader,
    bytes: Vec<u8>,
}

impl Entry {
    /// Check a whole entry file's bytes: header, lengths and both CRCs.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, EntryError> {
        let header = parse_header(&bytes)?;
        if header.file_len() != bytes.len() as u64 {
            return Err(EntryError::Length {
                found: bytes.len() as u64,
                expected: header.file_len(),
            });
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(EntryError::Checksum("payload"));
        }
        Ok(Self { header, bytes })
    }

    /// The saved session state.
    pub fn payload(&self) -> &[u8] {
        &self.bytes[self.header.header_len..self.bytes.len() - 4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(payload: &[u8]) -> Vec<u8> {
        let h = header_bytes(b"model-a", &[5, 6, 7], true, payload.len());
        let mut f = h.clone();
        f.extend_from_slice(payload);
        f.extend_from_slice(&final_crc(&h, payload).to_le_bytes());
        f
    }

    #[test]
    fn an_entry_parses_and_every_flipped_bit_or_cut_is_caught() {
        let f = entry(b"session bytes");
        let e = Entry::parse(f.clone()).expect("valid");
        assert_eq!(e.header.tokens, vec![5, 6, 7]);
        assert_eq!(e.header.key, b"model-a");
        assert!(e.header.rewindable);
        assert_eq!(e.payload(), b"session bytes");
        let h = read_header(&mut f.as_slice(), f.len() as u64).expect("header");
        assert_eq!(h, e.header);
        assert_eq!(entry_len(b"model-a".len(), 3, b"session bytes".len()), f.len() as u64);
        for i in 0..f.len() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert!(Entry::parse(g).is_err(), "byte {i} bit {bit}");
            }
        }
        for cut in 0..f.len() {
            assert!(Entry::parse(f[..cut].to_vec()).is_err(), "cut {cut}");
            assert!(read_header(&mut &f[..cut], cut as u64).is_err(), "header of cut {cut}");
        }
    }
}
