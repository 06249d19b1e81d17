//! The telemetry contract's key lists and columns, transcribed from spec/bmoe-telemetry.md
//! (not read from our writer's code), shared by the tests that parse sluice's output.
#![allow(dead_code)] // each test file uses a different subset

/// `BMOE_PROGRESS` keys and their JSON types ("int", "float", "string"); `reset` is optional
/// and only ever `1`.
pub const PROGRESS_KEYS: &[(&str, &str)] = &[
    ("step", "int"),
    ("steps", "int"),
    ("wall_ms", "float"),
    ("io_ms", "float"),
    ("compute_ms", "float"),
    ("mgmt_ms", "float"),
    ("stall_ms", "float"),
    ("read_mb", "float"),
    ("cache_hit_pct", "float"),
    ("majflt", "int"),
    ("cpu_ms", "float"),
    ("dense_resident_frac", "float"),
    ("delta_reasoning", "string"),
    ("delta_text", "string"),
];

pub const LOAD_KEYS: &[(&str, &str)] = &[("mb", "float"), ("ms", "float")];

/// The per-token CSV columns, in order.
pub const CSV_COLUMNS: &[&str] = &[
    "step",
    "steps",
    "wall_ms",
    "io_ms",
    "compute_ms",
    "read_bytes",
    "cache_hit_pct",
    "stall_ms",
    "mgmt_ms",
    "majflt",
    "cpu_ms",
    "dense_resident_frac",
    "turn",
    "majflt_mib",
    "cache_budget_mib",
    "rss_mib",
    "rss_anon_mib",
    "rss_file_mib",
    "swap_mib",
    "mem_available_mib",
    "mem_free_mib",
    "swap_free_mib",
    "loop_overhead_ms",
    "mtp_batch",
    "mtp_draft_ms",
    "drain_ms",
    "adopt_ms",
    "ra_issue_ms",
    "ra_wd_ms",
];

/// Integer columns (the rest are numbers).
pub const CSV_INT_COLUMNS: &[&str] =
    &["step", "steps", "read_bytes", "majflt", "turn", "mtp_batch"];

/// Preamble keys, by the `#` line they start or sit on.
pub const PREAMBLE_MODEL: &[&str] = &[
    "model",
    "arch",
    "n_layer",
    "n_expert",
    "n_expert_used",
    "threads",
    "n_ctx",
    "n_ubatch",
    "chatml",
];

pub const PREAMBLE_STREAM: &[&str] = &[
    "moe_stream",
    "cache_mb",
    "cache_auto",
    "cache_floor_mb",
    "cache_ceil_mb",
    "cache_cycle_mb",
    "force_cache",
    "load_all",
    "io_threads",
    "o_direct",
    "overlap",
    "io_two_wave",
    "prefetch",
    "route_ahead",
    "predict_prefetch",
    "predict_log",
    "predict_spec_max",
    "prefetch_sync",
    "dense_weights",
    "drop_cold_frac",
    "drop_renorm",
    "drop_prefill",
    "substitute_lambda",
];

pub const PREAMBLE_SAMPLING: &[&str] = &[
    "temp",
    "top_k",
    "top_p",
    "seed",
    "compute_trace_layers",
    "spec",
    "spec_draft_max",
    "mtp_p_min",
    "ngram_min_match",
];

/// `# summary` keys the spec names (the trailer "gains" these; the `mtp_*` ones only under
/// speculation, which sluice does not do).
pub const SUMMARY_KEYS: &[&str] = &[
    "stall_s/tok",
    "mgmt_s/tok",
    "majflt/tok",
    "cpu_s/tok",
    "token_demand_MiB",
    "experts_routed",
    "experts_dropped",
    "experts_reranked",
    "experts_substituted",
    "row_table_MiB",
    "row_resident_MiB",
    "row_rows",
    "row_reads",
    "row_read_MiB",
    "row_evictions",
    "row_io_errors",
    "layer_demand_MiB",
    "loop_overhead_s/tok",
    "drain_s/tok",
    "adopt_s/tok",
    "evictions",
    "rereads",
    "ra_committed",
    "ra_passthrough",
    "ra_agree_pct",
    "ra_gemv_ms/tok",
    "ra_issue_ms/tok",
    "ra_wd_ms/tok",
    "prefill_cpu_s",
    "prefill_read_mib",
    "prefill_io_s",
    "prefill_stall_s",
    "prefill_mgmt_s",
    "prefill_dev_tokens",
    "prefill_dev_nodes",
    "prefill_dev_read_mib",
    "prefill_dev_stall_s",
];
