use super::*;

fn scope(s: &str) -> CacheScope {
    CacheScope(s.to_string())
}

/// A cache whose state is the token list itself, so a copy can be checked.
fn cache(max_bytes: usize, rule: PrefixRule) -> PrefixCache<Vec<u32>> {
    PrefixCache::new(max_bytes, rule)
}

fn take(cache: &PrefixCache<Vec<u32>>, s: &str, prompt: &[u32]) -> Option<Vec<u32>> {
    cache
        .lookup_with(&scope(s), prompt, 0, |state, len| {
            Some(state[..len].to_vec())
        })
        .map(|hit| hit.copied)
}

#[test]
fn longest_usable_prefix_wins_and_one_token_is_left() {
    let c = cache(1000, PrefixRule::AnyLength);
    assert!(c.insert(scope(""), vec![1, 2, 3], 3, vec![1, 2, 3], 10, usize::MAX));
    assert!(c.insert(
        scope(""),
        vec![1, 2, 9, 9],
        4,
        vec![1, 2, 9, 9],
        10,
        usize::MAX
    ));
    assert_eq!(take(&c, "", &[1, 2, 9, 9, 5]), Some(vec![1, 2, 9, 9]));
    // The whole prompt cached: its last token is still computed.
    assert_eq!(take(&c, "", &[1, 2, 3]), Some(vec![1, 2]));
    assert_eq!(take(&c, "", &[7, 1, 2]), None);
    let totals = c.counters().totals();
    assert_eq!((totals.lookups, totals.hits, totals.hit_tokens), (3, 2, 6));
}

#[test]
fn scopes_do_not_share() {
    let c = cache(1000, PrefixRule::AnyLength);
    c.insert(
        scope("a"),
        vec![1, 2, 3, 4],
        4,
        vec![1, 2, 3, 4],
        10,
        usize::MAX,
    );
    assert_eq!(take(&c, "b", &[1, 2, 3, 4, 5]), None);
    assert_eq!(take(&c, "", &[1, 2, 3, 4, 5]), None);
    assert_eq!(take(&c, "a", &[1, 2, 3, 4, 5]), Some(vec![1, 2, 3, 4]));
}

#[test]
fn chunk_rule_keeps_to_whole_prefill_chunks() {
    let rule = PrefixRule::PrefillChunks(4);
    assert_eq!(rule.usable(11, 20, 30), 8);
    // Rows past the prefill were decoded: not reusable.
    assert_eq!(rule.usable(11, 6, 30), 4);
    assert_eq!(rule.usable(3, 20, 30), 0);
    // One prompt token is left even at a chunk boundary.
    assert_eq!(rule.usable(8, 8, 8), 4);
    assert_eq!(PrefixRule::Never.usable(8, 8, 9), 0);
    assert_eq!(PrefixRule::AnyLength.usable(8, 0, 9), 8);
}

#[test]
fn least_recently_used_goes_first_and_bytes_stay_bounded() {
    let c = cache(30, PrefixRule::AnyLength);
    c.insert(scope(""), vec![1, 1], 2, vec![1, 1], 10, usize::MAX);
    c.insert(scope(""), vec![2, 2], 2, vec![2, 2], 10, usize::MAX);
    c.insert(scope(""), vec![3, 3], 2, vec![3, 3], 10, usize::MAX);
    // Touch the first: the second is now the oldest.
    assert!(take(&c, "", &[1, 1, 0]).is_some());
    c.insert(scope(""), vec![4, 4], 2, vec![4, 4], 10, usize::MAX);
    assert_eq!(c.held(), (30, 6));
    assert!(take(&c, "", &[2, 2, 0]).is_none());
    assert!(take(&c, "", &[1, 1, 0]).is_some());
    assert_eq!(c.counters().totals().evictions, 1);
    // Larger than the whole cache: not kept, nothing evicted for it.
    assert!(!c.insert(scope(""), vec![5], 1, vec![5], 31, usize::MAX));
    assert_eq!(c.len(), 3);
}

#[test]
fn room_in_a_shared_budget_limits_growth() {
    let c = cache(100, PrefixRule::AnyLength);
    assert!(c.insert(scope(""), vec![1], 1, vec![1], 10, 10));
    // Only 5 more bytes may be taken: the old entry goes to make room.
    assert!(c.insert(scope(""), vec![2], 1, vec![2], 15, 5));
    assert_eq!(c.held(), (15, 1));
    assert!(!c.insert(scope(""), vec![3], 1, vec![3], 50, 0));
    assert_eq!(c.free_bytes(1), 15);
    assert!(c.is_empty());
}

#[test]
fn an_extension_replaces_the_entry_it_covers() {
    let c = cache(1000, PrefixRule::AnyLength);
    c.insert(scope(""), vec![1, 2], 2, vec![1, 2], 10, usize::MAX);
    c.insert(scope("x"), vec![1, 2], 2, vec![1, 2], 10, usize::MAX);
    c.insert(scope(""), vec![1, 2, 3], 3, vec![1, 2, 3], 10, usize::MAX);
    assert_eq!(c.len(), 2);
    // Less prefilled than the entry it extends: both stay (the chunk rule needs the old).
    c.insert(scope("x"), vec![1, 2, 3], 1, vec![1, 2, 3], 10, usize::MAX);
    assert_eq!(c.len(), 3);
}

#[test]
fn a_copy_that_fails_is_a_miss_and_a_disabled_cache_keeps_nothing() {
    let c = cache(1000, PrefixRule::AnyLength);
    c.insert(scope(""), vec![1, 2, 3], 3, vec![1, 2, 3], 10, usize::MAX);
    let miss = c.lookup_with(&scope(""), &[1, 2, 3, 4], 0, |_, _| None::<()>);
    assert!(miss.is_none());
    assert_eq!(c.counters().totals().hits, 0);
    // Only longer than what the caller already has.
    assert!(c
        .lookup_with(&scope(""), &[1, 2, 3, 4], 3, |_, _| Some(()))
        .is_none());
    let off = cache(0, PrefixRule::AnyLength);
    assert!(!off.insert(scope(""), vec![1], 1, vec![1], 0, usize::MAX));
    let never = cache(10, PrefixRule::Never);
    assert!(!never.insert(scope(""), vec![1], 1, vec![1], 1, usize::MAX));
}

#[test]
fn a_failed_copy_falls_back_to_the_next_longest_and_windows_keep_short_entries() {
    let c = cache(1000, PrefixRule::PrefillChunks(2));
    c.insert(scope(""), vec![1, 2], 2, vec![1, 2], 10, usize::MAX);
    c.insert(
        scope(""),
        vec![1, 2, 3, 4],
        4,
        vec![1, 2, 3, 4],
        10,
        usize::MAX,
    );
    // Under a rule where a longer state may not serve a shorter prefix, both stay.
    assert_eq!(c.len(), 2);
    let hit = c.lookup_with(&scope(""), &[1, 2, 3, 4, 5], 0, |state, len| {
        (state.len() == 2).then_some(len)
    });
    assert_eq!(hit.map(|h| h.tokens), Some(2));
    // The same tokens again replace the entry.
    c.insert(scope(""), vec![1, 2], 2, vec![1, 2], 10, usize::MAX);
    assert_eq!(c.len(), 2);
}

#[test]
fn take_moves_the_longest_entry_out() {
    let c = cache(1000, PrefixRule::AnyLength);
    c.insert(scope(""), vec![1, 2], 2, vec![1, 2], 10, usize::MAX);
    c.insert(
        scope(""),
        vec![1, 2, 3, 4],
        4,
        vec![1, 2, 3, 4],
        10,
        usize::MAX,
    );
    c.insert(scope("x"), vec![1, 2, 3, 4, 5], 5, vec![9], 10, usize::MAX);
    // The longer entry covered the shorter one of its scope.
    assert_eq!(c.len(), 2);
    assert_eq!(
        c.take(&scope(""), &[1, 2, 3, 9, 9], 0),
        Some((vec![1, 2, 3, 4], 3))
    );
    assert_eq!(c.held(), (10, 5));
    assert_eq!(c.take(&scope(""), &[1, 2, 3, 9, 9], 0), None);
    assert_eq!(c.take(&scope("x"), &[1, 2, 3, 4, 5, 6], 5), None);
    let totals = c.counters().totals();
    assert_eq!((totals.lookups, totals.hits, totals.hit_tokens), (3, 1, 3));
}
