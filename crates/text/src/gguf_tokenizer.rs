//! A GGUF model's tokenizer: from a `tokenizer.json` beside the model when there is one,
//! otherwise rebuilt from the GGUF `tokenizer.ggml.*` metadata, for the byte-level BPE of the
//! Llama-style families (`gpt2` with the `qwen2`, `llama-bpe` or `smollm` pre-tokenizer) and
//! Gemma 4's (`gemma4`).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Result, TextError};
use crate::gemma4_tokenizer::{self, GEMMA4_STOP_TOKENS};
use crate::gguf_metadata::{meta_str, read_metadata, string_array, value_usize, Metadata};

/// The `qwen2` pre-tokenizer split (as in Qwen2's tokenizer.json and llama.cpp).
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's split (`llama-bpe`): Qwen2's, but digits go in runs of up to three.
pub const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2's split, which `smollm` applies after cutting every digit apart.
const GPT2_SPLIT_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// The byte-level pre-tokenizers read from GGUF metadata: `tokenizer.ggml.pre` and the splits
/// it applies in turn (as llama.cpp's `llama-vocab.cpp` lists them).
const PRE_TOKENIZERS: [(&str, &[&str]); 3] = [
    ("qwen2", &[QWEN2_SPLIT_REGEX]),
    ("llama-bpe", &[LLAMA3_SPLIT_REGEX]),
    ("smollm", &[r"\p{N}", GPT2_SPLIT_REGEX]),
];

/// Chat-turn terminators that stop generation whenever the vocabulary has them.
pub const QWEN_STOP_TOKENS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: usize = 2;
const TOKEN_TYPE_CONTROL: usize = 3;
const TOKEN_TYPE_USER_DEFINED: usize = 4;

pub struct GgufTokenizer {
    inner: Tokenizer,
    eos_token_ids: Vec<u32>,
}

impl GgufTokenizer {
    /// The tokenizer for the model at `gguf_path`: `tokenizer.json` in the same directory when
    /// present, else the GGUF metadata.
    pub fn for_model(gguf_path: &Path) -> Result<Self> {
        Self::for_model_with(gguf_path, &read_metadata(gguf_path)?)
    }

    /// [`GgufTokenizer::for_model`] with the file's metadata already read.
    pub fn for_model_with(gguf_path: &Path, metadata: &Metadata) -> Result<Self> {
        let json = gguf_path.parent().map(|dir| dir.join("tokenizer.json"));
        match json {
            Some(json) if json.is_file() => Self::from_tokenizer_json(&json, metadata),
            _ => Self::from_gguf_metadata(metadata),
        }
    }

    /// Loads `tokenizer.json`; the stop ids still come from the GGUF metadata.
    pub fn from_tokenizer_json(path: &Path, metadata: &Metadata) -> Result<Self> {
        let inner = Tokenizer::from_file(path)
            .map_err(|e| TextError::tokenizer(format!("reading {}", path.display()), e))?;
        tracing::info!(path = %path.display(), "tokenizer from tokenizer.json");
        Self::with_stop_ids(inner, metadata)
    }

    /// Builds the tokenizer from `tokenizer.ggml.{model,pre,tokens,token_type,merges}`.
    pub fn from_gguf_metadata(metadata: &Metadata) -> Result<Self> {
        let inner = match meta_str(metadata, "tokenizer.ggml.model")? {
            "gpt2" => byte_level_bpe(metadata)?,
            "gemma4" => gemma4_tokenizer::from_gguf_metadata(metadata)?,
            model => {
                return Err(TextError::field(
                    "tokenizer.ggml.model",
                    format!(
                        "expected \"gpt2\" (byte-level BPE) or \"gemma4\" (Gemma 4's \
                         SentencePiece-style BPE), found {model:?}"
                    ),
                ))
            }
        };
        Self::with_stop_ids(inner, metadata)
    }

    fn with_stop_ids(inner: Tokenizer, metadata: &Metadata) -> Result<Self> {
        let mut eos_token_ids = Vec::new();
        for field in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(value) = metadata.get(field) {
                eos_token_ids.push(value_usize(value, field)? as u32);
            }
        }
        let named: &[&str] = match meta_str(metadata, "tokenizer.ggml.model") {
            Ok("gemma4") => &GEMMA4_STOP_TOKENS,
            _ => &QWEN_STOP_TOKENS,
        };
        eos_token_ids.extend(named.iter().filter_map(|t| inner.token_to_id(t)));
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        if eos_token_ids.is_empty() {
            return Err(TextError::MissingField {
                field: "tokenizer.ggml.eos_token_id".into(),
            });
        }
        Ok(Self {
            inner,
            eos_token_ids,
        })
    }

    /// Token ids of `text`, without a BOS (Qwen adds none; Gemma 4's comes from
    /// [`TargetText::encode`](crate::TargetText::encode)); special tokens written in the text
    /// (e.g. `<|im_start|>`) map to their single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| TextError::tokenizer("encoding text", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::tokenizer("decoding ids", e))
    }

    /// Ids that end a generation: the GGUF eos/eot/eom and, where the vocabulary has them, the
    /// family's terminators (Qwen's `<|im_end|>`, `<|endoftext|>`; Gemma 4's `<eos>`,
    /// `<turn|>`, `<|tool_response>`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    pub fn into_inner(self) -> Tokenizer {
        self.inner
    }
}

/// A byte-level BPE (`gpt2`) with one of [`PRE_TOKENIZERS`].
fn byte_level_bpe(metadata: &Metadata) -> Result<Tokenizer> {
    let pre = meta_str(metadata, "tokenizer.ggml.pre")?;
    let Some((_, splits)) = PRE_TOKENIZERS.iter().find(|(name, _)| *name == pre) else {
        let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|(name, _)| *name).collect();
        return Err(TextError::field(
            "tokenizer.ggml.pre",
            format!("unsupported pre-tokenizer {pre:?} (supported: {known:?})"),
        ));
    };
    let (tokens, types) = gguf_vocabulary(metadata)?;
    let merges = string_array(metadata, "tokenizer.ggml.merges")?;

    let vocab = bpe_vocab(&tokens)?;
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_string(), b.to_string()))
            }
            _ => Err(TextError::field(
                &format!("tokenizer.ggml.merges[{i}]"),
                format!("{m:?} is not two tokens separated by one space"),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| {
            TextError::tokenizer(
                "building the BPE model from tokenizer.ggml.tokens/merges",
                e,
            )
        })?;

    let mut steps = Vec::with_capacity(splits.len() + 1);
    for regex in splits.iter() {
        let split = Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TextError::tokenizer(format!("compiling the {pre} pre-tokenizer regex"), e))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let pre_tokenizer = Sequence::new(steps);

    let mut inner = Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(pre_tokenizer))
        .with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

    let special = add_gguf_special_tokens(&mut inner, &tokens, types)?;
    if let Some((bos, id)) = bos_to_add(metadata, &tokens)? {
        let processor = TemplateProcessing::builder()
            .try_single(format!("{bos} $A"))
            .and_then(|b| b.try_pair(format!("{bos} $A {bos} $B")))
            .map_err(|e| TextError::tokenizer("the BOS template", e))?
            .special_tokens(vec![(bos.to_string(), id)])
            .build()
            .map_err(|e| TextError::tokenizer("the BOS template", e))?;
        inner.with_post_processor(Some(processor));
    }
    tracing::info!(
        tokens = tokens.len(),
        special,
        "tokenizer from GGUF metadata"
    );
    Ok(inner)
}

/// The BOS token (and its id) a text prompt starts with, where
/// `tokenizer.ggml.add_bos_token` asks for one (Llama 3; Qwen2's files say false or nothing).
fn bos_to_add<'a>(metadata: &Metadata, tokens: &[&'a str]) -> Result<Option<(&'a str, u32)>> {
    if !matches!(
        metadata.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    ) {
        return Ok(None);
    }
    let field = "tokenizer.ggml.bos_token_id";
    let value = metadata.get(field).ok_or_else(|| TextError::MissingField {
        field: field.into(),
    })?;
    let id = value_usize(value, field)?;
    match tokens.get(id) {
        Some(&bos) => Ok(Some((bos, id as u32))),
        None => Err(TextError::field(
            field,
            format!("{id} is past the {} tokens", tokens.len()),
        )),
    }
}

/// `tokenizer.ggml.tokens` and their `tokenizer.ggml.token_type`, one type per token.
pub(crate) fn gguf_vocabulary(metadata: &Metadata) -> Result<(Vec<&str>, &[Value])> {
    let tokens = string_array(metadata, "tokenizer.ggml.tokens")?;
    let types = crate::gguf_metadata::array(metadata, "tokenizer.ggml.token_type")?;
    if types.len() != tokens.len() {
        return Err(TextError::field(
            "tokenizer.ggml.token_type",
            format!("{} entries for {} tokens", types.len(), tokens.len()),
        ));
    }
    Ok((tokens, types))
}

/// Token to id, ids numbering the tokens in order.
pub(crate) fn bpe_vocab(tokens: &[&str]) -> Result<Vocab> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), id as u32))
        .collect();
    if vocab.len() != tokens.len() {
        return Err(TextError::field(
            "tokenizer.ggml.tokens",
            "contains duplicate tokens",
        ));
    }
    Ok(vocab)
}

/// Makes the vocabulary's control and unknown tokens special (matched whole in the text,
/// skipped by `decode(.., true)`) and its user-defined ones, such as Qwen's `<tool_call>`,
/// added tokens that decode as text, as llama.cpp treats them. Returns how many are special.
pub(crate) fn add_gguf_special_tokens(
    inner: &mut Tokenizer,
    tokens: &[&str],
    types: &[Value],
) -> Result<usize> {
    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (i, (token, kind)) in tokens.iter().zip(types).enumerate() {
        match value_usize(kind, &format!("tokenizer.ggml.token_type[{i}]"))? {
            TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_CONTROL => {
                special.push(AddedToken::from(token.to_string(), true))
            }
            TOKEN_TYPE_USER_DEFINED => {
                user_defined.push(AddedToken::from(token.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    inner.add_special_tokens(&special);
    inner.add_tokens(&user_defined);
    Ok(special.len())
}
