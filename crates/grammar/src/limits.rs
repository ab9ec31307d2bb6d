//! How much work one request's grammar may cost. llguidance measures work in "fuel" and
//! item counts rather than time, so a limit fails the same way on every machine; the
//! speeds quoted below are llguidance's own estimates, the times measured with
//! Qwen2.5's vocabulary on a development machine.

use llguidance::api::ParserLimits;

/// Limits on compiling a grammar and on each mask, so that a pathological schema or
/// grammar from a client fails fast with an error instead of stalling a server thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrammarLimits {
    /// Bytes of a JSON schema's text, checked before parsing it: compile time grows with
    /// the schema (about 0.5 s at this size for the costliest shapes found). Default
    /// 256 KiB.
    pub max_schema_bytes: usize,
    /// Bytes of a regex or Lark grammar's text. Every literal of a Lark grammar is a lexeme
    /// and compile time grows faster than their count (~70 ms at this size, 2 s at 350 KB).
    /// Default 64 KiB.
    pub max_grammar_bytes: usize,
    /// Properties of one object of a JSON schema. Optional properties cost compile time
    /// quadratic in their count (75 ms for 1000, 1.7 s for 4000), and a few hundred
    /// optional ones already exceed `max_items_in_row` at the first token. Default 1000.
    pub max_object_properties: usize,
    /// Symbols in the compiled grammar's productions. Default 250 000 (about 2 MB of JSON
    /// schema; llguidance's 500 000 is for offline use).
    pub max_grammar_size: usize,
    /// Lexer fuel for building the lexer's regexes at compile time (~50k/ms, so about
    /// 20 ms). Default 1 000 000.
    pub initial_lexer_fuel: u64,
    /// Lexer fuel for one token mask (~14k/ms, so about 14 ms). Default 200 000.
    pub step_lexer_fuel: u64,
    /// Earley items created for one token mask (~20k/ms, so 2.5 ms). Default 50 000.
    pub step_max_items: usize,
    /// Earley items in one parser row: the grammar's branching factor, reached quickly by
    /// ambiguous grammars. Default 2 000.
    pub max_items_in_row: usize,
    /// Lexer (DFA) states, 1-2 kB each, kept for the whole request. Default 100 000, so a
    /// request's lexer stays under ~200 MB (llguidance's 250 000 is for one user).
    pub max_lexer_states: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        Self {
            max_schema_bytes: 256 << 10,
            max_grammar_bytes: 64 << 10,
            max_object_properties: 1_000,
            max_grammar_size: 250_000,
            initial_lexer_fuel: 1_000_000,
            step_lexer_fuel: 200_000,
            step_max_items: 50_000,
            max_items_in_row: 2_000,
            max_lexer_states: 100_000,
        }
    }
}

impl GrammarLimits {
    pub(crate) fn parser_limits(&self) -> ParserLimits {
        ParserLimits {
            max_items_in_row: self.max_items_in_row,
            initial_lexer_fuel: self.initial_lexer_fuel,
            step_lexer_fuel: self.step_lexer_fuel,
            step_max_items: self.step_max_items,
            max_lexer_states: self.max_lexer_states,
            max_grammar_size: self.max_grammar_size,
            // Matching big lexemes against the vocabulary once at compile time keeps each
            // mask cheap; the compile is bounded by `initial_lexer_fuel` anyway.
            precompute_large_lexemes: true,
            // Verbose errors quote the whole grammar and the tokens so far: too much for a
            // client-facing message.
            verbose_errors: false,
        }
    }
}
