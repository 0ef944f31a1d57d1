"""`braintrain export CHECKPOINT OUT`: the model as Hugging Face `transformers` loads it (trust_remote_code=True).

Beside the safetensors and their index (model/export.py), OUT holds:

    config.json                  model_type, auto_map and architectures, BrainAI's dimensions, the end-of-text id,
                                 and where it came from (`source`: job, step, tokens seen, eval loss)
    configuration_brain_ai.py    made from brain_trainer's own code (hf/remote/, its brain_trainer imports copied in:
    modeling_brain_ai.py         hf/inline.py), so the export runs exactly the model that was trained
    tokenizer.json               the dataset's tokenizer (or a byte tokenizer) and the stock fast tokenizer's
    tokenizer_config.json        settings: end-of-text is eos and pad
    generation_config.json       greedy unless asked; end-of-text stops generation
    README.md                    the model card

A user model (model.entrypoint) gets the safetensors and config.json only: there is no code to export for it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ..checkpoint import lease
from ..checkpoint.compat import SETTINGS
from ..data.errors import DataError
from ..inference.evaluate import evaluate_checkpoint
from ..inference.loading import LoadError, Origin, find_tokenizer
from ..inference.tokenizer_files import ExportTokenizer
from ..inference.tokenizer_files import write as write_tokenizer
from ..model import export as weights
from ..model.export_args import add_arguments
from ..schema import ConfigError
from ..version import __version__
from .card import model_card
from .inline import inline
from .names import CONFIG_CLASS, CONFIGURATION, MODEL_CLASS, MODEL_TYPE, MODELING

REMOTE = "brain_trainer.hf.remote"
# Builds from the trainer's presets; the export's config.json gives the dimensions instead.
OMIT = frozenset({"BrainAI.from_preset"})
GENERATION_CONFIG = "generation_config.json"


def remote_code() -> dict[str, str]:
    """The two files transformers imports, by name."""
    note = "Made by brain-train {} from {}: edit the source, not this file."
    return {f"{name}.py": inline(f"{REMOTE}.{name}", note.format(__version__, f"{REMOTE}.{name}"), OMIT)
            for name in (CONFIGURATION, MODELING)}


def provenance(checkpoint: Path, manifest: dict[str, Any], eval_loss: Optional[float]) -> dict[str, Any]:
    """Where the weights came from: the job (its checkpoint lease's holder), step, tokens seen, eval loss."""
    settings = manifest.get(SETTINGS) or {}
    holder = lease.read_newest(checkpoint.parent)
    seq_len, sequences = settings.get("training.seq_len"), manifest.get("sample_index")
    return {"job": holder.holder if holder else None, "checkpoint": str(checkpoint), "step": manifest.get("step"),
            "tokens_seen": sequences * seq_len if sequences is not None and seq_len else None,
            "eval_loss": eval_loss, "config_hash": manifest.get("config_hash"),
            "world_size": manifest.get("world_size"), "settings": settings}


def hf_config(described: dict[str, Any], tokenizer: ExportTokenizer, source: dict[str, Any]) -> dict[str, Any]:
    """config.json: brain-train's description of the model plus what transformers reads."""
    return {
        **described, **described["dimensions"], "source": source,
        "model_type": MODEL_TYPE, "architectures": [MODEL_CLASS],
        "auto_map": {"AutoConfig": f"{CONFIGURATION}.{CONFIG_CLASS}",
                     "AutoModelForCausalLM": f"{MODELING}.{MODEL_CLASS}"},
        "bos_token_id": None, "eos_token_id": tokenizer.eot_id, "pad_token_id": tokenizer.eot_id,
        "tie_word_embeddings": False, "use_cache": True,
    }


def generation_config(tokenizer: ExportTokenizer) -> dict[str, Any]:
    """Greedy unless asked, ended by end-of-text (the length is the caller's: max_new_tokens)."""
    return {"eos_token_id": tokenizer.eot_id, "pad_token_id": tokenizer.eot_id, "do_sample": False}


class Finisher:
    """model/export.py's `finish`: the transformers files, written into the export's work folder."""

    def __init__(self, tokenizer_dir: Optional[Path], eval_loss: Optional[float]):
        self.tokenizer_dir = tokenizer_dir
        self.eval_loss = eval_loss

    def __call__(self, work: Path, checkpoint: Path, manifest: dict[str, Any]) -> None:
        config_path = work / weights.CONFIG_FILE
        described = json.loads(config_path.read_text())
        if described.get("architecture") != "BrainAI":
            return  # a user model: no code of ours to export
        try:
            tokenizer = find_tokenizer(Origin(checkpoint, None, manifest), self.tokenizer_dir)
        except LoadError as exc:
            raise weights.ExportError(str(exc)) from None
        max_seq_len = described["dimensions"]["max_seq_len"]
        config = hf_config(described, tokenizer, provenance(checkpoint, manifest, self.eval_loss))
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        for name, text in remote_code().items():
            (work / name).write_text(text, encoding="utf-8")
        write_tokenizer(work, tokenizer, max_seq_len)
        (work / GENERATION_CONFIG).write_text(json.dumps(generation_config(tokenizer), indent=2) + "\n")
        (work / "README.md").write_text(model_card(config, tokenizer), encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    try:
        checkpoint = weights.resolve(args.checkpoint)
        eval_loss = evaluate_checkpoint(checkpoint, args.eval_data).loss if args.eval_data else None
        finisher = Finisher(args.tokenizer, eval_loss)
        folder, files = weights.export(args.checkpoint, args.out, args.dtype, args.max_shard_size, args.force,
                                       finish=finisher)
    except (weights.ExportError, LoadError, DataError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"exported the model of {folder} to {args.out} ({files} safetensors file(s))")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_trainer.export", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
