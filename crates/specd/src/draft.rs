//! `specd draft`: the target prefills a prompt and picks its first token, then the Gemma 4
//! assistant drafts one block after it. Shows what a drafter checkpoint proposes for its target.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::DType;
use clap::Args;
use serde_json::json;
use specd_models::gemma4::{Gemma4Model, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::{first_argmax, Gemma4Assistant};

use crate::device::ComputeArgs;

#[derive(Args, Debug)]
pub struct DraftArgs {
    /// Gemma 4 target: a checkpoint directory (config.json, safetensors) or a `gemma4` GGUF
    /// file.
    #[arg(long)]
    pub target: PathBuf,
    /// Gemma 4 assistant: a checkpoint directory (model_type gemma4_assistant) or a
    /// `gemma4-assistant` GGUF file.
    #[arg(long)]
    pub drafter: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 2,17,301.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Tokens to draft after the target's first token.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Print one JSON object: {"first_token": t, "drafts": [...]}.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

pub fn run(args: DraftArgs) -> Result<()> {
    let device = args.compute.device()?;
    let dtype = args.compute.dtype();
    let target = Gemma4Model::load(&args.target, dtype, &device)
        .with_context(|| format!("loading the target from {}", args.target.display()))?;
    let vocab = target.config().vocab_size;
    if args.prompt_ids.is_empty() {
        bail!("prompt_ids: the prompt is empty");
    }
    if let Some((i, id)) = args
        .prompt_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        bail!("prompt_ids[{i}]: token id {id} is not below the vocabulary size {vocab}");
    }
    let assistant = Gemma4Assistant::load(&args.drafter, &args.target, dtype, &device)
        .with_context(|| format!("loading the drafter from {}", args.drafter.display()))?;

    // The assistant's sliding layers see two positions more than the target's own window, so
    // the target keeps at least that much slack (as a verifier's rollback slack does).
    let mut cache = target.new_cache(args.steps.max(2));
    let hidden = target.prefill(&mut cache, &args.prompt_ids, DEFAULT_PREFILL_CHUNK)?;
    let logits = target
        .logits(&hidden)?
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let first_token = first_argmax(&logits).context("the target's logits are all NaN")?;
    let mirror = assistant.new_mirror(&target.shared_kv(&cache, 0, cache.len())?)?;
    let drafts = assistant.draft_greedy(&mirror, first_token, &hidden, args.steps)?;

    if args.json {
        println!(
            "{}",
            json!({ "first_token": first_token, "drafts": drafts })
        );
    } else {
        let drafts: Vec<String> = drafts.iter().map(u32::to_string).collect();
        println!("first token: {first_token}");
        println!("drafts: {}", drafts.join(" "));
    }
    Ok(())
}
