/// Finds stop strings in streamed text. Text that might begin a stop string is held back until
/// the next piece decides, so a client never receives the start of a stop string, and text
/// after a stop string is never sent.
#[derive(Debug)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What one piece of text gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Matched {
    /// Text that is safe to send.
    pub text: String,
    /// Whether a stop string was reached: generation ends, and `text` is the last of it.
    pub stopped: bool,
}

impl StopMatcher {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Adds `piece` to the text.
    pub(crate) fn push(&mut self, piece: &str) -> Matched {
        self.held.push_str(piece);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.held.truncate(at);
            return Matched {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.longest_partial_stop();
        let text = self.held.drain(..self.held.len() - keep).collect();
        Matched {
            text,
            stopped: false,
        }
    }

    /// The text held back when generation ended for another reason.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The length of the longest end of the held text that begins some stop string.
    fn longest_partial_stop(&self) -> usize {
        let held = &self.held;
        (1..=held.len())
            .rev()
            .filter(|&len| held.is_char_boundary(held.len() - len))
            .find(|&len| {
                let tail = &held[held.len() - len..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut matcher = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut sent = Vec::new();
        for piece in pieces {
            let matched = matcher.push(piece);
            sent.push(matched.text);
            if matched.stopped {
                return (sent, true, String::new());
            }
        }
        (sent, false, matcher.finish())
    }

    #[test]
    fn text_before_a_stop_string_split_across_pieces_is_sent_and_the_rest_is_not() {
        let (sent, stopped, _) = run(&["END"], &["hello E", "N", "D world"]);
        assert_eq!(sent.concat(), "hello ");
        assert!(stopped);
        assert_eq!(sent[0], "hello ", "the possible start of END is held");
    }

    #[test]
    fn a_piece_that_is_all_a_stop_prefix_is_held() {
        let (sent, stopped, _) = run(&[" 3\n"], &["2", " ", "3", "\n", "4"]);
        assert!(stopped);
        assert_eq!(sent, ["2", "", "", ""]);
    }

    #[test]
    fn a_false_start_is_released() {
        let (sent, stopped, rest) = run(&["END"], &["a E", "x", "y"]);
        assert!(!stopped);
        assert_eq!(sent.concat() + &rest, "a Exy");
        assert_eq!(sent[1], "Ex");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (sent, stopped, _) = run(&["world", "lo"], &["hello world"]);
        assert!(stopped);
        assert_eq!(sent.concat(), "hel");
    }

    #[test]
    fn held_text_is_cut_at_character_boundaries() {
        let (sent, stopped, rest) = run(&["é!"], &["café", " ok"]);
        assert!(!stopped);
        assert_eq!(sent[0], "caf");
        assert_eq!(sent.concat() + &rest, "café ok");
    }

    #[test]
    fn without_stop_strings_everything_passes() {
        let (sent, stopped, rest) = run(&[], &["a", "b"]);
        assert_eq!(
            (sent.concat(), stopped, rest.as_str()),
            ("ab".to_owned(), false, "")
        );
    }
}
