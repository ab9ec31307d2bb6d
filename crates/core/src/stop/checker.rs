//! Applies the stop conditions token by token and produces safe text deltas.

use super::conditions::StopConditions;
use super::detokenizer::{DetokenizeError, Detokenizer};
use super::incremental::IncrementalDecoder;
use crate::finish::FinishReason;

/// What emitting one token produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenOutcome {
    /// Text that is now safe to show (possibly empty).
    pub text: String,
    /// Set when this token ends generation.
    pub finish: Option<FinishReason>,
}

/// Tracks emitted tokens against a request's [`StopConditions`].
///
/// Semantics (as in OpenAI's API and vLLM):
/// * The token that completes a stop string, an end-of-sequence id or a stop token id is the
///   last token emitted.
/// * End-of-sequence and stop token ids contribute no text.
/// * The text is cut right before the stop string; the stop string itself is never shown.
///   With several stop strings, the one starting earliest in the text wins (ties: first
///   listed).
/// * Text deltas never end inside a character and never contain text that could still turn
///   out to be the start of a stop string; such text is held back until it is either ruled out
///   or generation ends (then it is released, unless it is cut as part of a stop string).
pub struct StopChecker<'a, T: ?Sized> {
    detokenizer: &'a T,
    conditions: StopConditions,
    decoder: IncrementalDecoder,
    /// Decoded text not yet handed out.
    pending: String,
    emitted: usize,
    finish: Option<FinishReason>,
}

impl<'a, T: Detokenizer + ?Sized> StopChecker<'a, T> {
    /// A checker for a fresh output; `context` (for example the last prompt tokens) shapes the
    /// first text delta but is never emitted or searched for stop strings.
    pub fn new(detokenizer: &'a T, conditions: StopConditions, context: &[u32]) -> Self {
        Self {
            detokenizer,
            conditions,
            decoder: IncrementalDecoder::new(context),
            pending: String::new(),
            emitted: 0,
            finish: None,
        }
    }

    /// Emits `token`. After generation has finished, further tokens are ignored and the
    /// finish reason is repeated.
    pub fn push(&mut self, token: u32) -> Result<TokenOutcome, DetokenizeError> {
        if let Some(finish) = self.finish {
            return Ok(TokenOutcome {
                text: String::new(),
                finish: Some(finish),
            });
        }
        self.emitted += 1;
        let control_finish = if self.conditions.is_eos(token) {
            Some(FinishReason::Eos)
        } else if self.conditions.is_stop_token(token) {
            Some(FinishReason::Stop)
        } else {
            None
        };
        if let Some(finish) = control_finish {
            return self.finish_with(finish);
        }
        let delta = self.decoder.push(token, self.detokenizer)?;
        self.pending.push_str(&delta);
        if self.cut_at_stop_string() {
            self.finish = Some(FinishReason::Stop);
            return Ok(TokenOutcome {
                text: std::mem::take(&mut self.pending),
                finish: self.finish,
            });
        }
        if self.emitted >= self.conditions.max_tokens {
            return self.finish_with(FinishReason::Length);
        }
        let hold = self.stop_prefix_len();
        let text = self.pending.drain(..self.pending.len() - hold).collect();
        Ok(TokenOutcome { text, finish: None })
    }

    /// Ends generation now (for example on cancellation) and returns the held-back text.
    pub fn finish(&mut self, reason: FinishReason) -> Result<TokenOutcome, DetokenizeError> {
        match self.finish {
            Some(finish) => Ok(TokenOutcome {
                text: String::new(),
                finish: Some(finish),
            }),
            None => self.finish_with(reason),
        }
    }

    /// Tokens emitted so far.
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// Why generation ended, once it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Releases everything held back, still cutting at a stop string.
    fn finish_with(&mut self, reason: FinishReason) -> Result<TokenOutcome, DetokenizeError> {
        let rest = self.decoder.flush(self.detokenizer)?;
        self.pending.push_str(&rest);
        // A held-back character may complete a stop string only now; the text still must not
        // show it, but the reason stays the one that ended generation.
        self.cut_at_stop_string();
        self.finish = Some(reason);
        Ok(TokenOutcome {
            text: std::mem::take(&mut self.pending),
            finish: Some(reason),
        })
    }

    /// Cuts `pending` before the earliest stop string; true if one was found. Searching only
    /// the pending text is enough: everything released before was ruled out as a stop prefix.
    fn cut_at_stop_string(&mut self) -> bool {
        let earliest = self
            .conditions
            .stop_strings
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min();
        match earliest {
            Some(at) => {
                self.pending.truncate(at);
                true
            }
            None => false,
        }
    }

    /// Length of the longest end of `pending` that is a proper prefix of a stop string.
    fn stop_prefix_len(&self) -> usize {
        self.conditions
            .stop_strings
            .iter()
            .filter_map(|stop| {
                (1..stop.len())
                    .rev()
                    .filter(|&k| stop.is_char_boundary(k))
                    .find(|&k| self.pending.ends_with(&stop[..k]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::stop::test_pieces::Pieces;

    const EOS: u32 = 0;
    const STOP_ID: u32 = 1;

    fn pieces() -> Pieces {
        let e = "é".as_bytes();
        Pieces(
            [
                b"<eos>".as_slice(),
                b"<stop>",
                b"Hello",
                b" wor",
                b"ld",
                b"!",
                b"EN",
                b"D",
                &e[..1],
                &e[1..],
                b"x",
            ]
            .iter()
            .map(|p| p.to_vec())
            .collect(),
        )
    }

    fn conditions(max_tokens: usize, stops: &[&str]) -> StopConditions {
        StopConditions {
            max_tokens,
            eos_token_ids: vec![EOS],
            ignore_eos: false,
            stop_token_ids: vec![STOP_ID],
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Pushes tokens until one finishes; returns the deltas and the finish reason.
    fn run(c: StopConditions, tokens: &[u32]) -> (Vec<String>, Option<FinishReason>, usize) {
        let p = pieces();
        let mut checker = StopChecker::new(&p, c, &[]);
        let mut deltas = Vec::new();
        for &t in tokens {
            let out = checker.push(t).unwrap();
            deltas.push(out.text);
            if out.finish.is_some() {
                break;
            }
        }
        (deltas, checker.finish_reason(), checker.emitted())
    }

    #[test]
    fn max_tokens_finishes_with_length() {
        let (deltas, finish, emitted) = run(conditions(2, &[]), &[2, 3, 4]);
        assert_eq!(deltas, vec!["Hello", " wor"]);
        assert_eq!((finish, emitted), (Some(FinishReason::Length), 2));
    }

    #[test]
    fn eos_is_emitted_without_text() {
        let (deltas, finish, emitted) = run(conditions(10, &[]), &[2, EOS, 3]);
        assert_eq!(deltas, vec!["Hello", ""]);
        assert_eq!((finish, emitted), (Some(FinishReason::Eos), 2));
    }

    #[test]
    fn ignore_eos_keeps_going() {
        let mut c = conditions(3, &[]);
        c.ignore_eos = true;
        let (deltas, finish, _) = run(c, &[2, EOS, 3]);
        assert_eq!(deltas, vec!["Hello", "<eos>", " wor"]);
        assert_eq!(finish, Some(FinishReason::Length));
    }

    #[test]
    fn stop_token_id_finishes_with_stop() {
        let (deltas, finish, emitted) = run(conditions(10, &[]), &[2, STOP_ID]);
        assert_eq!(deltas, vec!["Hello", ""]);
        assert_eq!((finish, emitted), (Some(FinishReason::Stop), 2));
    }

    #[test]
    fn stop_string_spanning_tokens_is_cut_and_held_back() {
        // "Hello" + " wor" + "ld": the stop string "world" spans two tokens.
        let (deltas, finish, emitted) = run(conditions(10, &["world"]), &[2, 3, 4, 5]);
        // " wor" could still be the start of " world": only " " is safe, then the stop hits.
        assert_eq!(deltas, vec!["Hello", " ", ""]);
        assert_eq!((finish, emitted), (Some(FinishReason::Stop), 3));
    }

    #[test]
    fn held_text_is_released_when_ruled_out() {
        let (deltas, finish, _) = run(conditions(10, &["world"]), &[3, 5, 2]);
        assert_eq!(deltas, vec![" ", "wor!", "Hello"]);
        assert_eq!(finish, None);
    }

    #[test]
    fn held_text_is_released_at_length() {
        let (deltas, finish, _) = run(conditions(2, &["world"]), &[2, 3]);
        assert_eq!(deltas, vec!["Hello", " wor"]);
        assert_eq!(finish, Some(FinishReason::Length));
    }

    #[test]
    fn stop_string_in_the_middle_of_a_token_cuts_the_text() {
        // "ld!" contains "d!" in the middle of the piece boundary: "l" is released.
        let (deltas, finish, emitted) = run(conditions(10, &["d!"]), &[4, 5, 2]);
        assert_eq!(deltas, vec!["l", ""]);
        assert_eq!((finish, emitted), (Some(FinishReason::Stop), 2));
    }

    #[test]
    fn earliest_stop_string_wins() {
        let (deltas, finish, _) = run(conditions(10, &["ld", "wor"]), &[3, 4]);
        assert_eq!(deltas.concat(), " ");
        assert_eq!(finish, Some(FinishReason::Stop));
    }

    #[test]
    fn stop_at_the_last_allowed_token_is_stop() {
        let (_, finish, _) = run(conditions(2, &["END"]), &[6, 7]);
        assert_eq!(finish, Some(FinishReason::Stop));
    }

    #[test]
    fn multibyte_stop_string_across_split_character() {
        // "xé" where é arrives as two byte tokens: nothing partial is ever shown.
        let (deltas, finish, emitted) = run(conditions(10, &["é"]), &[10, 8, 9, 2]);
        assert_eq!(deltas, vec!["x", "", ""]);
        assert_eq!((finish, emitted), (Some(FinishReason::Stop), 3));
    }

    #[test]
    fn split_character_is_never_partially_shown() {
        let (deltas, _, _) = run(conditions(10, &[]), &[8, 9, 5]);
        assert_eq!(deltas, vec!["", "é", "!"]);
    }

    #[test]
    fn finish_releases_held_text_and_is_sticky() {
        let p = pieces();
        let mut checker = StopChecker::new(&p, conditions(10, &["world"]), &[]);
        assert_eq!(checker.push(3).unwrap().text, " ");
        let out = checker.finish(FinishReason::Cancelled).unwrap();
        assert_eq!(out.text, "wor");
        assert_eq!(out.finish, Some(FinishReason::Cancelled));
        let again = checker.push(2).unwrap();
        assert_eq!(again.text, "");
        assert_eq!(again.finish, Some(FinishReason::Cancelled));
        assert_eq!(checker.emitted(), 1);
    }

    #[test]
    fn decode_errors_are_returned() {
        let p = pieces();
        let mut checker = StopChecker::new(&p, conditions(10, &[]), &[]);
        assert!(checker.push(999).is_err());
    }
}
