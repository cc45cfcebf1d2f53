"""The Kubernetes manifests (``deploy/kubernetes``) checked as a cluster would check them, with no cluster: built-in
kinds against Kubernetes' own schemas (``kubernetes-validate``, strict: an unknown field is an error, as kubectl's
default field validation makes it), KEDA's ScaledObject against the schema of KEDA's CRD (``tests/kubernetes/``, which
says where it comes from), and the manifests against each other and the code: names, ports, keys, the queue."""

from __future__ import annotations

import copy
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from rq import Queue

from worker.jobs.consumer import queue_name

MANIFESTS = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
KEDA_SCHEMA_FILE = Path(__file__).with_name("kubernetes") / "keda-scaledobject-schema.yaml"
KUSTOMIZATION = "kustomization.yaml"
OLDEST_KUBERNETES = "1.30"
"""The first Kubernetes with ``securityContext.appArmorProfile`` (worker.yaml)."""
KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, kubernetes_validate.latest_version())
KEDA_API_VERSION = "keda.sh/v1alpha1"


def strict(schema: dict) -> dict:
    """``schema`` as the API server applies a CRD's: unknown fields refused wherever it lists an object's fields (its
    strict field validation), and optional fields as the fields' own schemas, not "that or null" (the models' way of
    saying optional, which would hide which field was wrong)."""
    if {"type": "null"} in schema.get("anyOf", []):
        schema["allOf"] = [option for option in schema.pop("anyOf") if option != {"type": "null"}]
        schema.pop("default", None)
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
    for value in schema.values():
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, dict):
                strict(child)
    return schema


KEDA_SCHEMA = strict(yaml.safe_load(KEDA_SCHEMA_FILE.read_text()))


def load_documents() -> dict[str, dict]:
    """Every document of every manifest, by ``file:kind/name``."""
    documents = {}
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path.name != KUSTOMIZATION:
            for doc in filter(None, yaml.safe_load_all(path.read_text())):
                documents[f"{path.relative_to(MANIFESTS)}:{doc['kind']}/{doc['metadata']['name']}"] = doc
    return documents


DOCUMENTS = load_documents()


def validate(doc: dict, version: str) -> None:
    if doc["apiVersion"] == KEDA_API_VERSION:
        jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def find(kind: str, name: str) -> dict:
    [doc] = [doc for doc in DOCUMENTS.values() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return doc


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def rejection(doc: dict, version: str = OLDEST_KUBERNETES) -> tuple[str, str]:
    """Where and why the validator refuses ``doc``."""
    with pytest.raises(jsonschema.ValidationError) as caught:
        validate(doc, version)
    return ".".join(str(part) for part in caught.value.absolute_path), caught.value.message


@pytest.mark.parametrize(
    ("name", "version"),
    [(name, version) for name, doc in DOCUMENTS.items()
     for version in (["keda"] if doc["apiVersion"] == KEDA_API_VERSION else KUBERNETES_VERSIONS)],
)
def test_every_manifest_matches_its_schema(name, version):
    validate(DOCUMENTS[name], version)


@pytest.mark.parametrize(
    ("kind", "name", "break_it", "where", "why"),
    [
        pytest.param("Deployment", "skillrun-api", lambda d: d["spec"].update(replicas="two"),
                     "spec.replicas", "'two' is not of type 'integer'", id="replicas-not-a-number"),
        # A container's name is required; its image is not (the API leaves it to tools that fill it in).
        pytest.param("Deployment", "skillrun-worker", lambda d: container(d).pop("name"),
                     "spec.template.spec.containers.0", "'name' is a required property", id="container-without-name"),
        pytest.param("StatefulSet", "redis", lambda d: d["spec"]["template"]["spec"].update(volumeClaimTemplates=[]),
                     "spec.template.spec", "'volumeClaimTemplates' was unexpected", id="field-in-the-wrong-place"),
        pytest.param("ScaledObject", "skillrun-worker",
                     lambda d: d["spec"]["triggers"][0]["metadata"].update(listLength=1),
                     "spec.triggers.0.metadata.listLength", "1 is not of type 'string'", id="trigger-setting-a-number"),
        pytest.param("ScaledObject", "skillrun-worker", lambda d: d["spec"].update(maxReplicas=5),
                     "spec", "'maxReplicas' was unexpected", id="hpa-field-name"),
        pytest.param("ScaledObject", "skillrun-worker", lambda d: d["spec"].update(minReplicaCount="1"),
                     "spec.minReplicaCount", "'1' is not of type 'integer'", id="min-replicas-a-string"),
    ],
)
def test_a_broken_manifest_is_refused_naming_the_field(kind, name, break_it, where, why):
    broken = copy.deepcopy(find(kind, name))
    break_it(broken)
    path, message = rejection(broken)
    assert path == where
    assert why in message


def test_kubernetes_before_the_oldest_supported_lacks_a_field_the_workers_need():
    assert rejection(find("Deployment", "skillrun-worker"), "1.29") == (
        "spec.template.spec.containers.0.securityContext",
        "Additional properties are not allowed ('appArmorProfile' was unexpected)",
    )


@pytest.mark.parametrize("folder", [MANIFESTS, MANIFESTS / "without-keda"], ids=["keda", "without-keda"])
def test_each_kustomization_lists_the_manifests_of_its_folder(folder):
    listed = yaml.safe_load((folder / KUSTOMIZATION).read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.yaml") if p.name != KUSTOMIZATION)


def test_without_keda_the_hpa_replaces_the_scaled_object():
    component = yaml.safe_load((MANIFESTS / "without-keda" / KUSTOMIZATION).read_text())
    [removed] = [yaml.safe_load(p["patch"]) for p in component["patches"]]
    assert removed.pop("$patch") == "delete"
    scaler = find(removed["kind"], removed["metadata"]["name"])
    hpa = find("HorizontalPodAutoscaler", "skillrun-worker")
    assert hpa["spec"]["scaleTargetRef"]["name"] == scaler["spec"]["scaleTargetRef"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"])


def test_the_scaler_watches_the_queue_of_the_workers_it_scales():
    scaler = find("ScaledObject", "skillrun-worker")
    worker = find("Deployment", scaler["spec"]["scaleTargetRef"]["name"])
    command = container(worker)["command"]
    runtime = command[command.index("--runtime") + 1]
    trigger = scaler["spec"]["triggers"][0]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == Queue.redis_queue_namespace_prefix + queue_name(runtime)

    redis_url = urlsplit(find("ConfigMap", "skillrun-config")["data"]["SKILLRUN_REDIS_URL"])
    redis = find("Service", redis_url.hostname)
    assert [port["port"] for port in redis["spec"]["ports"]] == [redis_url.port]
    namespace = redis["metadata"]["namespace"]
    assert trigger["metadata"]["address"] == f"{redis_url.hostname}.{namespace}.svc.cluster.local:{redis_url.port}"
    assert trigger["metadata"]["databaseIndex"] == redis_url.path.lstrip("/")


def test_workers_reach_the_api_through_its_service():
    api_url = urlsplit(find("ConfigMap", "skillrun-config")["data"]["SKILLRUN_API_URL"])
    service = find("Service", api_url.hostname)
    [port] = [port for port in service["spec"]["ports"] if port["port"] == api_url.port]
    api = find("Deployment", "skillrun-api")
    assert port["targetPort"] in [p["name"] for p in container(api)["ports"]]
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()


def test_every_config_map_and_secret_a_pod_reads_is_there():
    for deployment in [doc for doc in DOCUMENTS.values() if doc["kind"] == "Deployment"]:
        for source in container(deployment).get("envFrom", []):
            [(kind, ref)] = source.items()
            find({"configMapRef": "ConfigMap", "secretRef": "Secret"}[kind], ref["name"])
        for variable in container(deployment).get("env", []):
            if "secretKeyRef" in variable.get("valueFrom", {}):
                ref = variable["valueFrom"]["secretKeyRef"]
                assert ref["key"] in find("Secret", ref["name"])["stringData"]
