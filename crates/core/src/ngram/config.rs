//! Settings of the n-gram drafter, their validation, and the draft-length rule they define.

/// Largest `max_ngram` accepted. The ramp reaches every block size in use long before it, so
/// a larger value can only be a mistake.
pub const NGRAM_LIMIT: usize = 64;

/// How long a match must be to draft, and how many drafts a match of a given length earns.
///
/// The drafter finds the longest suffix of the context that occurred earlier, whatever its
/// length; these settings only turn that length `m` into a number of drafts:
///
/// * `m < min_ngram`: none;
/// * `min_ngram <= m < max_ngram`: up to `m` (a short match is often a coincidence, so it
///   is trusted about as far ahead as it reaches back);
/// * `m >= max_ngram`: the full count the round asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest match that may produce drafts (at least 1).
    pub min_ngram: usize,
    /// Match length from which the full count is drafted (at least `min_ngram`, at most
    /// [`NGRAM_LIMIT`]).
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

    /// Drafts a match of `match_len` tokens may propose when the round wants `count`.
    pub fn draft_limit(&self, match_len: usize, count: usize) -> usize {
        if match_len < self.min_ngram {
            0
        } else if match_len >= self.max_ngram {
            count
        } else {
            count.min(match_len)
        }
    }
}

impl Default for NgramConfig {
    /// Any match may draft; a match of `m < 8` tokens drafts at most `m`, a longer one the
    /// full count.
    fn default() -> Self {
        Self {
            min_ngram: 1,
            max_ngram: 8,
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
        assert_eq!(NgramConfig::default(), config(1, 8));
        for (min, max) in [(1, 1), (1, 3), (2, 5), (4, 8), (NGRAM_LIMIT, NGRAM_LIMIT)] {
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
    fn draft_length_grows_with_the_match() {
        let ramp = config(2, 5);
        let limits: Vec<usize> = (0..=7).map(|m| ramp.draft_limit(m, 6)).collect();
        // Too short, then as long as the match, then the full count from max_ngram on.
        assert_eq!(limits, [0, 0, 2, 3, 4, 6, 6, 6]);
        // Never more than the round asks for.
        assert_eq!(ramp.draft_limit(3, 1), 1);
        assert_eq!(ramp.draft_limit(9, 0), 0);
        // min_ngram == max_ngram: all or nothing.
        assert_eq!(config(3, 3).draft_limit(2, 8), 0);
        assert_eq!(config(3, 3).draft_limit(3, 8), 8);
    }
}
