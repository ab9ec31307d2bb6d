//! Rows that come back a little after their answers (a router in another process) still
//! share forwards: a row queued during a forward waits, after it, for the rows that forward
//! answered, instead of running alone and staying a forward behind them for good.

use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;
use specd_core::{PrefixRule, SeqId, Verifier};
use specd_models::gemma4::SharedKv;
use specd_models::SeqBlock;
use specd_verifier::{
    BatchConfig, BatchVerifier, Gemma4Target, LocalVerifier, TargetModel, VerifierError,
    VerifierLimits,
};

use crate::batching::prefill_greedy;
use crate::support::{load_target, plain_round};

/// How long each verify forward takes at least: long beside the rows' return times, as a
/// real target's forward is beside a loopback round trip.
const FORWARD: Duration = Duration::from_millis(80);

/// The target fixture, each verify forward slowed to [`FORWARD`].
struct SlowForwards(Arc<Gemma4Target>);

type Cache = <Gemma4Target as TargetModel>::Cache;

impl TargetModel for SlowForwards {
    type Cache = Cache;

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_context(&self) -> usize {
        self.0.max_context()
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        self.0.eos_token_ids()
    }
    fn new_cache(&self) -> Result<Cache, VerifierError> {
        self.0.new_cache()
    }
    fn cache_len(&self, cache: &Cache) -> usize {
        self.0.cache_len(cache)
    }
    fn cache_bytes(&self, cache: &Cache) -> usize {
        self.0.cache_bytes(cache)
    }
    fn kv_bytes_bound(&self, tokens: usize) -> usize {
        self.0.kv_bytes_bound(tokens)
    }
    fn prefill_chunk_len(&self) -> usize {
        self.0.prefill_chunk_len()
    }
    fn prefill_piece(
        &self,
        cache: &mut Cache,
        piece: &[u32],
        last: bool,
    ) -> Result<Option<Tensor>, VerifierError> {
        self.0.prefill_piece(cache, piece, last)
    }
    fn forward_blocks(
        &self,
        rows: &mut [SeqBlock<'_, Cache>],
    ) -> Result<Vec<Tensor>, VerifierError> {
        std::thread::sleep(FORWARD);
        self.0.forward_blocks(rows)
    }
    fn supports_trees(&self) -> bool {
        self.0.supports_trees()
    }
    fn keep_path(
        &self,
        cache: &mut Cache,
        start: usize,
        path: &[usize],
    ) -> Result<(), VerifierError> {
        self.0.keep_path(cache, start, path)
    }
    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError> {
        self.0.logits(hidden)
    }
    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>, VerifierError> {
        self.0.argmax(hidden)
    }
    fn truncate(&self, cache: &mut Cache, len: usize) -> Result<(), VerifierError> {
        self.0.truncate(cache, len)
    }
    fn shared_kv(
        &self,
        cache: &Cache,
        from: usize,
        to: usize,
    ) -> Result<Option<SharedKv>, VerifierError> {
        self.0.shared_kv(cache, from, to)
    }
    fn prefix_rule(&self) -> PrefixRule {
        self.0.prefix_rule()
    }
    fn cache_prefix(&self, source: &Cache, len: usize) -> Result<Option<Cache>, VerifierError> {
        self.0.cache_prefix(source, len)
    }
}

/// Two sequences decode one token a round: the first sends its next row as soon as it has
/// its answer, the second a few milliseconds later. Once the scheduler has seen them come
/// back, every forward holds both; before, the late row missed each forward its partner ran
/// in and the two took turns, one row a forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_answered_by_a_forward_are_waited_for_by_the_rows_that_queued_during_it() {
    const ROUNDS: u32 = 8;
    let verifier = Arc::new(BatchVerifier::new(
        Arc::new(LocalVerifier::new(
            Arc::new(SlowForwards(load_target("target-full"))),
            VerifierLimits::default(),
        )),
        BatchConfig::default(),
    ));
    let first = prefill_greedy(verifier.as_ref(), &[1, 2]).await;
    let decode = |seq: u64, token: u32, late: Duration| {
        let verifier = verifier.clone();
        async move {
            let mut tokens = vec![token];
            for round in 1..=ROUNDS {
                let verified = verifier
                    .verify(plain_round(seq, round, &tokens))
                    .await
                    .unwrap();
                assert_eq!(verified.new_tokens.len(), 1);
                tokens.extend(verified.new_tokens);
                tokio::time::sleep(late).await;
            }
        }
    };
    tokio::join!(
        decode(1, first[0], Duration::ZERO),
        decode(2, first[1], Duration::from_millis(4)),
    );
    let stats = verifier.stats();
    // One forward each for the first round and the one that learns the return times, then
    // both rows together; a late return beyond its margin costs one more.
    assert_eq!(stats.largest_batch_rows, 2, "{stats:?}");
    assert!(
        stats.batches_run <= ROUNDS as u64 + 3,
        "{} forwards for {ROUNDS} rounds of two sequences: {stats:?}",
        stats.batches_run
    );
    for seq in [1, 2] {
        verifier.release(SeqId(seq)).await.unwrap();
    }
}
