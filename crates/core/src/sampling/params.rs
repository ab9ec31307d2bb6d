//! Sampling parameters and their validation.

/// How the target picks each output token.
///
/// `temperature == 0` is greedy decoding (argmax, ties to the lowest id); the other fields are
/// then ignored. Otherwise the logits are scaled by `1/temperature`, filtered by `top_k`
/// (0 = off) and `top_p` (1 = off), and one token is drawn with randomness keyed only by
/// `(seed, output_index)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 for greedy; otherwise a finite positive temperature.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps every token.
    pub top_k: u32,
    /// Key of the random stream; equal seeds give equal outputs.
    pub seed: u64,
}

impl SamplingParams {
    /// Greedy decoding.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    };

    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), SamplingParamError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingParamError {
                field: "temperature",
                reason: format!("must be finite and >= 0, got {}", self.temperature),
            });
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(SamplingParamError {
                field: "top_p",
                reason: format!("must be in (0, 1], got {}", self.top_p),
            });
        }
        Ok(())
    }

    /// True when the token is the argmax of the logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::GREEDY
    }
}

/// A sampling parameter is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid sampling parameter `{field}`: {reason}")]
pub struct SamplingParamError {
    /// Name of the offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(temperature: f32, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k: 0,
            seed: 1,
        }
    }

    #[test]
    fn accepts_valid_params() {
        assert!(with(0.0, 1.0).validate().is_ok());
        assert!(with(0.7, 0.9).validate().is_ok());
        assert!(with(2.0, 1e-9).validate().is_ok());
    }

    #[test]
    fn rejects_bad_temperature_naming_the_field() {
        for t in [f32::NAN, -0.5, f32::INFINITY] {
            let err = with(t, 1.0).validate().unwrap_err();
            assert_eq!(err.field, "temperature");
            assert!(err.to_string().contains("temperature"), "{err}");
        }
    }

    #[test]
    fn rejects_bad_top_p_naming_the_field() {
        for p in [f32::NAN, 0.0, -0.1, 1.5] {
            let err = with(1.0, p).validate().unwrap_err();
            assert_eq!(err.field, "top_p");
            assert!(err.to_string().contains("top_p"), "{err}");
        }
    }
}
