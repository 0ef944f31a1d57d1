"""brain_trainer.config.kubeyaml: YAML read as kubectl reads it, held against what the API server would store.

What the API server stores is what kubectl sends: kubectl (and the API server
itself, for YAML apply patches) turns YAML into JSON with sigs.k8s.io/yaml's
YAMLToJSON, i.e. go-yaml v2's resolver:
  - k8s.io/apimachinery pkg/util/yaml/decoder.go: YAMLToJSONDecoder.Decode calls yaml.Unmarshal of
    sigs.k8s.io/yaml (formerly github.com/ghodss/yaml);
  - kubernetes-sigs/yaml yaml.go: "As per the YAML 1.1 specification, which yaml.v2 used underneath
    implements, literal 'yes' and 'no' strings without quotation marks will be converted to true/false";
  - kubernetes-sigs/yaml goyaml.v2/resolve.go: resolveMapList makes y/Y/yes/on (and n/no/off) booleans;
    a leading digit or sign goes through strconv.ParseInt(plain, 0, 64) after removing "_" (so 0o17, 0x1f,
    0b101, 017 as octal, 1_000), then the float pattern [-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?.
The same library parses Helm's values files (helm pkg/chart/common/values.go: ReadValues calls
sigs.k8s.io/yaml's Unmarshal), so helm-python-sdk's values_from_yaml runs the real Go code here and
every row is checked against it rather than trusted. JSON has one number type, so 1E6 and 1000000
compare equal.
"""

from __future__ import annotations

import math

import helm_python as helm
import pytest
import yaml
from brain_trainer.config import kubeyaml
from brain_trainer.config import DataConfig, TrainerConfig, TrainingConfig, read_yaml
from brain_trainer.schema import ConfigError

# (plain scalar, what kubectl sends the API server, and so what brain-train reads)
TABLE = [
    ("3e-4", 0.0003),
    ("1E6", 1e6),
    (".5", 0.5),
    ("-.5", -0.5),
    ("1.5e+3", 1500.0),
    ("12.0", 12.0),
    ("0.", 0.0),
    ("+12", 12),
    ("-7", -7),
    ("0o17", 15),
    ("0x1f", 31),
    ("-0x1f", -31),
    ("true", True),
    ("True", True),
    ("FALSE", False),
    ("null", None),
    ("~", None),
    ("", None),
    ("2024-01-01", "2024-01-01"),
    ("1:20", "1:20"),
    ("=", "="),
    ("0xZZ", "0xZZ"),
    ("1e", "1e"),
    ("on", True),
    ("off", False),
    ("yes", True),
    ("no", False),
    ("y", True),
    ("n", False),
    ("Y", True),
    ("N", False),
    ("tRue", "tRue"),
    ("017", 15),
    ("08", 8.0),
    ("0b101", 5),
    ("1_000", 1000),
    ("1_", 1),
    ("_1", "_1"),
    ("._5", "._5"),
    ("0._1", 0.1),
    ("0o8", "0o8"),
    ("-9223372036854775809", -9.223372036854776e18),
]


def json_value(value):
    """A value as JSON can hold it: bool, number (int and float alike), string or null."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    return ("number", float(value))


def kubectl_reads(text: str):
    return helm.values_from_yaml(f"v: {text}\n").get("v")


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[row[0] or "empty" for row in TABLE])
def test_the_table_against_sigs_k8s_yaml(text, expected):
    read = kubeyaml.load(f"v: {text}\n")["v"]
    assert json_value(read) == json_value(expected)
    assert json_value(kubectl_reads(text)) == json_value(expected), "the table is not what sigs.k8s.io/yaml does"


def test_the_issue_cases():
    doc = kubeyaml.load("learningRate: 3e-4\nsteps: 1E6\nratio: .5\nperm: 0o17\nmask: 0x1f\n")
    assert doc == {"learningRate": 0.0003, "steps": 1e6, "ratio": 0.5, "perm": 15, "mask": 31}
    # PyYAML's YAML 1.1, which the reader replaced, got three of the five wrong.
    old = yaml.safe_load("learningRate: 3e-4\nsteps: 1E6\nperm: 0o17\n")
    assert old == {"learningRate": "3e-4", "steps": "1E6", "perm": "0o17"}


def test_keys_become_strings_as_json_needs_and_merge_keys_work():
    text = "on: 1\n1: x\nbase: &b {a: 1}\nderived:\n  <<: *b\n  c: 2\n"
    doc = kubeyaml.load(text)
    assert doc == {"true": 1, "1": "x", "base": {"a": 1}, "derived": {"a": 1, "c": 2}}
    assert doc == helm.values_from_yaml(text)


def test_special_floats_and_explicit_tags():
    doc = kubeyaml.load("a: .inf\nb: -.Inf\nc: .NaN\nd: !!float 3\ne: !!int '0x10'\nf: !!str 3e-4\ng: !!bool yes\n")
    assert doc["a"] == math.inf and doc["b"] == -math.inf and math.isnan(doc["c"])
    assert doc["d"] == 3.0 and doc["e"] == 16 and doc["f"] == "3e-4" and doc["g"] is True


@pytest.mark.parametrize("text", ["!!int yes", "!!float abc", "!!bool 1", "!!int 0b2"])
def test_an_explicit_tag_the_value_cannot_take_is_a_yaml_error(text):
    with pytest.raises(yaml.YAMLError, match="cannot read"):
        kubeyaml.load(f"v: {text}\n")


def test_read_yaml_reads_as_kubectl_and_keeps_its_one_line_errors(tmp_path):
    good = tmp_path / "job.yaml"
    good.write_text("spec:\n  training: {learningRate: 3e-4, compile: off}\n")
    assert read_yaml(good) == {"spec": {"training": {"learningRate": 0.0003, "compile": False}}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("v: !!int yes\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    [line] = [str(error) for error in caught.value.errors]
    assert line.startswith(f"{bad}: not valid YAML: cannot read 'yes' as int") and "\n" not in line


# Strings every schema must keep strings, numbers YAML 1.1 prints differently, and the two floats of the issue.
AMBIGUOUS_STRINGS = ["3e-4", "1E6", ".5", "0o17", "0x1f", "on", "off", "yes", "no", "y", "n", "Y", "N", "017", "1_000",
                     "0b101", "true", "null", "~", "", "2024-01-01", "1:20", "=", "12.0", ".inf", "-.5", "08", "1_"]


def test_the_writer_reads_back_identically_with_this_reader_yaml11_and_kubectl():
    data = {f"s{i}": text for i, text in enumerate(AMBIGUOUS_STRINGS)}
    data.update(lr=3e-4, tiny=1e-5, big=1e16, half=0.5, ints=[0, 15, -7], flag=True, none=None)
    text = kubeyaml.dump(data)
    assert kubeyaml.load(text) == data
    assert yaml.safe_load(text) == data
    from_kubectl = helm.values_from_yaml(text)
    assert {key: json_value(value) for key, value in from_kubectl.items() if key != "ints"} == {
        key: json_value(value) for key, value in data.items() if key != "ints"
    }


def test_trainer_config_round_trips_through_its_yaml(tmp_path):
    config = TrainerConfig(
        training=TrainingConfig(learning_rate=3e-4, min_lr_ratio=0.5, weight_decay=1e-5),
        data=DataConfig(source="files", path="1e5"),
    )
    path = tmp_path / "trainer.yaml"
    path.write_text(config.to_yaml())
    assert "learning_rate: 0.0003" in path.read_text()
    again = TrainerConfig.from_dict(read_yaml(path))
    assert again == config and again.data.path == "1e5" and again.training.weight_decay == 1e-5



def test_text_of_several_lines_is_a_literal_block_that_reads_back_as_written():
    config = TrainerConfig(data=DataConfig(source="files", path="data/*.txt"))
    text = kubeyaml.dump({"data": {"trainer.yaml": config.to_yaml(), "one-line": "x", "no-final-newline": "a\nb"}})
    assert text.startswith("data:\n  trainer.yaml: |\n    model:\n      preset: minimal\n    training:\n")
    assert "  no-final-newline: |-\n    a\n    b\n" in text and "  one-line: x\n" in text
    assert kubeyaml.load(text)["data"]["trainer.yaml"] == config.to_yaml()
    # what a block cannot hold (trailing spaces, a leading space on the first line) still reads back exactly
    for awkward in ("trailing \nspace", " indented\nfirst line\n", "tab\there\n", "\n\nblank lines first"):
        assert kubeyaml.load(kubeyaml.dump({"k": awkward})) == {"k": awkward} == yaml.safe_load(kubeyaml.dump({"k": awkward}))


def billion_laughs(levels=10):
    """Ten anchors, each a list of nine aliases of the one before: 9**10 strings if anything expanded it."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_yaml_bomb_is_refused_before_it_expands_with_kubectls_line(tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs())
    with pytest.raises(helm.errors.HelmValuesError, match="yaml: document contains excessive aliasing"):
        helm.values_from_yaml(bomb.read_text())  # what kubectl says (sigs.k8s.io/yaml, go-yaml v2)
    steps = []
    monkeypatch.setattr(kubeyaml, "_allowed_alias_ratio", lambda decodes: steps.append(decodes) or 0.99)
    monkeypatch.setattr(kubeyaml.Loader, "construct_object", lambda *a, **k: pytest.fail("built before refused"))
    with pytest.raises(ConfigError) as caught:
        read_yaml(bomb)
    [line] = [str(error) for error in caught.value.errors]
    assert line.startswith(f"{bomb}: not valid YAML: document contains excessive aliasing") and "\n" not in line
    # The rule is judged from the 1001st decode on and breaks within a few thousand nodes, of 9**10 expanded.
    assert steps[0] == 1001 and steps[-1] < 2000


def test_anchors_within_kubectls_ratio_still_work():
    text = "base: &b {a: 1, b: [1, 2, 3]}\n" + "".join(f"k{i}: *b\n" for i in range(200))
    assert kubeyaml.load(text) == helm.values_from_yaml(text)


@pytest.mark.parametrize("text", ["v: " + "[" * 600 + "]" * 600, "".join(f"{'  ' * i}k:\n" for i in range(600)) + f"{'  ' * 600}k: 1\n"])
def test_nesting_past_the_depth_limit_is_one_line_not_a_recursion_error(text, tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_yaml(deep)
    [line] = [str(error) for error in caught.value.errors]
    assert line.startswith(f"{deep}: not valid YAML: exceeded max depth of {kubeyaml.MAX_DEPTH}") and "\n" not in line
    assert len(line) < 400
    nested = "v: " + "[" * (kubeyaml.MAX_DEPTH - 1) + "]" * (kubeyaml.MAX_DEPTH - 1)
    assert kubeyaml.load(nested) == helm.values_from_yaml(nested)  # the deepest document that is read
