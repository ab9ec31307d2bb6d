//! Settings of the n-gram drafter and their validation.

/// Largest `max_ngram` accepted. Longer keys cost hashing on every appended token and rarely
/// find more than a shorter key already does.
pub const NGRAM_LIMIT: usize = 16;

/// Which suffix lengths the drafter tries, longest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest suffix n-gram that may produce drafts (at least 1).
    pub min_ngram: usize,
    /// Longest suffix n-gram tried first (at least `min_ngram`, at most [`NGRAM_LIMIT`]).
    pub max_ngram: usize,
}

impl NgramConfig {
    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), NgramConfigError> {
        if self.min_ngram == 0 {
            return Err(NgramConfigError {
                field: "min_ngram",
                reason: "must be at least 1, got 0".to_owned(),
            });
        }
        if self.max_ngram < self.min_ngram {
            return Err(NgramConfigError {
                field: "max_ngram",
                reason: format!(
                    "must be at least min_ngram ({}), got {}",
                    self.min_ngram, self.max_ngram
                ),
            });
        }
        if self.max_ngram > NGRAM_LIMIT {
            return Err(NgramConfigError {
                field: "max_ngram",
                reason: format!("must be at most {NGRAM_LIMIT}, got {}", self.max_ngram),
            });
        }
        Ok(())
    }

    /// Suffix lengths in the order they are tried.
    pub(crate) fn lengths_longest_first(&self) -> impl Iterator<Item = usize> {
        (self.min_ngram..=self.max_ngram).rev()
    }
}

impl Default for NgramConfig {
    /// Suffixes of 3, 2 and 1 tokens, as prompt-lookup decoding commonly uses.
    fn default() -> Self {
        Self {
            min_ngram: 1,
            max_ngram: 3,
        }
    }
}

/// An n-gram drafter setting is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid ngram drafter setting `{field}`: {reason}")]
pub struct NgramConfigError {
    /// Name of the offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(min_ngram: usize, max_ngram: usize) -> NgramConfig {
        NgramConfig {
            min_ngram,
            max_ngram,
        }
    }

    #[test]
    fn accepts_valid_settings() {
        assert_eq!(NgramConfig::default(), config(1, 3));
        for (min, max) in [(1, 1), (1, 3), (2, 5), (NGRAM_LIMIT, NGRAM_LIMIT)] {
            assert!(config(min, max).validate().is_ok(), "({min}, {max})");
        }
    }

    #[test]
    fn rejects_bad_settings_naming_the_field() {
        for (min, max, field) in [
            (0, 3, "min_ngram"),
            (0, 0, "min_ngram"),
            (3, 2, "max_ngram"),
            (1, NGRAM_LIMIT + 1, "max_ngram"),
        ] {
            let err = config(min, max).validate().unwrap_err();
            assert_eq!(err.field, field, "({min}, {max})");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn lengths_are_tried_longest_first() {
        let lengths: Vec<usize> = config(2, 4).lengths_longest_first().collect();
        assert_eq!(lengths, [4, 3, 2]);
    }
}
