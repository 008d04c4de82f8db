"""deploy/: the Kubernetes manifests render with kustomize, validate against the Kubernetes schemas,
and what they tell the server (flags, probe paths, metric names) is what tritium understands."""
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S_VERSION = "1.30.0"          # the oldest release whose schema has the preStop `sleep` action
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with its built-in kustomize) is not installed; "
                                   ".ci/run installs it")


def render(path: str) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


@needs_kubectl
@pytest.mark.parametrize("path", ["base"])
def test_manifests_render_and_validate(path):
    import kubernetes_validate
    docs = render(path)
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PersistentVolumeClaim", "HorizontalPodAutoscaler"}
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@needs_kubectl
def test_podmonitor_selects_the_pods_and_scrapes_metrics():
    (pm,) = render("monitoring")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    pod_labels = by_kind(render("base"))["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    container = by_kind(render("base"))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert ep["port"] in {p["name"] for p in container["ports"]} and ep["path"] == "/metrics"

