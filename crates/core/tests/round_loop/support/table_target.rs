//! A deterministic next-token function standing in for the target model's logits.

use specd_core::sampling::{mix64, sample};
use specd_core::SamplingParams;

/// Vocabulary size of the table target (matches the piece table).
pub const VOCAB: u32 = 24;

/// Logits after `context`: a hash of the last three tokens and the length, spread over
/// [-4, 4), so greedy and sampled sequences are varied but reproducible.
pub fn target_logits(context: &[u32]) -> Vec<f32> {
    let n = context.len();
    let mut key = mix64(n as u64 ^ 0xA5A5_A5A5);
    for &token in &context[n.saturating_sub(3)..] {
        key = mix64(key ^ (u64::from(token) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    (0..VOCAB)
        .map(|v| {
            let h = mix64(key ^ (u64::from(v) + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
            (h >> 40) as f32 / (1u32 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

/// The target's token after `context` at output index `index`.
pub fn target_token(context: &[u32], sampling: &SamplingParams, index: u64) -> u32 {
    sample(&target_logits(context), sampling, index).unwrap()
}

/// Distance back to the token [`repeating_logits`] favours (the scenario prompt's length).
pub const REPEAT_PERIOD: usize = 5;
/// Added to the favoured logit: more than the spread of [`target_logits`], so greedy decoding
/// always repeats while sampling at a high temperature sometimes does not.
pub const REPEAT_BOOST: f32 = 9.0;

/// Logits of a target that tends to repeat itself: [`target_logits`] with the token
/// [`REPEAT_PERIOD`] positions back boosted, as a model quoting its prompt or looping would.
pub fn repeating_logits(context: &[u32]) -> Vec<f32> {
    let mut logits = target_logits(context);
    let favoured = context
        .len()
        .checked_sub(REPEAT_PERIOD)
        .and_then(|position| context.get(position));
    if let Some(logit) = favoured.and_then(|&token| logits.get_mut(token as usize)) {
        *logit += REPEAT_BOOST;
    }
    logits
}

/// Which next-token function the table sides run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// [`target_logits`]: varied output that rarely repeats.
    #[default]
    Hashed,
    /// [`repeating_logits`]: output that mostly repeats with period [`REPEAT_PERIOD`].
    Repeating,
}

impl Target {
    pub fn logits(self, context: &[u32]) -> Vec<f32> {
        match self {
            Target::Hashed => target_logits(context),
            Target::Repeating => repeating_logits(context),
        }
    }

    /// The token after `context` at output index `index`.
    pub fn token(self, context: &[u32], sampling: &SamplingParams, index: u64) -> u32 {
        sample(&self.logits(context), sampling, index).unwrap()
    }
}

/// Plain decoding written independently of the round loop: one token per step, stopping at
/// `max_tokens` or at the first id in `eos`.
pub fn reference_decode(
    prompt: &[u32],
    sampling: &SamplingParams,
    max_tokens: usize,
    eos: &[u32],
) -> Vec<u32> {
    reference_decode_on(Target::Hashed, prompt, sampling, max_tokens, eos)
}

/// [`reference_decode`] of any target.
pub fn reference_decode_on(
    target: Target,
    prompt: &[u32],
    sampling: &SamplingParams,
    max_tokens: usize,
    eos: &[u32],
) -> Vec<u32> {
    let mut context = prompt.to_vec();
    let mut out = Vec::new();
    for index in 0..max_tokens {
        let token = target.token(&context, sampling, index as u64);
        out.push(token);
        if eos.contains(&token) {
            break;
        }
        context.push(token);
    }
    out
}
