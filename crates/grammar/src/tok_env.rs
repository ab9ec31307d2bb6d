//! The tokenizer as llguidance sees it: the token trie, and the real tokenizer for the
//! text a grammar forces (so forced tokens are the ones the model would have seen in
//! training, not a greedy split).

use llguidance::toktrie::{TokTrie, TokenId, TokenizerEnv};
use tokenizers::Tokenizer;

pub(crate) struct HfTokEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl HfTokEnv {
    pub(crate) fn new(trie: TokTrie, tokenizer: &Tokenizer) -> Self {
        let mut tokenizer = tokenizer.clone();
        // A forced span is tokenized whole, never cut or padded to a batch shape.
        tokenizer.with_truncation(None).ok();
        tokenizer.with_padding(None);
        Self { trie, tokenizer }
    }
}

impl TokenizerEnv for HfTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokenizer's ids when they spell exactly `bytes` (no prefix space added by a
    /// normalizer, no ids past the model's vocabulary), else the trie's greedy split, which
    /// always does. Forced bytes may end inside a UTF-8 char, which only the trie can split.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        if let Ok(text) = std::str::from_utf8(bytes) {
            if let Ok(encoding) = self.tokenizer.encode(text, false) {
                let ids = encoding.get_ids();
                let vocab = self.trie.vocab_size();
                if ids.iter().all(|&id| (id as usize) < vocab) && self.trie.decode(ids) == bytes {
                    return ids.to_vec();
                }
            }
        }
        self.trie.greedy_tokenize(bytes)
    }
}
