"""deploy/: the Kubernetes manifests render with kustomize, validate against the Kubernetes schemas,
and what they tell the server (flags, probe paths, metric names) is what tritium understands."""
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from api.cli import build_parser, server_config

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


def server_args(container: dict) -> list[str]:
    # the image's ENTRYPOINT (Dockerfile) comes first; a container's `args` follow it
    return ["--host", "0.0.0.0", "--port", "8080"] + list(container["args"])


@needs_kubectl
@pytest.mark.parametrize("path", ["base", "overlays/hf"])
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


@needs_kubectl
def test_deployment_wiring():
    docs = by_kind(render("base"))
    dep, svc, hpa = docs["Deployment"], docs["Service"], docs["HorizontalPodAutoscaler"]
    pod = dep["spec"]["template"]
    # the Service and the Deployment select the pods the Deployment makes
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    # the pod is given longer to stop than the server's own drain deadline plus the preStop pause
    args = build_parser().parse_args(server_args(c))
    assert args.metrics
    drain = float(c["args"][c["args"].index("--shutdown-timeout") + 1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain + c["lifecycle"]["preStop"]["sleep"]["seconds"]
    # annotations point Prometheus at the port the server listens on
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(c["ports"][0]["containerPort"]) == str(args.port)


@needs_kubectl
@pytest.mark.parametrize("path", ["base", "overlays/hf"])
def test_every_flag_in_the_manifests_is_one_tritium_accepts(path, tmp_path):
    pod = by_kind(render(path))["Deployment"]["spec"]["template"]["spec"]
    for c in pod["containers"]:
        args = build_parser().parse_args(server_args(c))   # argparse exits on an unknown flag
        server_config(args)                                 # and ArgError on a refused one
    for c in pod.get("initContainers", []):                # the -hf download: runtime.launch.hf_download's CLI
        assert c["command"] == ["python", "-m", "runtime.launch.hf_download"]
        from runtime.launch.hf_download import split_repo_tag
        repo, tag = split_repo_tag(c["args"][0])
        main = pod["containers"][0]["args"]
        assert main[main.index("-hf") + 1] == c["args"][0] and "--offline" in main and tag


def test_hpa_and_gateway_metrics_are_served(api_engine, api_client):
    """The metric names the HPA rule and the gateway docs use are series tritium's /metrics exports."""
    rules = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-adapter-rules.yaml").read_text())
    wanted = {r["name"]["matches"] for r in rules["rules"]["custom"]}
    hpa = yaml.safe_load((DEPLOY / "base" / "hpa.yaml").read_text())
    (m,) = hpa["spec"]["metrics"]
    assert m["pods"]["metric"]["name"] in {r["name"]["as"] for r in rules["rules"]["custom"]}
    with api_client(api_engine, metrics=True) as client:
        text = client.get("/metrics").text
    served = {line.split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert wanted <= served, wanted - served


def test_kv_cache_usage_ratio_follows_the_blocks_in_use(api_engine, api_client):
    """The gateway gauge is the share of KV blocks held: 0 when idle, above 0 while a slot holds a prompt."""
    def ratio(client) -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("llamacpp:kv_cache_usage_ratio "):
                return float(line.split()[1])
        raise AssertionError("no llamacpp:kv_cache_usage_ratio")
    with api_client(api_engine, metrics=True) as client:
        for s in range(api_engine.n_slots):     # drop what earlier tests left in the slots
            client.post(f"/slots/{s}?action=erase")
        idle = ratio(client)
        r = client.post("/completion", json={"prompt": "word " * 200, "n_predict": 1, "cache_prompt": True})
        assert r.status_code == 200
        busy = ratio(client)
    assert 0.0 <= idle < busy <= 1.0
