"""`braintrain generate CHECKPOINT_OR_EXPORT --prompt TEXT`: continue text, streamed to the terminal.

Greedy (`--greedy`, `--temperature 0`) or sampled (`--temperature`, `--top-k`,
`--top-p`, `--seed`) decoding, stopped at the end-of-text token, after
`--max-new-tokens` or where the model's max_seq_len ends. Each new token runs
one position through the model: model/decoding.py keeps the recurrence's
state, attention's keys and values and the encoder's last tokens. An empty
prompt starts a new document (after the end-of-text token).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

import torch
from tokenizers import Tokenizer
from torch import nn

from ..model.decoding import DecodingState, extend
from .generate_args import add_arguments
from .loading import LoadError, find_tokenizer, load_model, origin
from .tokenizer_files import ExportTokenizer

REPLACEMENT = "\ufffd"  # what a decoder writes for a character whose bytes have not all arrived


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0: greedy
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    max_new_tokens: int = 128
    seed: int = 0


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """The next token of each row of logits (B, V): the likeliest, or drawn as `sampling` says."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        beyond = probs.cumsum(dim=-1) - probs >= sampling.top_p  # the likeliest token is always kept
        scores = scores.scatter(-1, order, ordered.masked_fill(beyond, float("-inf")))
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator)[:, 0]


@torch.no_grad()
def generate_ids(model: nn.Module, prompt: list[int], sampling: Sampling, eot_id: Optional[int],
                 on_token: Callable[[int], None] = lambda _: None) -> list[int]:
    """The tokens that follow `prompt` (end-of-text not included), each passed to `on_token` as it comes."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    state = DecodingState()
    budget = min(sampling.max_new_tokens, model.cfg.max_seq_len - len(prompt))
    written: list[int] = []
    logits = extend(model, torch.tensor([prompt], device=device), state)[:, -1]
    while len(written) < budget:
        token = next_tokens(logits, sampling, generator)
        if int(token) == eot_id:
            break
        written.append(int(token))
        on_token(written[-1])
        if len(written) < budget:
            logits = extend(model, token.view(1, 1), state)[:, -1]
    return written


class Stream:
    """Writes decoded text as tokens arrive, holding back a character whose bytes are still coming."""

    def __init__(self, tokenizer: Tokenizer, out: TextIO):
        self.tokenizer, self.out = tokenizer, out
        self.ids: list[int] = []
        self.shown = 0

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if not text.endswith(REPLACEMENT):
            self._show(text)

    def _show(self, text: str) -> None:
        self.out.write(text[self.shown :])
        self.out.flush()
        self.shown = len(text)

    def close(self) -> None:
        self._show(self.tokenizer.decode(self.ids, skip_special_tokens=False))
        self.out.write("\n")


def prompt_ids(text: str, tokenizer: Tokenizer, export_tokenizer: ExportTokenizer) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if ids:
        return ids
    if export_tokenizer.eot_id is None:
        raise LoadError("an empty prompt needs an end-of-text token to start from, and this tokenizer has none")
    return [export_tokenizer.eot_id]


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    try:
        return [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise LoadError(f"{args.prompts}: cannot read the prompts: {getattr(exc, 'strerror', None) or exc}") from None


def run(args: argparse.Namespace, out: Optional[TextIO] = None) -> int:
    """Stream each prompt's continuation to `out` (None: sys.stdout as it is when called, not at import)."""
    out = out if out is not None else sys.stdout
    sampling = Sampling(0.0 if args.greedy else args.temperature, args.top_k, args.top_p, args.max_new_tokens,
                        args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        found = origin(args.model)
        export_tokenizer = find_tokenizer(found, args.tokenizer)
        prompts = _prompts(args)
        model = load_model(found, device)
        tokenizer = Tokenizer.from_str(export_tokenizer.json_text)
        for text in prompts:
            ids = prompt_ids(text, tokenizer, export_tokenizer)
            out.write(text)
            stream = Stream(tokenizer, out)
            generate_ids(model, ids, sampling, export_tokenizer.eot_id, stream)
            stream.close()
    except (LoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_trainer.inference.generate",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
