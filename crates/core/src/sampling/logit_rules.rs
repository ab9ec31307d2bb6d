//! What a request adds to the target's logits before a token is drawn: a bias per token,
//! repetition, frequency and presence penalties, and the min-p cut.
//!
//! Penalties depend on the tokens before the position, so a verify row is shaped from the
//! context up to that row alone: a block of k rows gets exactly the logits k plain steps
//! would get, which keeps speculation lossless under every rule.

use std::collections::{HashMap, HashSet};

/// Rules applied to one sequence's logits, in vLLM's order: bias, then penalties (before
/// temperature), then min-p (after temperature).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitRules {
    /// Subtracted once from the logit of every token already in the output (OpenAI's).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it is already in the output (OpenAI's).
    pub frequency_penalty: f32,
    /// Divides positive and multiplies negative logits of tokens in the prompt or the output
    /// (the CTRL / Hugging Face penalty); 0 and 1 are off.
    pub repetition_penalty: f32,
    /// Added to a token's logit, `(token, bias)`, bias in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// Keeps tokens whose probability (after temperature) is at least `min_p` times the best
    /// one's; 0 is off.
    pub min_p: f32,
}

impl LogitRules {
    /// Whether the rules change nothing.
    pub fn is_neutral(&self) -> bool {
        self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && !self.repeats_penalised()
            && self.logit_bias.is_empty()
            && self.min_p == 0.0
    }

    fn repeats_penalised(&self) -> bool {
        self.repetition_penalty != 0.0 && self.repetition_penalty != 1.0
    }

    fn uses_output(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repeats_penalised()
    }

    /// Checks every field against a vocabulary of `vocab_size` tokens (`None`: ids
    /// unchecked); the error names the offending field.
    pub fn validate(&self, vocab_size: Option<usize>) -> Result<(), LogitRuleError> {
        let bad = |field: &'static str, reason: String| Err(LogitRuleError { field, reason });
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return bad(field, format!("must be in [-2, 2], got {value}"));
            }
        }
        let r = self.repetition_penalty;
        if !r.is_finite() || r < 0.0 {
            return bad(
                "repetition_penalty",
                format!("must be finite and > 0 (0 or 1 is off), got {r}"),
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        for &(token, bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                return bad(
                    "logit_bias",
                    format!("the bias of token {token} must be in [-100, 100], got {bias}"),
                );
            }
            if vocab_size.is_some_and(|vocab| token as usize >= vocab) {
                return bad(
                    "logit_bias",
                    format!("token {token} is not below the vocabulary size"),
                );
            }
        }
        Ok(())
    }

    /// Bias and penalties on one row's logits, given the tokens before its position.
    pub fn shape(&self, logits: &mut [f32], context: &PenaltyContext) {
        for &(token, bias) in &self.logit_bias {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit += bias;
            }
        }
        if self.repeats_penalised() {
            let r = self.repetition_penalty;
            for &token in context.prompt.iter().chain(context.output.keys()) {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit = if *logit > 0.0 { *logit / r } else { *logit * r };
                }
            }
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            for (&token, &count) in &context.output {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit -= self.presence_penalty + self.frequency_penalty * count as f32;
                }
            }
        }
    }

    /// Min-p at `temperature` (a no-op when greedy): drops every token whose probability
    /// after temperature is below `min_p` times the best token's, i.e. whose logit is below
    /// `max + T ln(min_p)`.
    pub fn cut_min_p(&self, logits: &mut [f32], temperature: f32) {
        if self.min_p <= 0.0 || temperature <= 0.0 {
            return;
        }
        let max = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return;
        }
        let floor = f64::from(max) + f64::from(temperature) * f64::from(self.min_p).ln();
        for logit in logits.iter_mut() {
            if f64::from(*logit) < floor {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// The context the penalties need before the first row: the prompt's distinct tokens
    /// (only when the repetition penalty reads them) and the output's counts.
    pub fn context(&self, prompt: &[u32], output: &[u32]) -> PenaltyContext {
        let mut context = PenaltyContext::default();
        if !self.uses_output() {
            return context;
        }
        if self.repeats_penalised() {
            let distinct: HashSet<u32> = prompt.iter().copied().collect();
            context.prompt = distinct.into_iter().collect();
        }
        for &token in output {
            context.push(token);
        }
        context
    }
}

/// The tokens before one position, as the penalties read them.
#[derive(Clone, Debug, Default)]
pub struct PenaltyContext {
    /// Distinct prompt tokens that are not (yet) in the output.
    prompt: Vec<u32>,
    /// Output tokens and how often each occurs.
    output: HashMap<u32, u32>,
}

impl PenaltyContext {
    /// One more output token (the position moves on by one).
    pub fn push(&mut self, token: u32) {
        let count = self.output.entry(token).or_insert(0);
        if *count == 0 {
            // A token penalised for repetition is penalised once, from the output's side.
            self.prompt.retain(|&t| t != token);
        }
        *count += 1;
    }
}

/// A logit rule is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid sampling parameter `{field}`: {reason}")]
pub struct LogitRuleError {
    /// Name of the offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> LogitRules {
        LogitRules::default()
    }

    #[test]
    fn neutral_rules_change_nothing() {
        let r = rules();
        assert!(r.is_neutral());
        let mut logits = vec![1.0, -2.0, 3.0];
        r.shape(&mut logits, &r.context(&[0, 1], &[2, 2]));
        r.cut_min_p(&mut logits, 1.0);
        assert_eq!(logits, [1.0, -2.0, 3.0]);
    }

    #[test]
    fn presence_and_frequency_count_the_output_only() {
        let r = LogitRules {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..rules()
        };
        let mut context = r.context(&[0], &[1, 2, 2]);
        let mut logits = vec![1.0; 4];
        r.shape(&mut logits, &context);
        assert_eq!(logits, [1.0, 0.25, 0.0, 1.0]);
        context.push(3);
        let mut logits = vec![1.0; 4];
        r.shape(&mut logits, &context);
        assert_eq!(logits[3], 0.25);
    }

    #[test]
    fn repetition_penalty_reads_prompt_and_output_once_each() {
        let r = LogitRules {
            repetition_penalty: 2.0,
            ..rules()
        };
        let context = r.context(&[0, 0, 1], &[1, 3]);
        let mut logits = vec![4.0, -4.0, 4.0, 4.0];
        r.shape(&mut logits, &context);
        assert_eq!(logits, [2.0, -8.0, 4.0, 2.0]);
    }

    #[test]
    fn bias_adds_and_min_p_cuts_after_temperature() {
        let r = LogitRules {
            logit_bias: vec![(2, 5.0)],
            min_p: 0.5,
            ..rules()
        };
        let mut logits = vec![0.0, -1.0, -4.0];
        r.shape(&mut logits, &r.context(&[], &[]));
        assert_eq!(logits, [0.0, -1.0, 1.0]);
        // ln(0.5) = -0.69: at T = 1 only the best survives, at T = 2 the floor is -0.39.
        let mut cut = logits.clone();
        r.cut_min_p(&mut cut, 1.0);
        assert_eq!(cut, [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0]);
        let mut cut = logits.clone();
        r.cut_min_p(&mut cut, 2.0);
        assert_eq!(cut, [0.0, f32::NEG_INFINITY, 1.0]);
        let mut greedy = logits.clone();
        r.cut_min_p(&mut greedy, 0.0);
        assert_eq!(greedy, logits);
    }

    #[test]
    fn bad_rules_name_their_field() {
        let cases = [
            (
                LogitRules {
                    presence_penalty: 3.0,
                    ..rules()
                },
                "presence_penalty",
            ),
            (
                LogitRules {
                    frequency_penalty: f32::NAN,
                    ..rules()
                },
                "frequency_penalty",
            ),
            (
                LogitRules {
                    repetition_penalty: -1.0,
                    ..rules()
                },
                "repetition_penalty",
            ),
            (
                LogitRules {
                    min_p: 1.5,
                    ..rules()
                },
                "min_p",
            ),
            (
                LogitRules {
                    logit_bias: vec![(1, 101.0)],
                    ..rules()
                },
                "logit_bias",
            ),
            (
                LogitRules {
                    logit_bias: vec![(10, 1.0)],
                    ..rules()
                },
                "logit_bias",
            ),
        ];
        for (r, field) in cases {
            let err = r.validate(Some(10)).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }
}
