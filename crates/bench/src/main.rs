//! `specd-bench`: plain decoding, speculative decoding in this process, and speculative
//! decoding split over loopback gRPC, on one checkpoint pair and one prompt set, measured in
//! the same run and shown side by side.

#![forbid(unsafe_code)]

mod costs;
mod embedded;
mod engine;
mod load;
mod prompts;
mod quantile;
mod ranks;
mod report;
mod servers;
mod split;
mod sweep;
mod timing;
mod ttft;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Parser;
use serde_json::json;
use specd_core::hybrid::HYBRID_LOOKUP;
use specd_core::{BlockSizeConfig, NgramConfig};
use specd_drafter::{DraftModelEngine, MtpEngine, DEFAULT_DRAFT_VOCAB};
use specd_models::qwen2::{LoadOptions, Qwen2Model};
use specd_router::DraftSource;
use specd_verifier::{Gemma4Target, LocalVerifier, Qwen2Target, TargetModel, VerifierLimits};

use self::embedded::{EmbeddedDrafter, EmbeddedSuite};
use self::engine::EngineReport;
use self::prompts::Prompt;
use self::report::ModeResult;
use specd::device::{DTypeArg, DeviceArg};
use specd::draft_weights::DraftWeights;
use specd::generate::{self, EmbeddedDraft};
use specd::text::{dir_text, gguf_text, PromptText};
use specd::{embedded_draft_model, embedded_mtp, serve};
use specd_text::TargetText;

#[derive(Parser, Debug)]
#[command(
    name = "specd-bench",
    version,
    about = "Compare plain, embedded speculative and split (gRPC) decoding on one checkpoint pair"
)]
pub struct BenchArgs {
    /// Target: a Gemma 4 checkpoint directory or a GGUF file.
    #[arg(long, required_unless_present = "print_prompts")]
    pub target: Option<PathBuf>,
    /// Print the prompts (the built-in set or --prompts, of --kinds) as `KIND<TAB>TEXT`
    /// lines, the --prompts file format, and exit: the same prompts for other tools.
    #[arg(long)]
    pub print_prompts: bool,
    /// Drafter: a Gemma 4 assistant directory (mtp) or a GGUF file (draft-model).
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Drafting to compare with plain decoding (default: mtp for Gemma 4, draft-model for GGUF).
    #[arg(long, value_enum)]
    pub draft: Option<EmbeddedDraft>,
    /// The precision a GGUF draft model's matrices run in (see `specd generate`).
    #[arg(long, value_enum, default_value_t = DraftWeights::default())]
    pub draft_weights: DraftWeights,
    /// Verify block size while drafting.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=17))]
    pub block_size: u64,
    /// The speculative modes use the adaptive, cost-aware block size (up to 8, from
    /// --block-size) instead of a fixed one, embedded and split alike.
    #[arg(long)]
    pub adaptive: bool,
    /// Tokens generated per prompt (end-of-sequence is ignored, so every mode emits as many).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Prompts, one per line (token ids as `2,17,301` for a target without tokenizer); a line
    /// `KIND<TAB>TEXT` gives the prompt a kind and may write newlines as `\n`, any other line
    /// is of kind `file`.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Prompt kinds to run, e.g. code,prose,edit (default: every kind of the built-in set or
    /// of --prompts); results are also given per kind.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt_ids")]
    pub kinds: Vec<String>,
    /// A single prompt as comma-separated token ids (kind `ids`).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompts")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Times every prompt is generated in every mode.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Skip the split (gRPC) modes.
    #[arg(long)]
    pub no_split: bool,
    /// Context length of the long-context wire measurement, in tokens.
    #[arg(long, default_value_t = 256)]
    pub long_context: usize,
    /// Sweep the draft count instead of the mode table: fixed K drafts per round (block size
    /// K + 1) for each K given, e.g. 1,2,3,4,5,6, per drafter of --sweep-drafts, with
    /// acceptance per draft position, measured step costs and the speed-up they predict.
    /// GGUF targets.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=16))]
    pub sweep: Option<Vec<u64>>,
    /// Drafters of the sweep (default: draft-model when --drafter is given, and ngram).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub sweep_drafts: Vec<EmbeddedDraft>,
    /// Load instead of the mode table: for each concurrency given (e.g. 1,4,16,32), that many
    /// requests in flight at once, plain against speculative with the cost-aware block size,
    /// embedded (batching verifier in this process) and split (through a router); throughput
    /// and request latency p50/p99.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=256))]
    pub concurrency: Option<Vec<u64>>,
    /// With --sweep and a draft model: the time to the first token of a prompt of this many
    /// tokens (the built-in prompts' text repeated), plain against speculative (0: skipped).
    #[arg(long, default_value_t = 0)]
    pub ttft_tokens: usize,
    /// Requests per worker at each concurrency level.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub load_waves: u64,
    /// Instead of the mode table: where the target's greedy tokens rank among the draft
    /// model's choices, per prompt kind, and the tokens per round full trees of
    /// --block-size - 1 levels with 1-3 choices per node would reach, and the best tree of
    /// one fixed shape for budgets of 3-16 drafts beside the chain of as many (GGUF pair).
    #[arg(long, conflicts_with_all = ["sweep", "concurrency"])]
    pub ranks: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

fn levels_of(levels: &[u64]) -> Vec<usize> {
    levels.iter().map(|&c| c as usize).collect()
}

impl BenchArgs {
    /// The target (present whenever a benchmark runs: clap requires it then).
    fn target(&self) -> &Path {
        self.target.as_deref().unwrap_or(Path::new(""))
    }
}

fn main() -> Result<()> {
    let args = BenchArgs::parse();
    // Log lines of the models and services under test go to stderr as `specd`'s do.
    let _telemetry = serve::init_telemetry(None)?;
    run(args)
}

fn run(args: BenchArgs) -> Result<()> {
    if args.print_prompts {
        for prompt in prompts::texts(args.prompts.as_deref(), &args.kinds)? {
            println!("{}\t{}", prompt.kind, prompts::escape(&prompt.text));
        }
        return Ok(());
    }
    if args.max_tokens < 2 {
        bail!("max_tokens: needs at least 2 for a round to be timed");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let gguf = generate::detect(args.target(), "target")?.family() == &specd_models::qwen2::FAMILY;
    runtime.block_on(async move {
        if gguf {
            run_gguf(&args).await
        } else {
            run_gemma(&args).await
        }
    })
}

/// Turns prompt text into token ids.
type Encode<'a> = &'a dyn Fn(&str) -> Result<Vec<u32>>;

/// Prompts from --prompt-ids, --prompts or the built-in set, through `encode` when text.
fn load_prompts(args: &BenchArgs, encode: Option<Encode<'_>>) -> Result<Vec<Prompt>> {
    if let Some(ids) = &args.prompt_ids {
        return Ok(vec![Prompt {
            kind: prompts::IDS.into(),
            label: "prompt-ids".into(),
            ids: ids.clone(),
        }]);
    }
    let texts = prompts::texts(args.prompts.as_deref(), &args.kinds)?;
    texts
        .into_iter()
        .enumerate()
        .map(|(i, prompts::PromptText { kind, text })| {
            let ids = match encode {
                Some(encode) => encode(&text)?,
                None if args.prompts.is_some() => {
                    prompts::parse_ids(&text, &format!("prompt {}", i + 1))?
                }
                None => bail!(
                    "the target has no tokenizer: give --prompt-ids or --prompts with token ids"
                ),
            };
            Ok(Prompt {
                kind,
                label: text,
                ids,
            })
        })
        .collect()
}

/// A GGUF draft model on the engine whose kernels and costs the bench reports.
fn gguf_draft_engine(
    path: &Path,
    device: &Device,
    weights: DraftWeights,
) -> Result<DraftModelEngine<Qwen2Model>> {
    let options = LoadOptions {
        precision: weights.into(),
        ..LoadOptions::default()
    };
    let model = Qwen2Model::load_with(path, device, &options)
        .with_context(|| format!("loading the drafter from {}", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(DraftModelEngine::new(model, name, 16))
}

/// [`gguf_draft_engine`] in this process, for a target of `vocab` tokens.
fn gguf_draft_model(
    path: &Path,
    device: &Device,
    weights: DraftWeights,
    vocab: usize,
) -> Result<specd::embedded_drafter::EmbeddedDrafter<DraftModelEngine<Qwen2Model>>> {
    Ok(embedded_draft_model::with_target(
        gguf_draft_engine(path, device, weights)?,
        vocab,
        DEFAULT_DRAFT_VOCAB,
        0,
    )?)
}

fn drafter_path(args: &BenchArgs) -> Result<&PathBuf> {
    args.drafter
        .as_ref()
        .context("drafter: --draft mtp and --draft draft-model need --drafter")
}

async fn run_gemma(args: &BenchArgs) -> Result<()> {
    if args.ranks {
        bail!("ranks: needs a GGUF target and a GGUF draft model (--target, --drafter)");
    }
    let device = args.device.device()?;
    let dtype = args.dtype.dtype();
    let tokenizer = dir_text(args.target())?;
    let encode = tokenizer.as_ref().map(|t| move |s: &str| t.encode_raw(s));
    let prompts = load_prompts(
        args,
        encode
            .as_ref()
            .map(|f| f as &dyn Fn(&str) -> Result<Vec<u32>>),
    )?;
    let target = Arc::new(
        Gemma4Target::load(args.target(), dtype, &device)
            .with_context(|| format!("loading the target from {}", args.target().display()))?,
    );
    let draft = args.draft.unwrap_or(EmbeddedDraft::Mtp);
    let (embedded, split) = match draft {
        EmbeddedDraft::Mtp | EmbeddedDraft::Hybrid => {
            let dir = drafter_path(args)?;
            let embedded = Box::new(
                embedded_mtp::load(dir, args.target(), dtype, &device)
                    .with_context(|| format!("loading the drafter from {}", dir.display()))?,
            );
            let split = if args.no_split {
                None
            } else {
                let engine = MtpEngine::load(dir, args.target(), dtype, &device)?;
                Some(service_source(draft, servers::drafter(Arc::new(engine))?))
            };
            let embedded = match draft {
                EmbeddedDraft::Hybrid => EmbeddedDrafter::HybridMtp(embedded),
                _ => EmbeddedDrafter::Mtp(embedded),
            };
            (embedded, split)
        }
        EmbeddedDraft::Ngram => (
            EmbeddedDrafter::Ngram,
            Some(DraftSource::Ngram(NgramConfig::default())),
        ),
        EmbeddedDraft::DraftModel => bail!("draft: draft-model needs a GGUF target file"),
    };
    match &args.concurrency {
        Some(levels) => {
            load::bench(args, &levels_of(levels), target, prompts, embedded, split).await
        }
        None => bench_pair(args, target, prompts, embedded, split, None).await,
    }
}

async fn run_gguf(args: &BenchArgs) -> Result<()> {
    let device = args.device.device()?;
    let text = gguf_text(args.target())?;
    let encode = |s: &str| text.encode_user(s);
    let prompts = load_prompts(args, Some(&encode))?;
    let target = Arc::new(
        Qwen2Target::load(args.target(), &device, text.eos_token_ids().to_vec())
            .with_context(|| format!("loading the target from {}", args.target().display()))?,
    );
    let vocab = target.vocab_size();
    if args.ranks {
        prompts::check_vocab(&prompts, vocab)?;
        let path = drafter_path(args)?;
        let drafter = gguf_draft_engine(path, &device, args.draft_weights)?;
        return ranks::run(
            target,
            drafter.model(),
            DEFAULT_DRAFT_VOCAB,
            &prompts,
            args.max_tokens,
            args.block_size as usize - 1,
            args.json,
        )
        .await;
    }
    if let Some(counts) = &args.sweep {
        let counts: Vec<usize> = counts.iter().map(|&k| k as usize).collect();
        return sweep_gguf(args, &text, target, prompts, &counts).await;
    }
    let draft = args.draft.unwrap_or(EmbeddedDraft::DraftModel);
    let (embedded, split) = match draft {
        EmbeddedDraft::DraftModel | EmbeddedDraft::Hybrid => {
            let path = drafter_path(args)?;
            let embedded = Box::new(
                gguf_draft_model(path, &device, args.draft_weights, vocab)
                    .with_context(|| format!("loading the drafter from {}", path.display()))?,
            );
            let split = if args.no_split {
                None
            } else {
                let engine = gguf_draft_engine(path, &device, args.draft_weights)?;
                Some(service_source(draft, servers::drafter(Arc::new(engine))?))
            };
            let embedded = match draft {
                EmbeddedDraft::Hybrid => EmbeddedDrafter::HybridDraftModel(embedded),
                _ => EmbeddedDrafter::DraftModel(embedded),
            };
            (embedded, split)
        }
        EmbeddedDraft::Ngram => (
            EmbeddedDrafter::Ngram,
            Some(DraftSource::Ngram(NgramConfig::default())),
        ),
        EmbeddedDraft::Mtp => bail!("draft: mtp needs a Gemma 4 target directory"),
    };
    match &args.concurrency {
        Some(levels) => {
            load::bench(args, &levels_of(levels), target, prompts, embedded, split).await
        }
        None => {
            prompts::check_vocab(&prompts, vocab)?;
            let draft_model = embedded.draft_model().map(|dm| dm.engine().model());
            let engine = engine::measure_gguf(&target, draft_model, &text, &prompts[0].ids)?;
            bench_pair(args, target, prompts, embedded, split, engine).await
        }
    }
}

/// The split modes' drafting over the drafter service at `url`: behind the router's prompt
/// lookup for `--draft hybrid`.
fn service_source(draft: EmbeddedDraft, url: String) -> DraftSource {
    match draft {
        EmbeddedDraft::Hybrid => DraftSource::Hybrid {
            urls: vec![url],
            dns: None,
            lookup: HYBRID_LOOKUP,
        },
        _ => DraftSource::Remote(vec![url]),
    }
}

/// Timed repetitions of every step-cost measurement.
const COST_REPS: usize = 7;

/// The draft-count sweep on a GGUF target: draft-model and/or n-gram drafters.
async fn sweep_gguf(
    args: &BenchArgs,
    text: &TargetText,
    target: Arc<Qwen2Target>,
    prompts: Vec<Prompt>,
    counts: &[usize],
) -> Result<()> {
    prompts::check_vocab(&prompts, target.vocab_size())?;
    let device = args.device.device()?;
    let drafts = if args.sweep_drafts.is_empty() {
        let mut d = Vec::new();
        if args.drafter.is_some() {
            d.push(EmbeddedDraft::DraftModel);
        }
        d.push(EmbeddedDraft::Ngram);
        d
    } else {
        args.sweep_drafts.clone()
    };
    let max_width = counts.iter().copied().max().unwrap_or(1) + 1;
    let context = &prompts[0].ids;
    let mut verify = costs::measure_target(&*target, context, max_width, COST_REPS)?;
    let mut draft_step = None;
    let mut engine = None;
    let mut drafters = Vec::new();
    for draft in drafts {
        let verifier = LocalVerifier::new(target.clone(), VerifierLimits::default());
        let (name, embedded) = match draft {
            EmbeddedDraft::DraftModel | EmbeddedDraft::Hybrid => {
                let path = drafter_path(args)?;
                let dm = gguf_draft_model(path, &device, args.draft_weights, target.vocab_size())
                    .with_context(|| format!("loading the drafter from {}", path.display()))?;
                // One measurement of the draft model serves both of its sweep drafters.
                if draft_step.is_none() {
                    draft_step = Some(costs::measure_draft_model(
                        dm.engine().model(),
                        dm.engine().draft_vocab(),
                        context,
                        COST_REPS * 2,
                    )?);
                    engine =
                        engine::measure_gguf(&target, Some(dm.engine().model()), text, context)?;
                }
                match draft {
                    EmbeddedDraft::Hybrid => {
                        ("hybrid", EmbeddedDrafter::HybridDraftModel(Box::new(dm)))
                    }
                    _ => ("draft-model", EmbeddedDrafter::DraftModel(Box::new(dm))),
                }
            }
            EmbeddedDraft::Ngram => ("ngram", EmbeddedDrafter::Ngram),
            EmbeddedDraft::Mtp => bail!("sweep-drafts: mtp needs a Gemma 4 target directory"),
        };
        drafters.push(sweep::SweepDrafter {
            name,
            suite: EmbeddedSuite::new(verifier, embedded),
        });
    }
    if engine.is_none() {
        engine = engine::measure_gguf(&target, None, text, context)?;
    }
    // The target's costs again after the drafter's, so a load change during the run shows.
    let again = costs::measure_target(&*target, context, max_width, COST_REPS)?;
    for (a, b) in verify.iter_mut().zip(again) {
        *a = (*a + b) / 2;
    }
    let costs = costs::StepCosts { verify, draft_step };
    // A hybrid round costs a draft-model round or nothing: its cost is an upper bound.
    let draft_costs = [
        ("draft-model", costs.draft_cost()),
        ("ngram", 0.0),
        ("hybrid", costs.draft_cost()),
    ];
    let eos = target.eos_token_ids();
    // The adaptive row: the cost-aware policy up to the sweep's largest block size, from the
    // usual trained depth of 4.
    let adaptive = BlockSizeConfig::adaptive(max_width, 4.min(max_width));
    let result = sweep::run(
        &drafters,
        &prompts,
        counts,
        Some(adaptive),
        args.max_tokens,
        args.runs,
        &eos,
    )
    .await?;
    let texts: Vec<String> = prompts
        .iter()
        .map(|p| text.render_user(&p.label).unwrap_or_default())
        .collect();
    let ttft = match (args.ttft_tokens, &args.drafter) {
        (0, _) | (_, None) => None,
        (tokens, Some(path)) => {
            let long = prompts::long_prompt(&|s| text.encode_raw(s), tokens)?;
            let dm = gguf_draft_model(path, &device, args.draft_weights, target.vocab_size())
                .with_context(|| format!("loading the drafter from {}", path.display()))?;
            let verifier = LocalVerifier::new(target.clone(), VerifierLimits::default());
            let router = if args.no_split {
                None
            } else {
                let engine = gguf_draft_engine(path, &device, args.draft_weights)?
                    .with_draft_vocab(DEFAULT_DRAFT_VOCAB);
                let drafter_url = servers::drafter(Arc::new(engine))?;
                let local = Arc::new(LocalVerifier::new(
                    target.clone(),
                    VerifierLimits::default(),
                ));
                let verifier_url = servers::verifier(local)?;
                let source = DraftSource::Remote(vec![drafter_url]);
                Some(servers::router(&verifier_url, &source, target.eos_token_ids(), 4).await?)
            };
            Some(ttft::measure(&verifier, &dm, router.as_deref(), &long, TTFT_REPS).await?)
        }
    };
    if args.json {
        let mut out = sweep::json(&result, &costs, &draft_costs, &prompts, &texts, text);
        out["ttft"] = json!(ttft.as_ref().map(ttft::TtftReport::json));
        out["target"] = json!(args.target().display().to_string());
        out["drafter"] = json!(args.drafter.as_ref().map(|p| p.display().to_string()));
        out["max_tokens"] = json!(args.max_tokens);
        out["runs"] = json!(args.runs);
        out["engine"] = json!(engine.as_ref().map(EngineReport::json));
        println!("{out}");
    } else {
        println!(
            "specd-bench --sweep: {} prompt(s) x {} run(s), {} tokens each, greedy; tok/s over \
             decode rounds (prefill excluded)",
            prompts.len(),
            args.runs,
            args.max_tokens
        );
        print!("{}", costs.table());
        if let Some(engine) = &engine {
            print!("{}", engine.table());
        }
        println!(
            "cost = mean round cost in decode steps (drafts x draft step + verify(width)); \
             geo = (1-a^(K+1))/(1-a) / (K c_draft + c_verify(K+1)); pos = tok/rd / cost"
        );
        print!("{}", sweep::table(&result, &costs, &draft_costs));
        print!("{}", sweep::kinds_table(&result, &prompts));
        if let Some(ttft) = &ttft {
            println!("{}", ttft.line());
        }
        if !result.mismatches.is_empty() {
            println!(
                "{} speculative generation(s) differ from plain: see MISMATCH lines",
                result.mismatches.len()
            );
        }
    }
    if result.mismatches.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} speculative generation(s) differ from plain decoding",
            result.mismatches.len()
        )
    }
}

/// Repetitions of each mode's time to first token (the median is reported).
const TTFT_REPS: usize = 2;

/// Tokens of the unmeasured warm-up generation of each mode.
const WARMUP_TOKENS: usize = 8;

/// Largest block size of the adaptive modes (the router's default ceiling).
const ADAPTIVE_CEILING: usize = 8;

/// One generation of `prompt` in every mode, in table order; the speculative modes verify
/// blocks of `block_size`, or adapt from it when `adaptive`.
#[allow(clippy::too_many_arguments)]
async fn generate_all<T: TargetModel>(
    suite: &EmbeddedSuite<T>,
    router_url: Option<&str>,
    prompt: &[u32],
    max_tokens: usize,
    block_size: usize,
    adaptive: bool,
    eos: &[u32],
    modes: &mut [ModeResult],
) -> Result<()> {
    let (plain, rest) = modes.split_at_mut(1);
    suite
        .run(prompt, max_tokens, None, eos, &mut plain[0])
        .await?;
    let (embedded, split_block) = if adaptive {
        (
            BlockSizeConfig::adaptive(ADAPTIVE_CEILING.max(block_size), block_size),
            split::SplitBlock::Adaptive,
        )
    } else {
        (
            BlockSizeConfig::fixed(block_size),
            split::SplitBlock::Fixed(block_size),
        )
    };
    suite
        .run_with(prompt, max_tokens, embedded, eos, &mut rest[0])
        .await?;
    if let Some(router_url) = router_url {
        for (index, block) in [(1, split::SplitBlock::Plain), (2, split_block)] {
            let run = split::generate(router_url, prompt, max_tokens, block).await?;
            rest[index].runs.push(run.sample);
            rest[index].client_rounds.extend(run.chunk_gaps);
        }
    }
    Ok(())
}

async fn bench_pair<T: TargetModel>(
    args: &BenchArgs,
    target: Arc<T>,
    prompts: Vec<Prompt>,
    embedded: EmbeddedDrafter,
    split: Option<DraftSource>,
    engine: Option<EngineReport>,
) -> Result<()> {
    prompts::check_vocab(&prompts, target.vocab_size())?;
    let eos = target.eos_token_ids();
    let block_size = args.block_size as usize;
    let suite = EmbeddedSuite::new(
        LocalVerifier::new(target.clone(), VerifierLimits::default()),
        embedded,
    );
    let mut modes = vec![
        ModeResult::new("plain (embedded)"),
        ModeResult::new("spec (embedded)"),
    ];
    let split = match split.filter(|_| !args.no_split) {
        Some(source) => {
            let local = Arc::new(LocalVerifier::new(target, VerifierLimits::default()));
            let verifier_url = servers::verifier(local)?;
            let router_url =
                servers::router(&verifier_url, &source, eos.clone(), block_size).await?;
            modes.push(ModeResult::new("plain (split gRPC)"));
            modes.push(ModeResult::new("spec (split gRPC)"));
            Some((verifier_url, source, router_url))
        }
        None => None,
    };
    let router_url = split.as_ref().map(|(_, _, url)| url.as_str());
    // One short unmeasured generation per mode first: the first one pays for page faults on
    // memory-mapped weights, allocator growth and connection setup.
    let mut discarded: Vec<ModeResult> = modes.iter().map(|m| ModeResult::new(&m.name)).collect();
    let warm_tokens = args.max_tokens.min(WARMUP_TOKENS);
    let first = &prompts[0].ids;
    generate_all(
        &suite,
        router_url,
        first,
        warm_tokens,
        block_size,
        args.adaptive,
        &eos,
        &mut discarded,
    )
    .await?;
    // Interleave modes per prompt and run, so drift in machine load hits every mode alike.
    for _ in 0..args.runs {
        for prompt in &prompts {
            generate_all(
                &suite,
                router_url,
                &prompt.ids,
                args.max_tokens,
                block_size,
                args.adaptive,
                &eos,
                &mut modes,
            )
            .await?;
        }
    }
    let wire = match &split {
        Some((verifier_url, source, _)) => Some(
            wire::measure(
                verifier_url,
                source,
                &eos,
                &prompts[0].ids,
                args.long_context,
                args.max_tokens,
                block_size,
            )
            .await?,
        ),
        None => None,
    };
    let base = modes[0].tokens_per_second();
    if args.json {
        let out = json!({
            "target": args.target().display().to_string(),
            "drafter": args.drafter.as_ref().map(|p| p.display().to_string()),
            "block_size": block_size,
            "adaptive": args.adaptive,
            "max_tokens": args.max_tokens,
            "prompts": prompts.len(),
            "runs": args.runs,
            "modes": modes.iter().map(|m| report::mode_json(m, base)).collect::<Vec<_>>(),
            "per_kind": report::kinds_json(&modes, &prompts),
            "wire": wire.as_ref().map(|w| w.iter().map(wire::WireRow::json).collect::<Vec<_>>()),
            "engine": engine.as_ref().map(EngineReport::json),
        });
        println!("{out}");
    } else {
        let blocks = if args.adaptive {
            format!("adaptive block size from {block_size} up to {ADAPTIVE_CEILING}")
        } else {
            format!("block size {block_size}")
        };
        println!(
            "specd-bench: {} prompt(s) x {} run(s), {} tokens each, {blocks}",
            prompts.len(),
            args.runs,
            args.max_tokens
        );
        println!("latencies in ms; ratio is to plain (embedded); 'other' = round - draft - verify");
        print!("{}", report::table(&modes));
        print!("{}", report::kinds_table(&modes, &prompts));
        if let Some(wire) = &wire {
            println!();
            print!("{}", wire::table(wire));
        }
        if let Some(engine) = &engine {
            println!();
            print!("{}", engine.table());
        }
    }
    Ok(())
}
