"""The operator's own Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from octavo_operator.memory import heap_usage

RECONCILES = Counter(
    "octavo_operator_reconciles_total",
    "InferenceService reconciles, by trigger and result",
    ["trigger", "result"],
)
RECONCILE_SECONDS = Histogram(
    "octavo_operator_reconcile_duration_seconds",
    "Time to apply an InferenceService's children",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
STATUS_UPDATES = Counter(
    "octavo_operator_status_updates_total", "InferenceService status patches written"
)
DRIFT_CORRECTIONS = Counter(
    "octavo_operator_drift_corrections_total",
    "Children put back after being deleted or edited by someone else",
    ["kind"],
)
LEADER = Gauge(
    "octavo_operator_leader", "1 while this replica holds the Lease and reconciles (or runs alone)"
)
TRACKED_SERVICES = Gauge(
    "octavo_operator_tracked_services",
    "InferenceServices the operator keeps state for (back to 0 once they are all deleted)",
)
SWEPT_SERVICES = Counter(
    "octavo_operator_swept_services_total",
    "Deleted InferenceServices forgotten by the periodic check against the API server, "
    "their DELETED event never seen",
)
HEAP_IN_USE = Gauge(
    "octavo_operator_heap_in_use_bytes",
    "Bytes of live allocations in the C heap (glibc's mallinfo2; NaN elsewhere)",
)
HEAP_FREE = Gauge(
    "octavo_operator_heap_free_bytes",
    "Bytes freed but kept inside the C heap: resident memory that is not live data",
)
HEAP_IN_USE.set_function(lambda: _heap_field("in_use"))
HEAP_FREE.set_function(lambda: _heap_field("free"))
SCALED_TO_ZERO = Counter(
    "octavo_operator_scaled_to_zero_total", "Idle InferenceServices set to 0 replicas"
)
ACTIVATOR_REQUESTS = Counter(
    "octavo_operator_activator_requests_total",
    "Requests the activator received, by outcome (forwarded, no_service, timeout, error)",
    ["result"],
)
ACTIVATOR_WAIT_SECONDS = Histogram(
    "octavo_operator_activator_wait_seconds",
    "Time a request waited in the activator for a ready pod",
    buckets=(0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600),
)


def _heap_field(name: str) -> float:
    usage = heap_usage()
    return float("nan") if usage is None else float(getattr(usage, name))
