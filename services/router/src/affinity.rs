//! Where a prompt's prefix is likely cached: the router remembers, per pool member, the
//! blocks of prompts it sent there (hashes of the scope and every token up to each block's
//! end), so a conversation's next turn or an agent's next request goes where its history
//! was computed. A guess from what this router sent, not a view of the member's cache: a
//! member that evicted or restarted only costs that request its reuse.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use specd_core::sync::lock;

/// Tokens per remembered block: finer than any reuse granularity a verifier has, coarse
/// enough that a long prompt is a few dozen hashes.
pub const BLOCK_TOKENS: usize = 64;

/// Blocks remembered per member, oldest forgotten first (about 4M tokens of prompts).
const BLOCKS_PER_MEMBER: usize = 65_536;

/// The chain of block hashes of a prompt: entry `i` covers the scope and tokens
/// `0 .. (i + 1) * BLOCK_TOKENS`.
pub fn prefix_chain(scope: &str, tokens: &[u32]) -> Vec<u64> {
    let mut hasher = DefaultHasher::new();
    scope.hash(&mut hasher);
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|block| {
            block.hash(&mut hasher);
            hasher.finish()
        })
        .collect()
}

#[derive(Default)]
struct Member {
    blocks: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    tick: u64,
}

/// The prefix blocks sent to each member.
#[derive(Default)]
pub struct PrefixAffinity {
    members: Mutex<HashMap<String, Member>>,
}

impl PrefixAffinity {
    /// Leading blocks of `chain` last sent to `member`, in tokens.
    pub fn matched_tokens(&self, member: &str, chain: &[u64]) -> usize {
        let members = lock(&self.members);
        let Some(known) = members.get(member) else {
            return 0;
        };
        chain
            .iter()
            .take_while(|hash| known.blocks.contains_key(hash))
            .count()
            * BLOCK_TOKENS
    }

    /// Remembers that `chain`'s prompt went to `member`.
    pub fn record(&self, member: &str, chain: &[u64]) {
        if chain.is_empty() {
            return;
        }
        let mut members = lock(&self.members);
        let known = members.entry(member.to_owned()).or_default();
        for &hash in chain {
            known.tick += 1;
            let tick = known.tick;
            known.blocks.insert(hash, tick);
            known.order.push_back((hash, tick));
        }
        // Entries renewed since are skipped: only a block's last use counts.
        while known.blocks.len() > BLOCKS_PER_MEMBER {
            let Some((hash, tick)) = known.order.pop_front() else {
                break;
            };
            if known.blocks.get(&hash) == Some(&tick) {
                known.blocks.remove(&hash);
            }
        }
        if known.order.len() > 4 * BLOCKS_PER_MEMBER {
            let blocks = &known.blocks;
            known
                .order
                .retain(|(hash, tick)| blocks.get(hash) == Some(tick));
        }
    }

    /// Forgets `member` (it failed: whatever it held may be gone).
    pub fn forget(&self, member: &str) {
        lock(&self.members).remove(member);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_follow_scope_and_every_token_before() {
        let a: Vec<u32> = (0..200).collect();
        let mut b = a.clone();
        b[130] = 7;
        let (ca, cb) = (prefix_chain("", &a), prefix_chain("", &b));
        assert_eq!(ca.len(), 3);
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
        assert_ne!(prefix_chain("key", &a)[0], ca[0]);
        assert!(prefix_chain("", &a[..63]).is_empty());
    }

    #[test]
    fn members_match_what_they_were_sent() {
        let affinity = PrefixAffinity::default();
        let prompt: Vec<u32> = (0..300).collect();
        let chain = prefix_chain("", &prompt);
        affinity.record("a", &chain[..2]);
        assert_eq!(affinity.matched_tokens("a", &chain), 128);
        assert_eq!(affinity.matched_tokens("b", &chain), 0);
        affinity.record("b", &chain);
        assert_eq!(affinity.matched_tokens("b", &chain), 256);
        affinity.forget("b");
        assert_eq!(affinity.matched_tokens("b", &chain), 0);
    }
}
