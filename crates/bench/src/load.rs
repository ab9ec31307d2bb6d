//! Many requests at once: throughput and request latency at several concurrencies, plain
//! decoding against speculative decoding with the cost-aware block size, in this process (the
//! batching verifier under the round loop) and through a router's public gRPC API.

use specd_core::sync::lock;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use specd_core::round_loop::SinkClosed;
use specd_core::{
    load_block_cap, BlockSizeConfig, Drafter, Event, EventSink, RequestControl, RoundLoop,
    SpeculationGovernor,
};
use specd_core::{HybridDrafter, NgramConfig, NgramDrafter};
use specd_drafter::{DraftModelEngine, MtpEngine};
use specd_router::DraftSource;
use specd_verifier::{
    BatchConfig, BatchVerifier, LocalVerifier, TargetCarry, TargetModel, VerifierLimits,
};
use specd_wire::generation::{GenerationClient, SpeculativeParams};

use super::embedded::{greedy_request, EmbeddedDrafter};
use super::prompts::{self, Prompt};
use super::{servers, split, BenchArgs};
use specd::embedded_drafter::EmbeddedDrafter as InProcess;
use specd_text::TargetText;

/// Verify rows one batched forward should hold, shared between the active requests (the
/// router's default `--max-batch-tokens`).
pub const BATCH_TOKEN_BUDGET: usize = 32;

/// Block sizes of the speculative runs: up to `MAX_BLOCK`, the drafter's depth `DEPTH`.
const DEPTH: usize = 4;
const MAX_BLOCK: usize = 8;

/// One request's outcome.
struct Finished {
    index: usize,
    latency: Duration,
    tokens: Vec<u32>,
    rounds: u64,
    accepted: u64,
}

/// All requests of one (path, mode, concurrency) point.
pub struct LoadPoint {
    pub path: &'static str,
    pub speculative: bool,
    pub concurrency: usize,
    pub wall: Duration,
    latencies: Vec<Duration>,
    outputs: Vec<Vec<u32>>,
    rounds: u64,
    accepted: u64,
}

impl LoadPoint {
    fn new(
        path: &'static str,
        speculative: bool,
        concurrency: usize,
        wall: Duration,
        mut done: Vec<Finished>,
    ) -> Self {
        done.sort_by_key(|f| f.index);
        let mut latencies: Vec<Duration> = done.iter().map(|f| f.latency).collect();
        latencies.sort_unstable();
        Self {
            path,
            speculative,
            concurrency,
            wall,
            latencies,
            rounds: done.iter().map(|f| f.rounds).sum(),
            accepted: done.iter().map(|f| f.accepted).sum(),
            outputs: done.into_iter().map(|f| f.tokens).collect(),
        }
    }

    pub fn tokens(&self) -> usize {
        self.outputs.iter().map(Vec::len).sum()
    }

    pub fn tokens_per_second(&self) -> f64 {
        self.tokens() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The latency at quantile `q` (nearest rank).
    pub fn latency(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1]
    }

    /// Tokens emitted per verify round.
    pub fn tokens_per_round(&self) -> f64 {
        self.tokens() as f64 / (self.rounds.max(1)) as f64
    }

    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Requests whose tokens differ from `plain`'s (same prompts, same order).
    pub fn mismatches(&self, plain: &LoadPoint) -> usize {
        self.outputs
            .iter()
            .zip(&plain.outputs)
            .filter(|(a, b)| a != b)
            .count()
    }
}

/// Runs `prompts` (one request each) with at most `concurrency` in flight; `run_one` gets a
/// request's index and prompt.
async fn drive<F, Fut>(
    concurrency: usize,
    prompts: &[Vec<u32>],
    run_one: F,
) -> Result<(Duration, Vec<Finished>)>
where
    F: Fn(usize, Vec<u32>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(Vec<u32>, u64, u64)>> + Send + 'static,
{
    let prompts: Arc<Vec<Vec<u32>>> = Arc::new(prompts.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(Mutex::new(Vec::new()));
    let run_one = Arc::new(run_one);
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (prompts, next, done, run_one) =
            (prompts.clone(), next.clone(), done.clone(), run_one.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(prompt) = prompts.get(index) else {
                    return Ok::<(), anyhow::Error>(());
                };
                let begun = Instant::now();
                let (tokens, rounds, accepted) = run_one(index, prompt.clone()).await?;
                lock(&done).push(Finished {
                    index,
                    latency: begun.elapsed(),
                    tokens,
                    rounds,
                    accepted,
                });
            }
        }));
    }
    for worker in workers {
        worker.await.context("a load worker panicked")??;
    }
    let wall = start.elapsed();
    let done = std::mem::take(&mut *lock(&done));
    Ok((wall, done))
}

/// Keeps the token ids of one request.
#[derive(Default)]
struct Tokens(Vec<u32>);

impl EventSink for Tokens {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send {
        if let Event::Tokens(delta) = event {
            self.0.extend_from_slice(&delta.tokens);
        }
        std::future::ready(Ok(()))
    }
}

/// Speculative or plain block sizes, as a router would choose them.
fn block_config(speculative: bool) -> BlockSizeConfig {
    if speculative {
        BlockSizeConfig::adaptive(MAX_BLOCK, DEPTH)
    } else {
        BlockSizeConfig::PLAIN
    }
}

/// Requests through the core round loop on a batching verifier in this process, all with
/// the same drafter (plain when `speculative` is false) and following `governor`, as the
/// requests of one embedded server would.
#[allow(clippy::too_many_arguments)]
pub async fn embedded<T, D>(
    verifier: Arc<BatchVerifier<T>>,
    drafter: Arc<D>,
    governor: Arc<SpeculationGovernor>,
    eos: Vec<u32>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    concurrency: usize,
    speculative: bool,
) -> Result<LoadPoint>
where
    T: TargetModel,
    D: Drafter<Carry = TargetCarry> + Send + Sync + 'static,
{
    static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 40);
    let cap = load_block_cap(concurrency, BATCH_TOKEN_BUDGET, MAX_BLOCK);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (wall, done) = drive(concurrency, prompts, move |_, prompt_ids| {
        let (verifier, drafter, eos) = (verifier.clone(), drafter.clone(), eos.clone());
        let (governor, in_flight) = (governor.clone(), in_flight.clone());
        async move {
            governor.set_active(in_flight.fetch_add(1, Ordering::Relaxed) + 1);
            let _leaving = Leaving(&governor, &in_flight);
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            let request =
                greedy_request(id, prompt_ids, max_tokens, eos, block_config(speculative));
            let control = RequestControl::governed(governor.clone());
            control.set_block_cap(cap);
            let mut sink = Tokens::default();
            let finish = RoundLoop::new(&*verifier, Some(&*drafter), &TargetText::default())
                .run(request, &mut sink, &control)
                .await
                .map_err(|e| anyhow::anyhow!("embedded request: {e}"))?;
            Ok((sink.0, finish.stats.rounds, finish.stats.accepted))
        }
    })
    .await?;
    Ok(LoadPoint::new(
        "embedded",
        speculative,
        concurrency,
        wall,
        done,
    ))
}

/// Counts a request out of the governor's load when it ends, however it ends.
struct Leaving<'a>(&'a SpeculationGovernor, &'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        let left = self.1.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        self.0.set_active(left);
    }
}

/// Streaming requests through the router at `router_url` (its own adaptive, cost-aware
/// block size when `speculative`, speculation disabled otherwise).
pub async fn split(
    router_url: &str,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    concurrency: usize,
    speculative: bool,
) -> Result<LoadPoint> {
    let client = GenerationClient::connect(router_url.to_owned())
        .await
        .context("connecting to the benchmark router")?;
    let max_tokens = u32::try_from(max_tokens).context("max_tokens: exceeds 32 bits")?;
    let (wall, done) = drive(concurrency, prompts, move |_, ids| {
        let mut client = client.clone();
        async move {
            let speculative = SpeculativeParams {
                block_size: None,
                disabled: !speculative,
                ..Default::default()
            };
            let request = split::greedy_request(ids, max_tokens, speculative);
            let mut stream = client
                .generate_stream(request)
                .await
                .context("GenerateStream")?
                .into_inner();
            let mut tokens = Vec::new();
            let mut stats = None;
            while let Some(message) = stream.message().await.context("GenerateStream")? {
                tokens.extend_from_slice(&message.token_ids);
                if message.stats.is_some() {
                    stats = message.stats;
                }
            }
            let stats = stats.context("GenerateStream: no stats in the final message")?;
            Ok((tokens, u64::from(stats.rounds), u64::from(stats.accepted)))
        }
    })
    .await?;
    Ok(LoadPoint::new(
        "split",
        speculative,
        concurrency,
        wall,
        done,
    ))
}

/// The prompts of one point: `concurrency × waves` requests cycling through `prompts`.
pub fn requests(prompts: &[Vec<u32>], concurrency: usize, waves: usize) -> Vec<Vec<u32>> {
    (0..concurrency.max(1) * waves.max(1))
        .filter_map(|i| prompts.get(i % prompts.len().max(1)).cloned())
        .collect()
}

/// The table: one row per path and concurrency, plain and speculative side by side.
pub fn print_table(points: &[LoadPoint]) {
    println!(
        "{:<9} {:>4} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8}",
        "path",
        "conc",
        "plain t/s",
        "spec t/s",
        "ratio",
        "plain p50",
        "plain p99",
        "spec p50",
        "spec p99",
        "tok/rd",
        "mismatch"
    );
    for plain in points.iter().filter(|p| !p.speculative) {
        let Some(spec) = points
            .iter()
            .find(|p| p.speculative && p.path == plain.path && p.concurrency == plain.concurrency)
        else {
            continue;
        };
        println!(
            "{:<9} {:>4} {:>10.2} {:>10.2} {:>6.2}x {:>8.2}s {:>8.2}s {:>8.2}s {:>8.2}s {:>6.2} {:>8}",
            plain.path,
            plain.concurrency,
            plain.tokens_per_second(),
            spec.tokens_per_second(),
            spec.tokens_per_second() / plain.tokens_per_second().max(1e-9),
            plain.latency(0.5).as_secs_f64(),
            plain.latency(0.99).as_secs_f64(),
            spec.latency(0.5).as_secs_f64(),
            spec.latency(0.99).as_secs_f64(),
            spec.tokens_per_round(),
            spec.mismatches(plain),
        );
    }
}

/// The table as JSON rows.
pub fn json_rows(points: &[LoadPoint]) -> Vec<serde_json::Value> {
    points
        .iter()
        .map(|p| {
            serde_json::json!({
                "path": p.path,
                "mode": if p.speculative { "speculative" } else { "plain" },
                "concurrency": p.concurrency,
                "requests": p.outputs.len(),
                "tokens": p.tokens(),
                "wall_s": p.wall.as_secs_f64(),
                "tokens_per_s": p.tokens_per_second(),
                "latency_p50_s": p.latency(0.5).as_secs_f64(),
                "latency_p99_s": p.latency(0.99).as_secs_f64(),
                "tokens_per_round": p.tokens_per_round(),
                "accepted": p.accepted(),
            })
        })
        .collect()
}

/// Plain then speculative requests of one concurrency through the in-process round loop.
async fn embedded_pair<T, D>(
    verifier: &Arc<BatchVerifier<T>>,
    drafter: Arc<D>,
    governor: &Arc<SpeculationGovernor>,
    eos: &[u32],
    prompts: &[Vec<u32>],
    max_tokens: usize,
    concurrency: usize,
) -> Result<[LoadPoint; 2]>
where
    T: TargetModel,
    D: Drafter<Carry = TargetCarry> + Send + Sync + 'static,
{
    let run = |speculative| {
        embedded(
            verifier.clone(),
            drafter.clone(),
            governor.clone(),
            eos.to_vec(),
            prompts,
            max_tokens,
            concurrency,
            speculative,
        )
    };
    let plain = run(false).await?;
    let spec = run(true).await?;
    Ok([plain, spec])
}

/// `specd-bench --concurrency ...`: every concurrency level, embedded and (unless
/// `--no-split`) through a router, plain against speculative, then the table.
pub async fn bench<T: TargetModel>(
    args: &BenchArgs,
    levels: &[usize],
    target: Arc<T>,
    prompts: Vec<Prompt>,
    drafter: EmbeddedDrafter,
    split_source: Option<DraftSource>,
) -> Result<()> {
    prompts::check_vocab(&prompts, target.vocab_size())?;
    let eos = target.eos_token_ids();
    let local = Arc::new(LocalVerifier::new(target, VerifierLimits::default()));
    let batching = Arc::new(BatchVerifier::new(local.clone(), BatchConfig::default()));
    let router_url = match split_source.filter(|_| !args.no_split) {
        Some(source) => {
            let verifier_url = servers::verifier(local)?;
            Some(servers::router(&verifier_url, &source, eos.clone(), DEPTH).await?)
        }
        None => None,
    };
    let ids: Vec<Vec<u32>> = prompts.into_iter().map(|p| p.ids).collect();
    let waves = args.load_waves as usize;
    let max_tokens = args.max_tokens;
    let drafter: LoadDrafter = match drafter {
        EmbeddedDrafter::Ngram => {
            LoadDrafter::Ngram(Arc::new(NgramDrafter::new(NgramConfig::default())?))
        }
        EmbeddedDrafter::Mtp(engine) => LoadDrafter::Mtp(Arc::from(engine)),
        EmbeddedDrafter::DraftModel(engine) => LoadDrafter::DraftModel(Arc::from(engine)),
        EmbeddedDrafter::HybridMtp(engine) => {
            LoadDrafter::HybridMtp(Arc::new(HybridDrafter::with_default_lookup(*engine)))
        }
        EmbeddedDrafter::HybridDraftModel(engine) => {
            LoadDrafter::HybridDraftModel(Arc::new(HybridDrafter::with_default_lookup(*engine)))
        }
    };
    // Draft calls queue on the one in-process drafter; prompt lookup shares nothing.
    let parallel_drafters = match drafter {
        LoadDrafter::Ngram(_) => 0,
        LoadDrafter::Mtp(_)
        | LoadDrafter::DraftModel(_)
        | LoadDrafter::HybridMtp(_)
        | LoadDrafter::HybridDraftModel(_) => 1,
    };
    let governor = Arc::new(SpeculationGovernor::new(parallel_drafters, MAX_BLOCK));
    // One short unmeasured request per path first: page faults on the memory-mapped
    // weights, allocator growth and connection setup.
    let warm = requests(&ids, 1, 1);
    drafter
        .embedded(&batching, &governor, &eos, &warm, max_tokens.min(8), 1)
        .await?;
    if let Some(url) = &router_url {
        split(url, &warm, max_tokens.min(8), 1, true).await?;
    }
    let mut points = Vec::new();
    for &concurrency in levels {
        let batch = requests(&ids, concurrency, waves);
        points.extend(
            drafter
                .embedded(&batching, &governor, &eos, &batch, max_tokens, concurrency)
                .await?,
        );
        if let Some(url) = &router_url {
            points.push(split(url, &batch, max_tokens, concurrency, false).await?);
            points.push(split(url, &batch, max_tokens, concurrency, true).await?);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "load": json_rows(&points), "max_tokens": max_tokens,
                "waves": waves, "batch_token_budget": BATCH_TOKEN_BUDGET })
        );
    } else {
        println!(
            "{} requests per level x concurrency, {max_tokens} tokens each, greedy; \
             speculative = cost-aware block size up to {MAX_BLOCK} (depth {DEPTH}) under \
             the speculation governor, capped to {BATCH_TOKEN_BUDGET} verify rows per forward",
            waves
        );
        print_table(&points);
    }
    let mismatched: usize = points
        .iter()
        .filter(|p| p.speculative)
        .filter_map(|spec| {
            points
                .iter()
                .find(|p| {
                    !p.speculative && p.path == spec.path && p.concurrency == spec.concurrency
                })
                .map(|plain| spec.mismatches(plain))
        })
        .sum();
    if mismatched > 0 {
        anyhow::bail!("MISMATCH: {mismatched} speculative requests differ from plain decoding");
    }
    Ok(())
}

/// The drafter of the embedded runs, shared by all concurrent requests.
enum LoadDrafter {
    Ngram(Arc<NgramDrafter<TargetCarry>>),
    Mtp(Arc<InProcess<MtpEngine>>),
    DraftModel(Arc<InProcess<DraftModelEngine>>),
    HybridMtp(Arc<HybridDrafter<InProcess<MtpEngine>>>),
    HybridDraftModel(Arc<HybridDrafter<InProcess<DraftModelEngine>>>),
}

impl LoadDrafter {
    async fn embedded<T: TargetModel>(
        &self,
        verifier: &Arc<BatchVerifier<T>>,
        governor: &Arc<SpeculationGovernor>,
        eos: &[u32],
        prompts: &[Vec<u32>],
        max_tokens: usize,
        concurrency: usize,
    ) -> Result<[LoadPoint; 2]> {
        match self {
            LoadDrafter::Ngram(d) => {
                let d = d.clone();
                embedded_pair(verifier, d, governor, eos, prompts, max_tokens, concurrency).await
            }
            LoadDrafter::Mtp(d) => {
                let d = d.clone();
                embedded_pair(verifier, d, governor, eos, prompts, max_tokens, concurrency).await
            }
            LoadDrafter::DraftModel(d) => {
                let d = d.clone();
                embedded_pair(verifier, d, governor, eos, prompts, max_tokens, concurrency).await
            }
            LoadDrafter::HybridMtp(d) => {
                let d = d.clone();
                embedded_pair(verifier, d, governor, eos, prompts, max_tokens, concurrency).await
            }
            LoadDrafter::HybridDraftModel(d) => {
                let d = d.clone();
                embedded_pair(verifier, d, governor, eos, prompts, max_tokens, concurrency).await
            }
        }
    }
}
