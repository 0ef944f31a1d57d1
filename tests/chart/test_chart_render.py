"""The Helm chart through the real Helm engine: render, lint, values schema, Kubernetes schemas."""

from __future__ import annotations

import json

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from brain_operator.spec import OperatorDefaults
from brain_trainer.schema import ConfigError
from chart_render import CHART, REPO, only, render_objects

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
    for label, values in value_sets.items():
        objects = render_objects(values)
        assert {"Deployment", "ServiceAccount"} <= {obj["kind"] for obj in objects}, label
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{label}: {obj['kind']}/{obj['metadata']['name']} at {list(error.path)}: {error.message}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_crd_in_the_chart_passes_strict_kubernetes_schemas(version):
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
    assert [crd["spec"]["names"]["kind"] for crd in crds] == ["BrainTrainingJob"]
    kubernetes_validate.validate(crds[0], version, strict=True)


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
    assert container["args"] == ["--all-namespaces", "--liveness-port=8080", "--metrics-port=9090"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8080, "metrics": 9090}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert pod["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"]
    service = only(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_namespaced_values_file_reaches_the_deployment(namespaced_values):
    objects = render_objects(namespaced_values)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    container = _operator_container(objects)
    assert container["image"] == "registry.example.com/ml/brain-train-operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == ["--namespace=team-a", "--namespace=team-b", "--liveness-port=8181", "--metrics-port=9191"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8181, "metrics": 9191}
    assert "Service" not in {obj["kind"] for obj in objects}
    assert pod["serviceAccountName"] == "brain-operator-sa"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "ml-platform-critical"
    assert "nodeAffinity" in pod["affinity"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}


def test_notes_tell_the_user_what_to_apply_next(namespaced_values):
    with helm.Chart.load(CHART) as chart:
        notes = chart.render(None, name="brain", namespace="brain-system")["brain-operator/templates/NOTES.txt"]
        namespaced = chart.render(namespaced_values, name="brain", namespace="ops")["brain-operator/templates/NOTES.txt"]
    assert "kubectl apply -f deploy/examples/cpu-gloo.yaml" in notes
    assert "every namespace" in notes
    assert "deployment/brain-brain-operator" in notes
    assert "team-a, team-b" in namespaced


def _operator_env(objects):
    return {item["name"]: item["value"] for item in _operator_container(objects)["env"]}


def test_trainer_defaults_reach_the_operator_as_it_reads_them(namespaced_values):
    defaults = OperatorDefaults.from_env(_operator_env(render_objects()))
    assert defaults == OperatorDefaults(
        image="ghcr.io/brain-ai/brain-train-trainer:0.1.0", image_pull_policy="IfNotPresent", nccl_env={}
    )
    custom = OperatorDefaults.from_env(_operator_env(render_objects(namespaced_values)))
    assert custom == OperatorDefaults(
        image="registry.example.com/ml/brain-train-trainer:0.1.0-cuda",
        image_pull_policy="Always",
        nccl_env={"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_P2P_LEVEL": "NVL"},
    )


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
