//! What a remote drafter session carries from round to round, by drafter kind: the one place
//! the router's remote drafter tells an MTP session from a draft-model session.

use specd_wire::drafter::{draft_request, DrafterKind, MtpCarry, TokenCarry};
use specd_wire::{SnapshotChunk, WireTensor};

use crate::carry::WireCarry;
use crate::error::RemoteError;

/// What a session on another drafter would start from.
#[derive(Clone, Debug)]
pub(crate) enum SessionResume {
    /// An MTP session re-opens from a fresh verifier snapshot and the last hidden state.
    Mtp { hidden: Option<WireTensor> },
    /// A draft-model session re-opens from every token in the target cache as of the last
    /// draft call.
    DraftModel { context: Vec<u32> },
}

impl SessionResume {
    /// A session of `kind` that has not opened yet.
    pub(crate) fn of(kind: DrafterKind) -> Self {
        match kind {
            DrafterKind::Mtp => Self::Mtp { hidden: None },
            _ => Self::DraftModel {
                context: Vec::new(),
            },
        }
    }

    /// The label of the kind, for metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Mtp { .. } => "mtp",
            Self::DraftModel { .. } => "draft_model",
        }
    }

    /// Whether the drafter can pre-draft the next round while this one is verified: an MTP
    /// drafter needs each verify's hidden state, so it cannot draft ahead.
    pub(crate) fn predrafts(&self) -> bool {
        matches!(self, Self::DraftModel { .. })
    }

    /// Whether re-opening needs a verifier snapshot.
    pub(crate) fn needs_snapshot(&self) -> bool {
        matches!(self, Self::Mtp { .. })
    }

    /// The state right after the first open, from the prefill's `carry` and the prompt; the
    /// snapshot chunks the Open ships (none for a draft model).
    pub(crate) fn opened(
        &self,
        carry: WireCarry,
        prompt_ids: &[u32],
    ) -> (Self, Vec<SnapshotChunk>) {
        match self {
            Self::Mtp { .. } => (
                Self::Mtp {
                    hidden: carry.hidden,
                },
                carry.snapshot,
            ),
            Self::DraftModel { .. } => (
                Self::DraftModel {
                    context: prompt_ids.to_vec(),
                },
                Vec::new(),
            ),
        }
    }

    /// The context ids an Open's header carries (a draft model prefills them).
    pub(crate) fn context_ids(&self) -> Vec<u32> {
        match self {
            Self::Mtp { .. } => Vec::new(),
            Self::DraftModel { context } => context.clone(),
        }
    }

    /// The carry of a draft call that applies the rounds since the last one (`carries`,
    /// `committed` tokens), and the state once it is applied.
    pub(crate) fn advance(
        &self,
        carries: Vec<WireCarry>,
        committed: Vec<u32>,
    ) -> Result<(draft_request::Carry, Self), RemoteError> {
        match self {
            Self::Mtp { hidden } => {
                let (carry, hidden) = mtp_carry(carries, hidden.clone())?;
                let next = Self::Mtp {
                    hidden: Some(hidden),
                };
                Ok((draft_request::Carry::Mtp(carry), next))
            }
            Self::DraftModel { context } => {
                let mut context = context.clone();
                context.extend_from_slice(&committed);
                let carry = draft_request::Carry::Tokens(TokenCarry { committed });
                Ok((carry, Self::DraftModel { context }))
            }
        }
    }

    /// The carry of the first draft on a re-opened session: the open brought the rest.
    pub(crate) fn first_carry(&self) -> draft_request::Carry {
        match self {
            Self::Mtp { hidden } => draft_request::Carry::Mtp(MtpCarry {
                hidden: hidden.clone(),
                delta: None,
                later_deltas: Vec::new(),
            }),
            Self::DraftModel { .. } => draft_request::Carry::Tokens(TokenCarry::default()),
        }
    }

    /// Checks that a draft model's context is the target cache of `committed_len` tokens
    /// before a new session is opened from it.
    pub(crate) fn check(&self, committed_len: usize) -> Result<(), RemoteError> {
        match self {
            Self::DraftModel { context } if context.len() != committed_len => {
                Err(RemoteError::protocol(
                    "router",
                    format!(
                        "context of {} tokens for a committed length of {committed_len}",
                        context.len()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The MTP carry of the rounds since the last draft, and the hidden state it ends on.
fn mtp_carry(
    carries: Vec<WireCarry>,
    last_hidden: Option<WireTensor>,
) -> Result<(MtpCarry, WireTensor), RemoteError> {
    let mut hidden = last_hidden;
    let mut deltas = Vec::new();
    for carry in carries {
        if carry.hidden.is_some() {
            hidden = carry.hidden;
        }
        deltas.extend(carry.delta);
    }
    let hidden = hidden
        .ok_or_else(|| RemoteError::protocol("verifier", "no hidden state for the MTP drafter"))?;
    // Forwarded as the verifier sent them: the drafter joins several rounds' rows.
    let mut deltas = deltas.into_iter();
    let carry = MtpCarry {
        hidden: Some(hidden.clone()),
        delta: deltas.next(),
        later_deltas: deltas.collect(),
    };
    Ok((carry, hidden))
}
