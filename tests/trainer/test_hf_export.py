"""Issue 38: after training, a model transformers loads, `braintrain generate` samples and `braintrain eval` scores.

One demo-sized job (2 gloo ranks, DDP, a BPE dataset of the stdlib's json package) is trained here, exported,
and loaded with transformers offline: its logits equal the trainer's model's, its greedy generate equals
`braintrain generate`, its tokenizer round-trips the training text; a bf16 export loads in bf16 and on the meta
device; `model.initFrom` of the export trains on with the checkpoint's loss; `braintrain eval` gives the trainer's
own evaluation at two layouts.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Read once, when transformers is imported: no network, and (unless the caller chose one) its module cache in a
# folder of the tests', removed when they end.
os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
if "HF_HOME" not in os.environ:
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="brain-train-hf-")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], True)

import pytest  # noqa: E402
import torch  # noqa: E402
from harness import run_ranks  # noqa: E402
from processes import run  # noqa: E402
from tokens_corpus import STDLIB, stdlib_globs  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from brain_trainer.checkpoint import store  # noqa: E402
from brain_trainer.checkpoint.manager import load_model  # noqa: E402
from brain_trainer.config import ModelConfig, TrainerConfig  # noqa: E402
from brain_trainer.data.tokens.format import read_manifest  # noqa: E402
from brain_trainer.data.tokens.prepare import main as prepare  # noqa: E402
from brain_trainer.data.tokens.dataset import TokenDataset  # noqa: E402
from brain_trainer.data.tokens.tokenizer import load_dataset_tokenizer  # noqa: E402
from brain_trainer.hf.export import main as export  # noqa: E402
from brain_trainer.inference import tokenizer_files  # noqa: E402
from brain_trainer.inference.evaluate import EvalLayout, evaluate_checkpoint  # noqa: E402
from brain_trainer.inference.generate import Sampling, generate_ids  # noqa: E402
from brain_trainer.loop.loss import loss_fn  # noqa: E402
from brain_trainer.loop.train import train  # noqa: E402
from brain_trainer.model.brain_ai import BrainAI, build_model  # noqa: E402
from brain_trainer.model.decoding import DecodingState, extend  # noqa: E402

STEPS, SEQ_LEN, MICRO_BATCH, RANKS = 4, 32, 4, 2
PROMPTS = ("import json", "def loads(s")
CLI_TIMEOUT = 300


def job(data: Path, checkpoints: Path | None, steps: int = STEPS, init_from: str | None = None) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": {"preset": "minimal", **({"init_from": init_from} if init_from else {})},
        "training": {"steps": steps, "micro_batch_size": MICRO_BATCH, "seq_len": SEQ_LEN, "learning_rate": 3e-3,
                     "warmup_steps": 0, "log_interval": 1, "eval_interval": STEPS, "eval_steps": 1000},
        "distributed": {"strategy": "ddp" if checkpoints else "single"},
        "data": {"source": "tokens", "path": str(data)},
        "checkpoint": {"dir": str(checkpoints), "interval_steps": 0} if checkpoints else {"enabled": False},
        "metrics": {"port": 0},
    })


def _train(rank: int, world_size: int, data: str, checkpoints: str) -> list:
    torch.set_num_threads(1)
    return train(job(Path(data), Path(checkpoints))).eval_history


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The json package's sources, a 300-id BPE trained on them; one document (2,235 tokens) held out."""
    out = tmp_path_factory.mktemp("hf") / "data"
    assert prepare([*stdlib_globs("json"), "--out", str(out), "--train-tokenizer", "--vocab-size", "300",
                    "--val-fraction", "0.2", "--seed", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> tuple[Path, float]:
    """(the committed checkpoint of a 2-rank DDP job, the trainer's own evaluation of it on every window)."""
    checkpoints = tmp_path_factory.mktemp("hf") / "checkpoints"
    [(step, eval_loss)] = run_ranks(_train, RANKS, str(data), str(checkpoints))[0]
    assert step == STEPS
    return checkpoints / store.step_dir_name(STEPS), eval_loss


@pytest.fixture(scope="module")
def exported(trained, data, tmp_path_factory) -> Path:
    """`braintrain export` of it, measuring the held-out loss for config.json."""
    out = tmp_path_factory.mktemp("hf") / "export"
    done = run([sys.executable, "-m", "brain_trainer.export", str(trained[0].parent), str(out),
                "--eval-data", str(data)], timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr
    return out


def trainers_model(checkpoint: Path) -> torch.nn.Module:
    """The model as the trainer builds it, with the checkpoint's weights (not through the export's loaders)."""
    manifest = store.read_manifest(checkpoint)
    model = build_model(ModelConfig(**manifest["model"]))
    load_model(checkpoint, model)
    return model.eval()


def validation_window(data: Path) -> torch.Tensor:
    return TokenDataset(data, SEQ_LEN, "validation")[0][0].unsqueeze(0)


def test_logits_of_transformers_equal_the_trainers(trained, exported, data):
    model = AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
    assert type(model).__name__ == "BrainAIForCausalLM" and model.dtype == torch.float32
    tokens = validation_window(data)
    with torch.no_grad():
        theirs = model(tokens, labels=tokens)
        ours = trainers_model(trained[0])(tokens)
    torch.testing.assert_close(theirs.logits, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(theirs.loss, loss_fn(ours[:, :-1], tokens[:, 1:]), rtol=1e-6, atol=0)
    right_padded = torch.ones_like(tokens)
    right_padded[:, -3:] = 0
    with torch.no_grad():
        model(tokens, attention_mask=right_padded)
        with pytest.raises(ValueError, match="pad on the right"):
            model(tokens, attention_mask=right_padded.flip(1))


def test_the_export_says_what_it_is_and_where_it_came_from(trained, exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "brain_ai" and config["architectures"] == ["BrainAIForCausalLM"]
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
    assert config["vocab_size"] == 300 and config["d_model"] == 64 and config["eos_token_id"] == 0
    source = config["source"]
    assert source["step"] == STEPS and source["job"]
    assert source["tokens_seen"] == STEPS * RANKS * MICRO_BATCH * SEQ_LEN
    assert source["eval_loss"] == pytest.approx(trained[1], rel=1e-6)
    modeling = (exported / "modeling_brain_ai.py").read_text()
    assert "brain_trainer" not in modeling.split('"""', 2)[2]  # made self-contained
    card = (exported / "README.md").read_text()
    assert "trust_remote_code=True" in card and f"tokens seen: {source['tokens_seen']:,}" in card
    assert json.loads((exported / "generation_config.json").read_text())["eos_token_id"] == 0


def test_greedy_generate_of_transformers_equals_braintrain_generate(trained, exported, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=False)
    ours = trainers_model(trained[0])
    expected = ""
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        theirs = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
        written = generate_ids(ours, ids[0].tolist(), Sampling(temperature=0, max_new_tokens=24), eot_id=0)
        assert theirs[: len(written)] == written and theirs[len(written) :] in ([], [0])  # 0: end-of-text
        expected += prompt + tokenizer.decode(written) + "\n"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{p}\n" for p in PROMPTS))
    done = run([sys.executable, "-m", "brain_operator.cli", "generate", str(trained[0]), "--greedy",
                "--prompts", str(prompts), "--max-new-tokens", "24"], timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected  # the checkpoint's tokenizer: its dataset, as recorded


def test_decoding_with_the_models_state_equals_the_whole_forward():
    torch.manual_seed(0)
    model = BrainAI.from_preset("minimal", vocab_size=300, htm_blocks=2).eval()
    tokens = torch.randint(0, 300, (2, 41))
    with torch.no_grad():
        whole = model(tokens)
        state = DecodingState()
        pieces = [extend(model, tokens[:, :17], state), *(extend(model, tokens[:, t : t + 1], state)
                                                          for t in range(17, 23)), extend(model, tokens[:, 23:], state)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=2e-5)
    assert state.seen == 41
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        extend(model, torch.zeros(1, model.cfg.max_seq_len + 1, dtype=torch.long))


def test_sampled_generate_is_reproducible_and_stops_at_end_of_text(trained):
    model = trainers_model(trained[0])
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.95, max_new_tokens=30, seed=7)
    first = generate_ids(model, [5, 6, 7], sampling, eot_id=0)
    assert first == generate_ids(model, [5, 6, 7], sampling, eot_id=0) and 0 not in first
    assert len(first) <= 30


def test_tokenizer_round_trips_the_training_text(exported, data):
    tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=False)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>" and tokenizer.padding_side == "right"
    trained_with = load_dataset_tokenizer(data, read_manifest(data).tokenizer)
    for path in sorted((STDLIB / "json").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert ids == trained_with.encode([text], "int64")[0].tolist()
        assert tokenizer.decode(ids) == text


def test_byte_tokenizer_loads_as_a_stock_fast_tokenizer(tmp_path):
    tokenizer_files.write(tmp_path, tokenizer_files.byte_tokenizer(257), max_seq_len=512)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    text = "naïve café — ok\n\t€"
    ids = tokenizer(text).input_ids
    assert ids == list(text.encode("utf-8")) and tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == 256
    tokenizer_files.write(tmp_path, tokenizer_files.byte_tokenizer(256), max_seq_len=512)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path).eos_token is None


def test_bf16_sharded_export_loads_in_bf16_and_on_the_meta_device(trained, data, tmp_path):
    out = tmp_path / "bf16"
    assert export([str(trained[0]), str(out), "--dtype", "bf16", "--max-shard-size", "300KB"]) == 0
    assert (out / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert model(validation_window(data)).logits.isfinite().all()
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    assert all(p.is_meta for p in empty.parameters())
    assert sum(p.numel() for p in empty.parameters()) == json.loads((out / "config.json").read_text())["parameters"]


def _first_losses(rank: int, world_size: int, data: str, sources: list[str]) -> list[float]:
    torch.set_num_threads(1)
    return [train(job(Path(data), None, steps=1, init_from=source)).history[0][1] for source in sources]


def test_init_from_the_export_trains_on_as_from_the_checkpoint(trained, exported, data):
    from_export, from_checkpoint = run_ranks(_first_losses, 1, str(data), [str(exported), str(trained[0])])[0]
    assert from_export == from_checkpoint


def _evaluate(rank: int, world_size: int, checkpoint: str, data: str, layout: EvalLayout):
    return evaluate_checkpoint(checkpoint, data, layout=layout)


def test_braintrain_eval_is_the_trainers_evaluation_at_any_layout(trained, data):
    done = run([sys.executable, "-m", "brain_operator.cli", "eval", str(trained[0]), "--data", str(data),
                "--micro-batch-size", "16"], timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr
    loss = float(done.stdout.split("eval loss ")[1].split()[0])
    assert loss == pytest.approx(trained[1], rel=1e-6)
    piped = run_ranks(_evaluate, 2, str(trained[0]), str(data), EvalLayout("fsdp", pipeline_parallel=2))
    assert piped[0].loss == pytest.approx(trained[1], rel=1e-6) and piped[0].tokens == piped[1].tokens


HARNESS_TASK = """task: brain_train_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def test_lm_evaluation_harness_scores_the_export_offline(exported, tmp_path):
    """The documented command on a task written here: each document's log-likelihood is the model's own."""
    texts = [(STDLIB / "json" / "tool.py").read_text(encoding="utf-8")[:600], "import json\nprint(json.dumps([1]))\n"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "task.yaml").write_text(HARNESS_TASK.format(docs=docs))
    done = run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                f"pretrained={exported},trust_remote_code=True", "--tasks", "brain_train_local", "--include_path",
                str(tmp_path), "--device", "cpu", "--batch_size", "1", "--output_path", str(tmp_path / "out"),
                "--log_samples"], timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    [samples] = (tmp_path / "out").rglob("samples_brain_train_local_*.jsonl")
    scored = {json.loads(line)["doc"]["text"]: float(json.loads(line)["resps"][0][0])
              for line in samples.read_text().splitlines()}
    model = AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=False)
    for text in texts:  # rolling: every token, the first after end-of-text
        tokens = torch.tensor([[tokenizer.eos_token_id, *tokenizer(text).input_ids]])
        with torch.no_grad():
            ours = -loss_fn(model(tokens).logits[:, :-1], tokens[:, 1:]).item() * (tokens.shape[1] - 1)
        assert scored[text] == pytest.approx(ours, rel=1e-5)
