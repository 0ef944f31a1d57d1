"""`--set PATH=VALUE` (spec/overrides.py): the manifest changed before it is parsed, exactly as an edit of the file."""

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain_operator.spec import ConfigError, parse_job
from brain_operator.spec.overrides import Override, apply_overrides, as_flags, attribute, parse_overrides
from brain_trainer.config import kubeyaml
from brain_trainer.schema import FieldError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"


def manifest():
    return yaml.safe_load(EXAMPLE.read_text())


def one(text):
    (override,) = parse_overrides([text])
    return override


def errors_of(call):
    with pytest.raises(ConfigError) as raised:
        call()
    return [str(e) for e in raised.value.errors]


@pytest.mark.parametrize("text, steps, field", [
    ("training.steps=10", ("training", "steps"), "spec.training.steps"),
    ("spec.training.steps=10", ("training", "steps"), "spec.training.steps"),  # `spec.` is optional
    ("nodes=3", ("nodes",), "spec.nodes"),
    ("specimen.x=1", ("specimen", "x"), "spec.specimen.x"),  # only a whole `spec` key is the root
    ("scheduling.tolerations[0].key=gpu", ("scheduling", "tolerations", 0, "key"), "spec.scheduling.tolerations[0].key"),
    ("a[1][2]=x", ("a", 1, 2), "spec.a[1][2]"),
    (r"scheduling.nodeSelector.kubernetes\.io/arch=arm64", ("scheduling", "nodeSelector", "kubernetes.io/arch"),
     "spec.scheduling.nodeSelector.kubernetes.io/arch"),
    ("nccl.env.NCCL_ALGO=a=b", ("nccl", "env", "NCCL_ALGO"), "spec.nccl.env.NCCL_ALGO"),  # the first `=` splits
])
def test_a_path_is_the_manifests_own_spelling_below_spec(text, steps, field):
    override = one(text)
    assert (override.steps, override.field, override.text) == (steps, field, text)


@pytest.mark.parametrize("raw, value", [
    ("10", 10),
    ("3e-4", 0.0003),  # a number to kubectl, a string to YAML 1.1
    ('"10"', "10"),
    ("'3e-4'", "3e-4"),
    ("0x10", 16),
    ("yes", True),
    ("off", False),
    ("", None),
    ("null", None),
    ("repo/trainer:1.2", "repo/trainer:1.2"),
    ("{source: files, path: x}", {"source": "files", "path": "x"}),
    ("[a, b]", ["a", "b"]),
    ("a #not a comment", "a"),  # as in a manifest: ` #` starts a comment
])
def test_a_value_is_read_with_the_manifests_yaml_rules(raw, value):
    assert one(f"training.x={raw}").value == value


@pytest.mark.parametrize("text", ["training.steps", "=10", "spec=3", "spec.=3", "a..b=1", ".a=1", "a.=1", "[0]=1",
                                  "a[x]=1", "a[0]b=1", "a]=1"])
def test_what_is_no_path_is_one_line_naming_the_option_and_the_text(text):
    (line,) = errors_of(lambda: parse_overrides([text]))
    assert line.startswith("--set: expected PATH=VALUE with PATH a field under spec") and line.endswith(f"got {text!r}")


def test_every_bad_override_is_reported_and_a_value_that_is_no_yaml_names_its_field():
    lines = errors_of(lambda: parse_overrides(["training.steps=10", "oops", "data.path=*.txt", "x={a: 1"]))
    assert len(lines) == 3
    assert lines[0] == "--set: expected PATH=VALUE with PATH a field under spec " \
                       "(training.steps=10, scheduling.tolerations[0].key=gpu), got 'oops'"
    assert lines[1].startswith("spec.data.path: --set value '*.txt' is not valid YAML (")
    assert lines[1].endswith("quote it as in a manifest: data.path='\"...\"'")
    assert lines[2].startswith("spec.x: --set value '{a: 1' is not valid YAML (")


def test_a_value_cannot_bomb_the_reader():
    bomb = "[" * 10_000
    (line,) = errors_of(lambda: parse_overrides([f"x={bomb}"]))
    assert line.startswith("spec.x: --set value '[[[[") and len(line) < 400


def test_applying_copies_what_it_changes_and_leaves_the_manifest_as_it_was():
    original = manifest()
    before = copy.deepcopy(original)
    result = apply_overrides(original, parse_overrides(["training.steps=10", "checkpoint.intervalSteps=5"]))
    assert original == before
    assert result["spec"]["training"] == {**before["spec"]["training"], "steps": 10}
    assert result["spec"]["checkpoint"] == {**before["spec"]["checkpoint"], "intervalSteps": 5}
    assert result["spec"]["model"] is original["spec"]["model"]  # what no override touched is shared, not copied
    assert {k: v for k, v in result.items() if k != "spec"} == {k: v for k, v in before.items() if k != "spec"}


def test_missing_or_null_mappings_and_lists_on_the_way_are_created():
    data = {"spec": {"scheduling": None}}
    result = apply_overrides(data, parse_overrides(["scheduling.tolerations[0].key=gpu", "scheduling.tolerations[0].effect=NoSchedule",
                                                    "scheduling.tolerations[1].key=arm", "metrics.port=1"]))
    assert result["spec"]["scheduling"] == {"tolerations": [{"key": "gpu", "effect": "NoSchedule"}, {"key": "arm"}]}
    assert apply_overrides({}, parse_overrides(["nodes=2"])) == {"spec": {"nodes": 2}}


def test_the_later_override_wins_and_one_may_build_on_another():
    result = apply_overrides({"spec": {}}, parse_overrides(["training={steps: 5, seqLen: 64}", "training.steps=7",
                                                            "training.steps=9"]))
    assert result["spec"]["training"] == {"steps": 9, "seqLen": 64}


def test_null_gives_a_field_its_default_back():
    data = manifest()
    data["spec"]["model"]["initFrom"] = "weights/"
    job = parse_job(apply_overrides(data, parse_overrides(["model.initFrom="])), require_image=False)
    assert job.spec.model.init_from is None


def test_a_list_item_is_replaced_or_appended_never_past_the_end():
    data = {"spec": {"scheduling": {"tolerations": [{"key": "a"}, {"key": "b"}]}}}
    assert apply_overrides(data, parse_overrides(["scheduling.tolerations[1]={key: c}"]))["spec"]["scheduling"] == {
        "tolerations": [{"key": "a"}, {"key": "c"}]}
    assert apply_overrides(data, parse_overrides(["scheduling.tolerations[2].key=c"]))["spec"]["scheduling"] == {
        "tolerations": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}
    assert errors_of(lambda: apply_overrides(data, parse_overrides(["scheduling.tolerations[3].key=c"]))) == [
        "spec.scheduling.tolerations[3]: past the end of the list (2 items): --set replaces an item or appends one at [2]"]
    assert errors_of(lambda: apply_overrides({}, parse_overrides(["a[1]=c"]))) == [
        "spec.a[1]: past the end of the list (0 items): --set replaces an item or appends one at [0]"]


@pytest.mark.parametrize("text, line", [
    ("training.steps.x=1", "spec.training.steps: is 200, not a mapping: --set cannot reach below it"),
    ("training[0]=1", "spec.training: is {'seqLen': 128, 'steps': 200}, not a list: --set cannot reach below it"),
    ("data.path.x=1", "spec.data.path: is '{stdlib}/json/*.py', not a mapping: --set cannot reach below it"),
])
def test_a_way_through_a_value_of_another_kind_is_refused_naming_it(text, line):
    data = manifest()
    data["spec"]["training"] = {"steps": 200, "seqLen": 128}
    (found,) = errors_of(lambda: apply_overrides(data, parse_overrides([text])))
    assert found == line


def test_a_spec_that_is_no_mapping_is_named():
    assert errors_of(lambda: apply_overrides({"spec": "x"}, parse_overrides(["nodes=1"]))) == [
        "spec: is 'x', not a mapping: --set cannot reach below it"]


# -- parsed by the spec, as if the file said so --


def test_an_override_is_the_same_job_as_the_edited_file():
    edited = manifest()
    edited["spec"]["training"]["steps"] = 10
    edited["spec"]["checkpoint"]["intervalSteps"] = 5
    edited["spec"]["scheduling"] = {"nodeSelector": {"kubernetes.io/arch": "arm64"}}
    overridden = apply_overrides(manifest(), parse_overrides(
        ["training.steps=10", "spec.checkpoint.intervalSteps=5", r"scheduling.nodeSelector.kubernetes\.io/arch=arm64"]))
    assert parse_job(overridden, require_image=False) == parse_job(edited, require_image=False)


@given(steps=st.one_of(st.integers(-5, 10**6), st.text(max_size=8), st.floats(allow_nan=False), st.booleans()))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_value_is_typed_and_checked_by_the_spec_as_in_the_file(steps):
    """The same Job, or the same errors, as the file with the value written into it by the project's YAML writer."""
    edited = manifest()
    edited["spec"]["training"]["steps"] = steps
    from_file = kubeyaml.load(kubeyaml.dump(edited))
    overridden = apply_overrides(manifest(), parse_overrides([f"training.steps={kubeyaml.dump(steps)}"]))

    def outcome(data):
        try:
            return parse_job(data, require_image=False)
        except ConfigError as exc:
            return [str(e) for e in exc.errors]

    assert outcome(overridden) == outcome(from_file)


def test_an_unknown_field_or_a_bad_value_is_the_spec_error_saying_which_set_made_it():
    overrides = parse_overrides(["training.stepz=10", "training.microBatchSize=0", "nodes=2"])
    with pytest.raises(ConfigError) as raised:
        parse_job(apply_overrides(manifest(), overrides), require_image=False)
    lines = [str(e) for e in attribute(raised.value.errors, overrides)]
    assert len(lines) == 2
    assert lines[0].startswith("spec.training.stepz: unknown field (known fields: steps, ")
    assert lines[0].endswith(") (--set training.stepz=10)")
    assert lines[1] == "spec.training.microBatchSize: must be >= 1, got 0 (--set training.microBatchSize=0)"


def test_attribution_follows_the_path_both_ways_and_the_last_override_on_it():
    overrides = parse_overrides(["training.steps=1", "training.steps=0", "scheduling.tolerations[0].key=x", "training={a: 1}"])
    errors = [FieldError("spec.training.steps", "a"), FieldError("spec.training.stepsPerX", "b"),
              FieldError("spec.scheduling.tolerations", "c"), FieldError("spec.scheduling.tolerations[0].key.x", "d"),
              FieldError("spec.scheduling.tolerations[1]", "e"), FieldError("metadata.name", "f")]
    assert [str(e) for e in attribute(errors, overrides)] == [
        "spec.training.steps: a (--set training={a: 1})",  # the last override on the way wins
        "spec.training.stepsPerX: b (--set training={a: 1})",
        "spec.scheduling.tolerations: c (--set scheduling.tolerations[0].key=x)",
        "spec.scheduling.tolerations[0].key.x: d (--set scheduling.tolerations[0].key=x)",
        "spec.scheduling.tolerations[1]: e",
        "metadata.name: f",
    ]
    assert [str(e) for e in attribute(errors[:1], overrides[:2])] == ["spec.training.steps: a (--set training.steps=0)"]
    assert [str(e) for e in attribute([FieldError("spec.training.stepsPerX", "b")], overrides[:2])] == [
        "spec.training.stepsPerX: b"]


def test_as_flags_is_what_a_shell_takes_back():
    assert as_flags(["training.steps=10", "data.path=a b"]) == "--set training.steps=10 --set 'data.path=a b'"


# -- properties over any tree --

KEYS = st.sampled_from(["a", "b", "c", "steps", "x.y"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                    st.text(max_size=20))
TREES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(KEYS, inner, max_size=3)), max_leaves=12)
PATHS = st.lists(st.one_of(KEYS, st.integers(0, 3)), min_size=1, max_size=4).filter(lambda p: isinstance(p[0], str))


def path_text(steps):
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else ("." if out else "") + step.replace(".", "\\.")
    return out


def at(tree, steps):
    for step in steps:
        tree = tree[step]
    return tree


@given(spec=st.dictionaries(KEYS, TREES, max_size=4), steps=PATHS, value=TREES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_path_gets_the_value_or_one_error_and_nothing_else_changes(spec, steps, value):
    data = {"apiVersion": "v", "spec": spec}
    before = copy.deepcopy(data)
    override = Override(f"{path_text(steps)}=...", tuple(steps), value)
    assert override.field == "spec" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)
    try:
        result = apply_overrides(data, [override])
    except ConfigError as exc:
        (error,) = exc.errors
        assert error.path.startswith("spec")  # a spot on the way, named
        assert data == before
        return
    assert data == before
    assert at(result["spec"], steps) == value
    assert result["apiVersion"] == "v"
    # Every other key on the way is as it was.
    here, there = before["spec"], result["spec"]
    for step in steps[:-1]:
        if isinstance(here, dict):
            assert {k: v for k, v in there.items() if k != step} == {k: v for k, v in here.items() if k != step}
        here = here.get(step) if isinstance(here, dict) else (here[step] if isinstance(here, list) and step < len(here) else None)
        there = there[step]


@given(value=SCALARS)
@settings(max_examples=300, deadline=None)
def test_any_scalar_the_yaml_writer_writes_reads_back_as_itself(value):
    read = one(f"training.x={kubeyaml.dump(value)}").value
    assert read == value and type(read) is type(value)


@given(steps=PATHS)
@settings(max_examples=200, deadline=None)
def test_the_text_of_a_path_parses_back_to_its_steps(steps):
    assert one(f"{path_text(steps)}=1").steps == tuple(steps)
    assert one(f"spec.{path_text(steps)}=1").steps == tuple(steps)
