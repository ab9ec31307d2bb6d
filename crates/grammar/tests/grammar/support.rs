//! The two real vocabularies the tests run on, each built once per test binary: the
//! committed Gemma 4-style fixture (SentencePiece-style, byte fallback), and the real
//! Qwen2.5-Coder vocabulary (byte-level BPE) when its GGUF has been fetched.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use specd_core::TokenConstraint;
use specd_grammar::{GrammarConstraint, GrammarLimits, GrammarTokens, OutputFormat};
use specd_text::{GgufTokenizer, TargetText};
use tokenizers::Tokenizer;

/// Rows of Qwen2.5-Coder-1.5B's embedding (its GGUF pads the tokenizer to the same).
pub const QWEN_MODEL_VOCAB: usize = 151_936;
const QWEN_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// Model rows past the Gemma fixture's 1024 tokens, as a padded embedding has.
pub const GEMMA_PADDING: usize = 40;

pub struct Model {
    pub tokens: GrammarTokens,
    pub tokenizer: Tokenizer,
    pub eos: Vec<u32>,
}

impl Model {
    fn new(tokenizer: Tokenizer, eos: Vec<u32>, vocab: usize) -> Self {
        let tokens = GrammarTokens::new(&tokenizer, &eos, vocab).unwrap();
        Self {
            tokens,
            tokenizer,
            eos,
        }
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false).unwrap()
    }

    pub fn compile(&self, format: OutputFormat) -> GrammarConstraint {
        self.tokens
            .compile(&format, &GrammarLimits::default())
            .unwrap()
    }

    pub fn schema(&self, schema: &str) -> GrammarConstraint {
        self.compile(OutputFormat::JsonSchema(schema.to_string()))
    }

    /// The output so far: what the constraint was fed and its bytes as grammars see them.
    pub fn bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .flat_map(|&id| self.tokens.token_bytes(id).unwrap().to_vec())
            .collect()
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../text/tests/fixtures")
}

/// The Gemma 4-style fixture's tokenizer.json, with the stop ids of its GGUF twin, for a
/// model whose embedding is padded past the tokenizer.
pub fn gemma() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let metadata =
            specd_text::read_metadata(&fixtures().join("gemma4-tokenizer.gguf")).unwrap();
        let tok = GgufTokenizer::from_tokenizer_json(
            &fixtures().join("gemma4-tokenizer.hf.json"),
            &metadata,
        )
        .unwrap();
        let vocab = tok.vocab_size() + GEMMA_PADDING;
        Model::new(tok.inner().clone(), tok.eos_token_ids().to_vec(), vocab)
    })
}

/// The real Qwen2.5-Coder vocabulary, or `None` after a loud warning when the GGUF is
/// absent (tools/fetch_qwen_pair.sh fetches it).
pub fn qwen(test: &str) -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    let model = MODEL.get_or_init(|| {
        let path = model_dir().join(QWEN_FILE);
        if !path.is_file() {
            return None;
        }
        let text = TargetText::from_gguf(&path).unwrap();
        let tokenizer = text.tokenizer().unwrap().clone();
        let started = std::time::Instant::now();
        let model = Model::new(tokenizer, text.eos_token_ids().to_vec(), QWEN_MODEL_VOCAB);
        let _ = writeln!(
            std::io::stderr(),
            "Qwen grammar vocabulary built in {:?}",
            started.elapsed()
        );
        Some(model)
    });
    if model.is_none() {
        // Straight to the stderr handle: the harness captures `eprintln!` of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             SKIPPED {test}: {QWEN_FILE} not found in {}, run tools/fetch_qwen_pair.sh\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
            model_dir().display()
        );
    }
    model.as_ref()
}

fn model_dir() -> PathBuf {
    match std::env::var_os("SPECD_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/specd/models")
        }
    }
}

/// Every model the test can run on: Gemma always, Qwen when present.
pub fn models(test: &str) -> Vec<(&'static str, &'static Model)> {
    let mut models = vec![("gemma", gemma())];
    if let Some(qwen) = qwen(test) {
        models.push(("qwen", qwen));
    }
    models
}

/// Feeds `ids` one at a time, each checked against its mask first.
pub fn commit_each(model: &Model, constraint: &mut GrammarConstraint, ids: &[u32]) {
    for (i, &id) in ids.iter().enumerate() {
        let mask = constraint.next_mask().unwrap();
        assert!(
            mask.allows(id),
            "token {i} ({:?}) refused after {:?}",
            model.decode(&[id]),
            model.decode(&ids[..i])
        );
        constraint.commit(&[id]).unwrap();
    }
}
