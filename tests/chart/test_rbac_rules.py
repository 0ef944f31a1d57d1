"""RBAC: the chart grants exactly what the operator calls, never a wildcard or a secret."""

from __future__ import annotations

import brain_operator.handlers  # noqa: F401  (registers the kopf handlers inspected below)
import kopf
import pytest
import yaml
from brain_operator.cluster.children import WATCHED
from brain_operator.cluster.api import ClusterClient
from brain_operator.backends import render
from brain_operator.objects.schedulers import GANG_MODES
from brain_operator.spec import OperatorDefaults, parse_job
from chart_render import RELEASE_NAMESPACE, REPO, render_objects

import operator_permissions

ROLE_KINDS = ("Role", "ClusterRole")
BINDING_KINDS = ("RoleBinding", "ClusterRoleBinding")
AGGREGATE_LABEL = "rbac.authorization.k8s.io/aggregate-to-{}"


def rbac_rules(objects):
    """(role kind, namespace, rule) for every rule of every Role and ClusterRole bound to the operator."""
    bound = {(obj["roleRef"]["kind"], obj["roleRef"]["name"]) for obj in objects if obj["kind"] in BINDING_KINDS}
    return [
        (obj["kind"], obj["metadata"].get("namespace"), rule)
        for obj in objects
        if obj["kind"] in ROLE_KINDS and (obj["kind"], obj["metadata"]["name"]) in bound
        for rule in obj.get("rules") or []
    ]


def aggregated_rules(objects, role):
    """The rules the chart adds to Kubernetes' default ClusterRole `role` (view, edit, admin)."""
    label = AGGREGATE_LABEL.format(role)
    return [
        rule
        for obj in objects
        if obj["kind"] == "ClusterRole" and obj["metadata"]["labels"].get(label) == "true"
        for rule in obj["rules"]
    ]


def grants(rules):
    """Rules flattened to {(apiGroup, resource): verbs}."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                granted.setdefault((group, resource), set()).update(rule.get("verbs", []))
    return granted


def rule_problems(rules, allowed=operator_permissions.allowed_verbs()):
    """Wildcards, secrets, non-resource URLs, and verbs not allowed (by default: those the operator never uses)."""
    problems = []
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            if any("*" in item for item in rule.get(field, [])):
                problems.append(f"wildcard in {field}: {rule}")
        if any(resource.split("/")[0] == "secrets" for resource in rule.get("resources", [])):
            problems.append(f"secrets granted: {rule}")
        if rule.get("nonResourceURLs"):
            problems.append(f"nonResourceURLs granted: {rule}")
        for verb in rule.get("verbs", []):
            if verb not in allowed:
                problems.append(f"verb {verb!r} is not used by the operator: {rule}")
    return problems


def test_the_checker_catches_wildcards_secrets_and_unused_verbs():
    bad = [
        {"apiGroups": ["*"], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["deletecollection"]},
        {"apiGroups": [""], "resources": ["pods/*"], "verbs": ["create"]},
    ]
    problems = rule_problems(bad)
    assert len(problems) == 4
    assert "wildcard in apiGroups" in problems[0]
    assert "secrets granted" in problems[1]
    assert "'deletecollection' is not used" in problems[2]
    assert "wildcard in resources" in problems[3]


@pytest.mark.parametrize("cluster_wide", [True, False])
@pytest.mark.parametrize("pytorchjob", [True, False])
def test_rbac_grants_exactly_what_the_operator_uses(cluster_wide, pytorchjob):
    values = {"rbac": {"clusterWide": cluster_wide}, "pytorchjob": {"enabled": pytorchjob}}
    objects = render_objects(values)
    rules = rbac_rules(objects)
    assert rule_problems([rule for _, _, rule in rules]) == []
    want = {key: set(verbs) for key, verbs in operator_permissions.expected(cluster_wide=cluster_wide, pytorchjob=pytorchjob).items()}
    for kind, namespace in {(kind, namespace) for kind, namespace, _ in rules}:
        assert grants([rule for k, n, rule in rules if (k, n) == (kind, namespace)]) == want, (kind, namespace)
    kinds = {kind for kind, _, _ in rules}
    assert kinds == ({"ClusterRole"} if cluster_wide else {"Role"})


def test_namespaced_mode_has_one_role_and_binding_per_watched_namespace(namespaced_values):
    objects = render_objects(namespaced_values)
    kinds = [obj["kind"] for obj in objects]
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    roles = {obj["metadata"]["namespace"] for obj in objects if obj["kind"] == "Role"}
    bindings = [obj for obj in objects if obj["kind"] == "RoleBinding"]
    assert roles == {binding["metadata"]["namespace"] for binding in bindings} == {"team-a", "team-b"}
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "brain-operator-sa", "namespace": RELEASE_NAMESPACE}]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "brain-ops"}


def test_namespaced_mode_without_a_list_serves_the_release_namespace():
    objects = render_objects({"rbac": {"clusterWide": False}})
    assert {obj["metadata"]["namespace"] for obj in objects if obj["kind"] in ("Role", "RoleBinding")} == {RELEASE_NAMESPACE}


def test_cluster_wide_binding_targets_the_operator_service_account():
    objects = render_objects()
    [binding] = [obj for obj in objects if obj["kind"] == "ClusterRoleBinding"]
    [account] = [obj for obj in objects if obj["kind"] == "ServiceAccount"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": RELEASE_NAMESPACE}]
    assert account["automountServiceAccountToken"] is False


def test_rbac_create_false_renders_no_rbac():
    objects = render_objects({"rbac": {"create": False}})
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & {obj["kind"] for obj in objects}


@pytest.mark.parametrize("cluster_wide", [True, False])
def test_the_default_user_roles_gain_exactly_their_braintrainingjob_rights(cluster_wide):
    objects = render_objects({"rbac": {"clusterWide": cluster_wide}})
    for role, want in operator_permissions.DEFAULT_ROLES.items():
        rules = aggregated_rules(objects, role)
        assert grants(rules) == {key: set(verbs) for key, verbs in want.items()}, role
        assert rule_problems(rules, allowed=frozenset().union(*want.values())) == []
    # Only the aggregated roles and the operator's own: nothing bound to users, nothing else labelled.
    user_roles = [obj for obj in objects if obj["kind"] == "ClusterRole" and any(
        AGGREGATE_LABEL.format(role) in obj["metadata"]["labels"] for role in operator_permissions.DEFAULT_ROLES)]
    assert len(user_roles) == 2
    bound = {obj["roleRef"]["name"] for obj in objects if obj["kind"] in BINDING_KINDS}
    assert not bound & {obj["metadata"]["name"] for obj in user_roles}


def test_view_can_list_everything_in_the_crds_categories():
    # `kubectl get all` and `kubectl get brain` list every kind in the category: view must list them.
    crd = yaml.safe_load((REPO / "charts" / "brain-operator" / "crds" / "braintrainingjob.yaml").read_text())
    assert {"all", "brain"} <= set(crd["spec"]["names"]["categories"])
    view = grants(aggregated_rules(render_objects(), "view"))
    assert {"list", "get", "watch"} <= view[(crd["spec"]["group"], crd["spec"]["names"]["plural"])]


@pytest.mark.parametrize("values", [{"rbac": {"aggregateToDefaultRoles": False}}, {"rbac": {"create": False}}])
def test_the_aggregated_roles_can_be_left_out(values):
    assert aggregated_rules(render_objects(values), "view") == []


EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
NAMESPACED_GRANTS = operator_permissions.expected(cluster_wide=False, pytorchjob=True)


def _needs(key, *verbs):
    missing = set(verbs) - set(NAMESPACED_GRANTS.get(key, ()))
    assert not missing, f"the operator needs {sorted(missing)} on {key}: add them to tests/chart/operator_permissions.py and the chart"


def test_every_resource_kopf_serves_is_listed_watched_and_patched_when_handled():
    kopf_registry = kopf.get_default_registry()
    # Event handlers and indexes (children.py) both watch their resource.
    watching = [*kopf_registry._watching.get_all_handlers(), *kopf_registry._indexing.get_all_handlers()]
    served = {(h.selector.group, h.selector.any_name) for h in watching}
    # Change handlers and timers store kopf's progress and diff base in the object's annotations.
    handled = {
        (h.selector.group, h.selector.any_name)
        for h in [*kopf_registry._changing.get_all_handlers(), *kopf_registry._spawning.get_all_handlers()]
    }
    assert ("brain.ai", "braintrainingjobs") in handled and ("", "pods") in served and ("", "services") in served
    for key in served | handled:
        _needs(key, "list", "watch")
    for key in handled:
        _needs(key, "patch")


def _plural(obj):
    """A kind's resource name: the watched kinds' own (networkpolicies), else the kind plus s (pytorchjobs)."""
    plurals = {(api_version, kind): plural for api_version, kind, plural, _ in WATCHED}
    return plurals.get((obj["apiVersion"], obj["kind"]), f"{obj['kind'].lower()}s")


VARIANTS = [("elastic", gang) for gang in GANG_MODES] + [("pytorchjob", "none")]


def test_every_kind_the_renderers_make_can_be_listed_and_created():
    rendered = set()
    for example in EXAMPLES:
        for backend, gang in VARIANTS:
            manifest = yaml.safe_load(example.read_text())
            manifest["spec"]["backend"] = backend
            manifest["spec"].setdefault("scheduling", {})["gang"] = gang
            manifest["metadata"]["uid"] = "0f0e0d0c-0000-4000-8000-000000000001"  # as the API server sets it
            job = parse_job(manifest, defaults=OperatorDefaults(image="brain-train/trainer:dev"))
            rendered |= {(obj["apiVersion"].rpartition("/")[0], _plural(obj)) for obj in render(job)}
    assert ("", "pods") in rendered and ("kubeflow.org", "pytorchjobs") in rendered
    assert ("networking.k8s.io", "networkpolicies") in rendered
    assert {group for group, resource in rendered if resource == "podgroups"} == {
        "scheduling.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"
    }
    for key in rendered:
        _needs(key, "list", "create")
    # Nothing granted for a kind the operator never makes (jobs and events aside;
    # finalizers because children's owner references block the owner's deletion).
    assert any(ref.get("blockOwnerDeletion") for obj in render(job) for ref in obj["metadata"].get("ownerReferences", []))
    made_or_served = rendered | {
        ("brain.ai", "braintrainingjobs"), ("brain.ai", "braintrainingjobs/status"),
        ("brain.ai", "braintrainingjobs/finalizers"), ("", "events"), ("kueue.x-k8s.io", "workloads"),
        ("", "pods/status"),
    }
    assert set(NAMESPACED_GRANTS) == made_or_served


def test_the_cluster_client_still_makes_only_the_calls_the_allow_list_covers():
    # get_job -> get jobs; list_children/create -> list/create children; delete -> delete pods and
    # Kueue's workloads; patch -> patch pytorchjobs, configmaps, pods (retriable-in-group) and Kueue's
    # workloads (spec.active); patch_status -> patch jobs/status; post_event -> create events;
    # list_objects -> list Kueue's workloads; patch_pod_status -> patch pods/status (a lost node's pod under
    # Kueue); get -> get every kind created (a create
    # that meets AlreadyExists) and pods (one the watch shows Terminating); discover -> discovery
    # documents and SelfSubjectAccessReviews, which every authenticated user may ask (Kubernetes'
    # system:discovery and system:basic-user roles). A new call needs a new grant.
    calls = {name for name in vars(ClusterClient) if not name.startswith("_")}
    assert calls == {"get_job", "get", "list_children", "list_objects", "create", "delete", "patch", "patch_status",
                     "patch_pod_status", "post_event", "discover"}
    for kind, verbs in NAMESPACED_GRANTS.items():
        if "create" in verbs and kind != ("", "events"):
            _needs(kind, "get")
    _needs(("brain.ai", "braintrainingjobs"), "get")
    _needs(("brain.ai", "braintrainingjobs/status"), "patch")
    _needs(("", "pods"), "delete")
    _needs(("kubeflow.org", "pytorchjobs"), "patch")
    _needs(("", "configmaps"), "patch")
    _needs(("", "pods"), "patch")
    _needs(("", "pods/status"), "patch")
    _needs(("kueue.x-k8s.io", "workloads"), "list", "patch", "delete")


def test_pods_are_never_updated_and_their_status_only_patched():
    # Kueue's webhook adds the admission gate and Kueue removes it. The operator's one pod patch, a merge patch of
    # an annotation, ends a failed job's Kueue group (tests/operator/test_reconcile_cluster.py checks every
    # body it sends); an update, which could carry a gate, is not granted. The status is only patched, and only
    # to mark a lost node's pod Failed as PodGC would (tests/operator/test_shared_cluster.py).
    assert "update" not in NAMESPACED_GRANTS[("", "pods")]
    assert NAMESPACED_GRANTS[("", "pods/status")] == frozenset({"patch"})
