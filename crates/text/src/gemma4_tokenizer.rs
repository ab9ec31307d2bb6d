//! Gemma 4's tokenizer from GGUF metadata (`tokenizer.ggml.model = gemma4`): SentencePiece-style
//! BPE over raw UTF-8. Spaces become U+2581 before merging, the text is split only into runs of
//! newlines and runs of everything else, merges apply by rank, a piece outside the vocabulary
//! falls back to `<0xNN>` byte tokens, and every prompt starts with the BOS token. This is what
//! llama.cpp runs for such a file and what Hugging Face's Gemma tokenizer does.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use crate::error::{Result, TextError};
use crate::gguf_metadata::{string_array, value_usize, Metadata};
use crate::gguf_tokenizer::{add_gguf_special_tokens, bpe_vocab, gguf_vocabulary};

/// SentencePiece's visible space, which stands for ' ' inside every token.
const SPACE_MARK: &str = "\u{2581}";

/// Tokens llama.cpp ends a Gemma 4 generation at, besides the GGUF's eos/eot ids: the end of
/// text, the end of a turn, and the opening of a tool response (the model waits for the tool).
pub const GEMMA4_STOP_TOKENS: [&str; 3] = ["<eos>", "<turn|>", "<|tool_response>"];

/// Builds the tokenizer from `tokenizer.ggml.{tokens,token_type,merges,bos_token_id}`.
pub(crate) fn from_gguf_metadata(metadata: &Metadata) -> Result<Tokenizer> {
    let (tokens, types) = gguf_vocabulary(metadata)?;
    let vocab = bpe_vocab(&tokens)?;
    let merges = string_array(metadata, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, m)| merge_pair(i, m))
        .collect::<Result<Vec<_>>>()?;
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some((_, unk)) = token_named_by(metadata, &tokens, "tokenizer.ggml.unknown_token_id")? {
        bpe = bpe.unk_token(unk.to_string());
    }
    let bpe = bpe.build().map_err(|e| {
        TextError::tokenizer(
            "building the BPE model from tokenizer.ggml.tokens/merges",
            e,
        )
    })?;

    let space = Replace::new(" ", SPACE_MARK)
        .map_err(|e| TextError::tokenizer("building the space normalizer", e))?;
    let unspace = Replace::new(SPACE_MARK, " ")
        .map_err(|e| TextError::tokenizer("building the space decoder", e))?;
    // llama.cpp merges within newline runs and within the text between them, never across;
    // Gemma 4's merges never join a newline to anything else, so its tokenizer.json, which
    // does not split, gives the same tokens.
    let lines = Split::new(
        SplitPattern::Regex("\n+".to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TextError::tokenizer("compiling the newline split", e))?;
    let decoder = DecoderSequence::new(vec![
        unspace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ]);

    let mut inner = Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(space))
        .with_pre_tokenizer(Some(lines))
        .with_decoder(Some(decoder));
    // llama.cpp adds the BOS whatever tokenizer.ggml.add_bos_token says: Gemma 4 was trained
    // with it, and files converted before the converter wrote the flag lack it.
    let (bos_id, bos) = token_named_by(metadata, &tokens, "tokenizer.ggml.bos_token_id")?
        .ok_or_else(|| TextError::MissingField {
            field: "tokenizer.ggml.bos_token_id".into(),
        })?;
    inner.with_post_processor(Some(with_bos(bos, bos_id)?));

    let special = add_gguf_special_tokens(&mut inner, &tokens, types)?;
    tracing::info!(
        tokens = tokens.len(),
        special,
        "gemma4 tokenizer from GGUF metadata"
    );
    Ok(inner)
}

/// A merge as llama.cpp reads it: split at the first space after the first character (a
/// piece may itself be a space).
fn merge_pair(i: usize, merge: &str) -> Result<(String, String)> {
    let split = merge
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(at, _)| (&merge[..at], &merge[at + 1..]));
    match split {
        Some((a, b)) if !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err(TextError::field(
            &format!("tokenizer.ggml.merges[{i}]"),
            format!("{merge:?} is not two tokens separated by a space"),
        )),
    }
}

/// The id a metadata field holds and its token, `None` when the field is absent.
pub(crate) fn token_named_by<'a>(
    metadata: &Metadata,
    tokens: &[&'a str],
    field: &str,
) -> Result<Option<(u32, &'a str)>> {
    let Some(value) = metadata.get(field) else {
        return Ok(None);
    };
    let id = value_usize(value, field)?;
    let token = tokens.get(id).copied().ok_or_else(|| {
        TextError::field(field, format!("{id} is past the {} tokens", tokens.len()))
    })?;
    Ok(Some((id as u32, token)))
}

/// Prepends `bos` to every encoding that asks for special tokens.
fn with_bos(bos: &str, id: u32) -> Result<TemplateProcessing> {
    let processor = TemplateProcessing::builder()
        .try_single(vec![bos, "$A"])
        .and_then(|b| b.try_pair(vec![bos, "$A", "$B:1"]))
        .map_err(|e| TextError::tokenizer("the BOS template", e))?
        .special_tokens(vec![(bos, id)])
        .build()
        .map_err(|e| TextError::tokenizer("the BOS template", e))?;
    Ok(processor)
}
