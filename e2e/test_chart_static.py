"""Static checks of the Helm chart (charts/octavo) and the plain manifests (manifests/).

No cluster: helm renders offline (`helm template`, `helm lint`), kubernetes-validate checks
the output against Kubernetes 1.36's OpenAPI schemas, and the rendered objects are read field
by field. Applying them to a real apiserver is other tests' business.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator
from yamllint import linter
from yamllint.config import YamlLintConfig

from e2e.cluster import build

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "octavo"
ALL_VALUES = CHART / "ci" / "all-values.yaml"
CRD_FILE = CHART / "files" / "crds" / "inferenceservices.octavo.dev.yaml"
RULES_FILE = CHART / "files" / "rbac" / "clusterrole-rules.yaml"
DASHBOARDS = CHART / "dashboards"
MANIFESTS = ROOT / "manifests"
OPERATOR_MANIFEST = MANIFESTS / "octavo-operator.yaml"
EXAMPLES = MANIFESTS / "examples"
RENDER_SCRIPT = ROOT / "scripts" / "render_manifests.py"

RELEASE = "octavo"
NAMESPACE = "octavo-system"
MONITORING_API = "monitoring.coreos.com/v1"
KUBE_VERSION = "1.36.0"
CRD_NAME = "inferenceservices.octavo.dev"
OPERATOR = "octavo-operator"
ISVC_API = "octavo.dev/v1alpha1"

Helm = Callable[..., subprocess.CompletedProcess[str]]
Obj = dict[str, Any]


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    return build.ensure_built(("helm",))["helm"]


@pytest.fixture(scope="module")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return offline_helm(helm_binary, tmp_path_factory.mktemp("helm-home"))


def offline_helm(helm_binary: Path, home: Path) -> Helm:
    """Runs helm offline with its cache/config/data homes in a temporary folder."""
    env = {
        **os.environ,
        **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
    }
    env.pop("KUBECONFIG", None)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(helm_binary), *args], env=env, capture_output=True, text=True, timeout=120
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


def template_args(*extra: str, chart: Path = CHART) -> list[str]:
    return ["template", RELEASE, str(chart), "--namespace", NAMESPACE, *extra]


def all_enabled_args() -> list[str]:
    return ["--values", str(ALL_VALUES), "--api-versions", MONITORING_API]


def all_but_dashboards_args() -> list[str]:
    """Every option but the dashboards, whose JSON files come from their own owner."""
    return [*all_enabled_args(), "--set", "monitoring.dashboards.enabled=false"]


def parse_stream(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(helm: Helm, *extra: str) -> list[Obj]:
    return parse_stream(helm(*template_args(*extra)).stdout)


def find_all(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in find_all(objects, kind) if name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {len(matches)}"
    return matches[0]


def operator_container(objects: list[Obj]) -> Obj:
    pod = find(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


@pytest.fixture(scope="module")
def default_objects(helm: Helm) -> list[Obj]:
    return render(helm)


@pytest.fixture(scope="module")
def all_objects(helm: Helm) -> list[Obj]:
    return render(helm, *all_but_dashboards_args())


# --------------------------------------------------------------------------- lint and validity


def test_chart_yaml_metadata() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "octavo"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"] == ">=1.30.0-0"
    assert chart["type"] == "application"


@pytest.mark.parametrize("everything", [False, True], ids=["defaults", "all-enabled"])
def test_helm_lint_strict(helm: Helm, everything: bool) -> None:
    values = ["--values", str(ALL_VALUES)] if everything else []
    proc = helm("lint", "--strict", str(CHART), *values, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


def kubernetes_validate(manifest: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("kubernetes-validate")
    return subprocess.run(
        [str(cli), "--strict", "-k", KUBE_VERSION, "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("everything", [False, True], ids=["defaults", "all-enabled"])
def test_rendered_output_is_valid_kubernetes_1_36(helm: Helm, everything: bool) -> None:
    text = helm(*template_args(*(all_enabled_args() if everything else []))).stdout
    objects = parse_stream(text)
    proc = kubernetes_validate(text)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    # Every built-in object passed; only the custom resources (no schema here) may warn.
    custom = {"ServiceMonitor", "InferenceService"}
    builtin = [o for o in objects if o["kind"] not in custom]
    assert report.count("passed for resource") == len(builtin), report
    warned = re.findall(r"Couldn't find schema for kind (\w+)", report)
    assert set(warned) <= custom, report
    assert "ERROR" not in report


YAMLLINT = YamlLintConfig("extends: relaxed")


def yamllint_problems(text: str) -> list[str]:
    """yamllint's relaxed errors, and its warnings but for long lines (the chart's rendered
    output keeps one indentation style for sequences, so it has none)."""
    return [
        f"{p.line}:{p.column} {p.level} {p.message}"
        for p in linter.run(text, YAMLLINT)
        if p.level == "error" or p.rule != "line-length"
    ]


def test_yamllint_chart_files_and_rendered_output(helm: Helm) -> None:
    texts = {
        "values.yaml": (CHART / "values.yaml").read_text(),
        "Chart.yaml": (CHART / "Chart.yaml").read_text(),
        "ci/all-values.yaml": ALL_VALUES.read_text(),
        "helm template": helm(*template_args()).stdout,
        "helm template (all)": helm(*template_args(*all_but_dashboards_args())).stdout,
        "manifests/octavo-operator.yaml": OPERATOR_MANIFEST.read_text(),
        **{f"examples/{p.name}": p.read_text() for p in sorted(EXAMPLES.glob("*.yaml"))},
    }
    problems = {name: yamllint_problems(text) for name, text in texts.items()}
    assert {name: p for name, p in problems.items() if p} == {}


# --------------------------------------------------------------------------- values


def documented_key_violations(lines: list[str]) -> list[str]:
    """Keys of values.yaml without a comment on the line above. A key documented with
    `# -- ...` documents its whole value, so the keys inside that value need none."""
    key = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):")
    missing: list[str] = []
    payload_indent: int | None = None
    previous = ""
    for number, line in enumerate(lines, 1):
        match = key.match(line)
        if match:
            indent = len(match.group(1))
            if payload_indent is not None and indent <= payload_indent:
                payload_indent = None
            if payload_indent is None:
                if not previous.lstrip().startswith("#"):
                    missing.append(f"{number}: {line.strip()}")
                if previous.lstrip().startswith("# --"):
                    payload_indent = indent
        if line.strip():
            previous = line
    return missing


def test_values_yaml_documents_every_key() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    assert documented_key_violations(lines) == []
    # The check itself finds an undocumented key.
    assert documented_key_violations(["# a section", "a:", "  b: 1"]) == ["3: b: 1"]


def merged(base: Obj, overlay: Obj) -> Obj:
    """Helm's merge of a values file over the defaults: maps merge, everything else replaces."""
    out = dict(base)
    for key, value in overlay.items():
        both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both_maps else value
    return out


def test_values_yaml_is_valid_against_its_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    Draft7Validator.check_schema(schema)
    defaults = load_yaml(CHART / "values.yaml")
    for values in (defaults, merged(defaults, load_yaml(ALL_VALUES))):
        errors = [e.message for e in Draft7Validator(schema).iter_errors(values)]
        assert errors == []


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        (["--set", "replicaCount=two"], "/replicaCount"),
        (["--set", "crds.install=yes"], "/crds/install"),
        (["--set", "image.tag=1"], "/image/tag"),
        (["--set", "operator.watchNamespaces=team-a"], "/operator/watchNamespaces"),
        (
            ["--set", "monitoring.serviceMonitor.enabled=maybe"],
            "/monitoring/serviceMonitor/enabled",
        ),
        (["--set", "resources=small"], "/resources"),
        (["--set", "operator.logFormat=xml"], "/operator/logFormat"),
        (["--set", "replicaCount=6"], "/replicaCount"),
        (["--set", "unknownKey=1"], "unknownKey"),
    ],
)
def test_schema_rejects_wrong_values(helm: Helm, setting: list[str], field: str) -> None:
    proc = helm(*template_args(*setting), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert field in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- RBAC and CRD


def test_clusterrole_rules_are_exactly_the_generated_file(default_objects: list[Obj]) -> None:
    rules = find(default_objects, "ClusterRole", OPERATOR)["rules"]
    generated = load_yaml(RULES_FILE)
    assert isinstance(generated, list) and generated
    assert rules == generated
    flat = json.dumps(rules)
    assert "*" not in flat, "no wildcard in the operator's rules"
    binding = find(default_objects, "ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": OPERATOR,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
    ]
    sa = find(default_objects, "ServiceAccount", OPERATOR)
    assert sa["metadata"]["namespace"] == NAMESPACE


def test_crd_is_the_generated_file_and_kept_by_default(default_objects: list[Obj]) -> None:
    crd = find(default_objects, "CustomResourceDefinition", CRD_NAME)
    generated = load_yaml(CRD_FILE)
    assert crd["spec"] == generated["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "octavo"
    assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_crd_absent_with_install_false(helm: Helm) -> None:
    objects = render(helm, "--set", "crds.install=false")
    assert find_all(objects, "CustomResourceDefinition") == []
    assert find(objects, "Deployment", OPERATOR)


def test_crd_not_kept_with_keep_false(helm: Helm) -> None:
    crd = find(render(helm, "--set", "crds.keep=false"), "CustomResourceDefinition", CRD_NAME)
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_chart_and_manifests_ship_the_same_crd() -> None:
    assert load_yaml(CRD_FILE) == load_yaml(MANIFESTS / "crds" / f"{CRD_NAME}.yaml")


# --------------------------------------------------------------------------- the operator


def test_operator_deployment_defaults(default_objects: list[Obj]) -> None:
    deployment = find(default_objects, "Deployment", OPERATOR)
    assert deployment["metadata"]["namespace"] == NAMESPACE
    spec = deployment["spec"]
    assert spec["replicas"] == 2, "one leads, one stands by"
    assert spec["strategy"]["type"] == "RollingUpdate"
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    pdb = find(default_objects, "PodDisruptionBudget", OPERATOR)
    assert pdb["spec"]["minAvailable"] == 1
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/name"] == "octavo"
    assert labels["app.kubernetes.io/component"] == "operator"


def test_operator_container_hardening(default_objects: list[Obj]) -> None:
    container = operator_container(default_objects)
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }


def test_operator_container_command_env_probes_ports(default_objects: list[Obj]) -> None:
    container = operator_container(default_objects)
    assert container["image"] == "ghcr.io/octavo-dev/octavo-operator:0.1.0"
    assert container["command"] == ["octavo-operator"]
    assert container["args"] == [
        "--liveness-port",
        "8080",
        "--metrics-port",
        "8081",
        "--activator-port",
        "8082",
        "--log-format",
        "json",
        "--leader-elect",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env == {
        "OCTAVO_OPERATOR_DEFAULT_IMAGE": "ghcr.io/octavo-dev/octavo-server:0.1.0",
        "POD_NAMESPACE": None,
        "POD_NAME": None,
        "POD_IP": None,
    }
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"liveness": 8080, "metrics": 8081, "activator": 8082}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts, "a writable /tmp beside the read-only root filesystem"


def test_operator_with_every_option(all_objects: list[Obj]) -> None:
    deployment = find(all_objects, "Deployment", OPERATOR)
    pod = deployment["spec"]["template"]
    container = operator_container(all_objects)
    args = container["args"]
    assert args[args.index("--log-format") + 1] == "plain"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["team-a", "team-b"]
    assert args[-1] == "--verbose"
    assert container["image"].startswith("ghcr.io/octavo-dev/octavo-operator@sha256:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OCTAVO_OPERATOR_DEFAULT_IMAGE"] == "ghcr.io/octavo-dev/octavo-server:0.1.0-cuda"
    assert env["OCTAVO_OPERATOR_EXTRA"] == "1"
    assert pod["metadata"]["annotations"] == {"example.com/annotated": "true"}
    assert pod["metadata"]["labels"]["example.com/team"] == "ml"
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["spec"]["affinity"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_operator_cli_accepts_the_rendered_args(
    default_objects: list[Obj], all_objects: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's args and env parse with the operator's own command line."""
    from octavo_operator import constants
    from octavo_operator.main import build_parser

    default_env = operator_container(default_objects)["env"][0]
    assert default_env["value"] == constants.DEFAULT_SERVER_IMAGE
    for objects, namespaces, log_format in (
        (default_objects, [], "json"),
        (all_objects, ["team-a", "team-b"], "plain"),
    ):
        container = operator_container(objects)
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        monkeypatch.setenv("OCTAVO_OPERATOR_DEFAULT_IMAGE", env["OCTAVO_OPERATOR_DEFAULT_IMAGE"])
        args = build_parser().parse_args(container["args"])
        assert args.command is None, "runs the operator (the default command)"
        assert (args.liveness_port, args.metrics_port, args.activator_port) == (8080, 8081, 8082)
        assert args.namespace == namespaces
        assert args.log_format == log_format
        assert args.default_image == env["OCTAVO_OPERATOR_DEFAULT_IMAGE"]


def test_operator_cli_accepts_the_selfcheck_args(default_objects: list[Obj]) -> None:
    from octavo_operator.main import build_parser

    pod = find(default_objects, "Pod", f"{OPERATOR}-selfcheck")
    args = build_parser().parse_args(pod["spec"]["containers"][0]["args"])
    assert args.command == "selfcheck"
    assert args.operator_url == f"http://{OPERATOR}.{NAMESPACE}.svc:8080/healthz"


def test_operator_service_and_network_policy(default_objects: list[Obj]) -> None:
    service = find(default_objects, "Service", OPERATOR)
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"liveness": (8080, "liveness"), "metrics": (8081, "metrics")}
    selector = find(default_objects, "Deployment", OPERATOR)["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    policy = find(default_objects, "NetworkPolicy", OPERATOR)
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    allowed = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert allowed == ["liveness", "metrics", "activator"]
    activator_rule = policy["spec"]["ingress"][-1]
    assert "from" not in activator_rule, "clients of services at zero come from anywhere"


def test_helm_test_pod_runs_the_selfcheck(default_objects: list[Obj]) -> None:
    pod = find(default_objects, "Pod", f"{OPERATOR}-selfcheck")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "ghcr.io/octavo-dev/octavo-operator:0.1.0"
    assert container["command"] == ["octavo-operator"]
    url = f"http://{OPERATOR}.{NAMESPACE}.svc:8080/healthz"
    assert container["args"] == ["selfcheck", "--operator-url", url]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_common_labels_on_every_object(all_objects: list[Obj]) -> None:
    for obj in all_objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "octavo", obj["kind"]
        assert labels["app.kubernetes.io/instance"] == RELEASE, obj["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]
        assert labels["app.kubernetes.io/version"] == "0.1.0", obj["kind"]


# --------------------------------------------------------------------------- monitoring


def test_optional_objects_are_off_by_default(default_objects: list[Obj]) -> None:
    assert find_all(default_objects, "ServiceMonitor") == []
    assert find_all(default_objects, "ConfigMap") == []
    assert find_all(default_objects, "InferenceService") == []


def test_service_monitor_needs_the_api_version(helm: Helm) -> None:
    enabled = ["--set", "monitoring.serviceMonitor.enabled=true"]
    assert find_all(render(helm, *enabled), "ServiceMonitor") == []
    objects = render(helm, *enabled, "--api-versions", MONITORING_API)
    monitor = find(objects, "ServiceMonitor", OPERATOR)
    assert monitor["metadata"]["namespace"] == NAMESPACE
    selector = find(objects, "Service", OPERATOR)["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= selector.items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]


def test_service_monitor_with_every_option(all_objects: list[Obj]) -> None:
    monitor = find(all_objects, "ServiceMonitor", OPERATOR)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")


def test_dashboard_configmap_for_the_grafana_sidecar(helm: Helm) -> None:
    objects = render(helm, "--set", "monitoring.dashboards.enabled=true")
    configmap = find(objects, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert dashboard_files(), "charts/octavo/dashboards/ holds the server dashboard"
    assert sorted(configmap["data"]) == [p.name for p in dashboard_files()]
    for path in dashboard_files():
        dashboard = json.loads(configmap["data"][path.name])
        assert dashboard == json.loads(path.read_text())
        assert dashboard["title"]


def test_dashboard_label_and_namespace_are_configurable(helm: Helm) -> None:
    objects = render(
        helm,
        "--set",
        "monitoring.dashboards.enabled=true",
        "--set",
        "monitoring.dashboards.labelKey=grafana.com/dashboard",
        "--set-string",
        "monitoring.dashboards.labelValue=octavo",
        "--set",
        "monitoring.dashboards.namespace=monitoring",
    )
    configmap = find(objects, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana.com/dashboard"] == "octavo"
    assert "grafana_dashboard" not in configmap["metadata"]["labels"]
    assert configmap["metadata"]["namespace"] == "monitoring"


# --------------------------------------------------------------------------- NOTES.txt


def render_notes(helm: Helm, tmp_path: Path, *extra: str) -> str:
    """NOTES.txt rendered offline: a copy of the chart renders it into a ConfigMap."""
    chart = tmp_path / "octavo"
    shutil.copytree(CHART, chart)
    (chart / "notes").mkdir()
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes" / "NOTES.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes/NOTES.txt") . | quote }}\n'
    )
    objects = parse_stream(helm(*template_args(*extra, chart=chart)).stdout)
    return find(objects, "ConfigMap", "notes")["data"]["notes"]


def test_notes_tell_the_next_commands(helm: Helm, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path)
    assert "kubectl apply -f manifests/examples/smollm2-cpu.yaml" in notes
    assert "kubectl get isvc -w" in notes
    assert "kubectl port-forward svc/smollm2-cpu 8000:8000" in notes
    assert "/v1/chat/completions" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    assert "every namespace" in notes


def test_notes_warn_when_the_service_monitor_cannot_render(helm: Helm, tmp_path: Path) -> None:
    notes = render_notes(
        helm,
        tmp_path,
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "operator.watchNamespaces={team-a}",
    )
    assert "no ServiceMonitor was created" in notes
    assert "the namespaces team-a" in notes


def test_notes_point_at_the_installed_example(helm: Helm, tmp_path: Path) -> None:
    notes = render_notes(
        helm, tmp_path, "--set", "examples.enabled=true", "--set", "examples.namespace=models"
    )
    assert "smollm2-cpu was created in namespace models" in notes
    assert "kubectl get isvc -n models -w" in notes
    assert "kubectl port-forward -n models svc/smollm2-cpu 8000:8000" in notes
    assert "kubectl apply -f manifests/examples" not in notes


# --------------------------------------------------------------------------- manifests/


def test_manifests_equal_a_fresh_render(helm_binary: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RENDER_SCRIPT), "--check"],
        env={**os.environ, "HELM": str(helm_binary)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"run `make manifests`:\n{proc.stderr}"


def test_manifests_hold_the_chart_objects_without_the_crd(helm: Helm) -> None:
    text = OPERATOR_MANIFEST.read_text()
    assert text.startswith("# generated by make manifests; do not edit.")
    objects = parse_stream(text)
    namespace = objects[0]
    assert (namespace["kind"], namespace["metadata"]["name"]) == ("Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    chart = render(helm, "--set", "crds.install=false", "--skip-tests")
    assert objects[1:] == chart
    kinds = {o["kind"] for o in objects}
    assert "CustomResourceDefinition" not in kinds, "the CRD lives in manifests/crds/ only"
    assert kinds >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"}
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in objects:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]


def test_only_yaml_in_manifests_is_ours() -> None:
    """`kubectl apply -f manifests/crds/ -f manifests/` applies exactly these files."""
    top = sorted(p.name for p in MANIFESTS.iterdir() if p.suffix in {".yaml", ".yml", ".json"})
    assert top == ["octavo-operator.yaml"]


# --------------------------------------------------------------------------- examples


def strict_schema(schema: Any) -> Any:
    """The CRD's openAPIV3Schema with unknown fields refused, as the apiserver's strict
    field validation does (except where the schema preserves unknown fields)."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@pytest.fixture(scope="module")
def spec_validator() -> Draft7Validator:
    (version,) = [v for v in load_yaml(CRD_FILE)["spec"]["versions"] if v["name"] == "v1alpha1"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return Draft7Validator(strict_schema(spec))


def example_paths() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def load_example(name: str) -> Obj:
    docs = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    assert len(docs) == 1
    return docs[0]


def test_examples_are_there() -> None:
    names = {p.name for p in example_paths()}
    assert names >= {"smollm2-cpu.yaml", "llama-3-8b-gpu.yaml", "tensor-parallel-autoscaled.yaml"}


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_example_is_an_inference_service(path: Path, spec_validator: Draft7Validator) -> None:
    obj = load_example(path.name)
    assert obj["apiVersion"] == ISVC_API
    assert obj["kind"] == "InferenceService"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    assert len(obj["metadata"]["name"]) <= 50
    assert "namespace" not in obj["metadata"], "examples go to the current namespace"
    errors = [f"{list(e.path)}: {e.message}" for e in spec_validator.iter_errors(obj["spec"])]
    assert errors == []


def test_smollm2_example_runs_the_embedded_model_on_cpu() -> None:
    spec = load_example("smollm2-cpu.yaml")["spec"]
    assert "uri" not in spec.get("model", {})
    assert spec["resources"]["gpu"] == 0
    assert spec["resources"]["cpu"] == "2"
    assert spec["resources"]["memory"] == "2Gi"


def test_llama_example_uses_one_gpu_and_a_cache_claim() -> None:
    spec = load_example("llama-3-8b-gpu.yaml")["spec"]
    assert spec["model"]["uri"] == "hf://meta-llama/Meta-Llama-3-8B-Instruct"
    assert spec["resources"]["gpu"] == 1
    assert spec["cache"]["size"] == "40Gi"
    assert spec["cache"]["storageClassName"]


def test_tensor_parallel_example_autoscales() -> None:
    spec = load_example("tensor-parallel-autoscaled.yaml")["spec"]
    assert spec["engine"]["tensorParallelSize"] == 2
    assert spec["resources"]["gpu"] == 2
    assert spec["autoscaling"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "metric": "requestsWaiting",
        "target": 5,
    }
    assert "replicas" not in spec, "with autoscaling, replicas is the autoscaler's (GitOps-safe)"


def test_chart_example_is_the_smollm2_manifest(helm: Helm) -> None:
    objects = render(helm, "--set", "examples.enabled=true", "--set", "examples.namespace=models")
    isvc = find(objects, "InferenceService")
    manifest = load_example("smollm2-cpu.yaml")
    assert isvc["apiVersion"] == manifest["apiVersion"]
    assert isvc["metadata"]["name"] == manifest["metadata"]["name"]
    assert isvc["spec"] == manifest["spec"]
    assert isvc["metadata"]["namespace"] == "models"
    # A hook: created after the release's objects (the CRD among them) exist.
    assert isvc["metadata"]["annotations"]["helm.sh/hook"] == "post-install"
