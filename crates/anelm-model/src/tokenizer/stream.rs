//! Incremental detokenisation for streaming output.

use super::Tokenizer;

/// Incremental detokeniser for streaming: feed ids, get the text that is complete
/// (never splits a UTF-8 char; holds back incomplete bytes). Unlike [`Tokenizer::decode`]
/// it never strips a SentencePiece leading space: streamed pieces are exactly the tokens'
/// bytes, as llama.cpp's token-to-piece gives them.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder with nothing pending.
    pub fn new(tok: &'t Tokenizer) -> Self {
        Self {
            tok,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text that became complete (possibly empty).
    /// Bytes that can never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.tok.token_bytes_ref(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    if let Some(s) = self.pending.get(..valid).and_then(|b| std::str::from_utf8(b).ok()) {
                        out.push_str(s);
                    }
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..(valid + bad).min(self.pending.len()));
                        }
                    }
                }
            }
        }
        out
    }

    /// Flush whatever is held back, replacing an incomplete char with U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
