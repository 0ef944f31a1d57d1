"""braintrain prepare: corpus -> token dataset folder -> windows, with each tokenizer, dtype, split and worker count."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json

import numpy as np
import pyarrow
import pyarrow.parquet as pq
import pytest
import torch
import zstandard
from tokenizers import Tokenizer, models, pre_tokenizers
from tokens_corpus import documents, prepare, split_texts, stdlib_globs, stdlib_texts, stream

from brain_trainer.data.tokens import prepare as prepare_module
from brain_trainer.data.tokens.dataset import TokenDataset
from brain_trainer.data.tokens.format import read_manifest
from brain_trainer.data.tokens.report import PassProgress
from brain_trainer.data.tokens.tokenizer import load_dataset_tokenizer, train_bpe

PACKAGES = ("json", "email", "concurrent/futures")
SMALL = ("json", "concurrent/futures")


def test_bytes_prepare_then_windows_read_the_source_bytes(tmp_path, capsys):
    out = tmp_path / "ds"
    rc, stdout, errors = prepare(capsys, *stdlib_globs(*PACKAGES), "--out", out, "--val-fraction", "0.2",
                                 "--seed", "3", "--shard-tokens", "40000")
    assert rc == 0 and not errors
    manifest = read_manifest(out)
    train_texts, val_texts = split_texts(stdlib_texts(*PACKAGES), 3, 0.2)
    assert (manifest.train.documents, manifest.validation.documents) == (len(train_texts), len(val_texts))
    assert f"train {len(train_texts)} documents" in stdout
    assert manifest.dtype == "uint16" and manifest.tokenizer.vocab_size == 257 and manifest.tokenizer.eot_id == 256
    assert len(manifest.train.shards) > 3 and all(s.tokens == 40000 for s in manifest.train.shards[:-1])
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".bin") == sorted(
        s.name for split in (manifest.train, manifest.validation) for s in split.shards)

    # the train stream is each training document's UTF-8 bytes followed by end-of-text, in input order
    expected = np.concatenate([np.append(np.frombuffer(t.encode(), np.uint8).astype(np.int64), 256) for t in train_texts])
    assert manifest.train.tokens == len(expected)
    seq_len = 127
    ds = TokenDataset(out, seq_len)
    assert len(ds) == len(expected) // (seq_len + 1) and ds.vocab_size == 257 and ds.eot_id == 256
    crossing = 40000 // (seq_len + 1)  # the window holding the first shard boundary
    for i in (0, crossing, len(ds) - 1):
        x, y = ds[i]
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (seq_len,)
        window = expected[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]
        assert x.tolist() == window[:-1].tolist() and y.tolist() == window[1:].tolist()
    val = TokenDataset(out, seq_len, split="validation")
    assert val[0][0].tolist() == np.frombuffer(val_texts[0].encode(), np.uint8)[:seq_len].tolist()


def test_trained_tokenizer_is_stored_and_decodes_every_document_back(tmp_path, capsys):
    out = tmp_path / "bpe"
    rc, _, errors = prepare(capsys, *stdlib_globs(*SMALL), "--out", out, "--train-tokenizer", "--vocab-size", "600",
                            "--val-fraction", "0.25")
    assert rc == 0 and not errors
    manifest = read_manifest(out)
    tok = manifest.tokenizer
    assert (tok.kind, tok.source, tok.file, tok.eot_token, tok.eot_id) == ("huggingface", "trained", "tokenizer.json",
                                                                          "<|endoftext|>", 0)
    assert 300 < tok.vocab_size <= 600 and manifest.dtype == "uint16"
    assert hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest() == tok.sha256
    tokenizer = load_dataset_tokenizer(out, tok)
    train_texts, val_texts = split_texts(stdlib_texts(*SMALL), 0, 0.25)
    assert val_texts, "the split must hold documents on both sides"
    for split, texts in (("train", train_texts), ("validation", val_texts)):
        decoded = [tokenizer.decode(d) for d in documents(stream(out, split, manifest), tok.eot_id)]
        assert decoded == texts
    # BPE compresses: fewer ids than bytes
    assert manifest.train.tokens < sum(len(t.encode()) for t in train_texts) / 2
    # a sample the loader yields decodes to a stretch of its source
    x, _ = TokenDataset(out, 64)[1]
    assert tokenizer.decode(x.tolist()) in "<|endoftext|>".join(train_texts)


def test_a_tokenizer_file_with_an_end_of_text_token_is_stored_unchanged(tmp_path, capsys):
    texts = stdlib_texts("json")
    given = tmp_path / "given.json"
    bpe = train_bpe(texts, 400).tokenizer
    bpe.add_special_tokens(["</s>"])
    given.write_text(bpe.to_str(pretty=False))  # not the layout prepare would write: the copy must be byte-exact
    out = tmp_path / "ds"
    rc, _, errors = prepare(capsys, *stdlib_globs("json"), "--out", out, "--tokenizer", given, "--val-fraction", "0")
    assert rc == 0 and not errors
    tok = read_manifest(out).tokenizer
    assert tok.eot_token == "<|endoftext|>" and tok.source == str(given)  # the first known end-of-text token it has
    assert (out / "tokenizer.json").read_bytes() == given.read_bytes()


def word_tokenizer(words: int) -> Tokenizer:
    vocab = {f"w{i}": i for i in range(words)}
    vocab["[UNK]"] = words
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.mark.parametrize("words,dtype", [(1000, "uint16"), (70000, "uint32")])
def test_dtype_follows_the_vocabulary(tmp_path, capsys, words, dtype):
    tokenizer = tmp_path / "words.json"
    word_tokenizer(words).save(str(tokenizer))
    corpus = tmp_path / "corpus.txt"
    ids = [0, 5, words - 1, 65535 % words, 999, 7]
    corpus.write_text(" ".join(f"w{i}" for i in ids) + " unknown")
    out = tmp_path / "ds"
    rc, _, errors = prepare(capsys, corpus, "--out", out, "--tokenizer", tokenizer, "--val-fraction", "0",
                            "--add-eot-token")
    assert rc == 0 and not errors
    manifest = read_manifest(out)
    eot = words + 1  # <|endoftext|> added after the vocabulary and [UNK]
    assert (manifest.dtype, manifest.tokenizer.vocab_size, manifest.tokenizer.eot_id) == (dtype, words + 2, eot)
    assert manifest.tokenizer.eot_token == "<|endoftext|>"
    expected = [*ids, words, eot]
    assert (out / "train-00000.bin").stat().st_size == len(expected) * manifest.itemsize
    x, y = TokenDataset(out, len(expected) - 1)[0]
    assert x.tolist() + y.tolist()[-1:] == expected
    # the stored tokenizer holds the added token, and the manifest's sha256 names that file
    stored = load_dataset_tokenizer(out, manifest.tokenizer)
    assert stored.tokenizer.token_to_id("<|endoftext|>") == eot


def test_the_split_is_by_document_content_and_seed(tmp_path, capsys):
    globs = stdlib_globs("json", "email")

    def run(name, *args):
        out = tmp_path / name
        rc, _, errors = prepare(capsys, *args, "--out", out, "--val-fraction", "0.3")
        assert rc == 0 and not errors
        return out

    first, again = run("a", *globs, "--seed", "7"), run("b", *globs, "--seed", "7")
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    assert all((first / f).read_bytes() == (again / f).read_bytes() for f in files)

    texts = stdlib_texts("json", "email")
    train, val = split_texts(texts, 7, 0.3)
    assert 0 < len(val) < len(texts)
    eot = 256
    assert [bytes(d.astype(np.uint8)).decode() for d in documents(stream(first, "validation"), eot)] == val

    other = read_manifest(run("c", *globs, "--seed", "8"))
    assert other.validation.documents != len(val) or stream(tmp_path / "c", "validation").tolist() != stream(
        first, "validation").tolist()
    # the inputs in another order: every document keeps its split
    swapped = run("d", *reversed(globs), "--seed", "7")
    held_out = {bytes(d.astype(np.uint8)).decode() for d in documents(stream(swapped, "validation"), eot)}
    assert held_out == set(val)


def test_two_workers_write_exactly_what_one_does(tmp_path, capsys, monkeypatch):
    tokenizer = tmp_path / "bpe.json"
    train_bpe(stdlib_texts("json"), 500).tokenizer.save(str(tokenizer))
    monkeypatch.setattr(prepare_module, "BATCH_CHARS", 4000)  # many small tasks, so worker order matters
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        rc, _, errors = prepare(capsys, *stdlib_globs(*SMALL, "http"), "--out", out, "--tokenizer", tokenizer,
                                "--workers", workers, "--val-fraction", "0.2", "--shard-tokens", "20000")
        assert rc == 0 and not errors
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert len([n for n in names if n.startswith("train-")]) > 2
    assert names == sorted(p.name for p in outs[1].iterdir())
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    assert json.loads((outs[0] / "manifest.json").read_text())["validation"]["documents"] > 0


def test_json_lines_and_parquet_documents(tmp_path, capsys):
    texts = ["first record", "second, with ünïcödé", "third"]
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts[:2])) + "\n")
    parquet = tmp_path / "b.parquet"
    pq.write_table(pyarrow.table({"body": texts[2:], "n": [1]}), parquet)
    out = tmp_path / "ds"
    rc, _, errors = prepare(capsys, jsonl, parquet, "--out", out, "--text-field", "body", "--val-fraction", "0")
    assert rc == 0 and not errors
    got = [bytes(d.astype(np.uint8)).decode() for d in documents(stream(out, "train"), 256)]
    assert got == texts


def test_an_eot_token_the_tokenizer_lacks_is_added_as_named_only_when_asked(tmp_path, capsys):
    tokenizer = tmp_path / "words.json"
    word_tokenizer(10).save(str(tokenizer))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w1 w2 w3")
    out = tmp_path / "ds"
    rc, _, errors = prepare(capsys, corpus, "--out", out, "--tokenizer", tokenizer, "--val-fraction", "0",
                            "--eot-token", "<eos>", "--add-eot-token")
    assert rc == 0 and not errors
    tok = read_manifest(out).tokenizer
    assert (tok.eot_token, tok.eot_id, tok.vocab_size) == ("<eos>", 11, 12)  # the token named, after [UNK]
    assert load_dataset_tokenizer(out, tok).tokenizer.token_to_id("<eos>") == 11


COMPRESSORS = {"gz": gzip.compress, "bz2": bz2.compress, "zst": zstandard.ZstdCompressor().compress}


def test_gzip_bzip2_and_zstandard_inputs_are_read_as_what_they_hold(tmp_path, capsys):
    texts = [f"record {i}: " + "ünïcödé words " * (i + 1) for i in range(60)]
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (tmp_path / "plain.jsonl").write_bytes(lines)
    (tmp_path / "plain.txt").write_bytes(texts[0].encode())
    inputs = []
    for suffix, compress in COMPRESSORS.items():
        inputs += [tmp_path / f"c.jsonl.{suffix}", tmp_path / f"t.txt.{suffix}"]
        inputs[-2].write_bytes(compress(lines))
        inputs[-1].write_bytes(compress(texts[0].encode()))
    # the magic number decides, not the name: a gzip file named as plain JSON Lines; a zstd file of two frames
    (tmp_path / "renamed.jsonl").write_bytes(gzip.compress(lines))
    zstd = zstandard.ZstdCompressor()
    (tmp_path / "frames.jsonl.zst").write_bytes(zstd.compress(lines[: len(lines) // 2]) + zstd.compress(lines[len(lines) // 2:]))
    inputs += [tmp_path / "renamed.jsonl", tmp_path / "frames.jsonl.zst"]

    got = {}
    for name, files in (("plain", [tmp_path / "plain.jsonl", tmp_path / "plain.txt"]), ("compressed", inputs)):
        err = io.StringIO()
        manifest = prepare_module.prepare(prepare_module.PrepareOptions(inputs=[str(f) for f in files],
                                                                        out=str(tmp_path / name), val_fraction=0), err)
        got[name] = [bytes(d.astype(np.uint8)).decode() for d in documents(stream(tmp_path / name, "train", manifest), 256)]
        # progress counts the files' own bytes: compressed ones end at their compressed size, not past it
        total = sum(f.stat().st_size for f in files)
        assert err.getvalue().splitlines()[-1] == f"tokenizing: {total / 1e6:.1f} of {total / 1e6:.1f} MB (100%)"
    assert got["plain"] == texts + texts[:1]
    assert got["compressed"] == (texts + texts[:1]) * 3 + texts + texts


def test_braintrain_prepare_is_the_same_command(tmp_path, capsys):
    from brain_operator.cli import main as braintrain

    out = tmp_path / "ds"
    assert braintrain(["prepare", *stdlib_globs("json"), "--out", str(out), "--val-fraction", "0"]) == 0
    assert read_manifest(out).train.documents == len(stdlib_texts("json"))
    assert braintrain(["prepare", *stdlib_globs("json"), "--out", str(out), "--val-fraction", "0"]) == 1
    assert "already exists; --force replaces" in capsys.readouterr().err
    assert braintrain(["prepare", *stdlib_globs("json"), "--out", str(out), "--val-fraction", "0", "--force"]) == 0


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_tenths_elsewhere():
    plain = io.StringIO()
    with PassProgress("tokenizing", 1000, plain) as progress:
        for _ in range(40):
            progress.advance(25)
    lines = plain.getvalue().splitlines()
    assert [line.rsplit("(", 1)[1] for line in lines] == [f"{p}%)" for p in range(10, 101, 10)]
    terminal = Terminal()
    with PassProgress("tokenizing", 10**6, terminal) as progress:
        progress.advance(5 * 10**5)
    assert "tokenizing" in terminal.getvalue() and "\x1b[" in terminal.getvalue()  # drawn with escape codes
