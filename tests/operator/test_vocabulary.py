"""The vocabulary `braintrain estimate` and the storage check size a preset with (vocabulary.py): the token
dataset's tokenizer's where the dataset is reachable from here, else the preset's, said to be assumed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from fake_cluster import FakeCluster
from tokenizers import Tokenizer, models, pre_tokenizers

from brain_operator.cli import main
from brain_operator.local.dataset import job_vocabulary
from brain_operator.sizing.estimate import estimate_lines
from brain_operator.reconcile import reconcile
from brain_operator.spec import parse_job
from brain_operator.sizing.storage import size_text
from brain_trainer.config.presets import preset_config
from brain_trainer.data.tokens.options import PrepareOptions
from brain_trainer.data.tokens.prepare import prepare
from brain_trainer.plan import preset_checkpoint_bytes
from test_storage import NOW

LOCAL_TOKENS = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-tokens.yaml"
WORDS = 30_000
VOCAB = WORDS + 2  # the words, [UNK] and the end-of-text token prepare adds


def prepared(folder: Path, tmp_path: Path) -> Path:
    """A real token dataset at `folder` whose tokenizer has VOCAB ids."""
    vocab = {f"w{i}": i for i in range(WORDS)} | {"[UNK]": WORDS}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "words.json"))
    (tmp_path / "corpus.txt").write_text(" ".join(f"w{i}" for i in range(0, WORDS, 7)))
    options = PrepareOptions(inputs=[str(tmp_path / "corpus.txt")], out=str(folder), tokenizer=str(tmp_path / "words.json"),
                             add_eot_token=True, val_fraction=0)
    assert prepare(options, io.StringIO()).tokenizer.vocab_size == VOCAB
    return folder


def manifest(**spec) -> dict:
    data = yaml.safe_load(LOCAL_TOKENS.read_text())
    data["spec"].update(spec)
    return data


def estimate(capsys, path: Path) -> tuple[int, str, str]:
    code = main(["estimate", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_reads_the_vocabulary_of_the_dataset_on_the_local_claim(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # braintrain run's claims folder, runs/claims/, is the working directory's
    prepared(tmp_path / "runs" / "claims" / "stdlib-tokens" / "stdlib", tmp_path)
    code, out, err = estimate(capsys, LOCAL_TOKENS)
    assert code == 0, err
    first, second = out.splitlines()[:2]
    assert first.startswith(f"local-tokens: preset minimal (vocabulary {VOCAB:,}), 2 rank(s)")
    assert second == f"vocabulary: {VOCAB:,} ids, the tokenizer of runs/claims/stdlib-tokens/stdlib"
    size = preset_checkpoint_bytes(preset_config("minimal", vocab_size=VOCAB))
    assert size > 2 * preset_checkpoint_bytes("minimal")  # the vocabulary dominates a minimal model
    assert f"checkpoint: {size_text(size)} each; keepLast 2 + 1 being written = {size_text(3 * size)}" in out


def test_without_the_dataset_estimate_says_which_vocabulary_it_assumed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = estimate(capsys, LOCAL_TOKENS)
    assert code == 0, err
    assert out.splitlines()[1] == (
        "vocabulary: 256 ids assumed, the preset's: the dataset is not reachable from here (/data/stdlib: no such "
        "folder; runs/claims/stdlib-tokens/stdlib: no such folder); spec.model.vocabSize sets it")
    size = preset_checkpoint_bytes("minimal")
    assert f"checkpoint: {size_text(size)} each" in out
    # a folder that is no dataset is named with the reason
    (tmp_path / "runs" / "claims" / "stdlib-tokens" / "stdlib").mkdir(parents=True)
    _, out, _ = estimate(capsys, LOCAL_TOKENS)
    assert "runs/claims/stdlib-tokens/stdlib: not a token dataset (no manifest.json;" in out.splitlines()[1]


def test_a_relative_data_path_is_read_from_the_manifests_folder_and_a_hand_set_size_wins(tmp_path):
    prepared(tmp_path / "jobs" / "data" / "words", tmp_path)
    spec = manifest(data={"source": "tokens", "path": "data/words"})
    job = parse_job(spec, require_image=False)
    assert f"vocabulary: {VOCAB:,} ids, the tokenizer of {tmp_path}/jobs/data/words" in estimate_lines(
        job, job_vocabulary(job, base_dir=tmp_path / "jobs"))
    assert estimate_lines(job, job_vocabulary(job, base_dir=tmp_path))[1].startswith("vocabulary: 256 ids assumed")
    spec["spec"]["model"]["vocabSize"] = 50_000
    job = parse_job(spec, require_image=False)
    lines = estimate_lines(job, job_vocabulary(job, base_dir=tmp_path / "jobs"))
    assert lines[0].startswith("local-tokens: preset minimal (vocabulary 50,000)")
    assert not any(line.startswith("vocabulary:") for line in lines)  # the manifest settles it: nothing to say


def test_the_storage_check_sizes_checkpoints_with_the_datasets_vocabulary(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    size = preset_checkpoint_bytes(preset_config("minimal", vocab_size=VOCAB))
    storage = "64Mi"  # room for 3 checkpoints of the preset's own vocabulary, not for 3 of the dataset's
    assert 3 * preset_checkpoint_bytes("minimal") < 64 * 2**20 < 3 * size
    path = tmp_path / "job.yaml"
    data = manifest()
    data["spec"]["checkpoint"]["volumeClaimTemplate"]["storage"] = storage
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", "--local", str(path)]) == 0  # the dataset is not here yet: the preset's is assumed
    capsys.readouterr()
    prepared(tmp_path / "runs" / "claims" / "stdlib-tokens" / "stdlib", tmp_path)
    for command in (["validate", "--local"], ["estimate"]):
        assert main([*command, str(path)]) == 1
        assert capsys.readouterr().err.splitlines() == [
            f"{path}: spec.checkpoint.volumeClaimTemplate.storage: 64Mi (67.1 MB) cannot hold (checkpoint.keepLast 2 + 1) "
            f"x {size_text(size)} per checkpoint = {size_text(3 * size)} (vocabulary: {VOCAB:,} ids, the tokenizer of "
            "runs/claims/stdlib-tokens/stdlib)"]


@pytest.mark.parametrize("vocab_size", [None, 40_000])
def test_the_operator_says_it_assumed_the_presets_vocabulary(vocab_size):
    cluster = FakeCluster()
    data = manifest(image="registry.example/brain-trainer:1")
    data["metadata"]["namespace"] = "default"
    data["spec"]["checkpoint"]["volumeClaimTemplate"]["storage"] = "20Mi"
    if vocab_size:
        data["spec"]["model"]["vocabSize"] = vocab_size
    cluster.apply_job(data)
    status = reconcile(cluster.get_job("default", "local-tokens"), cluster, NOW)
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["reason"] == "CheckpointStorageTooSmall"
    assumed = ("(vocabulary: 256 ids assumed, the preset's: the operator does not read the data volume; "
               "spec.model.vocabSize sets it)")
    assert valid["message"].endswith(assumed) == (vocab_size is None), valid["message"]


@pytest.mark.parametrize("path", ["/data/a\x00b", "/data/" + "x" * 5000])
def test_a_data_path_no_folder_can_have_is_assumed_away_in_a_bounded_line(path):
    data = manifest()
    data["spec"]["data"]["path"] = path
    job = parse_job(data, require_image=False)
    lines = estimate_lines(job, job_vocabulary(job))
    assert lines[1].startswith("vocabulary: 256 ids assumed, the preset's: the dataset is not reachable from here (")
    assert len(lines[1]) < 600
