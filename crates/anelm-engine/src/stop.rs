//! Stop strings over streamed text: text is released only once it can no longer be the start of
//! a stop string, so a client never sees part of a stop sequence.

/// Watches generated text for any of a request's stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

/// What to do with a piece of text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to send now.
    pub emit: String,
    /// A stop string was found: generation ends after `emit` (the stop string is not sent).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Feed newly decoded text.
    pub fn push(&mut self, text: &str) -> StopStep {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return StopStep {
                emit: std::mem::take(&mut self.held),
                stopped: false,
            };
        }
        // The earliest match; at the same place, the first listed.
        if let Some((at, stop)) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)
        {
            self.matched = Some(stop.clone());
            let emit = self.held[..at].to_string();
            self.held.clear();
            return StopStep { emit, stopped: true };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let emit = self.held[..keep].to_string();
        self.held.drain(..keep);
        StopStep { emit, stopped: false }
    }

    /// Generation ended without a stop string: release what was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn no_stops_passes_everything() {
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("abc").emit, "abc");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_split_across_pieces_is_never_emitted() {
        let mut m = StopMatcher::new(&stops(&["</end>"]));
        let a = m.push("hello </");
        assert_eq!(a.emit, "hello ");
        assert!(!a.stopped);
        let b = m.push("en");
        assert_eq!(b.emit, "");
        let c = m.push("d> trailing");
        assert!(c.stopped);
        assert_eq!(c.emit, "");
    }

    #[test]
    fn the_matched_stop_string_is_named() {
        let mut m = StopMatcher::new(&stops(&["zz", "b", "ab"]));
        assert_eq!(m.matched(), None);
        assert!(!m.push("xa").stopped);
        assert!(m.push("b").stopped);
        assert_eq!(m.matched(), Some("ab"), "the earliest match wins");
        let mut m = StopMatcher::new(&stops(&["xyz"]));
        m.push("no stop here");
        m.finish();
        assert_eq!(m.matched(), None);
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(&stops(&["STOP"]));
        assert_eq!(m.push("ST").emit, "");
        let s = m.push("ART");
        assert_eq!(s.emit, "START");
        assert!(!s.stopped);
        assert_eq!(m.push("xx ST").emit, "xx ");
        assert_eq!(m.finish(), "ST");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_unicode_is_safe() {
        let mut m = StopMatcher::new(&stops(&["ß!", "é"]));
        let s = m.push("aé b ß!");
        assert!(s.stopped);
        assert_eq!(s.emit, "a");
        let mut m = StopMatcher::new(&stops(&["ßx"]));
        assert_eq!(m.push("ééß").emit, "éé");
    }
}
