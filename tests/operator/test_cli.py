"""`braintrain`: render == what reconcile creates, validate/run on bad input, estimate, help and version."""

import copy
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from fake_cluster import FakeCluster
from processes import run

from brain_operator import __version__
from brain_operator.cli import main
from brain_operator.objects.refs import ObjectRef
from brain_operator.local.run import _say, running_here
from brain_operator.local.plan import LocalRunError
from brain_operator.reconcile import reconcile
from brain_operator.spec import OperatorDefaults
from brain_trainer.contract import profile_request_steps

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))
LOCAL_MINIMAL = EXAMPLES[0].with_name("local-minimal.yaml")
GPU_7B = EXAMPLES[0].with_name("gpu-7b-fsdp.yaml")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
# Fields the API server adds to what the operator sent.
SERVER_FIELDS = ("uid", "generation", "resourceVersion", "creationTimestamp")


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def created_by_reconcile(cluster, stored):
    """What one reconcile of the stored job sends to create, less the fields the API server adds (a later patch of
    a created object, as of a queued PyTorchJob no Kueue suspended, is not the render's)."""
    ref = ObjectRef.of(stored)
    sent, create = [], cluster.create
    cluster.create = lambda obj: (sent.append(copy.deepcopy(dict(obj))), create(obj))[1]
    reconcile(cluster.get_job(ref.namespace, ref.name), cluster, NOW, OperatorDefaults.from_env())
    created = []
    for obj in sent:
        obj = {k: v for k, v in obj.items() if k != "status"}
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS}
        created.append(obj)
    return created


def key(obj):
    return (obj["kind"], obj["metadata"]["name"])


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_prints_exactly_what_reconcile_creates(example, backend, tmp_path, capsys, monkeypatch):
    # local-minimal names no image: the operator's default image fills it in, for both.
    monkeypatch.setenv(OperatorDefaults.ENV_IMAGE, "registry.example/brain-train-trainer:test")
    original = yaml.safe_load(example.read_text())
    cluster = FakeCluster()
    stored = cluster.apply_job({**original, "spec": {**original["spec"], "backend": backend}})
    # The file as the user has it, with the uid the API server gave; --backend chooses.
    as_stored = tmp_path / "job.yaml"
    as_stored.write_text(yaml.safe_dump({**stored, "spec": original["spec"]}))
    code, out, err = run_cli(capsys, "render", as_stored, "--backend", backend)
    assert code == 0, err
    rendered = list(yaml.safe_load_all(out))
    assert sorted(rendered, key=key) == sorted(created_by_reconcile(cluster, stored), key=key)
    kinds = {o["kind"] for o in rendered}
    assert ("Pod" in kinds) == (backend == "elastic") and ("PyTorchJob" in kinds) == (backend == "pytorchjob")
    # the ConfigMap's trainer.yaml reads as the file it is: a literal block, line for line
    (config,) = (o for o in rendered if o["kind"] == "ConfigMap")
    block = "".join(f"    {line}\n" for line in config["data"]["trainer.yaml"].splitlines())
    assert f"data:\n  trainer.yaml: |\n{block}" in out


BAD = {
    "spec": {"nodes": 2, "training": {"microBatchSize": 0, "steps": "many"}, "colour": "blue"},
}


def bad_manifest(tmp_path):
    data = yaml.safe_load(LOCAL_MINIMAL.read_text())
    data["spec"]["training"].update(BAD["spec"]["training"])
    data["spec"]["colour"] = "blue"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


EXPECTED_ERRORS = [
    "spec.colour: unknown field",
    "spec.training.steps: must be an integer, got 'many'",
    "spec.training.microBatchSize: must be >= 1, got 0",
]


@pytest.mark.parametrize("command", [["validate", "--local"], ["validate"], ["run"]])
def test_an_invalid_manifest_names_each_field_exits_1_and_starts_nothing(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = bad_manifest(tmp_path)
    code, out, err = run_cli(capsys, command[0], path, *command[1:])
    assert code == 1
    lines = err.splitlines()
    for expected in EXPECTED_ERRORS:
        assert any(line.startswith(f"{path}: {expected}") for line in lines), (expected, lines)
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "runs").exists()


def test_validate_accepts_every_example(capsys, monkeypatch):
    monkeypatch.delenv(OperatorDefaults.ENV_IMAGE, raising=False)
    for example in EXAMPLES:
        local = ["--local"] if example.name.startswith("local-") else []
        code, out, err = run_cli(capsys, "validate", example, *local)
        assert (code, err) == (0, ""), example
        assert "valid BrainTrainingJob" in out


def test_validate_without_local_requires_the_image_and_names_every_way_on(capsys, monkeypatch):
    monkeypatch.delenv(OperatorDefaults.ENV_IMAGE, raising=False)
    code, _, err = run_cli(capsys, "validate", LOCAL_MINIMAL)
    assert code == 1 and err.strip() == (
        f"{LOCAL_MINIMAL}: spec.image: required: the trainer image the workers run; set it, or the operator's default "
        "in the environment variable BRAIN_TRAINER_IMAGE, or check the job as `braintrain run` reads it "
        "(no image needed): braintrain validate --local")
    # Each way it names is a way on.
    for way in (["--local"], ["--set", "image=registry.example/trainer:1"]):
        code, out, err = run_cli(capsys, "validate", LOCAL_MINIMAL, *way)
        assert (code, err) == (0, ""), way
    monkeypatch.setenv(OperatorDefaults.ENV_IMAGE, "registry.example/trainer:1")
    assert run_cli(capsys, "validate", LOCAL_MINIMAL)[:3:2] == (0, "")
    # render has no --local: it names the image's two sources.
    monkeypatch.delenv(OperatorDefaults.ENV_IMAGE)
    code, _, err = run_cli(capsys, "render", LOCAL_MINIMAL)
    assert code == 1 and err.strip().endswith("set it, or the operator's default in the environment variable BRAIN_TRAINER_IMAGE")


def test_validate_accepts_a_relative_init_from_that_run_reads_from_the_manifests_folder(tmp_path, capsys):
    data = yaml.safe_load(LOCAL_MINIMAL.read_text())
    data["spec"]["model"]["initFrom"] = "weights/model.safetensors"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(capsys, "validate", "--local", path)
    assert (code, err) == (0, "") and "valid BrainTrainingJob" in out
    # (test_local_plan: the local plan's trainer.yaml names tmp_path/weights/model.safetensors.)


# -- --set PATH=VALUE on run, render, validate and estimate --


def test_validate_with_set_checks_the_overridden_job_and_says_so(capsys, monkeypatch):
    monkeypatch.delenv(OperatorDefaults.ENV_IMAGE, raising=False)
    code, out, err = run_cli(capsys, "validate", "--local", LOCAL_MINIMAL, "--set", "nodes=3", "--set", "spec.training.steps=10")
    assert (code, err) == (0, "")
    assert out == (f"{LOCAL_MINIMAL}: valid BrainTrainingJob 'local-minimal' (3 x 1 processes, with --set nodes=3 "
                   "--set spec.training.steps=10)\n")


@pytest.mark.parametrize("command", [["validate", "--local"], ["render"], ["estimate"], ["run"]])
def test_a_bad_set_is_one_line_naming_the_field_and_the_value_and_starts_nothing(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(OperatorDefaults.ENV_IMAGE, "registry.example/trainer:1")
    cases = [
        (["training.steps=0"], f"{LOCAL_MINIMAL}: spec.training.steps: must be >= 1, got 0 (--set training.steps=0)"),
        (["training.steps=many"],
         f"{LOCAL_MINIMAL}: spec.training.steps: must be an integer, got 'many' (--set training.steps=many)"),
        (["training.stepz=10"], f"{LOCAL_MINIMAL}: spec.training.stepz: unknown field (known fields: steps, "),
        (["training.steps.x=1"],
         f"{LOCAL_MINIMAL}: spec.training.steps: is 200, not a mapping: --set cannot reach below it (--set training.steps.x=1)"),
        (["data.path=*.txt"], "braintrain: spec.data.path: --set value '*.txt' is not valid YAML ("),
        (["training.steps"], "braintrain: --set: expected PATH=VALUE with PATH a field under spec"),
    ]
    for sets, line in cases:
        code, out, err = run_cli(capsys, *command[:1], LOCAL_MINIMAL, *command[1:], *(a for s in sets for a in ("--set", s)))
        assert code == 1 and out == "" and len(err.splitlines()) == 1 and err.startswith(line), (command, sets, err)
    assert not (tmp_path / "runs").exists()


def test_render_with_set_renders_the_overridden_job(capsys, monkeypatch):
    monkeypatch.delenv(OperatorDefaults.ENV_IMAGE, raising=False)
    code, out, err = run_cli(capsys, "render", LOCAL_MINIMAL, "--set", "image=registry.example/trainer:2", "--set", "nodes=3",
                             "--set", "scheduling.tolerations[0]={key: gpu, operator: Exists}")
    assert code == 0, err
    pods = [o for o in yaml.safe_load_all(out) if o["kind"] == "Pod"]
    assert len(pods) == 3
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"registry.example/trainer:2"}
    assert all({"key": "gpu", "operator": "Exists"} in p["spec"]["tolerations"] for p in pods)


def test_estimate_with_set_is_the_estimate_of_the_edited_file(tmp_path, capsys):
    data = yaml.safe_load(GPU_7B.read_text())
    data["spec"]["training"]["microBatchSize"] = 1
    data["spec"]["nodes"] = 2
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data))
    code, from_file, err = run_cli(capsys, "estimate", edited)
    assert code == 0, err
    code, overridden, err = run_cli(capsys, "estimate", GPU_7B, "--set", "training.microBatchSize=1", "--set", "nodes=2")
    assert code == 0, err
    _, plain, _ = run_cli(capsys, "estimate", GPU_7B)
    assert overridden == from_file != plain



# A reader that is gone before the first write, as `head -1` is once it has its line; Python ignores SIGPIPE, so the
# write fails with EPIPE (BrokenPipeError).
CLOSED_PIPE = """
import os, subprocess, sys
read, write = os.pipe()
os.close(read)
done = subprocess.run(sys.argv[1:], stdout=write, stderr=subprocess.PIPE, text=True)
print(done.returncode)
sys.stdout.write(done.stderr)
"""


def test_output_into_a_closed_pipe_ends_quietly():
    braintrain = Path(sys.executable).with_name("braintrain")
    done = run([sys.executable, "-c", CLOSED_PIPE, braintrain, "estimate", GPU_7B], timeout=120)
    assert done.returncode == 0, done.stderr
    code, _, stderr = done.stdout.partition("\n")
    # Python's own exit code for a write into a closed pipe, and nothing on stderr.
    assert (code, stderr) == ("1", "")
    # As a newcomer meets it.
    done = run(["bash", "-c", '"$0" estimate "$1" | head -1', braintrain, GPU_7B], timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("brain-7b: preset 7b") and done.stderr == ""


@pytest.mark.parametrize(
    "text, message",
    [
        ("spec: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "a BrainTrainingJob must be a mapping, got list"),
        (b"spec: \xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_unreadable_manifests_are_one_line(text, message, tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for command in ("validate", "run", "render", "estimate"):
        code, _, err = run_cli(capsys, command, path)
        assert code == 1 and len(err.splitlines()) == 1 and message in err, (command, err)
    code, _, err = run_cli(capsys, "validate", tmp_path / "missing.yaml")
    assert code == 1 and err.strip() == f"braintrain: {tmp_path / 'missing.yaml'}: cannot read: No such file or directory"


def test_estimate_on_the_7b_example_reports_the_per_rank_breakdown(capsys):
    code, out, err = run_cli(capsys, "estimate", GPU_7B)
    assert code == 0, err
    picked = out.split("strategy: auto picks ")[1]
    assert picked.startswith(
        "fsdp full_shard + full activation checkpointing\nfsdp full_shard + full activation checkpointing on 8 rank(s), per rank:"
    )
    for term in ("parameters", "gradients", "optimizer state", "activations", "overhead", "total"):
        assert f"\n  {term} " in picked
    for cheaper in ("ddp", "fsdp shard_grad_op", "fsdp full_shard"):
        assert re.search(rf"^  {cheaper} +[0-9.]+  too big +sends +[0-9.]+$", out, re.M), cheaper
    host = out.split("host memory per rank (fsdp full_shard + full activation checkpointing on GPU):")[1]
    for term in ("process", "initialisation", "ckpt staging", "data workers", "total"):
        assert f"\n  {term} " in host
    assert "recommended pod memory request: 115Gi (8 rank(s) per pod, +10%)" in host
    assert "spec.resources.requests.memory: 128Gi, covers it" in host
    # 20 GiB: no option on the device (16 micro-batches accumulate 28 GB of fp32 gradients at tp1), tp4's offload
    code, out, _ = run_cli(capsys, "estimate", GPU_7B, "--device-memory", "20")
    assert code == 0 and "strategy: auto picks fsdp full_shard + tp 4 + full activation checkpointing + CPU offload" in out


def test_estimate_sizes_a_hand_set_vocabulary(tmp_path, capsys):
    data = yaml.safe_load(GPU_7B.read_text())
    data["spec"]["model"]["vocabSize"] = 128_256
    path = tmp_path / "llama-vocab.yaml"
    path.write_text(yaml.safe_dump(data))
    code, resized, err = run_cli(capsys, "estimate", path)
    assert code == 0, err
    _, plain, _ = run_cli(capsys, "estimate", GPU_7B)
    assert resized.startswith("brain-7b: preset 7b (vocabulary 128,256), 8 rank(s)")

    def total(out):
        return float(re.search(r"^  total +([0-9.]+) GiB", out.split("strategy: auto picks ")[1], re.M)[1])

    assert total(resized) > total(plain)


def test_estimate_of_a_model_that_fits_nowhere_is_one_clear_line(tmp_path, capsys):
    data = yaml.safe_load(GPU_7B.read_text())
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "estimate", path, "--device-memory", "1")
    assert code == 1
    assert len(err.splitlines()) == 1
    assert f"{path}: spec.distributed.strategy: auto:" in err and "does not fit in 1.0 GiB per rank" in err
    assert err.rstrip().endswith("(add ranks, or lower spec.training.microBatchSize or spec.training.seqLen)")


def test_estimate_names_a_planner_rule_as_the_manifest_spells_it(tmp_path, capsys):
    data = yaml.safe_load(GPU_7B.read_text())
    data["spec"]["distributed"] = {"strategy": "fsdp", "fsdpSharding": "shard_grad_op", "cpuOffload": True}
    path = tmp_path / "offload.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "estimate", path)
    assert code == 1
    assert err.splitlines() == [f"{path}: spec.distributed.cpuOffload: is planned for fsdp full_shard or hybrid_shard "
                                "only, got fsdp shard_grad_op"]


@pytest.mark.parametrize("gib", ["0", "-1", "nan", "inf"])
def test_estimate_refuses_a_device_memory_that_is_no_size(gib, capsys):
    code, _, err = run_cli(capsys, "estimate", GPU_7B, "--device-memory", gib)
    assert code == 1 and len(err.splitlines()) == 1 and "--device-memory: must be a finite number > 0 GiB" in err


def test_operator_needs_a_namespace_choice(capsys):
    code, _, err = run_cli(capsys, "operator")
    assert code == 1 and "--namespace" in err and "--all-namespaces" in err


def test_help_everywhere_and_version(capsys):
    for argv in ([], ["run"], ["render"], ["validate"], ["estimate"], ["export"], ["generate"], ["eval"], ["operator"]):
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0
        assert "usage: braintrain" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"braintrain {__version__}"


def test_the_console_script_reports_errors_without_a_traceback(tmp_path):
    braintrain = Path(sys.executable).with_name("braintrain")
    result = run([braintrain, "validate", "--local", bad_manifest(tmp_path)], timeout=60)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == len(EXPECTED_ERRORS) and "Traceback" not in result.stderr


def test_checkpoint_asks_a_local_run_through_the_file_beside_its_trainer_yaml(capsys, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "trainer.yaml").write_text("{}\n")
    requests = []
    with running_here(tmp_path):  # what `braintrain run` holds while its run lives
        for _ in range(2):
            code, out, err = run_cli(capsys, "checkpoint", str(tmp_path))
            requests.append((tmp_path / "config" / "checkpoint-request").read_text().strip())
            assert code == 0 and err == ""
            assert out == f"braintrain: checkpoint requested ({requests[-1]}): the workers commit one at their next step boundary\n"
    assert requests[0] != requests[1], "every request is new, or the trainer would take it for the last one"
    assert sorted(p.name for p in (tmp_path / "config").iterdir()) == ["checkpoint-request", "trainer.yaml"]


def test_checkpoint_of_a_run_that_is_not_running_says_so_with_its_last_state(capsys, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "trainer.yaml").write_text("{}\n")
    code, out, err = run_cli(capsys, "checkpoint", str(tmp_path))  # a run from before the run state
    assert (code, out, err) == (1, "", f"braintrain: {tmp_path}: the run is not running\n")
    with running_here(tmp_path):
        pass  # a runner killed before its summary
    code, out, err = run_cli(capsys, "checkpoint", str(tmp_path))
    assert code == 1 and out == ""
    assert err == f"braintrain: {tmp_path}: the run is not running (last: its runner (pid {os.getpid()}) ended without a summary)\n"
    with running_here(tmp_path) as state:
        _say(state, "Succeeded at step 20/20")
        with pytest.raises(LocalRunError, match="another braintrain run is running there"):
            with running_here(tmp_path):
                pass
    code, out, err = run_cli(capsys, "checkpoint", str(tmp_path))
    assert (code, out) == (1, "") and err.endswith(": the run is not running (last: Succeeded at step 20/20)\n")
    assert not (tmp_path / "config" / "checkpoint-request").exists()


def test_profile_asks_a_local_run_for_its_steps_through_the_file_beside_its_trainer_yaml(capsys, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "trainer.yaml").write_text("{}\n")
    with running_here(tmp_path):
        code, out, err = run_cli(capsys, "profile", str(tmp_path), "--steps", "4")
        request = (tmp_path / "config" / "profile-request").read_text().strip()
        assert code == 0 and err == "" and profile_request_steps(request) == 4
        assert out.startswith(f"braintrain: profile requested ({request}): every worker traces 4 step(s)")
        code, out, err = run_cli(capsys, "profile", str(tmp_path), "--steps", "0")
        assert (code, out, err) == (1, "", "braintrain: --steps: must be a whole number >= 1, got 0\n")
    code, out, err = run_cli(capsys, "profile", str(tmp_path))
    assert (code, out) == (1, "") and err.startswith(f"braintrain: {tmp_path}: the run is not running")


def test_checkpoint_of_a_folder_without_a_run_is_one_line(capsys, tmp_path):
    code, out, err = run_cli(capsys, "checkpoint", str(tmp_path / "nothing"))
    assert code == 1 and out == ""
    assert err == f"braintrain: {tmp_path / 'nothing'}: no braintrain run here (no {tmp_path / 'nothing' / 'config' / 'trainer.yaml'})\n"


@pytest.mark.parametrize("policy, line", [
    ({"suspend": True}, "braintrain: spec.runPolicy.suspend: true: the job is suspended, nothing runs; "
                        "set it false to run locally"),
    ({"activeDeadlineSeconds": 600}, "braintrain: spec.runPolicy.activeDeadlineSeconds: 600: braintrain run does "
                                     "not enforce a deadline; remove it to run locally"),
])
def test_run_refuses_what_only_the_operator_honours_in_one_line(policy, line, tmp_path, capsys):
    job = yaml.safe_load(LOCAL_MINIMAL.read_text())
    job["spec"]["runPolicy"] = policy
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code, out, err = run_cli(capsys, "run", path, "--workdir", tmp_path / "work", "--claims", tmp_path / "claims")
    assert (code, out, err) == (1, "", line + "\n") and not (tmp_path / "work").exists()


def test_estimate_plans_tensor_parallel_70b_on_8_nodes(tmp_path, capsys):
    data = yaml.safe_load(GPU_7B.read_text())
    data["spec"]["model"]["preset"] = "70b"
    data["spec"]["nodes"] = 8
    data["spec"]["training"]["microBatchSize"] = 1  # 1 x 8 data-parallel ranks x 64 accumulation = 512
    data["spec"]["distributed"]["tensorParallel"] = 8
    data["spec"]["checkpoint"]["volumeClaimTemplate"]["storage"] = "4Ti"
    path = tmp_path / "70b.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(capsys, "estimate", path)
    assert code == 0, err
    picked = out.split("strategy: auto picks ")[1]
    assert picked.startswith("fsdp full_shard + tp 8 + full activation checkpointing\n"
                             "fsdp full_shard + tp 8 + full activation checkpointing on 64 rank(s), per rank:")
    tried = out.split(TRIED)[1].split("\n\n")[0].splitlines()
    assert tried and all(line.startswith("  fsdp ") for line in tried), "tensor parallelism composes with fsdp only"


TRIED = "cheapest first (device GiB per rank; GiB each rank sends per step; pipeline bubble):\n"


def _big_job(tmp_path, preset, **training):
    data = yaml.safe_load(GPU_7B.read_text())
    data["spec"]["model"]["preset"] = preset
    data["spec"]["nodes"] = 8
    data["spec"]["training"].update(training)
    data["spec"]["distributed"].pop("tensorParallel", None)
    data["spec"]["checkpoint"]["volumeClaimTemplate"]["storage"] = "4Ti"
    path = tmp_path / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_estimate_lets_auto_pick_the_smallest_tensor_parallel_that_fits(tmp_path, capsys):
    """13b on 8 nodes x 8 GPUs of 36 GiB, 1024 tokens, tensorParallel unset: no tp1 option fits on the device (8
    micro-batches accumulate every gradient unsharded in fp32), tp2's full_shard + checkpointing does; every degree's
    options are listed, smallest first, then the pipelines at tp8, CPU offload last."""
    path = _big_job(tmp_path, "13b", microBatchSize=1, seqLen=1024)
    code, out, err = run_cli(capsys, "estimate", path, "--device-memory", "36")
    assert code == 0, err
    assert "strategy: auto picks fsdp full_shard + tp 2 + full activation checkpointing\n" in out
    assert "  keeps the global batch: 16 micro-batches per step on 32 data-parallel rank(s), where " \
           "spec.training.globalBatchSize gives 8 on 64\n" in out
    tried = out.split(TRIED)[1].split("\n\n")[0].splitlines()
    degrees = [int(m[1]) if (m := re.search(r"\+ tp (\d+) ", line)) else 1 for line in tried]
    pipelines = [int(m[1]) if (m := re.search(r"\+ pp (\d+) ", line)) else 1 for line in tried]
    offload = ["CPU offload" in line for line in tried]
    assert sorted(set(degrees)) == [1, 2, 4, 8] and sorted(set(pipelines)) == [1, 2, 4, 8]
    assert offload == sorted(offload), "CPU offload comes after every layout's on-device options"
    on_device = [(pp, tp) for tp, pp, off in zip(degrees, pipelines, offload) if not off]
    assert on_device == sorted(on_device), "smallest tp first, then the pipelines at the largest"
    assert all(("bubble" in line) == (pp > 1) for line, pp in zip(tried, pipelines))


def test_estimate_adds_a_pipeline_when_tensor_parallel_8_is_not_enough(tmp_path, capsys):
    """70b on 8 nodes x 8 GPUs of 48 GiB, a global batch of 128: tp8 needs 56.9 GiB, tp8 x pp4 fits; the pick
    names the fullest pipeline rank, its stage and micro-batches in flight, the batch kept, and what each rank
    sends per step."""
    path = _big_job(tmp_path, "70b", microBatchSize=1, seqLen=4096, globalBatchSize=128)
    code, out, err = run_cli(capsys, "estimate", path, "--device-memory", "48")
    assert code == 0, err
    picked = out.split("strategy: auto picks ")[1].split("\n\n")[0].splitlines()
    assert picked[0] == "fsdp full_shard + tp 8 + pp 4 (1f1b) + full activation checkpointing"
    assert picked[1] == picked[0] + " on 64 rank(s), per rank:"
    assert picked[2] == "  pipeline rank 1 of 4 (the fullest), 64 micro-batches per step, bubble 4.5%:"
    stage = r"    stage 1: reasoning\.blocks\.\d+ \.\. reasoning\.blocks\.\d+, 3 micro-batch\(es\) in flight"
    assert re.fullmatch(stage, picked[3])
    rows = {line[:19].strip(): float(line[19:].split()[0]) for line in picked[4:]
            if line.endswith(" GiB") and ":" not in line}
    assert rows["total"] == 40.2 and rows["pipeline buffers"] == 8.0
    assert rows["fsdp"] > 0 and rows["tensor parallel"] > rows["pipeline"] == 8.0
    assert "  keeps the global batch: 64 micro-batches per step on 2 data-parallel rank(s), where " \
           "spec.training.globalBatchSize gives 2 on 64" in picked
    assert not any(line.startswith("  warning") for line in picked)  # 64 micro-batches: 16 per pipeline rank
    tried = out.split(TRIED)[1].split("\n\n")[0].splitlines()
    assert re.search(r"^  fsdp full_shard \+ tp 8 \+ full activation checkpointing +56\.86  too big ", out, re.M)
    first = next(line for line in tried if " fits " in line)
    assert first.startswith("  fsdp full_shard + tp 8 + pp 4 (1f1b) + full activation checkpointing ")

    # tensorParallel set to 8 and 16 sequences a step: fewer accumulators, so pp2 fits, with 4 micro-batches for 2
    # pipeline ranks, said so
    data = yaml.safe_load(path.read_text())
    data["spec"]["training"]["globalBatchSize"] = 16
    data["spec"]["distributed"]["tensorParallel"] = 8
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(capsys, "estimate", path, "--device-memory", "48")
    assert code == 0, err
    assert "strategy: auto picks fsdp full_shard + tp 8 + pp 2 (1f1b) + full activation checkpointing\n" in out
    assert "  warning: fewer than 4 x pp micro-batches per step: the pipeline idles 20.0% of it\n" in out
