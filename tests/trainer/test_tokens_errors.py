"""Bad input to prepare and to the dataset: one line naming the file, a non-zero exit, nothing that looks complete."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import zlib

import numpy as np
import pyarrow
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models
from tokens_corpus import PROG, prepare, stdlib_globs

from brain_trainer.contract import DATA_ERROR, EXIT_CODES
from brain_trainer.data.errors import DataError
from brain_trainer.data.tokens.dataset import TokenDataset
from brain_trainer.data.tokens.format import check_seq_len, in_validation, read_manifest
from brain_trainer.data.tokens.tokenizer import ByteTokenizer, TokenizerError, load_dataset_tokenizer, train_bpe
from brain_trainer.data.tokens.writer import DatasetWriter


def failed(capsys, tmp_path, *argv, code=1):
    """Run prepare into tmp_path/out expecting failure: the one error line; no dataset or temporary folder left."""
    out = tmp_path / "out"
    rc, stdout, errors = prepare(capsys, *argv, "--out", out)
    assert rc == code and not stdout
    assert len(errors) == 1, errors  # one line: no traceback
    assert errors[0].startswith(f"{PROG}: ")
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")], "a temporary folder was left"
    return errors[0]


def write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_an_empty_corpus(tmp_path, capsys):
    write(tmp_path / "a.txt", "")
    write(tmp_path / "b.jsonl", '\n{"text": ""}\n')
    assert "no text (every document is empty)" in failed(capsys, tmp_path, tmp_path / "a.txt", tmp_path / "b.jsonl")
    line = failed(capsys, tmp_path, tmp_path / "a.txt", "--train-tokenizer", "--vocab-size", "300")
    assert "no text" in line  # found while training the tokenizer, before training on nothing


def test_inputs_that_name_no_file(tmp_path, capsys):
    assert f"{tmp_path}/*.md: matches no file" in failed(capsys, tmp_path, tmp_path / "*.md")
    assert f"{tmp_path / 'missing.txt'}: no such file" in failed(capsys, tmp_path, tmp_path / "missing.txt")
    assert "is a folder; name files or a glob" in failed(capsys, tmp_path, tmp_path)


def test_non_utf8_text_names_file_and_byte_or_is_skipped_and_counted(tmp_path, capsys):
    good = write(tmp_path / "a.txt", "fine text\n" * 100)
    bad = write(tmp_path / "b.txt", b"caf\xc3\xa9 then \xff here")
    line = failed(capsys, tmp_path, good, bad, "--val-fraction", "0")  # a.txt was already written to a shard
    assert f"{bad}: not UTF-8 at byte 11 (invalid start byte)" in line and "--skip-bad" in line

    out = tmp_path / "out"
    rc, stdout, errors = prepare(capsys, good, bad, "--out", out, "--val-fraction", "0", "--skip-bad")
    assert rc == 0 and not errors
    assert "skipped 1 documents that are not UTF-8" in stdout
    manifest = read_manifest(out)
    assert (manifest.skipped, manifest.train.documents) == (1, 1)


def test_json_lines_records_are_named_by_file_and_line(tmp_path, capsys):
    first = '{"text": "ok"}\n'
    cases = {
        "[1, 2]": ":2: a JSON Lines record must be an object, got list",
        '{"body": "x", "id": 3}': ":2: no field 'text' (fields: body, id); --text-field names it",
        '{"text": 5}': ":2: field 'text' must be a string, got int",
        '{"text": "open': ":2: not JSON: ",
    }
    for i, (record, message) in enumerate(cases.items()):
        path = write(tmp_path / f"c{i}.jsonl", first + record + "\n")
        assert f"{path}{message}" in failed(capsys, tmp_path, path)
    bad = write(tmp_path / "bad.jsonl", first.encode() + b'{"text": "\xfe"}\n')
    assert f"{bad}:2: not UTF-8 at byte {len(first) + 10}" in failed(capsys, tmp_path, bad)
    out = tmp_path / "skipped"
    rc, _, errors = prepare(capsys, bad, "--out", out, "--skip-bad", "--val-fraction", "0")
    assert rc == 0 and not errors and read_manifest(out).skipped == 1


def test_a_json_array_is_refused_with_a_pointer_to_json_lines(tmp_path, capsys):
    records = [{"text": "one"}, {"text": "two"}]
    for name, content in (("a.json", json.dumps(records, indent=2)), ("b.jsonl", "\n" + json.dumps(records) + "\n")):
        path = write(tmp_path / name, content)
        line = failed(capsys, tmp_path, path)
        assert line.endswith("a JSON array; prepare reads JSON Lines, one JSON object per line "
                             "(jq -c '.[]' writes an array's objects so)")
        assert f"{path}:{1 + name.startswith('b')}: " in line
    # a .json file of JSON Lines is read as such
    out = tmp_path / "lines"
    path = write(tmp_path / "c.json", "".join(json.dumps(r) + "\n" for r in records))
    rc, _, errors = prepare(capsys, path, "--out", out, "--val-fraction", "0")
    assert rc == 0 and not errors and read_manifest(out).train.documents == 2


def test_damaged_or_unreadable_compressed_inputs(tmp_path, capsys):
    data = ("some text to compress " * 500).encode()
    cut = write(tmp_path / "cut.txt.gz", gzip.compress(data)[:-40])
    assert f"{cut}: damaged gzip data: " in failed(capsys, tmp_path, cut)
    garbage = write(tmp_path / "garbage.jsonl.bz2", b"BZh9" + bytes(range(200)))
    assert f"{garbage}: damaged bzip2 data: " in failed(capsys, tmp_path, garbage)
    parquet = write(tmp_path / "t.parquet.gz", gzip.compress(b"PAR1"))
    assert f"{parquet}: gzip-compressed Parquet; Parquet compresses its own columns" in failed(capsys, tmp_path, parquet)
    # named .bz2 but not compressed: read as the text it is
    out = tmp_path / "plain"
    rc, _, errors = prepare(capsys, write(tmp_path / "plain.txt.bz2", "plain text"), "--out", out, "--val-fraction", "0")
    assert rc == 0 and not errors and read_manifest(out).train.tokens == len("plain text") + 1


def test_an_end_of_text_token_the_tokenizer_lacks_is_refused_unless_asked_to_add_it(tmp_path, capsys):
    corpus = write(tmp_path / "a.txt", "some text")
    tokenizer = tmp_path / "tokenizer.json"
    train_bpe(["some text for a tokenizer"], 300).tokenizer.save(str(tokenizer))  # holds <|endoftext|> only
    line = failed(capsys, tmp_path, corpus, "--tokenizer", tokenizer, "--eot-token", "<eos>")
    assert line.endswith(f"{tokenizer}: has no token '<eos>' to end a document; name the end-of-text token it has "
                         "with --eot-token, or pass --add-eot-token to add '<eos>' as a new id")
    bare = tmp_path / "bare.json"
    Tokenizer(models.WordLevel({"some": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(bare))
    line = failed(capsys, tmp_path, corpus, "--tokenizer", bare)
    assert f"{bare}: has none of <|endoftext|>, <|end_of_text|>, </s>, <eos> to end a document" in line
    assert "--add-eot-token to add '<|endoftext|>' as a new id" in line
    assert "--add-eot-token: only applies to a tokenizer file" in failed(capsys, tmp_path, corpus, "--add-eot-token", code=2)


def test_parquet_without_the_column(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    pq.write_table(pyarrow.table({"content": ["a", "b"]}), path)
    assert f"{path}: no column 'text' (columns: content)" in failed(capsys, tmp_path, path)
    write(tmp_path / "fake.parquet", "not parquet at all")
    assert "fake.parquet: not a Parquet file" in failed(capsys, tmp_path, tmp_path / "fake.parquet")


def test_a_tokenizer_file_that_does_not_parse(tmp_path, capsys):
    corpus = write(tmp_path / "a.txt", "some text")
    for content in ("{not json", '{"model": {"type": "Nonsense"}}'):
        tokenizer = write(tmp_path / "tokenizer.json", content)
        assert f"{tokenizer}: not a Hugging Face tokenizers file: " in failed(capsys, tmp_path, corpus, "--tokenizer", tokenizer)
    missing = tmp_path / "nope.json"
    assert f"{missing}: cannot read the tokenizer" in failed(capsys, tmp_path, corpus, "--tokenizer", missing)


def test_a_split_left_empty(tmp_path, capsys):
    text = "the only document"
    corpus = write(tmp_path / "a.txt", text)
    seed = next(s for s in range(100) if not in_validation(text, s, 0.05))
    line = failed(capsys, tmp_path, corpus, "--seed", seed)
    assert "none of the 1 documents fell in the validation split (--val-fraction 0.05)" in line
    seed = next(s for s in range(100) if in_validation(text, s, 0.5))
    assert "all 1 documents fell in the validation split" in failed(capsys, tmp_path, corpus, "--seed", seed,
                                                                     "--val-fraction", "0.5")


def test_option_rules_name_the_flag(tmp_path, capsys):
    corpus = write(tmp_path / "a.txt", "text")
    assert "--vocab-size: only applies with --train-tokenizer" in failed(capsys, tmp_path, corpus, "--vocab-size", "500", code=2)
    assert "--vocab-size: required with --train-tokenizer" in failed(capsys, tmp_path, corpus, "--train-tokenizer", code=2)
    assert "--val-fraction: must be <= 0.5, got 0.9" in failed(capsys, tmp_path, corpus, "--val-fraction", "0.9", code=2)


def test_an_existing_folder_that_is_not_a_dataset_is_never_replaced(tmp_path, capsys):
    corpus = write(tmp_path / "a.txt", "text " * 50)
    keep = tmp_path / "out"
    write(keep.mkdir() or keep / "precious.txt", "mine")
    for extra in ((), ("--force",)):
        rc, _, errors = prepare(capsys, corpus, "--out", keep, "--val-fraction", "0", *extra)
        assert rc == 1 and len(errors) == 1
    assert "exists and is not a token dataset; not replacing it" in errors[0]
    assert [p.name for p in keep.iterdir()] == ["precious.txt"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "ds"
    from brain_trainer.data.tokens.prepare import main

    assert main([*stdlib_globs("json", "email"), "--out", str(out), "--val-fraction", "0.2", "--shard-tokens", "50000"]) == 0
    return out


@pytest.fixture
def copy(dataset, tmp_path):
    return shutil.copytree(dataset, tmp_path / "ds")


def test_a_folder_without_a_complete_manifest_is_not_a_dataset(copy):
    manifest = (copy / "manifest.json").read_text()
    (copy / "manifest.json").unlink()
    with pytest.raises(DataError, match=rf"^{copy}: not a token dataset \(no manifest.json"):
        TokenDataset(copy, 16)
    (copy / "manifest.json").write_text(manifest[: len(manifest) // 2])
    with pytest.raises(DataError, match=rf"^{copy}/manifest.json: not JSON"):
        read_manifest(copy)
    broken = json.loads(manifest)
    broken["train"]["tokens"] += 1
    (copy / "manifest.json").write_text(json.dumps(broken))
    with pytest.raises(DataError, match=r"manifest.json: train.tokens: is \d+, but the shards hold \d+"):
        read_manifest(copy)
    broken["format"] = 99
    (copy / "manifest.json").write_text(json.dumps(broken))
    with pytest.raises(DataError, match="format 99; this brain-train reads format 1"):
        read_manifest(copy)


def test_a_truncated_missing_or_damaged_shard_is_named_at_open(copy):
    manifest = read_manifest(copy)
    second = copy / manifest.train.shards[1].name
    data = second.read_bytes()
    second.write_bytes(data[:-2])
    with pytest.raises(DataError, match=rf"^{second}: {len(data) - 2} bytes, manifest says {len(data)} \(truncated\)$"):
        TokenDataset(copy, 16)
    second.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(DataError, match=rf"^{second}: checksum [0-9a-f]{{8}}, manifest says {manifest.train.shards[1].crc32} \(corrupted\)$"):
        TokenDataset(copy, 16)
    TokenDataset(copy, 16, split="validation")  # the other split is intact
    second.unlink()
    with pytest.raises(DataError, match=rf"^{second}: No such file"):
        TokenDataset(copy, 16)


def test_seq_len_longer_than_the_validation_split(dataset):
    manifest = read_manifest(dataset)
    held_out = manifest.validation.tokens
    assert manifest.train.tokens > held_out + 1
    check_seq_len(manifest, held_out - 1)
    message = rf"the validation split holds {held_out} tokens, fewer than one sequence \(seq_len \+ 1 = {held_out + 1}\)"
    with pytest.raises(DataError, match=message):
        check_seq_len(manifest, held_out)
    with pytest.raises(DataError, match=rf"^{dataset}: {message}"):
        TokenDataset(dataset, held_out, split="validation")
    TokenDataset(dataset, held_out, split="train")  # the training split is longer


def test_a_stored_tokenizer_changed_after_prepare(tmp_path, capsys):
    tokenizer = tmp_path / "t.json"
    train_bpe(["some words and more words"], 300).tokenizer.save(str(tokenizer))
    out = tmp_path / "ds"
    rc, _, _ = prepare(capsys, write(tmp_path / "a.txt", "words"), "--out", out, "--tokenizer", tokenizer,
                       "--val-fraction", "0")
    assert rc == 0
    stored = json.loads((out / "tokenizer.json").read_text())
    stored["model"]["dropout"] = 0.5  # still a valid tokenizer, but not the one that made the ids
    (out / "tokenizer.json").write_text(json.dumps(stored))
    with pytest.raises(TokenizerError, match="tokenizer.json: does not match the manifest's sha256"):
        load_dataset_tokenizer(out, read_manifest(out).tokenizer)


def trainer_fails(capsys, folder, tmp_path, **training):
    """`python -m brain_trainer` on the dataset `folder`: data-error's exit code and the one error line, before any
    rank trains."""
    from brain_trainer.__main__ import main as trainer_main

    config = {"training": {"steps": 2, "seq_len": 16, **training}, "data": {"source": "tokens", "path": str(folder)},
              "checkpoint": {"dir": str(tmp_path / "checkpoints")}, "metrics": {"port": 0}}
    path = tmp_path / "trainer.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    assert trainer_main(["--config", str(path)]) == EXIT_CODES[DATA_ERROR]
    _, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data.path: "), err
    assert not (tmp_path / "checkpoints").exists(), "nothing trained, nothing saved"
    assert not torch.distributed.is_initialized()
    return lines[0].removeprefix("error: data.path: ")


def test_the_trainer_names_a_damaged_shard_before_training(copy, tmp_path, capsys):
    shard = copy / read_manifest(copy).train.shards[0].name
    data = shard.read_bytes()
    shard.write_bytes(data[:-4])
    assert trainer_fails(capsys, copy, tmp_path) == f"{shard}: {len(data) - 4} bytes, manifest says {len(data)} (truncated)"
    shard.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert re.fullmatch(rf"{shard}: checksum [0-9a-f]{{8}}, manifest says [0-9a-f]{{8}} \(corrupted\)",
                        trainer_fails(capsys, copy, tmp_path))
    (copy / "manifest.json").unlink()
    assert trainer_fails(capsys, copy, tmp_path).startswith(f"{copy}: not a token dataset (no manifest.json")


def test_the_trainer_refuses_a_seq_len_longer_than_the_validation_split(tmp_path, capsys):
    folder = tmp_path / "short-validation"
    with DatasetWriter(folder, "uint16", 1 << 20) as writer:
        writer.write("train", np.arange(20_000, dtype=np.uint16) % 256, 1)
        writer.write("validation", np.arange(64, dtype=np.uint16), 1)
        writer.commit(ByteTokenizer().info(), 0.1, 0, ["synthetic"], 0)
    line = trainer_fails(capsys, folder, tmp_path, seq_len=100, eval_interval=1)
    assert line == (f"{folder}: the validation split holds 64 tokens, fewer than one sequence "
                    "(seq_len + 1 = 101); lower training.seq_len or prepare more data")


def test_a_token_id_outside_the_vocabulary_is_a_data_error_naming_the_file_and_the_id(copy):
    # A shard whose ids the model has no embedding for (a hand-edited or mismatched file with a matching
    # manifest) stops at open as data-error, not as a generic error or a device-side assert mid-training.
    manifest = json.loads((copy / "manifest.json").read_text())
    shard = copy / manifest["train"]["shards"][1]["name"]
    tokens = np.fromfile(shard, dtype=manifest["dtype"])
    vocab = manifest["tokenizer"]["vocab_size"]
    tokens[7], tokens[9] = vocab, vocab + 5
    tokens.tofile(shard)
    manifest["train"]["shards"][1]["crc32"] = f"{zlib.crc32(shard.read_bytes()):08x}"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError) as caught:
        TokenDataset(copy, 16)
    assert caught.value.reason == DATA_ERROR
    assert str(caught.value) == (f"{shard}: token id {vocab} at token 7 is outside the tokenizer's vocabulary of {vocab} ids "
                                 f"(the file does not match {copy / 'manifest.json'})")
    TokenDataset(copy, 16, split="validation")  # the other split is intact
