//! A test engine: it follows the Drafter protocol exactly (an MTP session mirrors the
//! target's shared K/V from the snapshot and every delta; a draft-model session tracks the
//! committed tokens) but proposes random token ids. Lossless decoding must give the same
//! output with it as without drafting. Shared by the drafter's and the router's tests.
#![allow(dead_code, unused_imports)]

pub mod mirror;
pub mod random;

pub use mirror::KvMirror;
pub use random::RandomDrafts;
