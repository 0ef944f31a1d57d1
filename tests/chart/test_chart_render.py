"""The Helm chart through the real Helm engine: render, lint, values schema, Kubernetes and upstream CRD schemas."""

from __future__ import annotations

import json
import re

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from brain_operator.objects.names import JOB_NAME_LABEL
from brain_operator.backends import render
from brain_operator.spec import OperatorDefaults, OverlayPolicy, parse_job
from brain_trainer.contract import METRICS_PATH, METRICS_PORT_NAME
from brain_trainer.schema import ConfigError, openapi_schema, to_dict
from brain_operator.spec.model import NetworkAccess
from chart_render import CHART, REPO, RELEASE_NAMESPACE, only, render_objects
from processes import run
from upstream_crds import crd_schemas, violations

# kubernetes-validate ships schemas for 1.25 ... 1.37: the oldest and newest we support.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
CRD_SOURCE = REPO / "deploy" / "crd" / "braintrainingjob.yaml"
CRD_COPY = CHART / "crds" / "braintrainingjob.yaml"
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_passes_strict_kubernetes_schemas(value_sets, version):
    kinds = set()
    for label, values in value_sets.items():
        objects = render_objects(values)
        assert {"Deployment", "ServiceAccount"} <= {obj["kind"] for obj in objects}, label
        for obj in objects:
            kinds.add(obj["kind"])
            assert violations(obj, version) == [], f"{label}: {obj['kind']}/{obj['metadata']['name']}"
    # Every optional kind was rendered by one of the value sets, so none went unchecked.
    assert {"ServiceMonitor", "PodMonitor", "ConfigMap", "ClusterRole", "Role", "Pod", "Service"} <= kinds
    assert {kind for _, kind in crd_schemas()} == {"ServiceMonitor", "PodMonitor", "BrainTrainingJob"}


@pytest.mark.parametrize(
    ("kind", "path", "value", "complaint"),
    [
        ("ServiceMonitor", ("spec", "endpoints", 0, "prot"), "metrics", "'prot' was unexpected"),
        ("ServiceMonitor", ("spec", "endpoints", 0, "interval"), "30 seconds", "does not match"),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "portNumber"), 0, "less than the minimum"),
        ("PodMonitor", ("spec", "selector", "matchExpressions", 0, "operator"), None, "None is not of type 'string'"),
        ("PodMonitor", ("metadata", "labelz"), {}, "labelz"),
    ],
)
def test_the_upstream_crd_schemas_refuse_typos_and_bad_values(monitoring_values, kind, path, value, complaint):
    obj = only(render_objects(monitoring_values), kind)
    assert violations(obj, "1.37.0") == []
    *parents, leaf = path
    node = obj
    for key in parents:
        node = node[key]
    node[leaf] = value
    assert any(complaint in problem for problem in violations(obj, "1.37.0")), violations(obj, "1.37.0")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_crd_in_the_chart_passes_strict_kubernetes_schemas(version):
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
    assert [crd["spec"]["names"]["kind"] for crd in crds] == ["BrainTrainingJob"]
    kubernetes_validate.validate(crds[0], version, strict=True)


def test_the_crd_has_its_own_category_beside_all():
    names = yaml.safe_load(CRD_COPY.read_text())["spec"]["names"]
    assert names["categories"] == ["all", "brain"]


def test_chart_crd_is_a_byte_identical_copy_of_the_generated_one():
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        "charts/brain-operator/crds/ drifted: cp deploy/crd/braintrainingjob.yaml charts/brain-operator/crds/"
    )


@pytest.mark.parametrize("version", ("v1.29.0", "v1.37.0"))
def test_helm_lint_reports_no_errors_or_warnings(value_sets, version):
    for label, values in value_sets.items():
        report = helm.lint(CHART, values, strict=True, kube_version=version)
        assert report["errors"] == [], (label, report)
        # Severity 1 is informational ("icon is recommended"); 2 and 3 are warnings and errors.
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], (label, report)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"image": {"tags": "v1"}}, "additional properties 'tags' not allowed"),
        ({"rbac": {"clusterWide": "yes"}}, "got string, want boolean"),
        ({"trainer": {"ncclEnv": {"NCCL_P2P_LEVEL": 5}}}, "got number, want string"),
        ({"trainer": {"ncclEnv": {"NCCL-P2P": "NVL"}}}, "invalid propertyName 'NCCL-P2P'"),
        ({"liveness": {"port": "8080"}}, "got string, want integer"),
        ({"liveness": {"port": 70000}}, "maximum"),
        ({"trainer": {"imagePullPolicy": "Sometimes"}}, "/trainer/imagePullPolicy': value must be one of"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"networkPolicy": {"scrapeNamespaces": ["Monitoring"]}}, "/networkPolicy/scrapeNamespaces/0"),
        ({"networkPolicy": {"enabled": "no"}}, "/networkPolicy/enabled"),
        ({"trainer": {"image": "registry.example.com/trainer:1"}}, "/trainer/image': got string, want object"),
        ({"trainer": {"image": {"repository": "r", "tag": "1", "digest": "sha256:0"}}}, "/trainer/image/digest': 'sha256:0' does not match pattern"),
        ({"logging": {"format": "xml"}}, "/logging/format': value must be one of"),
        ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "/metrics/serviceMonitor/interval"),
        ({"rbac": {"aggregateToDefaultRoles": "no"}}, "got string, want boolean"),
    ],
)
def test_values_schema_rejects_unknown_keys_and_wrong_types_through_helm(values, complaint):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=complaint):
            chart.render(values, name="brain", namespace="brain-system")
    report = helm.lint(CHART, values)
    assert any(complaint in error for error in report["errors"]), report


def _object_schemas(node, path="$"):
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield path, node
        for key, child in node.items():
            yield from _object_schemas(child, f"{path}.{key}")


def test_values_schema_closes_every_object():
    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = list(_object_schemas(schema))
    assert len(objects) > 10
    for path, node in objects:
        if "properties" in node:
            assert node.get("additionalProperties") is False, path
        else:
            # Free-form maps (labels, annotations, Kubernetes pass-through) say so explicitly.
            assert "additionalProperties" in node, path


def test_default_values_satisfy_the_schema():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)


def test_the_global_values_helm_gives_every_subchart_pass_the_schema():
    values = helm.values_from_yaml("global:\n  foo: 1\n")
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({**chart.values, **values})
        chart.render(values, name="brain", namespace="brain-system")
    report = helm.lint(CHART, values, strict=True)
    assert report["errors"] == [], report


def test_every_object_carries_the_standard_labels(value_sets):
    for label, values in value_sets.items():
        for obj in render_objects(values):
            labels = obj["metadata"]["labels"]
            missing = [key for key in STANDARD_LABELS if key not in labels]
            assert not missing, (label, obj["kind"], missing)
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/instance"] == "brain"


def _operator_container(objects):
    [container] = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def test_operator_deployment_defaults():
    objects = render_objects()
    deployment = only(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _operator_container(objects)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["image"] == "ghcr.io/brain-ai/brain-train-operator:0.1.0"  # tag defaults to appVersion
    assert container["command"] == ["braintrain", "operator"]
    assert container["args"] == ["--all-namespaces", "--liveness-port=8080", "--metrics-port=9090", "--log-format=text"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8080, "metrics": 9090}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert pod["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"]
    service = only(objects, "Service")
    # The Service picks the operator's pods, and not the helm test pod beside them.
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items() <= template_labels.items()
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"metrics": "metrics", "healthz": "healthz"}
    assert not {"ServiceMonitor", "PodMonitor"} & {obj["kind"] for obj in objects}


def test_namespaced_values_file_reaches_the_deployment(namespaced_values):
    objects = render_objects(namespaced_values)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    container = _operator_container(objects)
    assert container["image"] == "registry.example.com/ml/brain-train-operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == [
        "--namespace=team-a", "--namespace=team-b", "--liveness-port=8181", "--metrics-port=9191",
        "--log-format=json", "--verbose",
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8181, "metrics": 9191}
    assert "Service" not in {obj["kind"] for obj in objects}
    assert pod["serviceAccountName"] == "brain-operator-sa"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "ml-platform-critical"
    assert "nodeAffinity" in pod["affinity"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}


def _notes(values, namespace="brain-system"):
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name="brain", namespace=namespace)["brain-operator/templates/NOTES.txt"]


NOTES_JOB = re.compile(r"^kubectl apply (?P<flags>.*)-f - <<'EOF'\n(?P<manifest>.*)\nEOF\n*\Z", re.DOTALL | re.MULTILINE)


def _operator_env(objects):
    """The operator's environment as the kubelet gives it: the downward API's metadata.namespace resolved."""
    namespace = only(objects, "Deployment")["metadata"]["namespace"]
    resolved = {"metadata.namespace": namespace}
    return {
        item["name"]: item["value"] if "value" in item else resolved[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for item in _operator_container(objects)["env"]
    }


@pytest.mark.parametrize("values", ["defaults", "namespaced"])
def test_notes_end_with_a_job_that_needs_nothing_but_the_chart(value_sets, values):
    notes = _notes(value_sets[values], namespace="ops")
    assert "deploy/" not in notes and ".yaml" not in notes  # no file of this repository
    snippet = NOTES_JOB.search(notes)
    assert snippet, notes
    manifest = yaml.safe_load(snippet["manifest"])
    manifest["metadata"] |= {"namespace": "team-a", "uid": "u-1"}  # as the API server fills them in
    # What the API server would accept (the chart's CRD, unknown fields refused) ...
    assert violations(manifest, "1.37.0") == []
    # ... and what the operator would run: no image named, so the chart's trainer image.
    defaults = OperatorDefaults.from_env(_operator_env(render_objects(value_sets[values])))
    job = parse_job(manifest, defaults=defaults)
    assert job.spec.image == defaults.image and f"run {defaults.image}." in notes
    assert {obj["kind"] for obj in render(job)} >= {"Pod", "ConfigMap", "Service"}
    if values == "defaults":
        assert "every namespace" in notes and snippet["flags"] == ""
        assert "helm test brain --namespace ops" in notes and "deployment/brain-brain-operator" in notes
    else:
        assert "team-a, team-b" in notes and snippet["flags"] == "--namespace team-a "
        assert "helm test" not in notes  # no Service to probe through


def test_trainer_defaults_reach_the_operator_as_it_reads_them(namespaced_values):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    defaults = OperatorDefaults.from_env(_operator_env(render_objects()))
    assert defaults == OperatorDefaults(
        image=f"ghcr.io/brain-ai/brain-train-trainer:{app_version}", image_pull_policy="IfNotPresent", nccl_env={},
        network=NetworkAccess(operator_namespace=RELEASE_NAMESPACE),
    )
    custom = OperatorDefaults.from_env(_operator_env(render_objects(namespaced_values)))
    assert custom == OperatorDefaults(
        image="registry.example.com/ml/brain-train-trainer:0.1.0-cuda",
        image_pull_policy="Always",
        nccl_env={"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_P2P_LEVEL": "NVL"},
        network=NetworkAccess(operator_namespace=RELEASE_NAMESPACE),
    )


def test_the_network_policy_switch_and_scrape_namespaces_reach_the_operator(monitoring_values):
    # Prometheus in its own namespace scrapes the trainers: the chart names it, every job's policy admits it.
    values = {**monitoring_values, "networkPolicy": {"enabled": True, "scrapeNamespaces": ["monitoring"]}}
    scraped = OperatorDefaults.from_env(_operator_env(render_objects(values)))
    assert scraped.network == NetworkAccess(operator_namespace=RELEASE_NAMESPACE, scrape_namespaces=("monitoring",))
    off = OperatorDefaults.from_env(_operator_env(render_objects({"networkPolicy": {"enabled": False, "scrapeNamespaces": []}})))
    assert off.network is None


def test_a_reserved_nccl_default_is_refused_by_the_operator_naming_the_variable():
    env = _operator_env(render_objects({"trainer": {"ncclEnv": {"NCCL_DEBUG": "INFO"}}}))
    with pytest.raises(ConfigError, match="BRAIN_NCCL_ENV.*NCCL_DEBUG.*reserved"):
        OperatorDefaults.from_env(env)


def test_an_existing_service_account_must_be_named():
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="serviceAccount.name is required"):
            chart.render({"serviceAccount": {"create": False}}, name="brain", namespace="brain-system")
    objects = render_objects({"serviceAccount": {"create": False, "name": "platform-operator"}})
    assert "ServiceAccount" not in {obj["kind"] for obj in objects}
    assert only(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    assert only(objects, "ClusterRoleBinding")["subjects"][0]["name"] == "platform-operator"


def test_the_trainer_image_tag_is_set_apart_from_its_repository():
    env = _operator_env(render_objects({"trainer": {"image": {"repository": "registry.example.com/t", "tag": "2.0"}}}))
    assert env["BRAIN_TRAINER_IMAGE"] == "registry.example.com/t:2.0"


def test_the_operator_logs_as_the_values_say():
    args = _operator_container(render_objects({"logging": {"format": "json", "verbose": True}}))["args"]
    assert args[-2:] == ["--log-format=json", "--verbose"]
    assert "--verbose" not in _operator_container(render_objects())["args"]


def _trainer_pod():
    """A worker pod as the operator renders it."""
    manifest = yaml.safe_load((REPO / "deploy" / "examples" / "cpu-gloo.yaml").read_text())
    manifest["metadata"]["uid"] = "u-1"
    return next(obj for obj in render(parse_job(manifest)) if obj["kind"] == "Pod")


def test_the_service_monitor_scrapes_the_operators_metrics_service(monitoring_values):
    objects = render_objects(monitoring_values)
    monitor, service = only(objects, "ServiceMonitor"), only(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "5s"}
    assert "metrics" in {port["name"] for port in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_a_service_monitor_needs_the_metrics_service():
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="serviceMonitor.enabled needs metrics.service.enabled"):
            chart.render({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
                         name="brain", namespace="brain-system")


def test_the_pod_monitor_selects_trainer_pods_and_their_metrics_port(monitoring_values, namespaced_values):
    pod = _trainer_pod()
    for values, namespaces in ((monitoring_values, {"any": True}), (namespaced_values, {"matchNames": ["team-a", "team-b"]})):
        monitor = only(render_objects(values), "PodMonitor")
        assert monitor["spec"]["selector"] == {"matchExpressions": [{"key": JOB_NAME_LABEL, "operator": "Exists"}]}
        assert JOB_NAME_LABEL in pod["metadata"]["labels"] and monitor["spec"]["podTargetLabels"] == [JOB_NAME_LABEL]
        assert monitor["spec"]["namespaceSelector"] == namespaces
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        ports = {port["name"] for container in pod["spec"]["containers"] for port in container.get("ports", [])}
        assert (endpoint["port"], endpoint["path"]) == (METRICS_PORT_NAME, METRICS_PATH) and METRICS_PORT_NAME in ports
    assert only(render_objects(namespaced_values), "PodMonitor")["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"


def test_helm_test_probes_the_operators_health_endpoint_through_its_service():
    objects = render_objects()
    [test_pod] = [obj for obj in objects if obj["kind"] == "Pod"]
    service, container = only(objects, "Service"), _operator_container(objects)
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["restartPolicy"] == "Never" and test_pod["spec"]["automountServiceAccountToken"] is False
    [probe] = test_pod["spec"]["containers"]
    assert probe["image"] == container["image"]
    # Exec form: python itself, no shell between.
    assert probe["command"][:2] == ["python", "-c"] and "sh" not in probe["command"][0]
    url = probe["command"][-1]
    healthz = next(port for port in service["spec"]["ports"] if port["name"] == "healthz")
    assert url == f"http://{service['metadata']['name']}.brain-system.svc:{healthz['port']}/healthz"
    assert healthz["targetPort"] in {port["name"] for port in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The Service never routes to the test pod itself.
    assert not service["spec"]["selector"].items() <= test_pod["metadata"]["labels"].items()


def test_the_health_probe_command_works_against_a_real_server(tmp_path):
    """The probe's python -c, run here against a server answering 200 and one answering 500."""
    import http.server
    import sys
    import threading

    [test_pod] = [obj for obj in render_objects() if obj["kind"] == "Pod"]
    _, flag, code, _url = test_pod["spec"]["containers"][0]["command"]

    class Health(http.server.BaseHTTPRequestHandler):
        status = 200

        def do_GET(self):  # noqa: N802
            self.send_response(self.status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        assert run([sys.executable, flag, code, url], timeout=60).returncode == 0
        Health.status = 500
        assert run([sys.executable, flag, code, url], timeout=60).returncode == 1
    finally:
        server.shutdown()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_trainer_pull_secrets_reach_every_job_through_the_operator(version):
    objects = render_objects({"trainer": {"imagePullSecrets": [{"name": "org-registry"}, {"name": "mirror"}]}})
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    assert OperatorDefaults.from_env(_operator_env(objects)).image_pull_secrets == ("org-registry", "mirror")
    assert OperatorDefaults.from_env(_operator_env(render_objects())).image_pull_secrets == ()
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match="/trainer/imagePullSecrets/0"):
            chart.render({"trainer": {"imagePullSecrets": ["org-registry"]}}, name="brain", namespace="brain-system")


# ---- the overlay policy (issue 28): the chart's podOverlayPolicy is the operator's OverlayPolicy ----


def test_the_overlay_policy_values_are_the_operators_setting_declared_once():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["podOverlayPolicy"]
    assert schema == {**openapi_schema(OverlayPolicy), "additionalProperties": False}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["podOverlayPolicy"]
    assert values == to_dict(OverlayPolicy(), camel_case=True)  # every setting, each off


def test_the_overlay_policy_reaches_the_operator_as_it_reads_it():
    assert OperatorDefaults.from_env(_operator_env(render_objects())).overlay_policy == OverlayPolicy()
    values = {"podOverlayPolicy": {"capabilities": ["IPC_LOCK"], "hostPaths": ["/mnt/datasets"], "serviceAccounts": ["brain-trainer"]}}
    policy = OperatorDefaults.from_env(_operator_env(render_objects(values))).overlay_policy
    assert policy == OverlayPolicy(capabilities=["IPC_LOCK"], host_paths=["/mnt/datasets"], service_accounts=["brain-trainer"])
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match="additional properties 'hostPID' not allowed"):
            chart.render({"podOverlayPolicy": {"hostPID": True}}, name="brain", namespace="brain-system")
        with pytest.raises(helm.HelmValuesError, match="/podOverlayPolicy/privileged"):
            chart.render({"podOverlayPolicy": {"privileged": "yes"}}, name="brain", namespace="brain-system")


def test_an_image_digest_pins_both_images_instead_of_their_tags():
    digest = "sha256:" + "ab" * 32
    objects = render_objects({"image": {"tag": "9.9", "digest": digest}, "trainer": {"image": {"digest": digest}}})
    assert _operator_container(objects)["image"] == f"ghcr.io/brain-ai/brain-train-operator@{digest}"
    assert _operator_env(objects)["BRAIN_TRAINER_IMAGE"] == f"ghcr.io/brain-ai/brain-train-trainer@{digest}"
    with pytest.raises(Exception, match="digest"):
        render_objects({"image": {"digest": "latest"}})
