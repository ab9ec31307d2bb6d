//! A target model's vocabulary, prepared once for every grammar a request may bring.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use llguidance::api::{GrammarInit, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Logger, Matcher, ParserFactory};
use specd_text::token_bytes::Spelling;
use tokenizers::Tokenizer;

use crate::constraint::GrammarConstraint;
use crate::error::{GrammarError, VocabularyError};
use crate::format::OutputFormat;
use crate::limits::GrammarLimits;
use crate::tok_env::HfTokEnv;
use crate::token_bytes::vocabulary_bytes;

/// Longer tokens are left out of the trie: llguidance's trie nodes count at most 1024
/// levels, and no real output needs a 1000-byte token (a grammar spells it with shorter
/// ones).
const MAX_TOKEN_BYTES: usize = 1000;

/// Stack of the thread that compiles a grammar. llguidance compiles JSON schemas and Lark
/// grammars recursively, up to ~10 kB of stack per level (a chain of `$ref`s), so a
/// schema within [`GrammarLimits::max_schema_bytes`] can need tens of MB: far more than a
/// request thread has, and overflowing a stack aborts the process. Only the pages touched
/// use memory.
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Token ids the trie can hold (its nodes keep an id in 24 bits, one value reserved).
const MAX_VOCAB_SIZE: usize = 0xff_ffff;

/// The target model's vocabulary as llguidance needs it: the bytes of every token in a
/// trie, and the tokenizer for forced text. Building it walks the whole vocabulary (~150k
/// tokens for Qwen2) and precomputes llguidance's token slices, so it is built once per
/// model, off the request path, and shared: cloning is cheap.
#[derive(Clone)]
pub struct GrammarTokens {
    shared: Arc<Shared>,
}

/// What every constraint of the model reads.
pub(crate) struct Shared {
    pub(crate) factory: ParserFactory,
    /// The model's vocabulary (embedding rows), which every mask covers.
    pub(crate) vocab_size: usize,
    pub(crate) eos_token_ids: Vec<u32>,
}

impl GrammarTokens {
    /// Prepares the vocabulary of `tokenizer` for a model with `model_vocab_size` logits
    /// and these end-of-sequence ids. The model may have more rows than the tokenizer has
    /// tokens (padding): a grammar never allows those. Tokenizer ids past the model's rows
    /// cannot be sampled and are left out.
    pub fn new(
        tokenizer: &Tokenizer,
        eos_token_ids: &[u32],
        model_vocab_size: usize,
    ) -> Result<Self, VocabularyError> {
        let started = Instant::now();
        if model_vocab_size == 0 || model_vocab_size > MAX_VOCAB_SIZE {
            return Err(VocabularyError::VocabularySize(model_vocab_size));
        }
        let mut eos = Vec::with_capacity(eos_token_ids.len());
        for &id in eos_token_ids {
            if id as usize >= model_vocab_size {
                return Err(VocabularyError::EosOutOfVocabulary {
                    id,
                    vocab_size: model_vocab_size,
                });
            }
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let first_eos = *eos.first().ok_or(VocabularyError::NoEos)?;

        let spelling =
            Spelling::of(tokenizer).map_err(|e| VocabularyError::UnsupportedDecoder(e.0))?;
        let tokenizer_vocab = tokenizer.get_vocab_size(true);
        if tokenizer_vocab > model_vocab_size {
            tracing::warn!(
                tokenizer_vocab,
                model_vocab_size,
                "the tokenizer has more tokens than the model has logits; grammars never allow the rest"
            );
        }
        let mut words = vocabulary_bytes(tokenizer, spelling, model_vocab_size);
        for (id, word) in words.iter_mut().enumerate() {
            if word.len() > MAX_TOKEN_BYTES {
                tracing::warn!(
                    id,
                    bytes = word.len(),
                    "token too long for grammars; never allowed"
                );
                word.clear();
            }
        }

        let info = TokRxInfo {
            vocab_size: model_vocab_size as u32,
            tok_eos: first_eos,
            tok_bos: None,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        // The trie asserts its invariants; the checks above should keep them, and a panic
        // here must not take a model load down with it.
        let mut factory = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
            let env: TokEnv = Arc::new(HfTokEnv::new(trie, tokenizer));
            ParserFactory::new_simple(&env)
        }))
        .map_err(|_| VocabularyError::Trie("llguidance refused the vocabulary".to_string()))?
        .map_err(|e| VocabularyError::Trie(e.to_string()))?;
        // Warnings would go to stderr; compile() logs them through tracing instead.
        factory.quiet();
        let shared = Arc::new(Shared {
            factory,
            vocab_size: model_vocab_size,
            eos_token_ids: eos,
        });
        // llguidance prepares its token slices on the first mask (~1 s for Qwen2's
        // vocabulary): done here so that no request pays for it.
        let object = TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}));
        compile_grammar(Arc::clone(&shared), object, &GrammarLimits::default())
            .map_err(VocabularyError::Trie)?;
        tracing::info!(
            vocab_size = model_vocab_size,
            tokenizer_vocab,
            ?spelling,
            eos = ?shared.eos_token_ids,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "grammar vocabulary ready"
        );
        Ok(Self { shared })
    }

    /// The model's vocabulary size: every mask has a bit per id below it.
    pub fn vocab_size(&self) -> usize {
        self.shared.vocab_size
    }

    /// The end-of-sequence ids, the first one being llguidance's own EOS.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.shared.eos_token_ids
    }

    /// The bytes of token `id` as grammars see them: a special token is `0xFF` and its
    /// name, an id the tokenizer lacks is empty. `None` past the model's vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        ((id as usize) < self.shared.vocab_size)
            .then(|| self.shared.factory.tok_env().tok_trie().token(id))
    }

    /// A constraint of one request's output to `format`, in its start state. The first
    /// mask is computed here, so a grammar too costly for `limits` fails now, as a bad
    /// request, rather than in the middle of a generation.
    pub fn compile(
        &self,
        format: &OutputFormat,
        limits: &GrammarLimits,
    ) -> Result<GrammarConstraint, GrammarError> {
        let started = Instant::now();
        let kind = format.kind();
        let grammar = format.grammar(limits)?;
        let shared = Arc::clone(&self.shared);
        let limits = limits.clone();
        let compiler = std::thread::Builder::new()
            .name("grammar-compile".to_string())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || compile_grammar(shared, grammar, &limits))
            .map_err(|e| GrammarError::new(kind, format!("starting the compiler: {e}")))?;
        let constraint = compiler
            .join()
            .map_err(|_| GrammarError::new(kind, "the compiler crashed"))?
            .map_err(|message| GrammarError::new(kind, message))?;
        tracing::debug!(
            %kind,
            elapsed_us = started.elapsed().as_micros() as u64,
            "grammar compiled"
        );
        Ok(constraint)
    }
}

/// A constraint in its start state, or llguidance's message.
fn compile_grammar(
    shared: Arc<Shared>,
    grammar: TopLevelGrammar,
    limits: &GrammarLimits,
) -> Result<GrammarConstraint, String> {
    let parser = shared
        .factory
        .create_parser_from_init_ext(
            GrammarInit::Serialized(grammar),
            Logger::new(0, 0),
            InferenceCapabilities::default(),
            limits.parser_limits(),
        )
        .map_err(|e| client_message(&e.to_string()))?;
    let mut matcher = Matcher::new(Ok(parser));
    for warning in matcher.grammar_warnings() {
        tracing::debug!(%warning, "grammar warning");
    }
    GrammarConstraint::start(matcher, shared).map_err(|e| client_message(&e.0))
}

/// llguidance's message without what is no use to a client: the backtrace it appends to
/// a panic it caught (an internal limit such as 65k grammar symbols is an assertion
/// there), and its marker for errors without the grammar quoted.
fn client_message(message: &str) -> String {
    let message = message
        .split_once("\n<backtrace>")
        .map_or(message, |(message, _)| message);
    message.replace("<non-verbose/>", "").trim().to_string()
}

impl std::fmt::Debug for GrammarTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarTokens")
            .field("vocab_size", &self.shared.vocab_size)
            .field("eos_token_ids", &self.shared.eos_token_ids)
            .finish_non_exhaustive()
    }
}
