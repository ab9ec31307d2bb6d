//! Prometheus metric names and labels, as the telemetry contract fixes them (the names are
//! defined in specd-core, whose round loop records most of them), with their buckets and
//! help texts. Histograms are in seconds unless their name says otherwise.

pub use specd_core::metric_names::*;

/// Upper bounds of the latency histograms, 0.5 ms to 30 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Upper bounds of the block size histogram (one bucket per size up to 16).
pub const BLOCK_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0,
];
/// Upper bounds of the rows-per-batched-forward histogram.
pub const BATCH_ROWS_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Help text of every metric, shown in the exposition.
pub(crate) const HELP: &[(&str, &str)] = &[
    (REQUESTS, "Requests finished, by finish reason."),
    (ROUNDS, "Draft/verify rounds, by drafter kind."),
    (
        DRAFTED_TOKENS,
        "Draft tokens proposed, by 1-based draft position.",
    ),
    (
        ACCEPTED_TOKENS,
        "Draft tokens accepted, by 1-based draft position.",
    ),
    (EMITTED_TOKENS, "Tokens emitted to clients."),
    (ROUND_DURATION, "Duration of one draft/verify round."),
    (
        DRAFT_DURATION,
        "Duration of a Draft call, client or server side.",
    ),
    (
        VERIFY_DURATION,
        "Duration of a Verify call, client or server side.",
    ),
    (
        TIME_TO_FIRST_TOKEN,
        "Time from request start to its first token.",
    ),
    (
        TIME_PER_OUTPUT_TOKEN,
        "Mean time per output token after the first, per request.",
    ),
    (BLOCK_SIZE, "Block size (bonus plus drafts) of each round."),
    (VERIFY_BATCH_ROWS, "Rows per verifier forward."),
    (
        QUEUE_DEPTH,
        "Work waiting: admitted requests (router) or rows (verifier).",
    ),
    (ACTIVE_REQUESTS, "Requests in flight."),
    (ACTIVE_SEQUENCES, "Live verifier sequences."),
    (DRAFTER_SESSIONS, "Open drafter sessions."),
    (KV_BYTES, "Bytes held by the verifier's K/V caches."),
    (
        FALLBACKS,
        "Requests that continued without speculation, by cause.",
    ),
    (
        SPECULATION_SWITCHES,
        "Speculation switched on or off by the policy.",
    ),
    (
        SPECULATION_CAP,
        "Block-size cap of the speculation governor (1: speculation off, 0: no cap).",
    ),
    (
        WIRE_BYTES,
        "Protobuf bytes of RPC messages, by rpc and direction.",
    ),
    (
        PREDRAFTS,
        "Rounds that asked for the drafter's pre-draft, by whether it matched (outcome).",
    ),
    (
        OVERLAP_SWITCHES,
        "Pre-drafting (overlap) switched on or off by the router's measurements, by state.",
    ),
    (
        PREFIX_CACHE_HIT_TOKENS,
        "Prompt tokens whose K/V came from the prefix cache, by service.",
    ),
    (
        PREFIX_CACHE_LOOKUPS,
        "New sequences (verifier) or sessions (drafter) that looked up the prefix cache.",
    ),
    (
        PREFIX_CACHE_BYTES,
        "Bytes of K/V the prefix cache holds, by service.",
    ),
    (
        PREFIX_CACHE_EVICTIONS,
        "Cached prefixes evicted to stay within their bound or the K/V budget, by service.",
    ),
    (
        VERIFIER_MIGRATIONS,
        "Requests moved to another verifier replica after theirs failed.",
    ),
];
