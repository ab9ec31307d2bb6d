//! The Prometheus metric names of the telemetry contract (deploy/metrics.txt), defined once:
//! the round loop and the governor record under them through the `metrics` facade, and the
//! telemetry crate describes and exports them. Histograms are in seconds unless their name
//! says otherwise.

pub const REQUESTS: &str = "specd_requests_total";
pub const ROUNDS: &str = "specd_rounds_total";
pub const DRAFTED_TOKENS: &str = "specd_drafted_tokens_total";
pub const ACCEPTED_TOKENS: &str = "specd_accepted_tokens_total";
pub const EMITTED_TOKENS: &str = "specd_emitted_tokens_total";
pub const ROUND_DURATION: &str = "specd_round_duration_seconds";
pub const DRAFT_DURATION: &str = "specd_draft_duration_seconds";
pub const VERIFY_DURATION: &str = "specd_verify_duration_seconds";
pub const TIME_TO_FIRST_TOKEN: &str = "specd_time_to_first_token_seconds";
pub const TIME_PER_OUTPUT_TOKEN: &str = "specd_time_per_output_token_seconds";
pub const BLOCK_SIZE: &str = "specd_block_size";
pub const VERIFY_BATCH_ROWS: &str = "specd_verify_batch_rows";
pub const QUEUE_DEPTH: &str = "specd_queue_depth";
pub const ACTIVE_REQUESTS: &str = "specd_active_requests";
pub const ACTIVE_SEQUENCES: &str = "specd_active_sequences";
pub const DRAFTER_SESSIONS: &str = "specd_drafter_sessions";
pub const KV_BYTES: &str = "specd_kv_bytes";
pub const FALLBACKS: &str = "specd_fallbacks_total";
pub const SPECULATION_SWITCHES: &str = "specd_speculation_switches_total";
pub const SPECULATION_CAP: &str = "specd_speculation_cap";
pub const WIRE_BYTES: &str = "specd_wire_bytes_total";
pub const VERIFIER_MIGRATIONS: &str = "specd_verifier_migrations_total";
pub const PREDRAFTS: &str = "specd_predraft_total";
pub const OVERLAP_SWITCHES: &str = "specd_overlap_switches_total";
pub const PREFIX_CACHE_HIT_TOKENS: &str = "specd_prefix_cache_hit_tokens_total";
pub const PREFIX_CACHE_LOOKUPS: &str = "specd_prefix_cache_lookups_total";
pub const PREFIX_CACHE_BYTES: &str = "specd_prefix_cache_bytes";
pub const PREFIX_CACHE_EVICTIONS: &str = "specd_prefix_cache_evictions_total";
