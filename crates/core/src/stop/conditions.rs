//! When a request stops: token budget, end-of-sequence ids, stop tokens and stop strings.

/// Stop conditions of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Most tokens to emit, the first (prefill) token included; at least 1.
    pub max_tokens: usize,
    /// End-of-sequence ids (from the model config); ignored when `ignore_eos` is set.
    pub eos_token_ids: Vec<u32>,
    /// Keep generating through end-of-sequence ids.
    pub ignore_eos: bool,
    /// Further ids that end generation (finish reason `Stop`), even with `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation when they appear in the output text.
    pub stop_strings: Vec<String>,
}

impl StopConditions {
    /// Only a token budget.
    pub fn max_tokens(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            ..Self::default()
        }
    }

    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), StopConditionError> {
        if self.max_tokens == 0 {
            return Err(StopConditionError {
                field: "max_tokens".to_owned(),
                reason: "must be at least 1".to_owned(),
            });
        }
        if let Some(i) = self.stop_strings.iter().position(String::is_empty) {
            return Err(StopConditionError {
                field: format!("stop_strings[{i}]"),
                reason: "must not be empty".to_owned(),
            });
        }
        Ok(())
    }

    /// Whether `token` ends generation as end-of-sequence.
    pub fn is_eos(&self, token: u32) -> bool {
        !self.ignore_eos && self.eos_token_ids.contains(&token)
    }

    /// Whether `token` is a stop token.
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.stop_token_ids.contains(&token)
    }
}

/// A stop condition is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid stop condition `{field}`: {reason}")]
pub struct StopConditionError {
    /// Name of the offending field.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        assert!(StopConditions::max_tokens(1).validate().is_ok());
        let err = StopConditions::max_tokens(0).validate().unwrap_err();
        assert_eq!(err.field, "max_tokens");
        let c = StopConditions {
            stop_strings: vec!["a".into(), String::new()],
            ..StopConditions::max_tokens(5)
        };
        let err = c.validate().unwrap_err();
        assert_eq!(err.field, "stop_strings[1]");
        assert!(err.to_string().contains("stop_strings[1]"));
    }

    #[test]
    fn eos_respects_ignore_eos() {
        let mut c = StopConditions {
            eos_token_ids: vec![2],
            stop_token_ids: vec![7],
            ..StopConditions::max_tokens(5)
        };
        assert!(c.is_eos(2) && !c.is_eos(3));
        c.ignore_eos = true;
        assert!(!c.is_eos(2));
        assert!(c.is_stop_token(7));
    }
}
