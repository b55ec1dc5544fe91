"""Every diagnostic code servesim reports: one named constant each.

A code is the stable kebab-case name at the end of a diagnostic's line
(``path: message [code]``); scripts may match on it. Code raises diagnostics with these
constants, never with a string of its own; ``docs/diagnostics.md`` lists every one, and
``tests/test_codes.py`` keeps the module, the code base and the list in step. A plugin
may report codes of its own (named after it, e.g. ``static-batch-feature``).

This module imports nothing: every layer may use it.
"""

from __future__ import annotations

# -- Values and keys ---------------------------------------------------------------------

WRONG_TYPE = "wrong-type"
"""A value has the wrong TOML/JSON type (a string where a number belongs, a table where
a list belongs)."""

NOT_FINITE = "not-finite"
"""A number is NaN or infinite."""

OUT_OF_RANGE = "out-of-range"
"""A number is outside its documented limits (the message names them), or a derived
total exceeds what a replay holds."""

UNKNOWN_KEY = "unknown-key"
"""A key servesim does not know at this place (the message lists the allowed keys, with
a "did you mean")."""

MISSING_KEY = "missing-key"
"""A required key is missing."""

BAD_CHOICE = "bad-choice"
"""A string is not one of the allowed values (the message lists them)."""

INVALID_VALUE = "invalid-value"
"""A value the converter cannot read for another reason (the message says why)."""

EMPTY_VALUE = "empty-value"
"""A string that must name something is empty."""

# -- Files -------------------------------------------------------------------------------

EMPTY_CONFIG = "empty-config"
"""The config file is empty."""

NOT_UTF8 = "not-utf8"
"""The config file is not UTF-8 text."""

TOML_SYNTAX = "toml-syntax"
"""The config is not valid TOML (a payload given to a command that wants a config is
named as such)."""

FILE_NOT_FOUND = "file-not-found"
"""A file the input names does not exist."""

FILE_UNREADABLE = "file-unreadable"
"""A file the input names cannot be read (permissions, a folder, an I/O error)."""

FILE_TOO_LARGE = "file-too-large"
"""A file is larger than servesim reads for its kind."""

# -- Deployment --------------------------------------------------------------------------

NOT_SUPPORTED = "not-supported"
"""A feature the config asks for is not modelled (the message names the alternative)."""

UNSUPPORTED_FIELD = "unsupported-field"
"""A field that has no effect in this deployment."""

MISSING_ROLE = "missing-role"
"""The workers of the deployment's mode are missing (aggregated, or prefill and decode)."""

ROLE_MODE_MISMATCH = "role-mode-mismatch"
"""Workers or KV transfer that do not belong to the deployment's mode."""

ROLE_MISMATCH = "role-mismatch"
"""A payload role's worker_type is not its role name."""

UNKNOWN_MODE = "unknown-mode"
"""engine.mode is neither aggregated nor disaggregated (payload check)."""

HARDWARE_OVERRIDE = "hardware-override"
"""A per-worker hardware override where it is not allowed, or not one GPU name."""

UNKNOWN_MODEL = "unknown-model"
"""engine.model names no catalog model or model folder."""

UNKNOWN_HARDWARE = "unknown-hardware"
"""A GPU name the catalog does not know."""

UNUSED_PRICE = "unused-price"
"""A payload prices a GPU none of its roles runs on."""

BAD_MODEL_CONFIG = "bad-model-config"
"""A model's config.json cannot be used (malformed, missing sizes)."""

UNSUPPORTED_KV_DTYPE = "unsupported-kv-dtype"
"""engine.kvcache_quant_mode is not a KV-cache precision."""

UNKNOWN_BACKEND = "unknown-backend"
"""A payload names a backend no plugin registered."""

BACKEND_FIELD = "backend-field"
"""A scheduler field the chosen backend does not have."""

BLOCK_SIZE_TOO_SMALL = "block-size-too-small"
"""A block size the backend cannot run."""

INDIVISIBLE_HEADS = "indivisible-heads"
"""The attention heads do not split evenly over the tensor-parallel GPUs."""

PIPELINE_OVER_LAYERS = "pipeline-over-layers"
"""More pipeline stages than the model has layers."""

MOE_PARALLEL_DENSE = "moe-parallel-dense"
"""Expert parallelism asked of a model without routed experts."""

MOE_PARALLEL_SHAPE = "moe-parallel-shape"
"""moe_tensor x moe_expert does not match the GPUs of the attention group, or exceeds
the experts."""

# -- KV cache and state cache ------------------------------------------------------------

CAPACITY_DEFAULT = "capacity-default"
"""Default KV capacity given blocks or bytes (which belong to fixed capacity)."""

CAPACITY_FIXED = "capacity-fixed"
"""Fixed KV capacity without exactly one of blocks or bytes."""

CAPACITY_TOO_SMALL = "capacity-too-small"
"""A fixed KV capacity smaller than one block."""

HOST_OFFLOAD_CAPACITY = "host-offload-capacity"
"""host_offload without exactly one of capacity_blocks or capacity_gb, or with less than
one block of host memory."""

HOST_OFFLOAD_BANDWIDTH = "host-offload-bandwidth"
"""host_offload without bandwidth_gb_per_second on a GPU whose catalog entry gives no PCIe
bandwidth."""

HOST_OFFLOAD_CONFLICT = "host-offload-conflict"
"""host_offload with prefix_caching off or with a state_cache (the host tier holds prefix
blocks of token KV only)."""

NO_KV_BUDGET = "no-kv-budget"
"""The model's weights leave no GPU memory for the KV cache (the message names the
remedies)."""

MANUAL_GEOMETRY = "manual-geometry"
"""Manual KV capacity without an explicit block size or bytes per token."""

STATE_CACHE_INFERENCE = "state-cache-inference"
"""The state cache's size cannot be inferred from the model."""

STATE_CACHE_BACKEND = "state-cache-backend"
"""A state cache on a backend that does not model one."""

STATE_CACHE_BLOCK = "state-cache-block"
"""A state cache with a block size too small for it."""

STATE_CACHE_BLOCKS = "state-cache-blocks"
"""State-cache block counts that disagree with its bytes (payload check)."""

STATE_CACHE_CAPACITY = "state-cache-capacity"
"""A state cache without fixed capacity, or a pool too small for one request's state."""

PREFIX_MATCH_UNIT_NOT_DIVISOR = "prefix-match-unit-not-divisor"
"""prefix_match_unit does not divide the block size."""

PREFIX_MATCH_UNIT_REQUIRES_STATE_CACHE = "prefix-match-unit-requires-state-cache"
"""prefix_match_unit without a state cache."""

PREFIX_MATCH_UNIT_SPECULATION = "prefix-match-unit-speculation"
"""prefix_match_unit combined with speculative decoding."""

# -- Speculative decoding and P/D --------------------------------------------------------

SPECULATION_BACKEND = "speculation-backend"
"""A speculation kind the backend does not run."""

SPECULATION_NEXTN = "speculation-nextn"
"""speculation combined with the legacy nextn key."""

SPECULATION_RATES = "speculation-rates"
"""acceptance_rates does not hold one rate per speculative token."""

SPECULATION_TOKENS = "speculation-tokens"
"""num_speculative_tokens outside its range (payload check)."""

NEXTN_ACCEPTED = "nextn-accepted"
"""Legacy nextn without a valid nextn_accepted."""

PD_BACKEND = "pd-backend"
"""Prefill and decode workers on different backends."""

PD_MODEL = "pd-model"
"""Prefill and decode workers serving different models."""

PD_STATE_CACHE = "pd-state-cache"
"""A state cache on only one side of a P/D deployment, or KV-transfer state bytes that
disagree with it."""

REQUEST_UNSCHEDULABLE = "request-unschedulable"
"""A request that can never be scheduled (its uncached prompt exceeds the token budget
or the pool)."""

# -- Timing ------------------------------------------------------------------------------

TIMING_FIXED = "timing-fixed"
"""Fixed timing without both step times, or step times given to another timing type."""

TIMING_TABLE = "timing-table"
"""Table timing without a CSV path, or a path given to another timing type."""

TIMING_QUANT = "timing-quant"
"""A precision key the timing type does not read."""

TIMING_UNSUPPORTED = "timing-unsupported"
"""A precision or model the default timing cannot price."""

TIMING_UNAVAILABLE = "timing-unavailable"
"""An unknown timing type at replay, or one whose optional package is missing."""

TIMING_FALLBACK = "timing-fallback"
"""Warning: the measured tables do not cover a role; it is priced by the default timing."""

TIMING_INVALID = "timing-invalid"
"""A timer returned a price that is not a finite number of ms >= 0."""

TIMING_CALIBRATION = "timing-calibration"
"""A calibration file cannot be used."""

TIMING_TABLE_GRID = "timing-table-grid"
"""A timing table's rows do not form a complete grid."""

TIMING_TABLE_INVALID = "timing-table-invalid"
"""A timing table row is malformed."""

TIMING_TABLE_RANGE = "timing-table-range"
"""A timing table has no rows for the passes a role runs."""

# -- Traffic and traces ------------------------------------------------------------------

STOP_OVER_LIMIT = "stop-over-limit"
"""A derived stop count above the most a replay holds."""

SLA_EMPTY = "sla-empty"
"""An SLA key set to an empty table (it sets no target)."""

SLA_UNKNOWN_STAT = "sla-unknown-stat"
"""An SLA table names a statistic the report does not have (the message lists them)."""

SLA_DUPLICATE = "sla-duplicate"
"""Two SLA entries bound the same statistic (e.g. tpot_ms and the deprecated itl_ms number)."""

DEPRECATED_KEY = "deprecated-key"
"""Warning: a key kept for one release with its old meaning; the hint names its replacement."""

TRAFFIC_KEY = "traffic-key"
"""A traffic source key its source type does not accept."""

TRAFFIC_LOAD = "traffic-load"
"""A load type the traffic source cannot drive."""

TRAFFIC_STOP = "traffic-stop"
"""Stop conditions that conflict or do not apply."""

TRAFFIC_VALUE = "traffic-value"
"""Traffic values that contradict each other."""

TRAFFIC_LENGTH = "traffic-length"
"""A length distribution table that cannot be used (a missing or unknown parameter, min
above max)."""

BAD_LENGTH_FILE = "bad-length-file"
"""An empirical length file cannot be read as lengths (missing, empty, truncated, not numbers)."""

BAD_WORKLOAD = "bad-workload"
"""A workload that cannot be replayed (an unsupported trace format, a bad payload
workload)."""

ARRIVAL_TOO_LATE = "arrival-too-late"
"""A request arrives past the virtual time a replay covers."""

TRACE_BAD_DELAY = "trace-bad-delay"
"""A session turn's delay cannot be used."""

TRACE_BAD_FIELD = "trace-bad-field"
"""A trace field of the wrong type or value, or two fields that disagree."""

TRACE_BAD_JSON = "trace-bad-json"
"""A trace line is not valid JSON (or not UTF-8)."""

TRACE_BAD_ROW = "trace-bad-row"
"""A trace line is not one JSON object, or too long."""

TRACE_EMPTY = "trace-empty"
"""The trace has no rows."""

TRACE_MISSING_FIELD = "trace-missing-field"
"""A trace row lacks a required field."""

TRACE_UNKNOWN_KEY = "trace-unknown-key"
"""A trace row has a key the format does not define."""

TRACE_UNREADABLE = "trace-unreadable"
"""The trace file cannot be read."""

TRACE_UNSORTED = "trace-unsorted"
"""Trace sessions are not in timestamp order."""

WORKLOAD_DUPLICATE_ID = "workload-duplicate-id"
"""A request id arrived twice while in flight (a plugin workload's bug)."""

WORKLOAD_ORDER = "workload-order"
"""A workload produced an arrival earlier than the current virtual time."""

# -- Replay and payloads -----------------------------------------------------------------

REPLAY_STUCK = "replay-stuck"
"""A replay repeats one state without progress (a scheduler bug, reported instead of
hanging)."""

INVARIANT_VIOLATED = "invariant-violated"
"""An invariant of the replay kernel failed (a bug in servesim or a plugin engine)."""

NOTHING_COMPLETED = "nothing-completed"
"""No request of the replay completed (the message says why)."""

PAYLOAD_JSON = "payload-json"
"""A payload file is not JSON."""

PAYLOAD_NOT_OBJECT = "payload-not-object"
"""A payload is not a JSON object."""

PAYLOAD_VERSION = "payload-version"
"""A payload of a schema version this servesim does not read."""

# -- Plugins -----------------------------------------------------------------------------

ENGINE_MODE = "engine-mode"
"""The selected engine does not run the deployment's mode."""

UNKNOWN_ENGINE = "unknown-engine"
"""engine.engine names no registered engine."""

UNKNOWN_TIMING = "unknown-timing"
"""A timing type no plugin registered."""

UNKNOWN_ROUTER = "unknown-router"
"""A routing type no plugin registered (config or payload)."""

UNKNOWN_TRACE_FORMAT = "unknown-trace-format"
"""A trace format no plugin registered."""

PLUGIN_ERROR = "plugin-error"
"""Plugin code raised or returned what it may not (the message names the plugin and
hook)."""

PLUGIN_LOAD_FAILED = "plugin-load-failed"
"""An entry-point plugin cannot be imported or registered."""

PLUGIN_IMPORT = "plugin-import"
"""A --plugin module cannot be imported."""

PLUGIN_BAD_REGISTRATION = "plugin-bad-registration"
"""A registration hook returned something servesim cannot register."""

DUPLICATE_ENGINE = "duplicate-engine"
"""Two plugins register an engine of the same name."""

DUPLICATE_BACKEND = "duplicate-backend"
"""Two plugins register a backend of the same name."""

DUPLICATE_TIMING_PROVIDER = "duplicate-timing-provider"
"""Two plugins register a timing provider of the same name."""

DUPLICATE_ROUTER = "duplicate-router"
"""Two plugins register a router of the same name."""

DUPLICATE_TRACE_FORMAT = "duplicate-trace-format"
"""Two plugins register a trace format of the same name."""

MISSING_EXTRA = "missing-extra"
"""A feature needs an optional extra that is not installed (the hint names the pip
command)."""

# -- Commands ----------------------------------------------------------------------------

BAD_ARGUMENT = "bad-argument"
"""A command-line option's value is outside what it accepts."""

BAD_OVERRIDE = "bad-override"
"""A --set override cannot be applied."""

OUTPUT_PATH = "output-path"
"""An output file cannot be written, or would overwrite an input or another output."""

OUTPUT_EXISTS = "output-exists"
"""An output file exists and the command does not overwrite it without --force."""

MEASUREMENT_INVALID = "measurement-invalid"
"""A measurements file for calibrate cannot be read as measurements."""

CALIBRATE_POINTS = "calibrate-points"
"""Too many measured points to calibrate on."""

CALIBRATE_TIMING = "calibrate-timing"
"""A timing type calibrate cannot fit."""

BAD_JOBS = "bad-jobs"
"""--jobs outside its range."""

BAD_SPACE = "bad-space"
"""A sweep or search space that cannot be used."""

NO_VALID_POINT = "no-valid-point"
"""No point of a sweep or search could be replayed."""

SEARCH_STORAGE = "search-storage"
"""A search's storage file cannot be used as asked."""

RAY_CONNECT = "ray-connect"
"""The Ray cluster cannot be reached."""

RESULTS_FILE = "results-file"
"""A file servesim report cannot read."""

INIT_NO_FIT = "init-no-fit"
"""servesim init found no deployment of the model on the GPU (up to its node limit)."""
