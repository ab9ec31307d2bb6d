//! `specd generate`: one generation in this process, printed as it streams or as JSON.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use specd_core::round_loop::SinkClosed;
use specd_core::{
    BlockSizeConfig, Detokenizer, Event, EventSink, GenerationRequest, NgramDrafter,
    RequestControl, RoundLoop, SamplingParams, SeqId, SessionId, SpecStats, StopConditions,
};
use specd_verifier::{Gemma4Target, LocalVerifier, TargetCarry, VerifierLimits};

use crate::device::{DTypeArg, DeviceArg};
use crate::embedded_mtp::EmbeddedMtp;
use crate::text::{NoText, TextTokenizer};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Target checkpoint directory (config.json, safetensors, optional tokenizer.json).
    #[arg(long)]
    pub target: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 2,17,301.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prompt text (needs tokenizer.json in the target directory).
    #[arg(long)]
    pub prompt: Option<String>,
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
    /// `mtp` runs the Gemma 4 assistant given by --drafter.
    #[arg(long, value_enum, conflicts_with = "no_draft")]
    pub draft: Option<EmbeddedDraft>,
    /// Gemma 4 assistant checkpoint directory, for --draft mtp.
    #[arg(long, required_if_eq("draft", "mtp"))]
    pub drafter: Option<PathBuf>,
    /// Verify block size while drafting: the bonus token plus up to block_size - 1 drafts.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=17))]
    pub block_size: u64,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

/// Drafters `specd generate` can run in-process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbeddedDraft {
    /// Prompt lookup (no model).
    Ngram,
    /// Multi-token prediction with a Gemma 4 assistant.
    Mtp,
}

/// Prints text as it arrives and keeps every token.
struct PrintSink {
    stream: bool,
    tokens: Vec<u32>,
    text: String,
    finish: Option<specd_core::Finish>,
}

impl EventSink for PrintSink {
    fn send(
        &mut self,
        event: Event,
    ) -> impl std::future::Future<Output = Result<(), SinkClosed>> + Send {
        match event {
            Event::Tokens(delta) => {
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
    })
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let device = args.device.device()?;
    let tokenizer = TextTokenizer::from_dir(&args.target)?;
    let prompt_ids = match (&args.prompt_ids, &args.prompt, &tokenizer) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(text), Some(tok)) => tok.encode(text)?,
        (None, Some(_), None) => {
            bail!(
                "--prompt needs tokenizer.json in {}; pass --prompt-ids instead",
                args.target.display()
            )
        }
        (None, None, _) => bail!("give a prompt with --prompt-ids or --prompt"),
    };
    let block_size = match args.draft {
        Some(_) => BlockSizeConfig::fixed(args.block_size as usize),
        None => {
            if !args.no_draft {
                tracing::info!("no drafter given: decoding with the target alone");
            }
            BlockSizeConfig::PLAIN
        }
    };
    let target = Gemma4Target::load(&args.target, args.dtype.dtype(), &device)
        .with_context(|| format!("loading the target from {}", args.target.display()))?;
    let eos = specd_verifier::TargetModel::eos_token_ids(&target);
    let verifier = LocalVerifier::new(Arc::new(target), VerifierLimits::default());
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
            eos_token_ids: eos,
            ignore_eos: args.ignore_eos,
            stop_token_ids: Vec::new(),
            stop_strings: args.stop.clone(),
        },
        block_size,
    };
    let has_text = tokenizer.is_some();
    let detokenizer: Box<dyn Detokenizer> = match tokenizer {
        Some(t) => Box::new(t),
        None => Box::new(NoText),
    };
    let mut sink = PrintSink {
        stream: !args.json,
        tokens: Vec::new(),
        text: String::new(),
        finish: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let control = RequestControl::default();
    let detokenizer = detokenizer.as_ref();
    let finish = match (args.draft, &args.drafter) {
        (Some(EmbeddedDraft::Mtp), Some(dir)) => {
            let mtp = EmbeddedMtp::load(dir, &args.target, args.dtype.dtype(), &device)
                .with_context(|| format!("loading the drafter from {}", dir.display()))?;
            runtime.block_on(
                RoundLoop::new(&verifier, Some(&mtp), detokenizer)
                    .run(request, &mut sink, &control),
            )
        }
        (Some(EmbeddedDraft::Ngram), _) => {
            let ngram = NgramDrafter::<TargetCarry>::default();
            runtime.block_on(
                RoundLoop::new(&verifier, Some(&ngram), detokenizer)
                    .run(request, &mut sink, &control),
            )
        }
        _ => runtime
            .block_on(RoundLoop::plain(&verifier, detokenizer).run(request, &mut sink, &control)),
    }
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        let mut out = json!({
            "tokens": sink.tokens,
            "finish_reason": finish.reason.as_str(),
            "stats": stats_json(&finish.stats),
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
    }
    Ok(())
}
