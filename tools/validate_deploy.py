#!/usr/bin/env python3
"""Consistency checks of deploy/ that no schema can make (tools/validate_deploy.sh runs it).

The schemas say each file is well formed; this says the files agree with each other and
with the telemetry contract (deploy/metrics.txt):
  * dashboard: valid JSON; every queried metric, label and label value is in the contract;
  * compose: each specd service's health check, metrics port and peer addresses line up with
    the other services, Prometheus and the OpenTelemetry collector; every specd service has
    its TLS settings (mutual TLS on the verifier and the drafters, upstream TLS and https
    peers on the router) in read-only mounts that leave out the CA's key, and its health
    check speaks TLS with them; nothing is published beyond the loopback interface unless
    an environment variable says so; the GPU override's verifier command is the base one
    plus --device=cuda;
  * host networking (compose.host.yaml): every specd service and Prometheus on the host
    network, the drafter slots the router's `drafter` name lists and prometheus.host.yml
    scrapes agree;
  * Dockerfile.prebuilt: its runtime stage is Dockerfile's, line for line;
  * collector: every pipeline names receivers, processors and exporters that are defined;
  * Grafana provisioning: the dashboard's datasource exists;
  * Kubernetes: the kustomization lists every manifest; probes (exec probes running
    `specd health` over TLS), scrape annotations, --metrics-listen and container ports
    agree; the router's --verifier, --verifier-dns and --drafter-dns name Services (the DNS
    ones headless); every specd container has its TLS settings in a read-only mount of the
    Secret specd-tls (and the router its API keys in one of specd-api-keys); the
    NetworkPolicies deny by default, let only router pods reach the verifier and drafter
    ports, other namespaces (the ingress, monitoring) reach only the router's API and the
    metrics ports, and let the router reach its peers and DNS; ConfigMap keys, the PVC and
    the HPA's target exist.

Usage: validate_deploy.py [DEPLOY_DIR]   (exits 1 listing every problem)
Without PyYAML only the dashboard is checked (against the contract alone), with a warning.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

try:
    import yaml
except ImportError:  # only the dashboard check runs; main() says so
    yaml = None

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus itself attaches to every series.
TARGET_LABELS = {"instance", "job"}
METRIC_RE = re.compile(r"\bspecd_[a-zA-Z0-9_]+")
GROUPING_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SELECTOR_RE = re.compile(r"\{([^}]*)\}")
LEGEND_RE = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")

# The TLS settings (environment variables naming PEM files) each specd service needs: every
# port speaks TLS, the verifier and the drafters accept only clients with a certificate of
# their CA, and the router calls them over https with such a certificate.
TLS_ENV = {
    "verifier": ("SPECD_TLS_CERT", "SPECD_TLS_KEY", "SPECD_TLS_CLIENT_CA"),
    "drafter": ("SPECD_TLS_CERT", "SPECD_TLS_KEY", "SPECD_TLS_CLIENT_CA"),
    "router": (
        "SPECD_TLS_CERT",
        "SPECD_TLS_KEY",
        "SPECD_UPSTREAM_TLS_CA",
        "SPECD_UPSTREAM_TLS_CERT",
        "SPECD_UPSTREAM_TLS_KEY",
    ),
}
# Router flags naming upstream URLs (comma-separated lists for the plural ones).
UPSTREAM_URL_FLAGS = ("--verifier", "--verifiers", "--drafters")
LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}
TLS_SECRET = "specd-tls"
API_KEYS_SECRET = "specd-api-keys"


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")


def load_yaml_docs(path: Path) -> list[dict]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_yaml(path: Path) -> dict:
    docs = load_yaml_docs(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"{path}: expected one YAML mapping")
    return docs[0]


def host_port(address: str) -> tuple[str, int]:
    """'host:port' or 'scheme://host:port' -> (host, port)."""
    if "://" not in address:
        address = "tcp://" + address
    parsed = urlparse(address)
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"no host:port in {address!r}")
    return parsed.hostname, parsed.port


def compose_default(value: str) -> str:
    """A compose value with each ${VAR:-default} replaced by its default (unset: empty)."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def flag_values(args: list[str]) -> dict[str, str]:
    """--name=value and --name value pairs of a command line."""
    flags: dict[str, str] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
            flags[name] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[arg] = args[i + 1]
        else:
            flags[arg] = ""
    return flags


def command_flags(service: dict) -> dict[str, str]:
    """A compose service's command flags, each ${VAR:-default} at its default."""
    return flag_values([compose_default(str(arg)) for arg in service.get("command", [])])


def check_health_command(at: str, command: list[str], grpc_port: int, mutual: bool, readable, p: Problems):
    """A `specd health` probe of a TLS port: https to the port, the CA to check the server
    with, and a client certificate where the port requires one (mutual TLS). readable(path)
    says why a file the probe names is not there for it, or None."""
    if "health" not in command:
        p.add(at, "does not run `specd health`")
        return
    flags = flag_values(command[command.index("health") + 1 :])
    addr = flags.get("--addr", "")
    if urlparse(addr).scheme != "https":
        p.add(at, f"--addr {addr or '(default)'} is not https, but the port speaks TLS only")
    elif host_port(addr)[1] != grpc_port:
        p.add(at, f"probes port {host_port(addr)[1]}, not the gRPC port {grpc_port}")
    needed = ["--tls-ca"] + (["--tls-cert", "--tls-key"] if mutual else [])
    for flag in needed:
        if not flags.get(flag):
            why = " (the port requires a client certificate)" if flag != "--tls-ca" else ""
            p.add(at, f"no {flag}{why}")
        else:
            problem = readable(flags[flag])
            if problem:
                p.add(at, f"{flag} {flags[flag]}: {problem}")


def check_upstream_urls(at: str, flags: dict[str, str], p: Problems):
    for flag in UPSTREAM_URL_FLAGS:
        for url in filter(None, flags.get(flag, "").split(",")):
            if urlparse(url).scheme != "https":
                p.add(at, f"{flag} {url} is not https, but the verifier and the drafters speak TLS only")


# ---------------------------------------------------------------- the telemetry contract


class Metric:
    def __init__(self, name: str, kind: str, labels: dict[str, set[str] | None]) -> None:
        self.name = name
        self.kind = kind
        self.labels = labels


def load_contract(path: Path) -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, kind, *label_specs = line.split()
        if kind not in ("counter", "gauge", "histogram"):
            raise ValueError(f"{path}: {name}: unknown metric type {kind!r}")
        labels: dict[str, set[str] | None] = {}
        for spec in label_specs:
            label, _, values = spec.partition("=")
            labels[label] = set(values.split("|")) if values else None
        metrics[name] = Metric(name, kind, labels)
    return metrics


# ---------------------------------------------------------------- dashboard


def dashboard_targets(panels: list[dict]):
    for panel in panels:
        yield from ((panel, target) for target in panel.get("targets", []))
        yield from dashboard_targets(panel.get("panels", []))


def check_query(where: str, expr: str, legend: str, contract: dict[str, Metric], p: Problems):
    used: list[Metric] = []
    for name in METRIC_RE.findall(expr):
        base = name
        suffix = next((s for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if name not in contract and suffix:
            base = name[: -len(suffix)]
        metric = contract.get(base)
        if metric is None:
            p.add(where, f"metric {name} is not in the telemetry contract (deploy/metrics.txt)")
            continue
        if metric.kind == "histogram" and base == name:
            p.add(where, f"histogram {name} queried without _bucket, _sum or _count")
        if metric.kind != "histogram" and base != name:
            p.add(where, f"{name}: {base} is a {metric.kind}, not a histogram")
        used.append(metric)
    if not used:
        p.add(where, f"query names no specd metric: {expr}")
        return
    allowed = set(TARGET_LABELS)
    values: dict[str, set[str] | None] = {}
    for metric in used:
        allowed.update(metric.labels)
        values.update(metric.labels)
    if "_bucket" in expr:
        allowed.add("le")
    for group in GROUPING_RE.findall(expr):
        for label in filter(None, (s.strip() for s in group.split(","))):
            if label not in allowed:
                p.add(where, f"groups by label {label!r}, which none of its metrics has")
    for selector in SELECTOR_RE.findall(expr):
        for label, op, value in MATCHER_RE.findall(selector):
            if label not in allowed:
                p.add(where, f"matches on label {label!r}, which none of its metrics has")
            elif op == "=" and values.get(label) and value not in values[label]:
                p.add(where, f"{label}={value!r} is not a value the contract gives for {label}")
    for label in LEGEND_RE.findall(legend):
        if label not in allowed:
            p.add(where, f"legend uses label {label!r}, which none of its metrics has")


def check_dashboard(
    path: Path, contract: dict[str, Metric], datasource_uids: set[str] | None, p: Problems
):
    """datasource_uids None: the provisioning could not be read, so datasources go unchecked."""
    try:
        dashboard = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        p.add(str(path), f"invalid JSON: {e}")
        return
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dashboard:
            p.add(str(path), f"missing {key!r}")
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ids: set[int] = set()
    queries = 0
    for panel, target in dashboard_targets(dashboard.get("panels", [])):
        where = f"{path.name}: panel {panel.get('title')!r} {target.get('refId')}"
        ids.add(panel.get("id"))
        expr = target.get("expr", "")
        if not expr:
            p.add(where, "target without expr")
            continue
        queries += 1
        check_query(where, expr, target.get("legendFormat", ""), contract, p)
        uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid", "")
        if datasource_uids is None:
            continue
        match = re.fullmatch(r"\$\{?(\w+)\}?", uid)
        if match:
            variable = variables.get(match.group(1))
            if variable is None:
                p.add(where, f"datasource variable {uid} is not defined")
            elif variable.get("current", {}).get("value") not in datasource_uids:
                p.add(where, f"datasource variable {uid} defaults to no provisioned datasource")
        elif uid not in datasource_uids:
            p.add(where, f"datasource uid {uid!r} is not provisioned")
    panel_ids = [panel.get("id") for panel in dashboard.get("panels", [])]
    if len(panel_ids) != len(set(panel_ids)):
        p.add(str(path), "panel ids are not unique")
    if queries == 0:
        p.add(str(path), "no queries")
    print(f"  dashboard {path.name}: {queries} queries checked against {len(contract)} metrics")


def provisioned_datasources(provisioning: Path, p: Problems) -> set[str]:
    uids: set[str] = set()
    for path in sorted((provisioning / "datasources").glob("*.y*ml")):
        for source in load_yaml(path).get("datasources", []):
            if "uid" not in source:
                p.add(str(path), f"datasource {source.get('name')!r} has no uid")
            uids.add(source.get("uid", ""))
    return uids


def check_dashboard_provider(provisioning: Path, compose: dict, p: Problems):
    mounts = compose["services"].get("grafana", {}).get("volumes", [])
    targets = {m.split(":")[1] for m in mounts if isinstance(m, str)}
    for path in sorted((provisioning / "dashboards").glob("*.y*ml")):
        for provider in load_yaml(path).get("providers", []):
            folder = provider.get("options", {}).get("path")
            if folder not in targets:
                p.add(str(path), f"dashboard path {folder} is not mounted into grafana")


# ---------------------------------------------------------------- compose


def check_compose(deploy: Path, compose: dict, p: Problems):
    where = "compose.yaml"
    services = compose.get("services", {})
    prometheus = load_yaml(deploy / "prometheus.yml")
    scraped: set[tuple[str, int]] = set()
    for job in prometheus.get("scrape_configs", []):
        for static in job.get("static_configs", []):
            scraped.update(host_port(t) for t in static.get("targets", []))
        for dns in job.get("dns_sd_configs", []):
            scraped.update((name, dns["port"]) for name in dns.get("names", []))
    collector = load_yaml(deploy / "otel-collector.yaml")
    otlp_grpc = (
        collector.get("receivers", {}).get("otlp", {}).get("protocols", {}).get("grpc", {})
    )
    otlp_port = host_port(otlp_grpc.get("endpoint", "0.0.0.0:4317"))[1]

    specd = {n: s for n, s in services.items() if s.get("command", [])[:1] == ["serve"]}
    for role in ("router", "verifier", "drafter"):
        if not any(s["command"][1] == role for s in specd.values()):
            p.add(where, f"no service runs `specd serve {role}`")
    for name, service in specd.items():
        at = f"{where}: {name}"
        role = service["command"][1]
        flags = command_flags(service)
        listen_port = host_port(flags.get("--listen", ""))[1]
        env = compose_env(service)
        mounts = compose_mounts(service)
        for source in mounts.values():
            if source[0].rstrip("/").removeprefix("./") == "certs":
                p.add(at, f"mounts {source[0]}, which holds the CA's private key; "
                      "mount the service's own bundle")

        def readable(path: str, mounts=mounts) -> str | None:
            for target, (_, read_only) in mounts.items():
                if path.startswith(target.rstrip("/") + "/"):
                    return None if read_only else f"{target} is mounted read-write"
            return "in no mounted directory"

        for var in TLS_ENV.get(role, ()):
            if not env.get(var):
                p.add(at, f"no {var} in its environment")
            elif readable(env[var]):
                p.add(at, f"{var} {env[var]}: {readable(env[var])}")
        test = [compose_default(str(arg)) for arg in service.get("healthcheck", {}).get("test", [])]
        check_health_command(
            f"{at} healthcheck", test, listen_port, bool(env.get("SPECD_TLS_CLIENT_CA")), readable, p
        )
        if env.get("SPECD_UPSTREAM_TLS_CA"):
            check_upstream_urls(at, flags, p)
        if "--metrics-listen" not in flags:
            p.add(at, "no --metrics-listen")
        elif (name, host_port(flags["--metrics-listen"])[1]) not in scraped:
            p.add(at, f"prometheus.yml does not scrape {name}:{host_port(flags['--metrics-listen'])[1]}")
        if "--otlp-endpoint" in flags:
            host, port = host_port(flags["--otlp-endpoint"])
            if host not in services or port != otlp_port:
                p.add(at, f"--otlp-endpoint {flags['--otlp-endpoint']} is not the collector's OTLP/gRPC receiver")
        for flag in ("--verifier", "--drafter-dns"):
            if flag in flags:
                host, port = host_port(flags[flag])
                peer = specd.get(host)
                if peer is None:
                    p.add(at, f"{flag} {flags[flag]}: no specd service {host!r}")
                elif host_port(command_flags(peer).get("--listen", ""))[1] != port:
                    p.add(at, f"{flag} {flags[flag]}: {host} listens on another port")
        if service["command"][1] == "drafter" and "ports" in service:
            p.add(at, "a scaled drafter cannot publish fixed host ports")
    # A published port is reachable from the network unless bound to the loopback interface;
    # widening that is a decision for the one who starts it (an environment variable).
    for name, service in services.items():
        for entry in service.get("ports", []):
            if isinstance(entry, dict):
                ip = compose_default(str(entry.get("host_ip", "")))
                published = compose_default(str(entry.get("published", entry.get("target"))))
            else:
                text = compose_default(str(entry)).split("/")[0]
                match = re.fullmatch(r"(?:(\[[^\]]*\]|[^:]*):)?([^:]*):([^:]*)", text)
                ip, published = (match.group(1) or "", match.group(2)) if match else ("", text)
            if ip not in LOOPBACK:
                p.add(
                    f"{where}: {name}",
                    f"publishes port {published} on {ip or 'every interface'}, not the loopback "
                    "interface (only an environment variable may widen it)",
                )


def compose_env(service: dict) -> dict[str, str | None]:
    """A service's environment as a mapping; a variable without a value is None (passed
    through from the shell that starts compose, unset when that has none)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return {e.split("=", 1)[0]: (e.split("=", 1)[1] if "=" in e else None) for e in env}
    return {k: None if v is None else compose_default(str(v)) for k, v in env.items()}


def compose_mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only) of a service's volumes, short and long syntax."""
    mounts: dict[str, tuple[str, bool]] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *options = compose_default(volume).split(":")
            mounts[target] = (source, bool(options) and "ro" in options[0].split(","))
        else:
            target = compose_default(str(volume.get("target", "")))
            mounts[target] = (compose_default(str(volume.get("source", ""))), bool(volume.get("read_only")))
    return mounts


def check_cuda_override(deploy: Path, compose: dict, p: Problems):
    """The GPU override repeats the verifier's command; it must stay the base one plus
    --device=cuda, or the two setups drift apart."""
    where = "compose.cuda.yaml"
    override = load_yaml(deploy / where).get("services", {})
    for name, service in override.items():
        if name not in compose.get("services", {}):
            p.add(where, f"overrides {name!r}, which compose.yaml does not define")
        elif "command" in service:
            base = compose["services"][name].get("command", [])
            if service["command"] != base + ["--device=cuda"]:
                p.add(where, f"{name}: command is not compose.yaml's plus --device=cuda")


def check_collector(deploy: Path, p: Problems):
    where = "otel-collector.yaml"
    config = load_yaml(deploy / where)
    pipelines = config.get("service", {}).get("pipelines", {})
    if "traces" not in pipelines:
        p.add(where, "no traces pipeline")
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                if component not in (config.get(kind) or {}):
                    p.add(where, f"pipeline {name}: {kind[:-1]} {component!r} is not defined")
    for extension in config.get("service", {}).get("extensions", []):
        if extension not in (config.get("extensions") or {}):
            p.add(where, f"extension {extension!r} is not defined")


# ---------------------------------------------------------------- Kubernetes


def container_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def expand(value: str, env: dict[str, dict], configmaps: dict[str, dict]) -> str:
    """Resolves $(VAR) the way the kubelet does, for env taken from a ConfigMap."""

    def one(match: re.Match) -> str:
        entry = env.get(match.group(1), {})
        if "value" in entry:
            return str(entry["value"])
        ref = entry.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            return str(configmaps.get(ref["name"], {}).get(ref["key"], match.group(0)))
        return match.group(0)

    return re.sub(r"\$\((\w+)\)", one, value)


def check_kubernetes(k8s: Path, p: Problems):
    kustomization = load_yaml(k8s / "kustomization.yaml")
    listed = set(kustomization.get("resources", []))
    present = {f.name for f in k8s.glob("*.y*ml")} - {"kustomization.yaml"}
    for missing in sorted(listed - present):
        p.add("k8s/kustomization.yaml", f"lists {missing}, which does not exist")
    for unlisted in sorted(present - listed):
        p.add("k8s/kustomization.yaml", f"does not list {unlisted}")

    objects: list[tuple[str, dict]] = []
    for name in sorted(present):
        objects += [(name, doc) for doc in load_yaml_docs(k8s / name)]
    by_kind: dict[str, dict[str, dict]] = {}
    for _, obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    configmaps = {n: o.get("data", {}) for n, o in by_kind.get("ConfigMap", {}).items()}
    services = by_kind.get("Service", {})
    workloads = {
        **by_kind.get("Deployment", {}),
        **by_kind.get("StatefulSet", {}),
    }
    for required in ("StatefulSet", "Deployment", "Service", "ConfigMap",
                     "HorizontalPodAutoscaler", "PersistentVolumeClaim"):
        if not by_kind.get(required):
            p.add("k8s", f"no {required}")

    for name, workload in workloads.items():
        at = f"k8s {workload['kind']}/{name}"
        template = workload["spec"]["template"]
        selector = workload["spec"]["selector"].get("matchLabels", {})
        labels = template["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in selector.items()):
            p.add(at, "selector does not match the pod template's labels")
        if workload["kind"] == "StatefulSet":
            governing = services.get(workload["spec"].get("serviceName", ""))
            if governing is None or governing["spec"].get("clusterIP") != "None":
                p.add(at, "serviceName is not a headless Service")
        annotations = template["metadata"].get("annotations", {})
        for volume in template["spec"].get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in by_kind.get("PersistentVolumeClaim", {}):
                p.add(at, f"volume {volume['name']}: no PersistentVolumeClaim {claim}")
        for container in template["spec"]["containers"]:
            cat = f"{at} container {container['name']}"
            env = container_env(container)
            for var in env.values():
                ref = var.get("valueFrom", {}).get("configMapKeyRef")
                if ref and not ref.get("optional") and ref["key"] not in configmaps.get(ref["name"], {}):
                    p.add(cat, f"env {var['name']}: ConfigMap {ref['name']} has no key {ref['key']}")
            args = [expand(a, env, configmaps) for a in container.get("args", [])]
            for arg in args:
                for var in re.findall(r"\$\((\w+)\)", arg):
                    p.add(cat, f"argument {arg!r}: $({var}) is not defined")
            flags = flag_values(args)
            ports = {port.get("name"): port["containerPort"] for port in container.get("ports", [])}
            grpc_port = host_port(flags.get("--listen", ":0"))[1]
            if ports.get("grpc") != grpc_port:
                p.add(cat, f"containerPort grpc is not the --listen port {grpc_port}")
            metrics_port = host_port(flags.get("--metrics-listen", ":0"))[1]
            if ports.get("metrics") != metrics_port:
                p.add(cat, f"containerPort metrics is not the --metrics-listen port {metrics_port}")
            if annotations.get("prometheus.io/scrape") != "true" or annotations.get(
                "prometheus.io/port"
            ) != str(metrics_port):
                p.add(cat, f"pod is not annotated for scraping on port {metrics_port}")
            role = args[1] if args[:1] == ["serve"] and len(args) > 1 else ""
            volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
            mounts = container.get("volumeMounts", [])

            def readable(path: str, secret: str = TLS_SECRET, mounts=mounts, volumes=volumes) -> str | None:
                for mount in mounts:
                    if path.startswith(mount["mountPath"].rstrip("/") + "/"):
                        source = volumes.get(mount["name"], {}).get("secret", {}).get("secretName")
                        if source != secret:
                            origin = f"Secret {source}" if source else f"volume {mount['name']}"
                            return f"mounted from {origin}, not the Secret {secret}"
                        if not mount.get("readOnly"):
                            return f"the Secret {secret} is mounted without readOnly: true"
                        return None
                return f"in no mount of the Secret {secret}"

            for var in TLS_ENV.get(role, ()):
                if var not in env:
                    p.add(cat, f"no {var} in its environment")
                elif "value" in env[var] and readable(str(env[var]["value"])):
                    p.add(cat, f"{var} {env[var]['value']}: {readable(str(env[var]['value']))}")
            if role == "router":
                keys = env.get("SPECD_API_KEYS_FILE", {}).get("value")
                if keys is None:
                    p.add(cat, "no SPECD_API_KEYS_FILE: the public API would serve every client")
                elif readable(str(keys), API_KEYS_SECRET):
                    p.add(cat, f"SPECD_API_KEYS_FILE {keys}: {readable(str(keys), API_KEYS_SECRET)}")
                if "SPECD_UPSTREAM_TLS_CA" in env:
                    check_upstream_urls(cat, flags, p)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = container.get(probe)
                if spec is None:
                    p.add(cat, f"no {probe}")
                elif "grpc" in spec:
                    p.add(cat, f"{probe} is a kubelet gRPC probe, which cannot speak TLS; "
                          "run `specd health` in an exec probe")
                elif not spec.get("exec", {}).get("command"):
                    p.add(cat, f"{probe} is not an exec probe running `specd health`")
                else:
                    command = [expand(str(a), env, configmaps) for a in spec["exec"]["command"]]
                    check_health_command(
                        f"{cat} {probe}", command, grpc_port, "SPECD_TLS_CLIENT_CA" in env, readable, p
                    )
                    timeout = flag_values(command).get("--timeout-secs")
                    if timeout is not None and int(timeout) >= spec.get("timeoutSeconds", 1):
                        p.add(cat, f"{probe}: --timeout-secs={timeout} is not below timeoutSeconds, "
                              "so the kubelet gives up first")
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(resources.get(bound, {})):
                    p.add(cat, f"resources.{bound} lacks cpu or memory")
            for flag in ("--verifier", "--verifier-dns", "--drafter-dns"):
                if flag not in flags:
                    continue
                host, port = host_port(flags[flag])
                service = services.get(host.split(".")[0])
                if service is None:
                    p.add(cat, f"{flag} {flags[flag]}: no Service {host}")
                    continue
                if port not in [sp["port"] for sp in service["spec"].get("ports", [])]:
                    p.add(cat, f"{flag} {flags[flag]}: Service {host} has no port {port}")
                if flag.endswith("-dns") and service["spec"].get("clusterIP") != "None":
                    p.add(cat, f"{flag} {flags[flag]}: Service {host} is not headless, so its name resolves to one address")

    for name, service in services.items():
        selector = service["spec"].get("selector", {})
        if not any(
            all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
            for w in workloads.values()
        ):
            p.add(f"k8s Service/{name}", "selects no workload's pods")
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["name"] not in by_kind.get(ref["kind"], {}):
            p.add(f"k8s HorizontalPodAutoscaler/{name}", f"targets missing {ref['kind']}/{ref['name']}")
    check_network_policies(by_kind, workloads, kustomization.get("namespace", "default"), configmaps, p)
    print(f"  kubernetes: {len(objects)} objects in {len(present)} files cross-checked")


class Endpoint:
    """One end of a connection, for evaluating NetworkPolicies: a pod (its labels and its
    namespace's labels) or an address outside the cluster's pods."""

    def __init__(self, what: str, labels: dict | None = None, namespace: dict | None = None) -> None:
        self.what = what
        self.labels = labels or {}
        self.namespace = namespace  # None: outside the cluster's pods


def label_selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def peer_matches(peer: dict, other: Endpoint, own_namespace: dict) -> bool:
    if "ipBlock" in peer:
        return other.namespace is None  # taken as addresses outside the cluster's pods
    if other.namespace is None:
        return False
    selector = peer.get("namespaceSelector")
    if selector is None and other.namespace != own_namespace:
        return False
    if selector is not None and not label_selects(selector, other.namespace):
        return False
    return "podSelector" not in peer or label_selects(peer["podSelector"], other.labels)


def port_matches(ports: list[dict] | None, port: int, protocol: str, named: dict[str, int]) -> bool:
    if not ports:
        return True
    for spec in ports:
        if spec.get("protocol", "TCP") != protocol:
            continue
        number = spec.get("port")
        if number is None:
            return True
        if isinstance(number, str):
            number = named.get(number, -1)
        if number <= port <= spec.get("endPort", number):
            return True
    return False


def policy_types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def allowed(
    policies: list[dict], own_namespace: dict, src: Endpoint, dst: Endpoint, port: int,
    protocol: str = "TCP", named: dict[str, int] | None = None,
) -> bool:
    """Whether the NetworkPolicies of the namespace let src open port on dst: src's egress
    (when src is one of its pods) and dst's ingress (when dst is)."""
    named = named or {}
    for direction, subject, other, key in (("Egress", src, dst, "to"), ("Ingress", dst, src, "from")):
        if subject.namespace != own_namespace:
            continue
        applying = [
            pol for pol in policies
            if direction in policy_types(pol)
            and label_selects(pol["spec"].get("podSelector") or {}, subject.labels)
        ]
        if applying and not any(
            (not rule.get(key) or any(peer_matches(peer, other, own_namespace) for peer in rule[key]))
            and port_matches(rule.get("ports"), port, protocol, named)
            for pol in applying
            for rule in pol["spec"].get(direction.lower()) or []
        ):
            return False
    return True


def check_network_policies(by_kind: dict, workloads: dict, namespace: str, configmaps: dict, p: Problems):
    where = "k8s NetworkPolicy"
    policies = list(by_kind.get("NetworkPolicy", {}).values())
    if not policies:
        p.add("k8s", "no NetworkPolicy: every pod of the cluster reaches every specd port")
        return
    own = {"kubernetes.io/metadata.name": namespace}
    for ns in by_kind.get("Namespace", {}).values():
        if ns["metadata"]["name"] == namespace:
            own.update(ns["metadata"].get("labels") or {})
    if not any(
        not (pol["spec"].get("podSelector") or {})
        and "Ingress" in policy_types(pol)
        and not pol["spec"].get("ingress")
        for pol in policies
    ):
        p.add(where, "none denies ingress by default (podSelector: {}, policyTypes Ingress, no rules)")

    pods: dict[str, tuple[Endpoint, dict[str, int]]] = {}
    for workload in workloads.values():
        template = workload["spec"]["template"]
        for container in template["spec"]["containers"]:
            args = container.get("args", [])
            if args[:1] == ["serve"] and len(args) > 1:
                ports = {port.get("name"): port["containerPort"] for port in container.get("ports", [])}
                labels = template["metadata"].get("labels", {})
                pods[args[1]] = (Endpoint(f"{args[1]} pods", labels, own), ports)
    # Namespaces the policies name (the ingress controller's, the monitoring one), and
    # sources that none of them should let in.
    named_namespaces = [
        peer["namespaceSelector"].get("matchLabels") or {}
        for pol in policies
        for rule in (pol["spec"].get("ingress") or []) + (pol["spec"].get("egress") or [])
        for peer in rule.get("from", rule.get("to")) or []
        if peer.get("namespaceSelector", {}).get("matchLabels")
    ]
    strangers = [
        Endpoint("other pods of the namespace", {"app.kubernetes.io/name": "other"}, own),
        Endpoint("pods of any namespace", {}, {"kubernetes.io/metadata.name": "any-other-namespace"}),
        Endpoint("addresses outside the cluster"),
    ]

    def from_elsewhere(dst: Endpoint, port: int, ports: dict[str, int], what: str):
        if not any(
            allowed(policies, own, Endpoint("", {}, ns), dst, port, named=ports) for ns in named_namespaces
        ):
            p.add(where, f"no other namespace reaches the {dst.what} on port {port} ({what})")
        for stranger in strangers:
            if allowed(policies, own, stranger, dst, port, named=ports):
                p.add(where, f"{stranger.what} reach the {dst.what} on port {port} ({what})")

    # The collector named in the ConfigMap, in the namespace its Service name says.
    endpoint = next(
        (data["otlp-endpoint"] for data in configmaps.values() if data.get("otlp-endpoint")), None
    )
    router = pods.get("router")
    for role in ("verifier", "drafter"):
        if role not in pods:
            continue
        dst, ports = pods[role]
        grpc = ports.get("grpc", 0)
        if router and not allowed(policies, own, router[0], dst, grpc, named=ports):
            p.add(where, f"router pods cannot reach the {dst.what} on port {grpc}")
        for other in [pods[r][0] for r in pods if r != "router"] + strangers:
            if allowed(policies, own, other, dst, grpc, named=ports):
                p.add(where, f"{other.what} reach the {dst.what} on port {grpc}; only router pods should")
    if router:
        dst, ports = router
        for name in ("grpc", "http"):
            if name in ports:
                from_elsewhere(dst, ports[name], ports, f"the public {name} API, for the ingress")
        for role in ("verifier", "drafter"):
            grpc = ports.get("grpc", 0)
            if role in pods and allowed(policies, own, pods[role][0], dst, grpc, named=ports):
                p.add(where, f"{role} pods reach the router pods on port {ports.get('grpc')}")
    for role, (dst, ports) in pods.items():
        if "metrics" in ports:
            from_elsewhere(dst, ports["metrics"], ports, "metrics, for Prometheus")
        dns = Endpoint("", {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"})
        if not allowed(policies, own, dst, dns, 53, "UDP"):
            p.add(where, f"the {dst.what} cannot reach DNS (UDP 53)")
        if endpoint:
            host, port = host_port(endpoint)
            parts = host.split(".")
            collector_namespace = parts[1] if len(parts) > 1 else namespace
            collector = Endpoint("", {}, {"kubernetes.io/metadata.name": collector_namespace})
            if not allowed(policies, own, dst, collector, port):
                p.add(where, f"the {dst.what} cannot reach the OTLP collector {endpoint}")


def unexported(contract: dict[str, Metric], root: Path) -> list[str]:
    """Contract metrics whose name appears in no Rust source of the workspace."""
    sources = "".join(
        f.read_text(errors="replace")
        for folder in ("crates", "services")
        for f in (root / folder).rglob("*.rs")
    )
    if not sources:  # not a workspace checkout (a copy of deploy/ alone)
        return []
    return [name for name in contract if name not in sources]


def dashboards_only(deploy: Path, p: Problems) -> None:
    print("WARNING: PyYAML is missing: only the dashboard is checked", file=sys.stderr)
    contract = load_contract(deploy / "metrics.txt")
    for dashboard in sorted((deploy / "grafana" / "dashboards").glob("*.json")):
        check_dashboard(dashboard, contract, None, p)


def main() -> int:
    deploy = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "deploy")
    p = Problems()
    try:
        if yaml is None:
            dashboards_only(deploy, p)
            return report(p)
        contract = load_contract(deploy / "metrics.txt")
        missing = unexported(contract, deploy.parent)
        if missing:
            # The services name their metrics in code; a name absent there is not exported
            # (yet), so its dashboard panel stays empty. A note, not a failure.
            print(f"  note: not (yet) named in the Rust sources: {', '.join(missing)}")
        compose = load_yaml(deploy / "compose.yaml")
        provisioning = deploy / "grafana" / "provisioning"
        uids = provisioned_datasources(provisioning, p)
        dashboards = sorted((deploy / "grafana" / "dashboards").glob("*.json"))
        if not dashboards:
            p.add("grafana/dashboards", "no dashboard")
        for dashboard in dashboards:
            check_dashboard(dashboard, contract, uids, p)
        check_dashboard_provider(provisioning, compose, p)
        check_compose(deploy, compose, p)
        check_cuda_override(deploy, compose, p)
        check_host_override(deploy, compose, p)
        check_prebuilt_dockerfile(deploy, p)
        check_collector(deploy, p)
        check_kubernetes(deploy / "k8s", p)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        p.add("deploy", f"cannot check: {type(e).__name__}: {e}")
    except Exception as e:  # a YAML syntax error, reported like any other problem
        if yaml is None or not isinstance(e, yaml.YAMLError):
            raise
        p.add("deploy", f"invalid YAML: {e}")
    return report(p)


def check_host_override(deploy: Path, compose: dict, p: Problems):
    """compose.host.yaml: it overrides services compose.yaml defines; every specd service and
    Prometheus leave the bridge network; the drafter addresses the slot script may claim are
    the ones the router's `drafter` name lists and prometheus.host.yml scrapes; and the
    router's and the verifier's metrics ports are scraped under the names it maps."""
    where = "compose.host.yaml"
    override = load_yaml(deploy / where).get("services", {})
    base = compose.get("services", {})
    for name, service in override.items():
        if name not in base:
            p.add(where, f"overrides {name!r}, which compose.yaml does not define")
    specd = [n for n, s in base.items() if s.get("command", [])[:1] == ["serve"]]
    for name in specd + ["prometheus"]:
        if override.get(name, {}).get("network_mode") != "host":
            p.add(where, f"{name}: not on the host network")
    drafter = override.get("drafter", {})
    slots = str(compose_env(drafter).get("SPECD_DRAFTER_SLOTS") or "").split()
    if not slots:
        p.add(where, "drafter: no SPECD_DRAFTER_SLOTS")
    if "drafter-slot.sh" not in " ".join(str(a) for a in drafter.get("entrypoint", [])):
        p.add(where, "drafter: the entrypoint is not drafter-slot.sh")
    named = {}
    for entry in override.get("router", {}).get("extra_hosts", []):
        host, _, address = compose_default(str(entry)).replace("=", ":", 1).partition(":")
        named.setdefault(host, []).append(address)
    if sorted(named.get("drafter", [])) != sorted(slots):
        p.add(where, f"router: `drafter` maps to {named.get('drafter', [])}, not the slots {slots}")
    prometheus = load_yaml(deploy / "prometheus.host.yml")
    scraped = {
        t for job in prometheus.get("scrape_configs", []) for static in job.get("static_configs", [])
        for t in static.get("targets", [])
    }
    drafter_metrics = host_port(command_flags(base["drafter"])["--metrics-listen"])[1]
    for slot in slots:
        if f"{slot}:{drafter_metrics}" not in scraped:
            p.add("prometheus.host.yml", f"does not scrape the drafter slot {slot}:{drafter_metrics}")
    for name in specd:
        if name == "drafter":
            continue
        flags = command_flags(base[name])
        target = f"{name}:{host_port(flags['--metrics-listen'])[1]}"
        if target not in scraped:
            p.add("prometheus.host.yml", f"does not scrape {target}")


def check_prebuilt_dockerfile(deploy: Path, p: Problems):
    """Dockerfile.prebuilt's image is Dockerfile's runtime stage around a binary built
    elsewhere: the two must stay the same line for line, but for where the binary comes from."""

    def runtime(name: str) -> list[str]:
        text = (deploy / name).read_text()
        # Joined continuation lines, from the runtime base on, comments and COPY aside.
        lines = text.replace("\\\n", " ").splitlines()
        start = next(i for i, line in enumerate(lines) if re.match(r"FROM \S+ AS runtime", line))
        return [
            " ".join(line.split())
            for line in lines[start + 1 :]
            if line.strip() and not line.lstrip().startswith(("#", "COPY "))
        ]

    if runtime("Dockerfile.prebuilt") != runtime("Dockerfile"):
        p.add("Dockerfile.prebuilt", "its runtime stage differs from Dockerfile's")


def report(p: Problems) -> int:
    if p.items:
        for item in p.items:
            print(f"ERROR {item}", file=sys.stderr)
        print(f"validate_deploy: {len(p.items)} problem(s)", file=sys.stderr)
        return 1
    print("  cross-checks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
