//! Thinking models (Qwen3, Qwen3.5) write their reasoning between `<think>` and `</think>`
//! before the answer. [`ReasoningSplitter`] separates the two as text streams in, so a server
//! can send the reasoning as `reasoning_content` and only the answer as `content`, holding back
//! no more than a possible partial tag.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Which part of the answer a piece of text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Between `<think>` and `</think>`.
    Reasoning,
    /// The answer.
    Content,
}

/// Whether a chat template is a thinking model's (it writes `<think>` blocks).
pub fn template_thinks(template_source: &str) -> bool {
    template_source.contains(CLOSE)
}

/// Splits streamed text into reasoning and content (see the module docs).
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    part: Part,
    /// Whether a `<think>` may still open at the very start of the output.
    at_start: bool,
    /// Just after `</think>`: the whitespace before the answer is dropped.
    after_close: bool,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for an output whose prompt ended as `prompt` does: a prompt that ends inside
    /// an open `<think>` (templates that open the block themselves) starts in reasoning.
    pub fn new(prompt: &str) -> Self {
        let open = prompt.rfind(OPEN);
        let closed = prompt.rfind(CLOSE);
        let inside = match (open, closed) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        };
        Self {
            part: if inside { Part::Reasoning } else { Part::Content },
            at_start: !inside,
            after_close: false,
            held: String::new(),
        }
    }

    /// Feed text; returns the pieces now certain, each with its part.
    pub fn push(&mut self, text: &str) -> Vec<(Part, String)> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.at_start {
                let trimmed = self.held.trim_start();
                if trimmed.starts_with(OPEN) {
                    let skip = self.held.len() - trimmed.len() + OPEN.len();
                    self.held.drain(..skip);
                    self.part = Part::Reasoning;
                    self.at_start = false;
                    continue;
                }
                if OPEN.starts_with(trimmed) {
                    return out; // could still become `<think>`
                }
                self.at_start = false;
            }
            match self.part {
                Part::Reasoning => match self.held.find(CLOSE) {
                    Some(at) => {
                        let reasoning: String = self.held.drain(..at).collect();
                        self.held.drain(..CLOSE.len());
                        push_piece(&mut out, Part::Reasoning, reasoning);
                        self.part = Part::Content;
                        self.after_close = true;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        let ready: String = self.held.drain(..self.held.len() - keep).collect();
                        push_piece(&mut out, Part::Reasoning, ready);
                        return out;
                    }
                },
                Part::Content => {
                    if self.after_close {
                        // The answer starts after the blank line templates put there.
                        let rest = self.held.trim_start().to_string();
                        self.held = rest;
                        if self.held.is_empty() {
                            return out;
                        }
                        self.after_close = false;
                    }
                    let text = std::mem::take(&mut self.held);
                    push_piece(&mut out, Part::Content, text);
                    return out;
                }
            }
        }
    }

    /// The output ended: release what was held back.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        let text = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        push_piece(&mut out, self.part, text);
        out
    }

    /// Split a whole answer: (reasoning, content); reasoning is `None` when there was none.
    pub fn split(prompt: &str, text: &str) -> (Option<String>, String) {
        let mut s = Self::new(prompt);
        let mut pieces = s.push(text);
        pieces.extend(s.finish());
        let mut reasoning: Option<String> = None;
        let mut content = String::new();
        for (part, t) in pieces {
            match part {
                Part::Reasoning => reasoning.get_or_insert_with(String::new).push_str(&t),
                Part::Content => content.push_str(&t),
            }
        }
        (reasoning.map(|r| r.trim().to_string()), content)
    }
}

fn push_piece(out: &mut Vec<(Part, String)>, part: Part, text: String) {
    if !text.is_empty() {
        out.push((part, text));
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.len() >= n && text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(prompt: &str, chunks: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::new(prompt);
        let (mut r, mut c) = (String::new(), String::new());
        let mut all: Vec<(Part, String)> = chunks.iter().flat_map(|t| s.push(t)).collect();
        all.extend(s.finish());
        for (p, t) in all {
            match p {
                Part::Reasoning => r.push_str(&t),
                Part::Content => c.push_str(&t),
            }
        }
        (r, c)
    }

    #[test]
    fn think_blocks_split_however_the_text_is_cut() {
        let text = "<think>\nThe user asks 2+2.\n</think>\n\nIt is 4.";
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let (r, c) = streamed("<|im_start|>assistant\n", &[&text[..cut], &text[cut..]]);
            assert_eq!(r.trim(), "The user asks 2+2.", "cut at {cut}");
            assert_eq!(c, "It is 4.", "cut at {cut}");
        }
        // Byte by byte too.
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(streamed("", &refs).1, "It is 4.");
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_in_reasoning_and_plain_answers_stay_content() {
        let (r, c) = ReasoningSplitter::split("<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nYes.");
        assert_eq!((r.as_deref(), c.as_str()), (Some("Hmm."), "Yes."));
        // Thinking switched off: the template closed the block in the prompt.
        let (r, c) = ReasoningSplitter::split("<think>\n\n</think>\n\n", "Yes.");
        assert_eq!((r, c.as_str()), (None, "Yes."));
        // Cut off while thinking: all reasoning.
        let (r, c) = ReasoningSplitter::split("", "<think>still going");
        assert_eq!((r.as_deref(), c.as_str()), (Some("still going"), ""));
        // Text that merely starts like a tag is content.
        let (r, c) = ReasoningSplitter::split("", "<thin air>");
        assert_eq!((r, c.as_str()), (None, "<thin air>"));
    }
}
