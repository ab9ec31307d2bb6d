//! How fast a `specd generate` run decoded: tokens/s after the first token and, for a
//! speculative run, the speed-up over plain decoding, estimated from the target's decode step
//! measured on the same sequence once generation is over.

use specd_core::sync::lock;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use specd_core::{PrefillRequest, Prefilled, SeqId, Verified, Verifier, VerifyRequest};
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel, VerifierError};

/// Plain decode steps timed for the estimate (their median is used).
const PROBE_STEPS: usize = 3;

/// The in-process verifier, which, when asked to, times a few plain decode steps at the
/// sequence's final length just before releasing it (each rolled back, so nothing changes).
pub struct ProbedVerifier<'a, T: TargetModel> {
    inner: &'a LocalVerifier<T>,
    probe: bool,
    plain_step: Mutex<Option<Duration>>,
}

impl<'a, T: TargetModel> ProbedVerifier<'a, T> {
    pub fn new(inner: &'a LocalVerifier<T>, probe: bool) -> Self {
        Self {
            inner,
            probe,
            plain_step: Mutex::new(None),
        }
    }

    /// The median plain decode step measured at release, if any.
    pub fn plain_step(&self) -> Option<Duration> {
        *lock(&self.plain_step)
    }

    fn measure(&self, seq: SeqId) -> Result<Duration, VerifierError> {
        let (len, _) = self.inner.shared_kv_sync(seq)?;
        let mut times = Vec::with_capacity(PROBE_STEPS);
        for _ in 0..PROBE_STEPS {
            let started = Instant::now();
            self.inner.verify_sync(VerifyRequest {
                seq,
                round: u32::MAX,
                // Any token in the vocabulary costs the same step.
                tokens: vec![0],
                budget: 1,
                output_index_base: 0,
                want_carry: false,
                masks: Vec::new(),
                parents: Vec::new(),
            })?;
            times.push(started.elapsed());
            self.inner.truncate_sync(seq, len)?;
        }
        times.sort();
        Ok(times[times.len() / 2])
    }
}

impl<T: TargetModel> Verifier for ProbedVerifier<'_, T> {
    type Carry = TargetCarry;
    type Error = VerifierError;

    async fn prefill(
        &self,
        request: PrefillRequest,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        self.inner.prefill(request).await
    }

    async fn verify(&self, request: VerifyRequest) -> Result<Verified<TargetCarry>, VerifierError> {
        self.inner.verify(request).await
    }

    async fn truncate(&self, seq: SeqId, committed_len: usize) -> Result<(), VerifierError> {
        self.inner.truncate(seq, committed_len).await
    }

    async fn release(&self, seq: SeqId) -> Result<(), VerifierError> {
        if self.probe {
            match self.measure(seq) {
                Ok(step) => *lock(&self.plain_step) = Some(step),
                Err(error) => tracing::warn!(%error, "timing a plain decode step failed"),
            }
        }
        self.inner.release(seq).await
    }

    fn release_detached(&self, seq: SeqId) {
        self.inner.release_detached(seq);
    }
}

/// The decode speed of one run.
#[derive(Debug, Clone, Copy)]
pub struct DecodeSpeed {
    /// Tokens emitted after the first one.
    pub tokens: usize,
    /// From the first token to the last.
    pub time: Duration,
    /// One plain decode step of the target, when measured.
    pub plain_step: Option<Duration>,
}

impl DecodeSpeed {
    pub fn tokens_per_s(&self) -> Option<f64> {
        let secs = self.time.as_secs_f64();
        (self.tokens > 0 && secs > 0.0).then(|| self.tokens as f64 / secs)
    }

    /// Plain decoding's tokens/s at one token per measured step.
    pub fn plain_tokens_per_s(&self) -> Option<f64> {
        let step = self.plain_step?.as_secs_f64();
        (step > 0.0).then(|| 1.0 / step)
    }

    pub fn speedup(&self) -> Option<f64> {
        Some(self.tokens_per_s()? / self.plain_tokens_per_s()?)
    }

    /// One line for the end of a run, or `None` when too little was decoded to time.
    pub fn line(&self) -> Option<String> {
        let rate = self.tokens_per_s()?;
        let mut line = format!(
            "decode: {} tokens in {:.2} s, {rate:.1} tokens/s",
            self.tokens,
            self.time.as_secs_f64()
        );
        if let (Some(step), Some(plain), Some(speedup)) =
            (self.plain_step, self.plain_tokens_per_s(), self.speedup())
        {
            line.push_str(&format!(
                "; plain decoding ≈ {plain:.1} tokens/s (target step {:.1} ms, measured): \
                 {speedup:.2}x plain",
                step.as_secs_f64() * 1e3
            ));
        }
        Some(line)
    }

    pub fn json(&self) -> Value {
        json!({
            "decode_tokens": self.tokens,
            "decode_seconds": self.time.as_secs_f64(),
            "decode_tokens_per_s": self.tokens_per_s(),
            "plain_step_ms": self.plain_step.map(|s| s.as_secs_f64() * 1e3),
            "plain_tokens_per_s": self.plain_tokens_per_s(),
            "speedup_vs_plain": self.speedup(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speedup_is_decode_rate_over_one_token_per_plain_step() {
        let speed = DecodeSpeed {
            tokens: 30,
            time: Duration::from_secs(1),
            plain_step: Some(Duration::from_millis(50)),
        };
        assert_eq!(speed.tokens_per_s(), Some(30.0));
        assert_eq!(speed.plain_tokens_per_s(), Some(20.0));
        assert!((speed.speedup().unwrap() - 1.5).abs() < 1e-12);
        let line = speed.line().unwrap();
        assert!(
            line.contains("30.0 tokens/s") && line.contains("1.50x plain"),
            "{line}"
        );
    }

    #[test]
    fn nothing_decoded_gives_no_rate() {
        let speed = DecodeSpeed {
            tokens: 0,
            time: Duration::ZERO,
            plain_step: None,
        };
        assert!(speed.tokens_per_s().is_none() && speed.line().is_none());
    }
}
