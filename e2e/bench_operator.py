"""Benchmark (not a test): N InferenceServices applied at once on the e2e control plane.

    python -m e2e.bench_operator [--count 100] [--out bench-results/operator]

Reports, for each service, the time from its create call returning to its Deployment
appearing in a watch (p50/p99/max), the time until every one is Ready, the operator's
resident memory (idle; "warm idle", after one service was created and deleted before the
burst; with every service; peak; and once all are deleted again) and its status writes.
Then the control plane's own share: the same burst with an "ideal operator" (each
Deployment applied by a thread pool as soon as a watch sees its InferenceService, no
operator running), whose latencies are the floor on this machine.
Writes operator.json and operator.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch
from tqdm import tqdm

from e2e import cluster as e2e_cluster
from e2e import isvc
from e2e.operator_process import OperatorProcess, install_crd, install_rbac


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of PID in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of PID so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watch_deployments(apps: client.AppsV1Api, namespace: str, seen: dict, stop: threading.Event):
    w = watch.Watch()
    for event in w.stream(apps.list_namespaced_deployment, namespace, timeout_seconds=120):
        name = event["object"].metadata.name
        seen.setdefault(name, time.monotonic())
        if stop.is_set():
            w.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(count: int, out: Path) -> dict:
    cluster = e2e_cluster.status() or e2e_cluster.up()
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    install_crd(client.ApiextensionsV1Api(api))
    install_rbac(api)
    wait_no_other_services(custom)
    namespace = f"bench-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    operator = OperatorProcess(cluster, Path(tempfile.mkdtemp(prefix="octavo-bench-")))
    operator.start()
    idle_rss, _ = rss_mib(operator.proc.pid)
    warm_idle_rss = warm_up(custom, core, namespace, operator)
    cpu_at_start = cpu_seconds(operator.proc.pid)
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_deployments, args=(apps, namespace, seen, stop))
    watcher.start()
    created: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"svc-{i:03d}"
        isvc.create(
            custom, namespace, isvc.manifest(name, {"replicas": 1, "resources": {"gpu": 0}})
        )
        created[name] = time.monotonic()

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(tqdm(pool.map(create, range(count)), total=count, desc="creating"))
    with tqdm(total=count, desc="deployments") as bar:
        while len(seen) < count and time.monotonic() - started < 120:
            bar.update(len(seen) - bar.n)
            time.sleep(0.05)
        bar.update(len(seen) - bar.n)
    all_deployments = max(seen.values()) - started if seen else float("nan")
    ready_at = wait_all_ready(custom, namespace, count, started)
    rss, peak = rss_mib(operator.proc.pid)
    cpu = cpu_seconds(operator.proc.pid) - cpu_at_start
    operator_metrics = scrape(operator.metrics())
    stop.set()
    rss_deleted = delete_all_and_measure(custom, core, namespace, operator)
    heap_deleted = {
        f"{name}_after_delete": value
        for name, value in scrape(operator.metrics()).items()
        if "_heap_" in name
    }
    latencies = [max(0.0, seen[n] - created[n]) for n in created if n in seen]
    result = {
        "count": count,
        "deployments_seen": len(seen),
        "latency_p50_s": statistics.median(latencies),
        "latency_p99_s": percentile(latencies, 0.99),
        "latency_max_s": max(latencies),
        "all_deployments_s": all_deployments,
        "all_ready_s": ready_at,
        "operator_rss_idle_mib": idle_rss,
        "operator_rss_warm_idle_mib": warm_idle_rss,
        "operator_rss_mib": rss,
        "operator_rss_peak_mib": peak,
        "operator_rss_after_delete_mib": rss_deleted,
        "operator_cpu_seconds": cpu,
        **operator_metrics,
        **heap_deleted,
    }
    operator.stop()
    core.delete_namespace(namespace)
    floor = control_plane_floor(api, count)
    result.update(floor_p50_s=statistics.median(floor), floor_p99_s=percentile(floor, 0.99))
    result["operator_share_of_p99"] = 1 - result["floor_p99_s"] / result["latency_p99_s"]
    write(out, result, latencies)
    return result


def warm_up(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
) -> float:
    """One service created, Ready, deleted and forgotten before the burst: the operator's
    RSS then ("warm idle"), with the code and caches that its first reconcile loads
    once (imports, API client models, kopf's per-resource machinery) already counted."""
    spec = {"replicas": 1, "resources": {"gpu": 0}}
    isvc.create(custom, namespace, isvc.manifest("warm-up", spec))
    wait_all_ready(custom, namespace, 1, time.monotonic())
    return delete_all_and_measure(custom, core, namespace, operator)


def delete_all_and_measure(
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
) -> float:
    """Delete every service, wait until the operator has forgotten them and their pods are
    gone; its RSS then."""
    for item in custom.list_namespaced_custom_object(
        isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL
    )["items"]:
        custom.delete_namespaced_custom_object(
            isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, item["metadata"]["name"]
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tracked = [
            line
            for line in operator.metrics().splitlines()
            if line.startswith("octavo_operator_tracked_services ")
        ]
        if tracked and float(tracked[0].split()[1]) == 0:
            break
        time.sleep(0.5)
    # Garbage collection then deletes the children and pods (their watch events reach the
    # operator); it gives memory back a few seconds after the last deletion (memory.py),
    # and its burst threads exit after 5 idle seconds (elastic_executor.py).
    while time.monotonic() < deadline and core.list_namespaced_pod(namespace).items:
        time.sleep(1)
    time.sleep(15)
    return rss_mib(operator.proc.pid)[0]


def control_plane_floor(api: client.ApiClient, count: int, workers: int = 64) -> list[float]:
    """Latencies with an ideal operator: the same burst of creates, each InferenceService's
    Deployment applied by a thread pool as soon as a watch sees it (no kopf, no status,
    no Service): what this control plane alone takes."""
    from octavo_operator.api.service import InferenceService
    from octavo_operator.builders.deployment import deployment
    from octavo_operator.kube import Kube

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom, kube = client.CustomObjectsApi(api), Kube(api)
    namespace = f"bench-floor-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    seen: dict[str, float] = {}
    created: dict[str, float] = {}
    stop = threading.Event()
    threading.Thread(target=watch_deployments, args=(apps, namespace, seen, stop)).start()
    pool = ThreadPoolExecutor(workers)

    def apply_on_sight() -> None:
        w = watch.Watch()
        list_isvc = custom.list_namespaced_custom_object
        for event in w.stream(
            list_isvc, isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL, timeout_seconds=120
        ):
            body = event["object"]
            pool.submit(kube.apply, deployment(InferenceService.from_body(body), isvc.FAKE_IMAGE))
            if stop.is_set():
                w.stop()

    threading.Thread(target=apply_on_sight, daemon=True).start()
    time.sleep(1)  # the watch is open

    def create(i: int) -> None:
        name = f"svc-{i:03d}"
        isvc.create(
            custom, namespace, isvc.manifest(name, {"replicas": 1, "resources": {"gpu": 0}})
        )
        created[name] = time.monotonic()

    with ThreadPoolExecutor(16) as creators:
        list(tqdm(creators.map(create, range(count)), total=count, desc="floor"))
    deadline = time.monotonic() + 120
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    pool.shutdown(wait=False)
    core.delete_namespace(namespace)
    return [max(0.0, seen[n] - created[n]) for n in created if n in seen]


def wait_no_other_services(custom: client.CustomObjectsApi, timeout: float = 300) -> None:
    """Measure on a quiet cluster: earlier runs' services must be gone (the operator would
    otherwise resume them at start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = custom.list_cluster_custom_object(isvc.GROUP, isvc.VERSION, isvc.PLURAL)["items"]
        if not left:
            return
        time.sleep(1)
    raise RuntimeError(f"{len(left)} InferenceServices still exist; delete them first")


def scrape(text: str) -> dict[str, float]:
    """The operator's own counters: reconciles, their total time, status writes, and its C
    heap (live and freed-but-kept MiB)."""
    wanted = {
        "octavo_operator_reconcile_duration_seconds_count": "reconciles",
        "octavo_operator_reconcile_duration_seconds_sum": "reconcile_seconds_total",
        "octavo_operator_status_updates_total": "status_updates",
    }
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[wanted[name]] = float(value)
        elif name.startswith(("octavo_operator_reconciles_total{", "octavo_operator_drift")):
            out[name] = float(value)
        elif name.startswith("octavo_operator_heap_"):  # bytes -> MiB
            out[name.removesuffix("_bytes") + "_mib"] = float(value) / 2**20
    return out


def wait_all_ready(custom: client.CustomObjectsApi, namespace: str, count: int, t0: float) -> float:
    with tqdm(total=count, desc="Ready=True") as bar:
        while time.monotonic() - t0 < 300:
            items = custom.list_namespaced_custom_object(
                isvc.GROUP, isvc.VERSION, namespace, isvc.PLURAL
            )["items"]
            ready = sum(isvc.condition(o, "Ready").get("status") == "True" for o in items)
            bar.update(ready - bar.n)
            if ready >= count:
                return time.monotonic() - t0
            time.sleep(0.5)
    return float("nan")


def write(out: Path, result: dict, latencies: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "operator.json").write_text(json.dumps(result, indent=2))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist([x * 1000 for x in latencies], bins=30)
    ax.axvline(result["latency_p99_s"] * 1000, color="red", label="p99")
    ax.axvline(1000, color="black", linestyle="--", label="target p99 1 s")
    ax.set_xlabel("create -> Deployment exists (ms)")
    ax.set_ylabel("InferenceServices")
    ax.set_title(f"{result['count']} InferenceServices applied at once")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "operator.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench-results/operator"))
    args = parser.parse_args()
    result = run(args.count, args.out)
    print(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'operator.json'} and {args.out / 'operator.png'}")


if __name__ == "__main__":
    main()
