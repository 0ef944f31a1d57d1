"""`python -m brain_trainer` on bad trainer.yaml files: one clear line per bad field, exit 2 (a missing dataset: 65), no traceback."""

import sys

import pytest
from processes import run

from brain_trainer import contract

CASES = [
    # (yaml, the field each error line must name, words the message must contain)
    ("training: {steps: ten}", ["training.steps"], "must be an integer, got 'ten'"),
    ("training: {learning_rate: fast}", ["training.learning_rate"], "must be a number"),
    ("training: {compile: maybe}", ["training.compile"], "must be true, false or auto; got 'maybe'"),
    ("distributed: {fsdp_sharding: fullshard}", ["distributed.fsdp_sharding"], "must be one of full_shard"),
    ("distributed: {strategy: zero3}", ["distributed.strategy"], "got 'zero3'"),
    ("distributed: {mixed_precision_policy: fp8}", ["distributed.mixed_precision_policy"], "must be one of fp32, bf16, fp16"),
    ("training: {micro_batch_size: -4}", ["training.micro_batch_size"], "must be >= 1, got -4"),
    ("training: {warmup_steps: -1}", ["training.warmup_steps"], "must be >= 0"),
    ("data: {num_workers: -2}", ["data.num_workers"], "must be >= 0"),
    ("training: {learning_rate: 0}", ["training.learning_rate"], "must be > 0"),
    ("checkpoint: {keep_last: 0}", ["checkpoint.keep_last"], "must be >= 1"),
    ("distributed: {master_port: 70000}", ["distributed.master_port"], "must be <= 65535"),
    ("training: {stepz: 5}", ["training.stepz"], "unknown field"),
    ("optimizer: {name: sgd}", ["optimizer"], "unknown field"),
    ("training: [1, 2]", ["training"], "must be a mapping"),
    ("data: {source: files}", ["data.path"], "required when source is 'files'"),
    ("model: {entrypoint: 'not a pattern'}", ["model.entrypoint"], "must match"),
    ("training: {micro_batch_size: 4, global_batch_size: 10}", ["training.global_batch_size"], "multiple of micro_batch_size"),
    (
        "training: {global_batch_size: 8}\ndistributed: {gradient_accumulation_steps: 2}",
        ["distributed.gradient_accumulation_steps"],
        "not both",
    ),
    (
        "training: {steps: 0, seq_len: 1}\ndistributed: {backend: mpi}",
        ["training.steps", "training.seq_len", "distributed.backend"],
        "",
    ),
]


def run_trainer(config_path):
    return run([sys.executable, "-m", "brain_trainer", "--config", str(config_path)], timeout=120)


def assert_clean_failure(proc, fields, words, code=contract.CONFIG_ERROR):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert [line.split(": ")[1] for line in lines] == fields, proc.stderr
    assert all(line.startswith("error: ") for line in lines)
    assert words in proc.stderr


@pytest.mark.parametrize("text,fields,words", CASES, ids=[c[1][0] + ":" + c[0][:30] for c in CASES])
def test_bad_config_is_one_line_per_field_and_exit_2(tmp_path, text, fields, words):
    path = tmp_path / "trainer.yaml"
    path.write_text(text + "\n")
    assert_clean_failure(run_trainer(path), fields, words)


def test_a_missing_dataset_is_a_data_error_in_one_line(tmp_path):
    # Found only at run time, once torch is imported: still one line, with data-error's exit code.
    path = tmp_path / "trainer.yaml"
    path.write_text("data: {source: files, path: /nonexistent/brain/*.txt}\nmetrics: {port: 0}\n")
    assert_clean_failure(run_trainer(path), ["data.path"], "no files match '/nonexistent/brain/*.txt'",
                         code=contract.EXIT_CODES[contract.DATA_ERROR])


def test_unreadable_and_malformed_files(tmp_path):
    missing = run_trainer(tmp_path / "absent.yaml")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith(f"error: {tmp_path / 'absent.yaml'}: cannot read: No such file or directory")
    broken = tmp_path / "broken.yaml"
    broken.write_text("training: {steps: [\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"training: \xff\xfe\n")
    for path, problem in ((broken, "not valid YAML"), (binary, "not UTF-8 text")):
        proc = run_trainer(path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith(f"error: {path}: {problem}") and len(proc.stderr.splitlines()) == 1
