#!/usr/bin/env python3
"""Tests of the Helm chart helm/hourglass, without a cluster.

Each check renders the chart with `helm template` (values from tests/chart/*.yaml or
--set) and asserts one fact that matters to a user: the agent is a DaemonSet with the
DogStatsD host port, the aggregator a StatefulSet with a claim template, the probes are
gRPC, the config checksum follows the config, the schema refuses bad values, and so on.
With built binaries (--bin-dir), a last check starts hourglass-aggregator and
hourglass-agent with the environment and config files the chart renders, sends events and
queries them, then stops both with SIGTERM.

Run by scripts/check-chart with the Python of the helm tools' venv (PyYAML, jsonschema).
Prints one line per check and ends with "chart: N passed, N failed, N skipped".
"""

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "hourglass"
VALUES = ROOT / "tests" / "chart"
RELEASE = "hg"
NAMESPACE = "analytics"

CHECKS = []


def check(description):
    """Registers a check; the description is what its result line says."""

    def register(function):
        CHECKS.append((description, function))
        return function

    return register


class Skip(Exception):
    """A check that cannot run here (say why)."""


# ---------------------------------------------------------------------------- helpers


def helm(*args, release=RELEASE, chart=CHART):
    return subprocess.run(
        ["helm", "template", release, str(chart), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
    )


def render(*args, release=RELEASE, chart=CHART):
    """The rendered documents, or an AssertionError with helm's message."""
    result = helm(*args, release=release, chart=chart)
    if result.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def values(name):
    return ["-f", str(VALUES / f"{name}.yaml")]


def only(docs, kind, name_suffix=None):
    """The one document of `kind` (whose name ends with name_suffix, if given)."""
    found = [
        d
        for d in docs
        if d["kind"] == kind and (name_suffix is None or d["metadata"]["name"].endswith(name_suffix))
    ]
    assert len(found) == 1, f"expected one {kind}{' *' + name_suffix if name_suffix else ''}, found {len(found)}"
    return found[0]


def kinds(docs):
    return sorted(d["kind"] for d in docs)


def container(workload, name):
    pod = workload["spec"]["template"]["spec"]
    found = [c for c in pod["containers"] if c["name"] == name]
    assert found, f"{workload['kind']} has no container {name!r}"
    return found[0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def env_value(c, name):
    e = env_of(c).get(name)
    assert e is not None, f"container {c['name']} has no env {name}"
    return e.get("value")


def port(c, name):
    found = [p for p in c.get("ports", []) if p["name"] == name]
    assert found, f"container {c['name']} has no port {name!r}"
    return found[0]


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def rejected(args, needle):
    """helm template with args must fail, saying `needle`. A value's path may be written
    /a/b (Helm 4's schema errors) or a.b (Helm 3's)."""
    result = helm(*args)
    expect(result.returncode != 0, f"helm template {' '.join(args)} succeeded; it must fail")
    needles = [needle.lower()]
    if needle.startswith("/"):
        needles.append(needle[1:].replace("/", ".").lower())
    expect(
        any(n in result.stderr.lower() for n in needles),
        f"helm template {' '.join(args)} failed without {needle!r} in: {result.stderr.strip()}",
    )


# ------------------------------------------------------------------------------ agent


@check("agent: a DaemonSet with DogStatsD on UDP hostPort 8125, listening on 0.0.0.0:8125")
def agent_daemonset():
    ds = only(render(), "DaemonSet")
    agent = container(ds, "agent")
    statsd = port(agent, "statsd")
    expect(statsd["protocol"] == "UDP", f"statsd port protocol is {statsd['protocol']}")
    expect(statsd.get("hostPort") == 8125, f"statsd hostPort is {statsd.get('hostPort')}")
    expect(statsd["containerPort"] == 8125, f"statsd containerPort is {statsd['containerPort']}")
    expect(env_value(agent, "HOURGLASS_STATSD_LISTEN") == "0.0.0.0:8125", "HOURGLASS_STATSD_LISTEN")
    expect(agent["command"] == ["hourglass-agent"], f"command is {agent['command']}")
    expect(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0, "maxSurge must be 0")


@check("agent: server name from spec.nodeName, labels as comma-separated k=v in HOURGLASS_LABELS")
def agent_identity():
    agent = container(only(render(*values("agent-only")), "DaemonSet"), "agent")
    name = env_of(agent)["HOURGLASS_SERVER_NAME"]
    expect(
        name.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
        f"HOURGLASS_SERVER_NAME is {name}",
    )
    expect(env_value(agent, "HOURGLASS_LABELS") == "region=eu,role=web", "HOURGLASS_LABELS")
    default_agent = container(only(render(), "DaemonSet"), "agent")
    expect("HOURGLASS_LABELS" not in env_of(default_agent), "HOURGLASS_LABELS set without labels")


@check("agent: ships to this release's aggregator Service by default, to aggregatorUrl otherwise")
def agent_aggregator_url():
    agent = container(only(render(), "DaemonSet"), "agent")
    expect(
        env_value(agent, "HOURGLASS_AGGREGATOR") == f"http://{RELEASE}-hourglass-aggregator.{NAMESPACE}.svc:7700",
        f"HOURGLASS_AGGREGATOR is {env_value(agent, 'HOURGLASS_AGGREGATOR')}",
    )
    agent = container(only(render(*values("agent-only")), "DaemonSet"), "agent")
    expect(
        env_value(agent, "HOURGLASS_AGGREGATOR") == "http://hourglass-aggregator.analytics.svc:7700",
        "agent.aggregatorUrl not used",
    )


@check("agent: checkpoints on a per-release hostPath, chowned by an init container with CAP_CHOWN only")
def agent_data_dir():
    ds = only(render(), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    agent = container(ds, "agent")
    volume = next(v for v in pod["volumes"] if v["name"] == "data")
    expect(
        volume["hostPath"] == {"path": f"/var/lib/hourglass-agent/{NAMESPACE}-{RELEASE}", "type": "DirectoryOrCreate"},
        f"data volume is {volume}",
    )
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "data")
    expect(mount["mountPath"] == env_value(agent, "HOURGLASS_DATA_DIR"), "data dir is not the mounted volume")
    init = pod["initContainers"][0]
    expect(init["command"][:2] == ["chown", "10001:10001"], f"init command is {init['command']}")
    caps = init["securityContext"]["capabilities"]
    expect(caps == {"drop": ["ALL"], "add": ["CHOWN"]}, f"init capabilities are {caps}")
    pod = only(render("--set", "agent.dataDir.fixPermissions=false"), "DaemonSet")["spec"]["template"]["spec"]
    expect("initContainers" not in pod, "fixPermissions=false still renders the init container")


@check("agent: tolerates every taint by default, so every node has one")
def agent_tolerations():
    pod = only(render(), "DaemonSet")["spec"]["template"]["spec"]
    expect({"operator": "Exists"} in pod["tolerations"], f"tolerations are {pod.get('tolerations')}")


@check("agent: hostNetwork puts every port on the node and resolves Services with ClusterFirstWithHostNet")
def agent_host_network():
    ds = only(render(*values("agent-only")), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    expect(pod.get("hostNetwork") is True, "hostNetwork is not true")
    expect(pod.get("dnsPolicy") == "ClusterFirstWithHostNet", f"dnsPolicy is {pod.get('dnsPolicy')}")
    for p in container(ds, "agent")["ports"]:
        expect(p.get("hostPort") == p["containerPort"], f"port {p['name']}: hostPort must equal containerPort")
    agent = container(ds, "agent")
    expect(env_value(agent, "HOURGLASS_STATSD_SOCKET") == "/var/run/hourglass/dsd.socket", "statsd socket")
    expect(
        any(v["name"] == "statsd-socket" and v["hostPath"]["path"] == "/var/run/hourglass" for v in pod["volumes"]),
        "no statsd-socket hostPath volume",
    )


@check("agent: statsd.enabled=false turns DogStatsD off and drops the port")
def agent_statsd_off():
    agent = container(only(render("--set", "agent.statsd.enabled=false"), "DaemonSet"), "agent")
    expect(env_value(agent, "HOURGLASS_STATSD_LISTEN") == "off", "HOURGLASS_STATSD_LISTEN is not off")
    expect(all(p["name"] != "statsd" for p in agent["ports"]), "statsd port still declared")


@check("agent: the grace period must cover shipping.shutdown_timeout")
def agent_grace_period():
    rejected(["--set", "agent.terminationGracePeriodSeconds=12"], "must be at least agent.config.shipping.shutdown_timeout")
    rejected(
        ["--set", "agent.config.shipping.shutdown_timeout=1m"],
        "agent.terminationGracePeriodSeconds (30) must be at least agent.config.shipping.shutdown_timeout (60s)",
    )
    render("--set", "agent.config.shipping.shutdown_timeout=1m", "--set", "agent.terminationGracePeriodSeconds=65")


# ------------------------------------------------------------------------- aggregator


@check("aggregator: a StatefulSet with a volumeClaimTemplate mounted as its data dir")
def aggregator_statefulset():
    docs = render()
    sts = only(docs, "StatefulSet")
    claims = sts["spec"].get("volumeClaimTemplates", [])
    expect(len(claims) == 1, f"{len(claims)} volumeClaimTemplates")
    claim = claims[0]
    expect(claim["metadata"]["name"] == "data", "claim template is not named data")
    expect(claim["spec"]["resources"]["requests"]["storage"] == "20Gi", "claim size")
    expect(claim["spec"]["accessModes"] == ["ReadWriteOnce"], "claim access modes")
    expect("storageClassName" not in claim["spec"], "storageClassName set though null (default class)")
    expect("helm.sh/chart" not in claim["metadata"]["labels"], "claim template labels change with the chart version")
    agg = container(sts, "aggregator")
    mount = next(m for m in agg["volumeMounts"] if m["name"] == "data")
    expect(mount["mountPath"] == env_value(agg, "HOURGLASS_DATA_DIR"), "data dir is not the claim")
    expect(agg["command"] == ["hourglass-aggregator"], f"command is {agg['command']}")
    expect(sts["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001, "fsGroup")
    expect(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30, "grace period too short to flush")


@check("aggregator: a headless Service (serviceName) and a client Service (gRPC, HTTP API), both selecting its pods")
def aggregator_services():
    docs = render()
    sts = only(docs, "StatefulSet")
    headless = only(docs, "Service", "-headless")
    client = only(docs, "Service", "-aggregator")
    expect(sts["spec"]["serviceName"] == headless["metadata"]["name"], "serviceName is not the headless Service")
    expect(headless["spec"]["clusterIP"] == "None", "headless Service has a cluster IP")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    for svc in (headless, client):
        selector = svc["spec"]["selector"]
        expect(all(pod_labels.get(k) == v for k, v in selector.items()), f"{svc['metadata']['name']} misses the pods")
    expect([p["name"] for p in client["spec"]["ports"]] == ["grpc", "http"],
           "client Service ports must be grpc and http only (never admin)")
    expect({p["name"] for p in headless["spec"]["ports"]} == {"grpc", "admin"}, "headless Service ports")
    expect(sts["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "aggregator", "selector")


@check("aggregator: a PodDisruptionBudget selecting its pods (maxUnavailable 1, or minAvailable)")
def aggregator_pdb():
    docs = render()
    pdb = only(docs, "PodDisruptionBudget")
    sts = only(docs, "StatefulSet")
    expect(pdb["spec"]["selector"] == sts["spec"]["selector"], "PDB selector differs from the StatefulSet's")
    expect(pdb["spec"].get("maxUnavailable") == 1, f"PDB is {pdb['spec']}")
    pdb = only(render(*values("aggregator-only")), "PodDisruptionBudget")
    expect(pdb["spec"].get("minAvailable") == 1 and "maxUnavailable" not in pdb["spec"], f"PDB is {pdb['spec']}")


@check("aggregator only: no agent objects; storage class, claim retention and load balancer as asked")
def aggregator_only():
    docs = render(*values("aggregator-only"))
    expect(all(d["metadata"]["labels"].get("app.kubernetes.io/component") != "agent" for d in docs), "agent objects")
    expect("DaemonSet" not in kinds(docs), "a DaemonSet is rendered")
    sts = only(docs, "StatefulSet")
    expect(sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast-ssd", "storageClassName")
    expect(
        sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"},
        "persistentVolumeClaimRetentionPolicy",
    )
    expect(only(docs, "Service", "-aggregator")["spec"]["type"] == "LoadBalancer", "client Service type")


@check("agent only: no aggregator objects")
def agent_only():
    docs = render(*values("agent-only"))
    expect(kinds(docs) == ["ConfigMap", "DaemonSet", "ServiceAccount"], f"rendered {kinds(docs)}")


@check("aggregator.persistence.enabled=false: an emptyDir instead of a claim")
def aggregator_ephemeral():
    sts = only(render("--set", "aggregator.persistence.enabled=false"), "StatefulSet")
    expect("volumeClaimTemplates" not in sts["spec"], "volumeClaimTemplates still rendered")
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    expect(any(v["name"] == "data" and "emptyDir" in v for v in volumes), "no emptyDir data volume")


@check("HTTP API: on aggregator.httpPort in the pod, the client Service and the NetworkPolicy; null turns it off")
def http_api():
    docs = render("--set", "networkPolicy.enabled=true")
    agg = container(only(docs, "StatefulSet"), "aggregator")
    expect(port(agg, "http")["containerPort"] == 7702, "aggregator http port")
    expect(env_value(agg, "HOURGLASS_HTTP_LISTEN") == "0.0.0.0:7702", "HOURGLASS_HTTP_LISTEN")
    client = only(docs, "Service", "-aggregator")
    expect({"name": "http", "port": 7702, "targetPort": "http", "protocol": "TCP"} in client["spec"]["ports"],
           f"client Service ports {client['spec']['ports']}")
    rule = only(docs, "NetworkPolicy")["spec"]["ingress"][0]
    expect({"port": "http", "protocol": "TCP"} in rule["ports"], f"NetworkPolicy ports {rule['ports']}")
    off = render("--set", "aggregator.httpPort=null", "--set", "networkPolicy.enabled=true")
    agg = container(only(off, "StatefulSet"), "aggregator")
    expect(env_value(agg, "HOURGLASS_HTTP_LISTEN") == "off", "httpPort=null does not turn the API off")
    expect(all(p["name"] != "http" for p in agg["ports"]), "an http container port without httpPort")
    expect(all(p["name"] != "http" for p in only(off, "Service", "-aggregator")["spec"]["ports"]),
           "an http Service port without httpPort")
    rule = only(off, "NetworkPolicy")["spec"]["ingress"][0]
    expect(rule["ports"] == [{"port": "grpc", "protocol": "TCP"}], f"NetworkPolicy ports {rule['ports']}")


# ----------------------------------------------------------------------------- probes


@check("probes: gRPC (grpc.health.v1) on the aggregator's gRPC port and the agent's Ingest port")
def probes_grpc():
    docs = render()
    agg = container(only(docs, "StatefulSet"), "aggregator")
    agent = container(only(docs, "DaemonSet"), "agent")
    for c, probes, grpc_port in (
        (agg, ("startupProbe", "livenessProbe", "readinessProbe"), 7700),
        (agent, ("livenessProbe", "readinessProbe"), 7710),
    ):
        for probe in probes:
            expect(probe in c, f"{c['name']} has no {probe}")
            expect(c[probe].get("grpc") == {"port": grpc_port}, f"{c['name']} {probe} is {c[probe]}")
    expect(port(agg, "grpc")["containerPort"] == 7700, "aggregator grpc port")
    expect(env_value(agent, "HOURGLASS_INGEST_LISTEN") == "0.0.0.0:7710", "Ingest must listen beyond loopback")
    changed = container(only(render("--set", "aggregator.port=9000"), "StatefulSet"), "aggregator")
    expect(changed["livenessProbe"]["grpc"]["port"] == 9000, "probe does not follow aggregator.port")
    expect(env_value(changed, "HOURGLASS_LISTEN") == "0.0.0.0:9000", "HOURGLASS_LISTEN does not follow the port")


@check("probes: with TLS, the aggregator is probed over HTTP on the admin port (kubelet's gRPC probes cannot do TLS)")
def probes_tls():
    agg = container(only(render(*values("tls")), "StatefulSet"), "aggregator")
    expect(agg["livenessProbe"].get("httpGet") == {"path": "/healthz", "port": "admin"}, "liveness")
    expect(agg["readinessProbe"].get("httpGet") == {"path": "/readyz", "port": "admin"}, "readiness")
    expect("grpc" not in agg["startupProbe"], "startup probe still gRPC")


# ----------------------------------------------------------------------------- config


@check("config: the ConfigMaps are the values' TOML, whole numbers as integers, metric names quoted")
def config_toml():
    docs = render(*values("agent-only"))
    text = only(docs, "ConfigMap")["data"]["agent.toml"]
    parsed = tomllib.loads(text)
    expected = yaml.safe_load((CHART / "values.yaml").read_text())["agent"]["config"]
    overrides = yaml.safe_load((VALUES / "agent-only.yaml").read_text())["agent"]["config"]
    expected.update(overrides)
    # A null value (agent.config.defaults.precision: the form's own default) is left out.
    expected["defaults"] = {k: v for k, v in expected["defaults"].items() if v is not None}
    expect(parsed == expected, f"agent.toml parses to {parsed}, not {expected}")
    expect(isinstance(parsed["limits"]["max_series"], int), "max_series is not an integer")
    expect('[metrics."http.requests"]' in text, "metric name with '.' is not quoted")
    text = only(render(), "ConfigMap", "-aggregator")["data"]["aggregator.toml"]
    parsed = tomllib.loads(text)
    expected = yaml.safe_load((CHART / "values.yaml").read_text())["aggregator"]["config"]
    expect(parsed == expected, f"aggregator.toml parses to {parsed}, not {expected}")
    expect("block_cache_mib = 256\n" in text, "block_cache_mib is not written as an integer")
    text = only(render("--set", "aggregator.config.storage.block_cache_mib=null"), "ConfigMap", "-aggregator")
    expect("block_cache_mib" not in text["data"]["aggregator.toml"], "a null key is written")


def checksums(*args):
    docs = render(*args)
    return {
        d["kind"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in docs
        if d["kind"] in ("StatefulSet", "DaemonSet")
    }


@check("config: checksum/config changes when (and only when) that role's config changes")
def config_checksum():
    base = checksums()
    agg = checksums("--set", "aggregator.config.retention.hourly=40d")
    expect(agg["StatefulSet"] != base["StatefulSet"], "aggregator checksum unchanged by its config")
    expect(agg["DaemonSet"] == base["DaemonSet"], "agent checksum changed by the aggregator's config")
    agent = checksums("--set", "agent.config.flush_interval=5s")
    expect(agent["DaemonSet"] != base["DaemonSet"], "agent checksum unchanged by its config")
    expect(agent["StatefulSet"] == base["StatefulSet"], "aggregator checksum changed by the agent's config")
    other = checksums("--set", "aggregator.resources.limits.memory=3Gi", "--set", "agent.labels.region=eu")
    expect(other == base, "checksums changed by values that are not config")


@check("config: each process reads its ConfigMap through HOURGLASS_CONFIG")
def config_mounted():
    docs = render()
    for kind, name, file in (("StatefulSet", "aggregator", "aggregator.toml"), ("DaemonSet", "agent", "agent.toml")):
        workload = only(docs, kind)
        c = container(workload, name)
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        expect(env_value(c, "HOURGLASS_CONFIG") == f"{mount['mountPath']}/{file}", f"{name} HOURGLASS_CONFIG")
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
        expect(file in cm["data"], f"ConfigMap {cm['metadata']['name']} has no {file}")


# --------------------------------------------------------------------------- security


@check("security: non-root, read-only root, no privilege escalation, all capabilities dropped, no token")
def security_contexts():
    for docs in (render(), render(*values("tls")), render(*values("agent-only"))):
        for workload in (d for d in docs if d["kind"] in ("StatefulSet", "DaemonSet")):
            pod = workload["spec"]["template"]["spec"]
            expect(pod.get("automountServiceAccountToken") is False, "service account token mounted")
            expect(pod.get("enableServiceLinks") is False, "service links enabled")
            expect(pod["securityContext"].get("runAsNonRoot") is True, "pod runAsNonRoot")
            expect(pod["securityContext"].get("seccompProfile") == {"type": "RuntimeDefault"}, "seccomp")
            for c in pod["containers"] + pod.get("initContainers", []):
                sc = c["securityContext"]
                where = f"{workload['kind']} container {c['name']}"
                expect(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation")
                expect(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem")
                expect("ALL" in sc.get("capabilities", {}).get("drop", []), f"{where}: capabilities not dropped")
                if c in pod["containers"]:
                    expect(sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot")
                    expect("add" not in sc.get("capabilities", {}), f"{where}: adds capabilities")


@check("secrets: TLS and the token come from the named Secrets, mounted read-only; no Secret is rendered")
def secrets_by_reference():
    docs = render(*values("tls"))
    expect("Secret" not in kinds(docs), "the chart renders a Secret")
    sts = only(docs, "StatefulSet")
    agg = container(sts, "aggregator")
    expect(
        agg["args"]
        == [
            "--tls-cert=/etc/hourglass/tls/tls.crt",
            "--tls-key=/etc/hourglass/tls/tls.key",
            "--tls-client-ca=/etc/hourglass/client-ca/ca.crt",
        ],
        f"aggregator args are {agg.get('args')}",
    )
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    expect(volumes["tls"]["secret"]["secretName"] == "hourglass-aggregator-tls", "server Secret")
    expect(volumes["client-ca"]["secret"]["secretName"] == "hourglass-client-ca", "client CA Secret")
    ds = only(docs, "DaemonSet")
    agent = container(ds, "agent")
    expect(
        agent["args"]
        == [
            "--tls-ca=/etc/hourglass/tls-ca/ca.crt",
            "--tls-client-cert=/etc/hourglass/tls-client/tls.crt",
            "--tls-client-key=/etc/hourglass/tls-client/tls.key",
            "--token-file=/etc/hourglass/token/token",
        ],
        f"agent args are {agent.get('args')}",
    )
    expect(env_value(agent, "HOURGLASS_AGGREGATOR").startswith("https://"), "agents do not use https")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    expect(
        volumes["tls-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}],
        "agents must get only ca.crt from the server's Secret",
    )
    expect(volumes["token"]["secret"]["secretName"] == "hourglass-agent-token", "token Secret")
    for c in (agg, agent):
        for m in c["volumeMounts"]:
            if m["name"] in ("tls", "client-ca", "tls-ca", "tls-client", "token"):
                expect(m.get("readOnly") is True, f"{c['name']} mount {m['name']} is writable")
    default = render()
    for c in (container(only(default, "StatefulSet"), "aggregator"), container(only(default, "DaemonSet"), "agent")):
        expect("args" not in c, f"{c['name']} has TLS or token args by default")


# ---------------------------------------------------------------- monitoring, network


@check("ServiceMonitors: valid, one per role, each selecting exactly one Service with an admin port")
def service_monitors():
    schema = json.loads((VALUES / "servicemonitor.schema.json").read_text())
    docs = render(*values("servicemonitor"))
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    expect(len(monitors) == 2, f"{len(monitors)} ServiceMonitors")
    services = [d for d in docs if d["kind"] == "Service"]
    for monitor in monitors:
        jsonschema.validate(monitor, schema)
        expect(monitor["metadata"]["labels"].get("release") == "prometheus", "serviceMonitor.labels not applied")
        selector = monitor["spec"]["selector"]["matchLabels"]
        endpoint = monitor["spec"]["endpoints"][0]
        expect(endpoint["interval"] == "15s", "interval")
        matched = [
            s
            for s in services
            if all(s["metadata"]["labels"].get(k) == v for k, v in selector.items())
            and any(p["name"] == endpoint["port"] for p in s["spec"]["ports"])
        ]
        expect(len(matched) == 1, f"{monitor['metadata']['name']} scrapes {len(matched)} Services, not 1")
    expect(not [d for d in render() if d["kind"] == "ServiceMonitor"], "ServiceMonitor rendered by default")


@check("NetworkPolicy: only agents, labelled queriers and node CIDRs reach gRPC; admin as configured")
def network_policy():
    docs = render(*values("networkpolicy"))
    policy = only(docs, "NetworkPolicy")
    sts = only(docs, "StatefulSet")
    ds = only(docs, "DaemonSet")
    expect(policy["spec"]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"], "podSelector")
    expect(policy["spec"]["policyTypes"] == ["Ingress"], "policyTypes")
    grpc_rule, admin_rule = policy["spec"]["ingress"]
    expect(grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}, {"port": "http", "protocol": "TCP"}], f"first rule ports {grpc_rule['ports']}")
    peers = grpc_rule["from"]
    expect({"podSelector": {"matchLabels": ds["spec"]["selector"]["matchLabels"]}} in peers, "agents not allowed")
    expect(
        {
            "podSelector": {"matchLabels": {"hourglass-querier": "true"}},
            "namespaceSelector": {"matchLabels": {"hourglass-queries": "allowed"}},
        }
        in peers,
        f"queriers not allowed as configured: {peers}",
    )
    expect({"ipBlock": {"cidr": "10.0.0.0/16"}} in peers, "node CIDR not allowed")
    expect(len(peers) == 3, f"unexpected peers: {peers}")
    expect(admin_rule["ports"] == [{"port": "admin", "protocol": "TCP"}], "admin rule ports")
    expect(admin_rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"},
           "adminFrom not applied")
    default_policy = render("--set", "networkPolicy.enabled=true")
    peers = only(default_policy, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    expect({"podSelector": {"matchLabels": {"hourglass-querier": "true"}}} in peers, "default querier peer")
    expect(not [d for d in render() if d["kind"] == "NetworkPolicy"], "NetworkPolicy rendered by default")


# ----------------------------------------------------------------------------- schema


@check("values.schema.json: rejects bad values with a message naming them")
def schema_rejects():
    for args, needle in (
        (["--set", "aggregator.port=abc"], "/aggregator/port"),
        (["--set", "aggregator.port=0"], "/aggregator/port"),
        (["--set", "agent.statsd.hostPort=70000"], "/agent/statsd/hostPort"),
        (["--set", "aggregator.replicas=2"], "/aggregator/replicas"),
        (["--set", "logFormat=xml"], "/logFormat"),
        (["--set", "agent.hostnetwork=true"], "hostnetwork"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "agent.config.flush_interval=10"], "/agent/config/flush_interval"),
        (["--set", "agent.config.lateness=1hour"], "/agent/config/lateness"),
        (["--set", "agent.config.default_kinds={distinct,sketchy}"], "/agent/config/default_kinds"),
        (["--set", "agent.config.defaults.precision=20"], "/agent/config/defaults/precision"),
        (["--set", "agent.config.defaults.epsilon=1.5"], "/agent/config/defaults/epsilon"),
        (["--set", "agent.config.shipping.max_batch_mib=0"], "/agent/config/shipping/max_batch_mib"),
        (["--set", "agent.config.bogus=1"], "bogus"),
        (["--set-json", 'agent.config.metrics={"9lives":{"precision":12}}'], "9lives"),
        (["--set-string", "agent.labels.region=eu|west"], "/agent/labels/region"),
        (["--set-string", "agent.labels.bad key=x"], "bad key"),
        (["--set", "aggregator.config.storage.block_cache_mib=0"], "/aggregator/config/storage/block_cache_mib"),
        (["--set", "aggregator.config.retenton.hourly=1d"], "retenton"),
        (["--set", "aggregator.service.type=Ingress"], "/aggregator/service/type"),
        (["--set", "aggregator.persistence.size=lots"], "/aggregator/persistence/size"),
        (["--set", "aggregator.probes.liveness.periodSeconds=0"], "/aggregator/probes/liveness/periodSeconds"),
        (["--set", "listenHost=localhost"], "/listenHost"),
        (["--set", "agent.updateStrategy.maxUnavailable=0"], "/agent/updateStrategy/maxUnavailable"),
        (["--set", "auth.agentToken.enabled=true"], "/auth/agentToken/secretName"),
        (["--set", "agent.aggregatorUrl=aggregator:7700"], "/agent/aggregatorUrl"),
    ):
        rejected(args, needle)


@check("templates: missing Secrets or aggregator fail with a message saying what to set")
def template_requirements():
    rejected(["--set", "tls.enabled=true"], "tls.serverSecret is required")
    rejected(["--set", "tls.enabled=true", "--set", "aggregator.enabled=false", "--set",
              "agent.aggregatorUrl=https://agg:7700"], "tls.caSecret (or tls.serverSecret) is required")
    rejected(["--set", "tls.enabled=true", "--set", "tls.serverSecret=s", "--set", "tls.clientAuth.enabled=true"],
             "tls.clientAuth.caSecret is required")
    rejected(["--set", "aggregator.enabled=false"], "agent.aggregatorUrl is required")


@check("Chart.yaml: kubeVersion refuses clusters without native gRPC probes (before 1.27)")
def kube_version():
    rejected(["--kube-version", "1.26.0"], "kubeVersion")
    render("--kube-version", "1.27.0")


@check("names: DNS labels of at most 63 characters, workloads at most 52, for a long release name")
def names_fit():
    release = "a-release-name-as-long-as-helm-allows-53-characters-x"
    expect(len(release) == 53, "the test's release name must be 53 characters")
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                  release=release)
    for d in docs:
        name = d["metadata"]["name"]
        expect(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) is not None, f"{name!r} is not a DNS label")
        limit = 52 if d["kind"] in ("StatefulSet", "DaemonSet") else 63
        expect(len(name) <= limit, f"{d['kind']} name {name!r} is {len(name)} characters, over {limit}")
        for key, value in d["metadata"].get("labels", {}).items():
            expect(len(str(value)) <= 63, f"label {key}={value} is over 63 characters")
    names = {d["metadata"]["name"] for d in render("--set", "fullnameOverride=hourglass")}
    expect({"hourglass-aggregator", "hourglass-agent", "hourglass-aggregator-headless"} <= names, f"{names}")


@check("labels: every object has the app.kubernetes.io labels, pods have a component")
def standard_labels():
    for d in render(*values("servicemonitor")):
        labels = d["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "helm.sh/chart"):
            expect(key in labels, f"{d['kind']} {d['metadata']['name']} has no {key}")
        if d["kind"] in ("StatefulSet", "DaemonSet"):
            pod_labels = d["spec"]["template"]["metadata"]["labels"]
            expect(pod_labels.get("app.kubernetes.io/component") in ("agent", "aggregator"), "pod component")


@check("values.yaml: a comment above every value")
def values_documented():
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^( *)([A-Za-z_][\w.-]*):")
    indent = lambda line: len(line) - len(line.lstrip())

    def only_child(number):
        """Whether the key on line `number` (0-based) is its parent's only key."""
        depth = indent(lines[number])
        siblings = 0
        for line in lines[number:]:
            if not line.strip() or line.strip().startswith("#"):
                continue
            if indent(line) < depth:
                break
            if indent(line) == depth and key.match(line):
                siblings += 1
        return siblings == 1

    undocumented = []
    for number, line in enumerate(lines):
        if not key.match(line):
            continue
        previous = lines[number - 1] if number else ""
        if previous.strip().startswith("#"):
            continue
        # A lone child of a documented key (seccompProfile: / type: RuntimeDefault) is
        # covered by its parent's comment.
        if previous.rstrip().endswith(":") and indent(previous) < indent(line) and only_child(number):
            continue
        undocumented.append(f"line {number + 1}: {line.strip()}")
    expect(not undocumented, "values without a comment above them:\n    " + "\n    ".join(undocumented))


def render_notes(*args):
    """NOTES.txt as rendered with args. helm template leaves NOTES.txt out, and Helm 3's
    `install --dry-run=client` wants a cluster: render the notes as a template of a copy
    of the chart instead."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "hourglass"
        shutil.copytree(CHART, copy)
        notes_file = copy / "templates" / "NOTES.txt"
        (copy / "templates" / "_notes.tpl").write_text(
            '{{- define "notes" -}}\n' + notes_file.read_text() + "{{- end -}}\n"
        )
        notes_file.unlink()
        (copy / "templates" / "notes.yaml").write_text('notes: |\n{{ include "notes" . | indent 2 }}\n')
        result = subprocess.run(
            ["helm", "template", RELEASE, str(copy), "--namespace", NAMESPACE, "--show-only", "templates/notes.yaml",
             *args],
            capture_output=True,
            text=True,
        )
    expect(result.returncode == 0, f"rendering NOTES.txt failed: {result.stderr.strip()}")
    return yaml.safe_load(result.stdout)["notes"]


@check("NOTES.txt: shows the port-forward and the hourglass query to run")
def notes():
    notes_text = render_notes()
    expect(
        f"kubectl --namespace {NAMESPACE} port-forward service/{RELEASE}-hourglass-aggregator 7700:7700" in notes_text,
        "no port-forward command in NOTES",
    )
    expect(
        "hourglass query distinct --metric visitors --from -7d --aggregator http://127.0.0.1:7700" in notes_text,
        "no hourglass query command in NOTES",
    )
    expect("status.hostIP" in notes_text, "NOTES do not say how applications reach their node's agent")


# ----------------------------------------------------------------------- cluster mode


CLUSTER_NATS = '["nats://nats.nats.svc:4222"]'


def cluster(*args):
    """Cluster mode with the fewest values: enabled and one NATS URL, then args."""
    return ("--set", "aggregator.cluster.enabled=true", "--set-json", f"aggregator.cluster.nats={CLUSTER_NATS}", *args)


def cluster_toml(docs):
    return tomllib.loads(only(docs, "ConfigMap", "-aggregator")["data"]["aggregator.toml"])


@check("cluster: off by default, and then its values change nothing: no [cluster], ordered pods, no cluster env")
def cluster_off():
    docs = render()
    toml_text = only(docs, "ConfigMap", "-aggregator")["data"]["aggregator.toml"]
    expect("[cluster]" not in toml_text, "[cluster] rendered with cluster mode off")
    sts = only(docs, "StatefulSet")
    expect(sts["spec"]["podManagementPolicy"] == "OrderedReady", f"podManagementPolicy {sts['spec']['podManagementPolicy']}")
    env = env_of(container(sts, "aggregator"))
    extra = {n for n in env if n.startswith("HOURGLASS_CLUSTER_") or n.startswith("POD_")}
    expect(not extra, f"cluster env with cluster mode off: {sorted(extra)}")
    # Every cluster value but `enabled`, changed: the render must not move by a byte.
    changed = render(
        "--set-json", f"aggregator.cluster.nats={CLUSTER_NATS}",
        "--set", "aggregator.cluster.owners=3", "--set", "aggregator.cluster.partitions=128",
        "--set", "aggregator.cluster.natsPort=4333", "--set", "aggregator.cluster.credentials.existingSecret=creds",
        "--set", "aggregator.cluster.caSecret=ca", "--set", "aggregator.cluster.peerToken.existingSecret=peer",
        "--set", "clusterDomain=example.org", "--set", "networkPolicy.enabled=false",
    )
    expect(changed == docs, "cluster values change the render while aggregator.cluster.enabled is false")
    policy = only(render("--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    expect(policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"],
           "the NetworkPolicy limits egress with cluster mode off")


@check("cluster: [cluster] in the config file is the values' (no node, no advertise), Secrets' paths included")
def cluster_config():
    parsed = cluster_toml(render(*values("cluster")))
    expect(parsed["cluster"] == {
        "nats": ["tls://nats.nats.svc:4222", "tls://nats-headless.nats.svc:4222"],
        "stream": "HOURGLASS",
        "subject_prefix": "hourglass",
        "partitions": 128,
        "subjects": 16,
        "replicas": 3,
        "owners": 2,
        "max_age": "3d",
        "publish_timeout": "10s",
        "heartbeat": "1s",
        "member_ttl": "10s",
        "credentials": "/etc/hourglass/nats/nats.creds",
        "ca_file": "/etc/hourglass/nats-ca/ca.crt",
        "peer_token_file": "/etc/hourglass/peer-token/query-token",
    }, f"[cluster] is {parsed['cluster']}")
    expect(all(isinstance(parsed["cluster"][k], int) for k in ("partitions", "subjects", "replicas", "owners")),
           "partitions, subjects, replicas or owners not written as integers")
    rest = {k: v for k, v in parsed.items() if k != "cluster"}
    expected = yaml.safe_load((CHART / "values.yaml").read_text())["aggregator"]["config"]
    expect(rest == expected, f"the other sections are {rest}, not aggregator.config")
    # Without Secrets no file is named; a null config key is still left out.
    parsed = cluster_toml(render(*cluster("--set", "aggregator.replicas=3", "--set", "aggregator.config.storage.block_cache_mib=null")))
    expect(not {"credentials", "ca_file", "peer_token_file"} & parsed["cluster"].keys(),
           f"[cluster] names files without Secrets: {parsed['cluster']}")
    # subjects null: left out, so that the node takes the stream's.
    expect("subjects" not in parsed["cluster"], f"[cluster] names subjects: {parsed['cluster']}")
    expect("block_cache_mib" not in parsed["storage"], "a null key is written in cluster mode")
    expect(parsed["cluster"]["nats"] == ["nats://nats.nats.svc:4222"], "nats")


@check("cluster: N pods in parallel, each named after itself and advertised at its headless-Service address")
def cluster_nodes():
    docs = render(*values("cluster"))
    sts = only(docs, "StatefulSet")
    headless = only(docs, "Service", "-headless")
    expect(sts["spec"]["replicas"] == 3, f"replicas {sts['spec']['replicas']}")
    expect(sts["spec"]["podManagementPolicy"] == "Parallel", f"podManagementPolicy {sts['spec']['podManagementPolicy']}")
    expect(sts["spec"]["serviceName"] == headless["metadata"]["name"], "serviceName is not the headless Service")
    expect(headless["spec"].get("publishNotReadyAddresses") is True, "headless Service hides starting nodes")
    agg = container(sts, "aggregator")
    env = [e["name"] for e in agg["env"]]
    field = lambda name: env_of(agg)[name].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    expect(field("HOURGLASS_CLUSTER_NODE") == "metadata.name", "HOURGLASS_CLUSTER_NODE is not the pod's name")
    expect(field("POD_NAME") == "metadata.name" and field("POD_NAMESPACE") == "metadata.namespace", "POD_* env")
    # $(VAR) expands only variables defined earlier in the list.
    advertise = env.index("HOURGLASS_CLUSTER_ADVERTISE")
    expect(env.index("POD_NAME") < advertise and env.index("POD_NAMESPACE") < advertise,
           "HOURGLASS_CLUSTER_ADVERTISE comes before the variables it uses")
    expect(
        env_value(agg, "HOURGLASS_CLUSTER_ADVERTISE")
        == f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:{port(agg, 'grpc')['containerPort']}",
        f"HOURGLASS_CLUSTER_ADVERTISE is {env_value(agg, 'HOURGLASS_CLUSTER_ADVERTISE')}",
    )
    agg = container(only(render(*values("cluster"), "--set", "clusterDomain=k8s.example.org", "--set",
                                "aggregator.port=9000"), "StatefulSet"), "aggregator")
    expect(env_value(agg, "HOURGLASS_CLUSTER_ADVERTISE").endswith(".svc.k8s.example.org:9000"),
           f"advertise does not follow clusterDomain and port: {env_value(agg, 'HOURGLASS_CLUSTER_ADVERTISE')}")
    # Every DNS label of the advertised name fits, even for the longest release name.
    release = "a-release-name-as-long-as-helm-allows-53-characters-x"
    docs = render(*values("cluster"), "--set", "aggregator.replicas=100", release=release)
    sts = only(docs, "StatefulSet")
    host = env_value(container(sts, "aggregator"), "HOURGLASS_CLUSTER_ADVERTISE").rpartition(":")[0]
    host = host.replace("$(POD_NAME)", f"{sts['metadata']['name']}-99").replace("$(POD_NAMESPACE)", NAMESPACE)
    expect(all(0 < len(label) <= 63 for label in host.split(".")), f"{host!r} has a label over 63 characters")


@check("cluster: NATS credentials, CA and peer token from the named Secrets, read-only where [cluster] points")
def cluster_secrets():
    docs = render(*values("cluster"))
    expect("Secret" not in kinds(docs), "the chart renders a Secret")
    sts = only(docs, "StatefulSet")
    agg = container(sts, "aggregator")
    mounts = {m["mountPath"]: m for m in agg["volumeMounts"]}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    config = cluster_toml(docs)["cluster"]
    for field, secret in (("credentials", "hourglass-nats-creds"), ("ca_file", "nats-ca"),
                          ("peer_token_file", "hourglass-peer-token")):
        directory, _, key = config[field].rpartition("/")
        mount = mounts.get(directory)
        expect(mount is not None, f"{field} = {config[field]!r}, but nothing is mounted at {directory}")
        expect(mount.get("readOnly") is True, f"{directory} is writable")
        volume = volumes[mount["name"]]["secret"]
        expect(volume["secretName"] == secret, f"{field} comes from {volume['secretName']}, not {secret}")
        expect(volume["items"] == [{"key": key, "path": key}], f"{field}: the Secret's items are {volume['items']}")
    bare = only(render(*cluster()), "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    expect({v["name"] for v in bare} == {"config", "tmp"}, f"volumes without Secrets: {[v['name'] for v in bare]}")


@check("cluster with TLS: nodes trust the agents' CA for each other, and present their serving certificate under mutual TLS")
def cluster_tls():
    for extra, secret in (((), "hourglass-aggregator-tls"), (("--set", "tls.caSecret=agg-ca"), "agg-ca")):
        docs = render(*values("cluster"), *values("tls"), *extra)
        sts = only(docs, "StatefulSet")
        mounts = {m["mountPath"]: m for m in container(sts, "aggregator")["volumeMounts"]}
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        config = cluster_toml(docs)["cluster"]
        expect(config.get("peer_ca_file") == "/etc/hourglass/peer-ca/ca.crt", f"peer_ca_file is {config.get('peer_ca_file')}")
        mount = mounts.get("/etc/hourglass/peer-ca")
        expect(mount is not None and mount.get("readOnly") is True, "the peer CA is not mounted read-only")
        volume = volumes[mount["name"]]["secret"]
        expect(volume["secretName"] == secret and volume["items"] == [{"key": "ca.crt", "path": "ca.crt"}],
               f"the peer CA comes from {volume}, not {secret}'s ca.crt")
        # tls.yaml has mutual TLS: the node's own certificate, where --tls-cert reads it.
        expect(config.get("peer_cert_file") == "/etc/hourglass/tls/tls.crt"
               and config.get("peer_key_file") == "/etc/hourglass/tls/tls.key",
               f"peer certificate {config.get('peer_cert_file')}, key {config.get('peer_key_file')}")
        expect("/etc/hourglass/tls" in mounts, "the serving certificate is not mounted")
    config = cluster_toml(render(*values("cluster"), *values("tls"), "--set", "tls.clientAuth.enabled=false"))["cluster"]
    expect("peer_ca_file" in config and not {"peer_cert_file", "peer_key_file"} & config.keys(),
           f"TLS without client authentication: {config}")
    config = cluster_toml(render(*values("cluster")))["cluster"]
    expect(not {"peer_ca_file", "peer_cert_file", "peer_key_file"} & config.keys(), f"no TLS: {config}")


@check("cluster: the PodDisruptionBudget lets owners - 1 nodes go (1 by default), whatever maxUnavailable says")
def cluster_pdb():
    for args, expected in (
        ((), 1),
        (("--set", "aggregator.cluster.owners=3"), 2),
        (("--set", "aggregator.cluster.owners=1"), 0),
        (("--set", "aggregator.cluster.owners=5"), 2),  # 3 nodes: each partition on all 3
        (("--set", "aggregator.podDisruptionBudget.maxUnavailable=null",
          "--set", "aggregator.podDisruptionBudget.minAvailable=3"), 1),
    ):
        pdb = only(render(*values("cluster"), *args), "PodDisruptionBudget")["spec"]
        expect(pdb.get("maxUnavailable") == expected and "minAvailable" not in pdb,
               f"with {' '.join(args) or 'the cluster values'}: PDB is {pdb}, not maxUnavailable {expected}")


@check("cluster: the NetworkPolicy lets nodes reach each other's gRPC port; egress only DNS, NATS, nodes, extraEgress")
def cluster_network_policy():
    docs = render(*values("cluster"))
    policy = only(docs, "NetworkPolicy")["spec"]
    nodes = {"podSelector": {"matchLabels": only(docs, "StatefulSet")["spec"]["selector"]["matchLabels"]}}
    expect(policy["policyTypes"] == ["Ingress", "Egress"], f"policyTypes {policy['policyTypes']}")
    grpc_rule = policy["ingress"][0]
    expect(grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}, {"port": "http", "protocol": "TCP"}], "first rule is not the gRPC and HTTP ports")
    expect(nodes in grpc_rule["from"], f"the nodes cannot reach each other's gRPC port: {grpc_rule['from']}")
    expect(policy["egress"] == [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"ports": [{"port": 4222, "protocol": "TCP"}]},
        {"ports": [{"port": 7700, "protocol": "TCP"}], "to": [nodes]},
    ], f"egress is {policy['egress']}")
    otlp = {"ports": [{"port": 4317, "protocol": "TCP"}]}
    policy = only(render(*values("cluster"), "--set", "aggregator.cluster.natsPort=4333",
                         "--set-json", f"networkPolicy.extraEgress=[{json.dumps(otlp)}]"), "NetworkPolicy")["spec"]
    expect(policy["egress"][1] == {"ports": [{"port": 4333, "protocol": "TCP"}]}, "egress does not follow natsPort")
    expect(policy["egress"][-1] == otlp, "networkPolicy.extraEgress not appended")


@check("cluster: the schema refuses replicas > 1 without cluster mode, and cluster mode without NATS URLs")
def cluster_schema():
    for args, needle in (
        (["--set", "aggregator.replicas=3"], "/aggregator/replicas"),
        (["--set", "aggregator.cluster.enabled=true"], "/aggregator/cluster/nats"),
        (list(cluster("--set", "aggregator.replicas=0")), "/aggregator/replicas"),
        (list(cluster("--set-json", 'aggregator.cluster.nats=["http://nats:4222"]')), "/aggregator/cluster/nats/0"),
        (list(cluster("--set", "aggregator.cluster.partitions=0")), "/aggregator/cluster/partitions"),
        (list(cluster("--set", "aggregator.cluster.partitions=4097")), "/aggregator/cluster/partitions"),
        (list(cluster("--set", "aggregator.cluster.replicas=6")), "/aggregator/cluster/replicas"),
        (list(cluster("--set", "aggregator.cluster.owners=0")), "/aggregator/cluster/owners"),
        (list(cluster("--set", "aggregator.cluster.stream=a.b")), "/aggregator/cluster/stream"),
        (list(cluster("--set", "aggregator.cluster.subjectPrefix=a..b")), "/aggregator/cluster/subjectPrefix"),
        (list(cluster("--set", "aggregator.cluster.maxAge=7days")), "/aggregator/cluster/maxAge"),
        (list(cluster("--set", "aggregator.cluster.peerToken.existingSecret=Not_A_Name")),
         "/aggregator/cluster/peerToken/existingSecret"),
        (list(cluster("--set", "aggregator.cluster.node=agg-1")), "node"),
        (["--set", "clusterDomain=cluster_local"], "/clusterDomain"),
    ):
        rejected(args, needle)
    render(*cluster("--set", "aggregator.replicas=5"))


@check("cluster: `helm upgrade --reuse-values` from a release made before cluster mode renders as before")
def cluster_reuse_values():
    # --reuse-values renders with the old release's values in place of the new chart's
    # defaults (Helm's Upgrade.reuseValues: chart.Values = oldVals), so the values added
    # for cluster mode are absent: that must mean cluster mode off, not a failed upgrade.
    old = yaml.safe_load((CHART / "values.yaml").read_text())
    del old["aggregator"]["cluster"], old["clusterDomain"], old["networkPolicy"]["extraEgress"]
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "hourglass"
        shutil.copytree(CHART, chart)
        (chart / "values.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
        for args in ((), ("--set", "networkPolicy.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")):
            expect(render(*args, chart=chart) == render(*args), f"with the old values and {args}, the render differs")
        # Turning cluster mode on over the old values names what is missing.
        result = helm(*cluster("--set", "aggregator.replicas=3"), chart=chart)
        expect(result.returncode != 0 and "stream" in result.stderr,
               f"cluster mode over pre-cluster values: {result.stderr.strip() or 'rendered'}")


@check("cluster: checksum/config follows the [cluster] values; NOTES name the nodes and NATS")
def cluster_checksum_and_notes():
    base = checksums(*values("cluster"))
    changed = checksums(*values("cluster"), "--set", "aggregator.cluster.owners=3")
    expect(changed["StatefulSet"] != base["StatefulSet"], "aggregator checksum unchanged by [cluster]")
    expect(changed["DaemonSet"] == base["DaemonSet"], "agent checksum changed by [cluster]")
    text = render_notes(*values("cluster"))
    expect("Cluster mode: the StatefulSet's 3 pods are nodes" in text and "tls://nats.nats.svc:4222" in text, f"NOTES in cluster mode:\n{text}")
    expect("sync_interval: always" in text, "NOTES do not say NATS needs sync_interval: always")
    expect("Cluster mode" not in render_notes(), "NOTES mention cluster mode with it off")


# ------------------------------------------------------------- the real binaries


class Stderr:
    """What a process has written to stderr so far, read without blocking."""

    def __init__(self, process):
        self.process = process
        self.text = b""

    def wait_for(self, prefix, seconds):
        """The rest of the first line starting with prefix, waiting up to `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            complete = self.text[: self.text.rfind(b"\n") + 1]  # a line may arrive in pieces
            for line in complete.decode(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            if time.monotonic() >= deadline:
                break
            ready, _, _ = select.select([self.process.stderr], [], [], 0.2)
            if ready:
                chunk = os.read(self.process.stderr.fileno(), 65536)
                if not chunk:
                    break
                self.text += chunk
            elif self.process.poll() is not None:
                break
        raise AssertionError(
            f"{Path(self.process.args[0]).name}: no {prefix!r} line within {seconds}s; "
            f"stderr: {self.text.decode(errors='replace').strip()!r}"
        )


def process_env(c, overrides):
    """The container's literal env, with the overrides (None removes a variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def stop(process, grace):
    """SIGTERM, then the exit code within the pod's grace period (SIGKILL after)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"{process.args[0]} did not stop within {grace}s of SIGTERM")


class Programs:
    """Starts the chart's programs with a container's env: the built binaries in
    `bin_dir`, or, with `image`, that image under Docker (host network, so the addresses
    are the same; the env is the container's alone, as in a pod)."""

    def __init__(self, tmp, bin_dir=None, image=None):
        self.tmp, self.bin_dir, self.image = tmp, bin_dir, image
        self.containers = []
        if image:
            os.chmod(tmp, 0o777)  # the image's user (10001) writes its data here

    def popen(self, c, overrides):
        command = [*c["command"], *c.get("args", [])]
        if not self.image:
            return subprocess.Popen([str(self.bin_dir / command[0]), *command[1:]], env=process_env(c, overrides),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        env.update(overrides)
        name = f"hourglass-chart-{os.getpid()}-{len(self.containers)}"
        self.containers.append(name)
        flags = [f for k, v in env.items() if v is not None for f in ("-e", f"{k}={v}")]
        return subprocess.Popen(
            ["docker", "run", "--rm", "--name", name, "--network", "host", "-v", f"{self.tmp}:{self.tmp}",
             *flags, self.image, *command],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def hourglass(self, *args):
        if not self.image:
            return [str(self.bin_dir / "hourglass"), *args]
        return ["docker", "run", "--rm", "--network", "host", self.image, "hourglass", *args]

    def cleanup(self):
        for name in self.containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def chart_image():
    """The image the chart names by default, if this machine's Docker has it."""
    sts = only(render(), "StatefulSet")
    image = container(sts, "aggregator")["image"]
    if shutil.which("docker") is None:
        return image, False
    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    return image, found


def run_binaries(bin_dir=None, image=None):
    """The chart's rendered env and config files drive the real processes end to end."""
    docs = render(*values("agent-only"), "--set", "aggregator.enabled=true", "--set", "agent.config.flush_interval=500ms")
    sts = only(docs, "StatefulSet")
    ds = only(docs, "DaemonSet")
    agg_c = container(sts, "aggregator")
    agent_c = container(ds, "agent")
    if image:
        expect(agg_c["image"] == image and agent_c["image"] == image,
               f"the pods run {agg_c['image']} and {agent_c['image']}, not {image}")
    agg_toml = only(docs, "ConfigMap", "-aggregator")["data"]["aggregator.toml"]
    agent_toml = only(docs, "ConfigMap", "-agent")["data"]["agent.toml"]
    with tempfile.TemporaryDirectory(prefix="hourglass-chart-") as tmp:
        tmp = Path(tmp)
        (tmp / "aggregator.toml").write_text(agg_toml)
        (tmp / "agent.toml").write_text(agent_toml)
        programs = Programs(tmp, bin_dir, image)
        processes = []
        try:
            aggregator = programs.popen(agg_c, {
                "HOURGLASS_LISTEN": "127.0.0.1:0",
                "HOURGLASS_ADMIN_LISTEN": "127.0.0.1:0",
                "HOURGLASS_HTTP_LISTEN": "127.0.0.1:0",
                "HOURGLASS_DATA_DIR": str(tmp / "aggregator"),
                "HOURGLASS_CONFIG": str(tmp / "aggregator.toml"),
            })
            processes.append(aggregator)
            aggregator_stderr = Stderr(aggregator)
            grpc = aggregator_stderr.wait_for("grpc listening on ", 60)
            http = aggregator_stderr.wait_for("http listening on ", 10)
            expect(env_of(agent_c)["HOURGLASS_SERVER_NAME"].get("valueFrom"), "server name not from the downward API")
            agent = programs.popen(agent_c, {
                "HOURGLASS_SERVER_NAME": "node-1",  # what spec.nodeName gives
                "HOURGLASS_AGGREGATOR": grpc,  # host:port, as the chart's own value may be
                "HOURGLASS_STATSD_LISTEN": "127.0.0.1:0",
                "HOURGLASS_STATSD_SOCKET": str(tmp / "dsd.socket"),
                "HOURGLASS_INGEST_LISTEN": "127.0.0.1:0",
                "HOURGLASS_ADMIN_LISTEN": "127.0.0.1:0",
                "HOURGLASS_DATA_DIR": str(tmp / "agent"),
                "HOURGLASS_CONFIG": str(tmp / "agent.toml"),
            })
            processes.append(agent)
            agent_stderr = Stderr(agent)
            statsd = agent_stderr.wait_for("statsd listening on ", 30)
            agent_stderr.wait_for("ingest listening on ", 30)
            host, _, statsd_port = statsd.rpartition(":")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"visitors:user42|s|#country:de\nvisitors:user43|s|#country:de", (host, int(statsd_port)))
            query = programs.hourglass(
                "query", "distinct", "--metric", "visitors", "--tag", "country=de",
                "--from", "-2h", "--label", "region=eu", "--server", "node-1", "--aggregator", f"http://{grpc}", "--json",
            )
            deadline = time.monotonic() + 30
            answer = None
            while time.monotonic() < deadline:
                result = subprocess.run(query, capture_output=True, text=True, timeout=20)
                if result.returncode == 0:
                    answer = json.loads(result.stdout)
                    if round(answer.get("estimate", 0)) == 2:
                        break
                time.sleep(0.5)
            expect(answer is not None and round(answer.get("estimate", 0)) == 2,
                   f"query by the chart's labels and node name did not find the 2 visitors: {answer}")
            url = (f"http://{http}/api/v1/distinct?metric=visitors&tag=country%3Dde&from=-2h"
                   "&label=region%3Deu&server=node-1")
            with urllib.request.urlopen(url, timeout=20) as reply:
                over_http = json.load(reply)
            expect(over_http["answer"]["estimate"] == answer["estimate"],
                   f"the HTTP API answers {over_http['answer']}, gRPC {answer['estimate']}")
            grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            expect(stop(agent, grace) == 0, "agent exited non-zero on SIGTERM")
            grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            expect(stop(aggregator, grace) == 0, "aggregator exited non-zero on SIGTERM")
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            programs.cleanup()


# ------------------------------------------------------------------------------- main


def find_bin_dir(given):
    names = ("hourglass", "hourglass-agent", "hourglass-aggregator")
    if given == "skip":
        return None
    candidates = [Path(given)] if given else []
    if not given:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        candidates = [target / "debug", target / "release"]
    for candidate in candidates:
        if all((candidate / n).is_file() and os.access(candidate / n, os.X_OK) for n in names):
            return candidate
    if given:
        raise SystemExit(f"chart_test: {given} does not hold {', '.join(names)}")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", default=os.environ.get("HOURGLASS_BIN_DIR", ""),
                        help="directory with the built binaries; 'skip' to skip the check that runs them "
                             "(default: $CARGO_TARGET_DIR or target/, debug then release, if built)")
    args = parser.parse_args()

    bin_dir = find_bin_dir(args.bin_dir)

    def binaries():
        if bin_dir is None:
            raise Skip("no built binaries (cargo build, or set HOURGLASS_BIN_DIR)")
        run_binaries(bin_dir=bin_dir)

    CHECKS.append(("binaries: the rendered env and config run a real aggregator and agent end to end"
                   + (f" ({bin_dir})" if bin_dir else ""), binaries))

    def in_image():
        if args.bin_dir == "skip":
            raise Skip("HOURGLASS_BIN_DIR=skip")
        image, found = chart_image()
        if not found:
            raise Skip(f"no image {image} in this machine's Docker (docker build -t {image} .)")
        run_binaries(image=image)

    CHECKS.append(("image: the rendered env and config run the chart's default image end to end", in_image))

    passed = failed = skipped = 0
    for description, function in CHECKS:
        start = time.monotonic()
        try:
            function()
        except Skip as why:
            skipped += 1
            print(f"skip - {description}: {why}", flush=True)
        except (AssertionError, jsonschema.ValidationError) as error:
            failed += 1
            print(f"FAIL - {description}\n    {error}", flush=True)
        except Exception as error:  # a broken check is a failure too, with its cause
            failed += 1
            print(f"FAIL - {description}\n    {type(error).__name__}: {error}", flush=True)
        else:
            passed += 1
            print(f"ok   - {description} ({time.monotonic() - start:.1f}s)", flush=True)
    print(f"chart: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
