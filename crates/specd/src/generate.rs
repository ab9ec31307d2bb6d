//! `specd generate`: one generation in this process, printed as it streams or as JSON.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use specd_core::round_loop::SinkClosed;
use specd_core::{
    BlockSizeConfig, Detokenizer, Drafter, Event, EventSink, GenerationRequest, HybridDrafter,
    NgramDrafter, NoDrafter, RequestControl, RoundLoop, SamplingParams, SeqId, SessionId,
    SpecStats, StopConditions,
};
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel, VerifierLimits, MAX_ROLLBACK};

use crate::checkpoints::LoadedTarget;
pub use crate::checkpoints::{detect, drafter_kind_of, not_a_drafter, not_a_target};
use crate::device::ComputeArgs;
use crate::draft_weights::DraftWeights;
use crate::model_drafter::{DraftModelOptions, ModelDrafter};
use crate::speed::{DecodeSpeed, ProbedVerifier};
use crate::text::PromptText;
use specd_text::TargetText;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Target: a checkpoint directory (config.json, safetensors, optional tokenizer.json) or
    /// a GGUF file (a Llama-style decoder: Qwen2, Llama; or a dense Gemma 4 in llama.cpp's
    /// layout).
    #[arg(long)]
    pub target: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 2,17,301.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prompt text (needs the target's tokenizer: tokenizer.json in a checkpoint directory, or
    /// a GGUF's metadata), sent as one user message through the target's chat template when
    /// it has one.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Tokenize --prompt as it is instead of through the chat template.
    #[arg(long)]
    pub raw_prompt: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Seed of the keyed sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Decode with the target alone, without drafting.
    #[arg(long)]
    pub no_draft: bool,
    /// Draft in this process: `ngram` looks the continuation up in the prompt and output;
    /// `mtp` runs the Gemma 4 assistant given by --drafter, `draft-model` the GGUF draft
    /// model; `hybrid` looks up first and runs --drafter only when the lookup finds no long
    /// match.
    #[arg(long, value_enum, conflicts_with = "no_draft")]
    pub draft: Option<EmbeddedDraft>,
    /// Drafter: a Gemma 4 assistant, as a directory or a `gemma4-assistant` GGUF file (--draft
    /// mtp), or a GGUF draft model (--draft draft-model); with --draft hybrid, the one that fits
    /// the target.
    #[arg(
        long,
        required_if_eq_any([("draft", "mtp"), ("draft", "draft-model"), ("draft", "hybrid")])
    )]
    pub drafter: Option<PathBuf>,
    /// Verify block size while drafting: the bonus token plus up to block_size - 1 drafts,
    /// every round. Without it: up to 4, cost-aware (smaller blocks or plain rounds while
    /// drafting does not pay).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=17))]
    pub block_size: Option<u64>,
    /// Without --block-size: always verify blocks of 4, even while drafting does not pay.
    #[arg(long)]
    pub no_auto_speculation: bool,
    /// Drafts a round may verify beside its chain, as a token tree (0: chains only): a draft
    /// model's or an MTP assistant's first and second choices where it is unsure (a seeded
    /// request's first choice being the assistant's draw with the target's key), or what
    /// followed other occurrences of a prompt-lookup match. Each request measures whether
    /// trees or chains cost less per token and uses the cheaper, and keeps a branch only if
    /// it is likelier than its verify row costs in tokens. Trees run for requests without
    /// penalties, bias, min-p or log probabilities.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=8))]
    pub tree_nodes: u64,
    /// A GGUF draft model proposes only token ids below this (its LM head reads only their
    /// rows); 0: the whole vocabulary.
    #[arg(long, default_value_t = specd_drafter::DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: usize,
    /// The precision a GGUF draft model's matrices run in on CPU: `q4` re-encodes those
    /// stored wider than 4.5 bits a weight at load, so each draft step streams fewer bytes
    /// (the output is the target's either way).
    #[arg(long, value_enum, default_value_t = DraftWeights::default())]
    pub draft_weights: DraftWeights,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

/// Drafters `specd generate` can run in-process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbeddedDraft {
    /// Prompt lookup (no model).
    Ngram,
    /// Multi-token prediction with a Gemma 4 assistant.
    Mtp,
    /// An independent small LM (a GGUF sharing the target's vocabulary).
    DraftModel,
    /// Prompt lookup while the output copies earlier text (a match of 4 tokens or more),
    /// the --drafter model (draft model or MTP assistant) for the other rounds.
    Hybrid,
}

/// Prints text as it arrives and keeps every token.
struct PrintSink {
    stream: bool,
    tokens: Vec<u32>,
    text: String,
    finish: Option<specd_core::Finish>,
    /// When the first and the last tokens arrived.
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

impl PrintSink {
    fn speed(&self, plain_step: Option<Duration>) -> DecodeSpeed {
        let time = match (self.first_at, self.last_at) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        DecodeSpeed {
            tokens: self.tokens.len().saturating_sub(1),
            time,
            plain_step,
        }
    }
}

impl EventSink for PrintSink {
    fn send(
        &mut self,
        event: Event,
    ) -> impl std::future::Future<Output = Result<(), SinkClosed>> + Send {
        match event {
            Event::Tokens(delta) => {
                let now = Instant::now();
                self.first_at.get_or_insert(now);
                self.last_at = Some(now);
                self.tokens.extend_from_slice(&delta.tokens);
                if self.stream {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(delta.text.as_bytes());
                    let _ = out.flush();
                }
                self.text.push_str(&delta.text);
            }
            Event::Finished(finish) => self.finish = Some(finish),
        }
        std::future::ready(Ok(()))
    }
}

fn stats_json(stats: &SpecStats) -> serde_json::Value {
    json!({
        "rounds": stats.rounds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "accepted_per_position": stats.accepted_at_position,
        "mean_accepted_tokens_per_round": stats.accepted_tokens_per_round(),
        "speculation_off_rounds": stats.speculation_off_rounds,
        "speculation_switches": stats.speculation_switches,
        "tree_rounds": stats.tree_rounds,
        "tree_branch_drafts": stats.tree_branch_drafts,
    })
}

/// Turns prompt text into token ids.
type Encode<'a> = &'a dyn Fn(&str) -> Result<Vec<u32>>;

/// How the prompt was given, resolved to ids.
fn prompt_ids_from(args: &GenerateArgs, encode: Option<Encode<'_>>) -> Result<Vec<u32>> {
    match (&args.prompt_ids, &args.prompt, encode) {
        (Some(ids), _, _) => Ok(ids.clone()),
        (None, Some(text), Some(encode)) => encode(text),
        (None, Some(_), None) => bail!(
            "--prompt needs tokenizer.json in {}; pass --prompt-ids instead",
            args.target.display()
        ),
        (None, None, _) => bail!("give a prompt with --prompt-ids or --prompt"),
    }
}

pub fn run(mut args: GenerateArgs) -> Result<()> {
    // A drafter without --draft picks its kind from the checkpoint.
    if args.draft.is_none() && !args.no_draft {
        if let Some(path) = args.drafter.as_deref() {
            args.draft = Some(drafter_kind_of(path)?);
        }
    }
    let mut target = LoadedTarget::load(&args.target, &args.compute)?;
    let text = target.text.take().filter(|t| t.has_tokenizer());
    let prompt_ids = {
        let encode = text.as_ref().map(|t| prompt_encoder(t, args.raw_prompt));
        prompt_ids_from(
            &args,
            encode
                .as_ref()
                .map(|f| f as &dyn Fn(&str) -> Result<Vec<u32>>),
        )?
    };
    let drafter = match (args.draft, &args.drafter) {
        (
            Some(kind @ (EmbeddedDraft::Mtp | EmbeddedDraft::DraftModel | EmbeddedDraft::Hybrid)),
            Some(path),
        ) => {
            let options = DraftModelOptions {
                draft_vocab: args.draft_vocab,
                weights: args.draft_weights,
                prefix_cache_bytes: 0,
            };
            Some(ModelDrafter::load(path, kind, &target, options)?)
        }
        _ => None,
    };
    let verifier = LocalVerifier::new(Arc::new(target.model), VerifierLimits::default());
    let has_text = text.is_some();
    // The tokenizer may know more ends than the model's config: a Gemma 4 GGUF's <turn|> and
    // <|tool_response>, where llama.cpp stops too.
    let text_eos_ids = text
        .as_ref()
        .map(|t| t.eos_token_ids().to_vec())
        .unwrap_or_default();
    let detokenizer = text.unwrap_or_else(|| TargetText::without_tokenizer(Vec::new()));
    let run = Generation {
        args: &args,
        verifier: &verifier,
        detokenizer: &detokenizer,
        has_text,
        text_eos_ids: &text_eos_ids,
    };
    run.drafting(prompt_ids, drafter)
}

/// How `--prompt` becomes ids: one user message through the chat template, or the text as it
/// is with `--raw-prompt` or a target without a template.
fn prompt_encoder(text: &TargetText, raw: bool) -> impl Fn(&str) -> Result<Vec<u32>> + '_ {
    move |s: &str| {
        if raw || !text.has_chat_template() {
            text.encode_raw(s)
        } else {
            text.encode_user(s)
        }
    }
}

/// One embedded generation: the target's verifier, the text side, and the flags.
struct Generation<'a, T: TargetModel> {
    args: &'a GenerateArgs,
    verifier: &'a LocalVerifier<T>,
    detokenizer: &'a dyn Detokenizer,
    has_text: bool,
    text_eos_ids: &'a [u32],
}

impl<T: TargetModel> Generation<'_, T> {
    /// Runs with the drafting `--draft` chose: the loaded drafter (of whichever kind) alone
    /// or behind prompt lookup (`hybrid`), prompt lookup alone (`ngram`), or none. The kind
    /// and the lookup in front are two independent choices, each made once here.
    fn drafting<D>(&self, prompt_ids: Vec<u32>, loaded: Option<D>) -> Result<()>
    where
        D: Drafter<Carry = TargetCarry>,
    {
        match (self.args.draft, loaded) {
            (Some(EmbeddedDraft::Hybrid), Some(inner)) => {
                self.run(prompt_ids, Some(&HybridDrafter::with_default_lookup(inner)))
            }
            (_, Some(drafter)) => self.run(prompt_ids, Some(&drafter)),
            (Some(EmbeddedDraft::Ngram), None) => {
                self.run(prompt_ids, Some(&NgramDrafter::<TargetCarry>::default()))
            }
            (_, None) => self.run::<NoDrafter<TargetCarry>>(prompt_ids, None),
        }
    }

    /// One generation with `drafter` (`None`: plain decoding), printed as it streams or as
    /// JSON.
    fn run<D>(&self, prompt_ids: Vec<u32>, drafter: Option<&D>) -> Result<()>
    where
        D: Drafter<Carry = TargetCarry>,
    {
        let Generation {
            args,
            verifier,
            detokenizer,
            has_text,
            text_eos_ids,
        } = *self;
        let block_size = match drafter {
            None => {
                if !args.no_draft {
                    tracing::info!("no drafter given: decoding with the target alone");
                }
                BlockSizeConfig::PLAIN
            }
            _ => {
                let block = match args.block_size {
                    Some(size) => BlockSizeConfig::fixed(size as usize),
                    None => {
                        BlockSizeConfig::adaptive(4, 4).with_cost_aware(!args.no_auto_speculation)
                    }
                };
                // A tree's rows beside its deepest block stay within one verify round; a
                // target that verifies chains only gets chains.
                let room = match verifier.target().supports_trees() {
                    true => (MAX_ROLLBACK + 1).saturating_sub(block.requested),
                    false => 0,
                };
                block.with_tree_nodes((args.tree_nodes as usize).min(room))
            }
        };
        let mut eos_token_ids = verifier.target().eos_token_ids();
        for &id in text_eos_ids {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let request = GenerationRequest {
            seq: SeqId(1),
            session: SessionId(1),
            prompt_ids,
            sampling: SamplingParams {
                temperature: args.temperature,
                top_p: args.top_p,
                top_k: args.top_k,
                seed: args.seed,
            },
            stop: StopConditions {
                max_tokens: args.max_tokens,
                eos_token_ids,
                ignore_eos: args.ignore_eos,
                stop_token_ids: Vec::new(),
                stop_strings: args.stop.clone(),
            },
            block_size,
            cache_scope: Default::default(),
            forced_drafts: 0,
            rules: Default::default(),
            top_logprobs: None,
        };
        let mut sink = PrintSink {
            stream: !args.json,
            tokens: Vec::new(),
            text: String::new(),
            finish: None,
            first_at: None,
            last_at: None,
        };
        // A speculative run ends with its speed-up over plain decoding, estimated from a few
        // plain steps timed on the finished sequence.
        let probed = ProbedVerifier::new(verifier, drafter.is_some());
        let verifier = &probed;
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let control = RequestControl::default();
        let finish = match drafter {
            Some(drafter) => runtime.block_on(
                RoundLoop::new(verifier, Some(drafter), detokenizer)
                    .run(request, &mut sink, &control),
            ),
            None => runtime.block_on(
                RoundLoop::plain(verifier, detokenizer).run(request, &mut sink, &control),
            ),
        }
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let speed = sink.speed(probed.plain_step());
        if args.json {
            let mut out = json!({
                "tokens": sink.tokens,
                "finish_reason": finish.reason.as_str(),
                "stats": stats_json(&finish.stats),
                "speed": speed.json(),
            });
            if has_text {
                out["text"] = json!(sink.text);
            }
            println!("{out}");
        } else {
            println!();
            if let Some(line) = finish.stats.format() {
                eprintln!("{line}");
            }
            if let Some(line) = speed.line() {
                eprintln!("{line}");
            }
        }
        Ok(())
    }
}
