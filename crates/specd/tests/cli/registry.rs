//! A model family the binary's sources never name, added to the registry at run time (as a
//! program embedding specd would), goes through the same loading as the built-in ones: told
//! from its checkpoint, loaded as a target and as a draft model, and speculation over it gives
//! plain decoding's tokens. Its checkpoints are directories of `model_type` `specd-test-lm`
//! holding the weights as a GGUF file the Llama-style engine runs.

use std::path::{Path, PathBuf};

use specd::checkpoints::{drafter_kind_of, LoadedTarget};
use specd::device::{ComputeArgs, DTypeArg, DeviceArg};
use specd::draft_weights::DraftWeights;
use specd::generate::EmbeddedDraft;
use specd::model_drafter::{DraftModelOptions, ModelDrafter};
use specd_core::{
    BlockSizeConfig, Drafter, Event, GenerationRequest, RequestControl, RoundLoop, SamplingParams,
    SeqId, SessionId, StopConditions,
};
use specd_models::family::{register, EosSource, Family, LmFamily, Role};
use specd_models::qwen2::{LoadOptions, Qwen2Model};
use specd_models::{AnyLm, LoadSpec, LoadedLm, ModelSource};
use specd_text::TargetText;
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel, VerifierLimits};

use crate::qwen2_support::{write_tiny_gguf, TinySpec};

const EOS: u32 = 255;

static TEST_LM: Family = Family {
    name: "test LM",
    model_types: &["specd-test-lm"],
    gguf_architectures: Vec::new,
    role: Role::CausalLm(LmFamily {
        load: load_test_lm,
        eos: EosSource::Config,
        exports_kv: false,
        draft_model: true,
    }),
};

fn load_test_lm(dir: &Path, spec: &LoadSpec<'_>) -> specd_models::Result<LoadedLm> {
    let model = Qwen2Model::load_with(
        &dir.join("model.gguf"),
        spec.device,
        &LoadOptions::default(),
    )?;
    Ok(LoadedLm {
        model: AnyLm::new(model),
        eos_token_ids: vec![EOS],
    })
}

/// A checkpoint directory of the test family, removed on drop.
struct Checkpoint(PathBuf);

impl Checkpoint {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("specd-registry-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"model_type": "specd-test-lm", "eos_token_id": {EOS}}}"#),
        )
        .unwrap();
        write_tiny_gguf(&dir.join("model.gguf"), &TinySpec::default());
        Self(dir)
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn request(block: BlockSizeConfig) -> GenerationRequest {
    GenerationRequest {
        seq: SeqId(1),
        session: SessionId(1),
        prompt_ids: vec![1, 5, 9, 13, 5, 9, 13, 5, 9],
        sampling: SamplingParams::default(),
        stop: StopConditions {
            max_tokens: 40,
            eos_token_ids: Vec::new(),
            ignore_eos: true,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        },
        block_size: block,
        cache_scope: Default::default(),
        forced_drafts: 0,
        rules: Default::default(),
        top_logprobs: None,
    }
}

/// The tokens and the accepted drafts of one generation.
async fn generate<T: TargetModel, D: Drafter<Carry = TargetCarry>>(
    verifier: &LocalVerifier<T>,
    drafter: Option<&D>,
) -> (Vec<u32>, u64) {
    let text = TargetText::without_tokenizer(Vec::new());
    let control = RequestControl::default();
    let mut events = Vec::new();
    let finish = match drafter {
        Some(drafter) => RoundLoop::new(verifier, Some(drafter), &text)
            .run(request(BlockSizeConfig::fixed(4)), &mut events, &control)
            .await
            .unwrap(),
        None => RoundLoop::plain(verifier, &text)
            .run(request(BlockSizeConfig::PLAIN), &mut events, &control)
            .await
            .unwrap(),
    };
    let tokens = events
        .iter()
        .flat_map(|e| match e {
            Event::Tokens(delta) => delta.tokens.clone(),
            Event::Finished(_) => Vec::new(),
        })
        .collect();
    (tokens, finish.stats.accepted)
}

#[tokio::test]
async fn a_family_registered_at_run_time_is_a_target_and_a_draft_model() {
    let target = Checkpoint::new("target");
    let drafter = Checkpoint::new("drafter");
    let unknown = ModelSource::detect(&target.0).unwrap_err().to_string();
    assert!(unknown.contains("specd-test-lm"), "{unknown}");

    register(&TEST_LM).unwrap();
    assert_eq!(ModelSource::detect(&target.0).unwrap().family(), &TEST_LM);
    assert_eq!(
        drafter_kind_of(&drafter.0).unwrap(),
        EmbeddedDraft::DraftModel
    );
    let compute = ComputeArgs {
        device: DeviceArg::Cpu,
        dtype: DTypeArg::F32,
    };
    let loaded = LoadedTarget::load(&target.0, &compute).unwrap();
    assert_eq!(loaded.model.eos_token_ids(), [EOS]);
    assert_eq!(loaded.vocab_size(), TinySpec::default().vocab);
    assert!(!loaded.exports_kv());
    let options = DraftModelOptions {
        draft_vocab: 0,
        weights: DraftWeights::default(),
        prefix_cache_bytes: 0,
    };
    let model_drafter =
        ModelDrafter::load(&drafter.0, EmbeddedDraft::DraftModel, &loaded, options).unwrap();
    let mtp = ModelDrafter::load(&drafter.0, EmbeddedDraft::Mtp, &loaded, options);
    let mtp = mtp.err().unwrap().to_string();
    assert!(mtp.contains("needs an MTP assistant"), "{mtp}");

    let verifier = LocalVerifier::new(std::sync::Arc::new(loaded.model), VerifierLimits::default());
    let (plain, _) = generate(&verifier, None::<&ModelDrafter>).await;
    let (speculative, accepted) = generate(&verifier, Some(&model_drafter)).await;
    assert_eq!(plain.len(), 40);
    assert_eq!(speculative, plain);
    // The drafter has the target's weights: its drafts are the target's tokens.
    assert!(accepted > 0);
}
