//! Bias, penalties, min-p, log probabilities and constraint masks on the real (tiny Gemma 4)
//! target: a speculative round of k rows shapes each row from the context up to it, so its
//! tokens and log probabilities equal k plain steps'.

use std::convert::Infallible;
use std::sync::Mutex;

use specd_core::{
    BlockSizeConfig, Detokenizer, DraftRequest, Drafter, Event, GenerationRequest, LogitRules,
    OpenRequest, Opened, RequestControl, RoundLoop, SamplingParams, SeqId, SessionId,
    StopConditions, TokenLogprob,
};
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel, VerifierLimits};

use crate::support::*;

struct NoText;

impl Detokenizer for NoText {
    fn decode(&self, _ids: &[u32]) -> Result<String, specd_core::stop::DetokenizeError> {
        Ok(String::new())
    }
}

/// Drafts the given tokens at each output index, every third one wrong, so rounds both
/// accept and reject.
struct Replay {
    tokens: Vec<u32>,
    vocab: u32,
    calls: Mutex<usize>,
}

impl Drafter for Replay {
    type Carry = TargetCarry;
    type Error = Infallible;

    async fn open(&self, _request: OpenRequest<TargetCarry>) -> Result<Opened, Infallible> {
        Ok(Opened::default())
    }

    async fn draft(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, Infallible> {
        *self.calls.lock().unwrap() += 1;
        let start = request.output_index_base as usize;
        Ok((start..start + request.count)
            .filter_map(|i| self.tokens.get(i).copied())
            .enumerate()
            .map(|(j, t)| {
                if (start + j) % 3 == 2 {
                    (t + 1) % self.vocab
                } else {
                    t
                }
            })
            .collect())
    }

    async fn close(&self, _session: SessionId) -> Result<(), Infallible> {
        Ok(())
    }

    fn close_detached(&self, _session: SessionId) {}
}

const MAX_TOKENS: usize = 24;

fn request(
    sampling: SamplingParams,
    rules: LogitRules,
    block: BlockSizeConfig,
) -> GenerationRequest {
    GenerationRequest {
        seq: SeqId(1),
        session: SessionId(1),
        prompt_ids: PROMPT.to_vec(),
        sampling,
        stop: StopConditions::max_tokens(MAX_TOKENS),
        block_size: block,
        cache_scope: Default::default(),
        rules,
        top_logprobs: Some(5),
        forced_drafts: 0,
    }
}

fn collect(events: Vec<Event>) -> (Vec<u32>, Vec<TokenLogprob>) {
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    for event in events {
        if let Event::Tokens(delta) = event {
            tokens.extend(delta.tokens);
            logprobs.extend(delta.logprobs);
        }
    }
    (tokens, logprobs)
}

fn cases() -> Vec<(SamplingParams, LogitRules)> {
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 0,
        seed: 11,
    };
    let penalties = LogitRules {
        presence_penalty: 0.6,
        frequency_penalty: 0.4,
        repetition_penalty: 1.3,
        logit_bias: vec![(3, 2.5), (7, -100.0)],
        min_p: 0.0,
    };
    vec![
        (SamplingParams::GREEDY, LogitRules::default()),
        (SamplingParams::GREEDY, penalties.clone()),
        (seeded, penalties.clone()),
        (
            seeded,
            LogitRules {
                min_p: 0.2,
                ..penalties
            },
        ),
    ]
}

#[tokio::test]
async fn shaped_speculative_rounds_equal_plain_steps_with_equal_logprobs() {
    let target = load_target("target-full");
    let vocab = target.vocab_size() as u32;
    for (sampling, rules) in cases() {
        let case = format!("{sampling:?} {rules:?}");
        let local = LocalVerifier::new(target.clone(), VerifierLimits::default());
        let mut events = Vec::new();
        RoundLoop::plain(&local, &NoText)
            .run(
                request(sampling, rules.clone(), BlockSizeConfig::PLAIN),
                &mut events,
                &RequestControl::new(),
            )
            .await
            .unwrap();
        let (plain, plain_logprobs) = collect(events);
        assert_eq!(plain.len(), MAX_TOKENS, "{case}");
        assert_eq!(plain_logprobs.len(), MAX_TOKENS, "{case}");
        for (token, logprob) in plain.iter().zip(&plain_logprobs) {
            assert_eq!(logprob.token, *token, "{case}");
            assert_eq!(logprob.top.len(), 5, "{case}");
            assert!(logprob.logprob <= 0.0, "{case}");
            assert!(logprob.top.windows(2).all(|w| w[0].1 >= w[1].1), "{case}");
            if sampling.is_greedy() {
                assert_eq!(logprob.top[0], (*token, logprob.logprob), "{case}");
            }
        }
        if rules.logit_bias.contains(&(7, -100.0)) {
            assert!(
                !plain.contains(&7),
                "{case}: a -100 bias still let token 7 out"
            );
        }

        let drafter = Replay {
            tokens: plain.clone(),
            vocab,
            calls: Mutex::new(0),
        };
        let local = LocalVerifier::new(target.clone(), VerifierLimits::default());
        let mut events = Vec::new();
        RoundLoop::new(&local, Some(&drafter), &NoText)
            .run(
                request(sampling, rules.clone(), BlockSizeConfig::fixed(4)),
                &mut events,
                &RequestControl::new(),
            )
            .await
            .unwrap();
        let (spec, spec_logprobs) = collect(events);
        assert!(*drafter.calls.lock().unwrap() > 0, "{case}: never drafted");
        assert_eq!(spec, plain, "{case}");
        assert_eq!(spec_logprobs, plain_logprobs, "{case}");
    }
}

#[tokio::test]
async fn penalties_change_the_output() {
    let target = load_target("target-full");
    let run = |rules: LogitRules| {
        let local = LocalVerifier::new(target.clone(), VerifierLimits::default());
        async move {
            let mut events = Vec::new();
            RoundLoop::plain(&local, &NoText)
                .run(
                    request(SamplingParams::GREEDY, rules, BlockSizeConfig::PLAIN),
                    &mut events,
                    &RequestControl::new(),
                )
                .await
                .unwrap();
            collect(events).0
        }
    };
    let free = run(LogitRules::default()).await;
    let penalised = run(LogitRules {
        frequency_penalty: 2.0,
        presence_penalty: 2.0,
        ..LogitRules::default()
    })
    .await;
    assert_ne!(free, penalised);
    let distinct = |tokens: &[u32]| {
        tokens
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    assert!(
        distinct(&penalised) >= distinct(&free),
        "{free:?} vs {penalised:?}"
    );
}
