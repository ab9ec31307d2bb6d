//! A request's output constraint, compiled against the target's vocabulary.
//!
//! The vocabulary trie llguidance needs takes a pass over every token, so it is built once,
//! the first time it is needed or when the router starts (whichever comes first), and
//! shared by every request after.

use std::sync::{Arc, OnceLock};

use specd_core::TokenConstraint;
use specd_grammar::{GrammarErrorKind, GrammarLimits, GrammarTokens, OutputFormat};
use specd_text::TargetText;
use specd_wire::generation::{output_constraint, OutputConstraint};
use tonic::Status;

/// The target's vocabulary for constraints, built on first use.
pub(crate) struct Grammars {
    text: Arc<TargetText>,
    vocab_size: usize,
    limits: GrammarLimits,
    tokens: OnceLock<Result<GrammarTokens, String>>,
}

impl Grammars {
    pub fn new(text: Arc<TargetText>, vocab_size: usize) -> Self {
        Self {
            text,
            vocab_size,
            limits: GrammarLimits::default(),
            tokens: OnceLock::new(),
        }
    }

    /// Builds the vocabulary now (blocking), so the first constrained request does not
    /// wait for it. Does nothing for a target without a tokenizer.
    pub fn prepare(&self) {
        if self.text.has_tokenizer() {
            let _ = self.tokens();
        }
    }

    fn tokens(&self) -> Result<&GrammarTokens, &str> {
        self.tokens
            .get_or_init(|| {
                let tokenizer = self
                    .text
                    .tokenizer()
                    .ok_or_else(|| "this router's target has no tokenizer".to_owned())?;
                let mut eos = self.text.eos_token_ids().to_vec();
                for &id in self.text.end_of_turn_ids() {
                    if !eos.contains(&id) {
                        eos.push(id);
                    }
                }
                GrammarTokens::new(tokenizer, &eos, self.vocab_size).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The request's constraint in its start state, or `None` for free text. Blocking: a
    /// grammar compiles within [`GrammarLimits`]. Errors are INVALID_ARGUMENT naming the
    /// `constraint` field at fault.
    pub fn compile(
        &self,
        constraint: Option<&OutputConstraint>,
    ) -> Result<Option<Box<dyn TokenConstraint>>, Status> {
        let Some(format) = constraint.and_then(format_of) else {
            return Ok(None);
        };
        let tokens = self.tokens().map_err(|why| {
            Status::failed_precondition(format!("constraint: unavailable: {why}"))
        })?;
        let compiled = tokens.compile(&format, &self.limits).map_err(|error| {
            Status::invalid_argument(format!("{}: {}", field_of(error.kind()), error.message()))
        })?;
        Ok(Some(Box::new(compiled)))
    }
}

/// The format a wire constraint asks for; `None` when it asks for none.
fn format_of(wire: &OutputConstraint) -> Option<OutputFormat> {
    match wire.kind.as_ref()? {
        output_constraint::Kind::JsonObject(false) => None,
        output_constraint::Kind::JsonObject(true) => Some(OutputFormat::JsonObject),
        output_constraint::Kind::JsonSchema(schema) => {
            Some(OutputFormat::JsonSchema(schema.clone()))
        }
        output_constraint::Kind::Regex(regex) => Some(OutputFormat::Regex(regex.clone())),
        output_constraint::Kind::Lark(lark) => Some(OutputFormat::Lark(lark.clone())),
    }
}

/// The request field a grammar error is about.
fn field_of(kind: GrammarErrorKind) -> &'static str {
    match kind {
        GrammarErrorKind::JsonObject => "constraint.json_object",
        GrammarErrorKind::Schema => "constraint.json_schema",
        GrammarErrorKind::Regex => "constraint.regex",
        GrammarErrorKind::Lark => "constraint.lark",
    }
}
