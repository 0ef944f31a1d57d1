"""The tokenizers a dataset can be made with: built-in bytes, a Hugging Face tokenizers file, or a BPE trained here.

Each gives `encode(texts, dtype)` (one id array per text, no special tokens),
`decode(ids)`, its vocabulary size, its end-of-text id, and the `TokenizerInfo`
the manifest records.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .format import TOKENIZER_FILE, TokenizerInfo

EOT_TOKEN = "<|endoftext|>"
# End-of-text tokens of common tokenizer families, looked for before adding EOT_TOKEN.
KNOWN_EOT_TOKENS = (EOT_TOKEN, "<|end_of_text|>", "</s>", "<eos>")


class TokenizerError(ValueError):
    """A tokenizer that cannot be used; the message names the file."""


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255 and 256 is end-of-text: no file, nothing to download."""

    kind = "bytes"
    vocab_size = 257
    eot_id = 256
    eot_token = EOT_TOKEN

    def encode(self, texts: Sequence[str], dtype: str) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(dtype) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def info(self) -> TokenizerInfo:
        return TokenizerInfo(kind=self.kind, vocab_size=self.vocab_size, eot_id=self.eot_id,
                             eot_token=self.eot_token, source="built-in")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer with an end-of-text token (added as a special token only when asked)."""

    kind = "huggingface"

    def __init__(self, tokenizer: Tokenizer, source: str, json_text: str, eot_token: Optional[str] = None,
                 add_eot_token: bool = False):
        self.tokenizer = tokenizer
        self.source = source
        candidates = (eot_token,) if eot_token else KNOWN_EOT_TOKENS
        found = next((t for t in candidates if tokenizer.token_to_id(t) is not None), None)
        if found is None:
            if not add_eot_token:
                # an added token is a new id the model has never been trained on: only by request
                lacks = f"no token {eot_token!r}" if eot_token else f"none of {', '.join(KNOWN_EOT_TOKENS)}"
                raise TokenizerError(f"{source}: has {lacks} to end a document; name the end-of-text token it has "
                                     f"with --eot-token, or pass --add-eot-token to add {candidates[0]!r} as a new id")
            found = candidates[0]
            tokenizer.add_special_tokens([found])
            json_text = tokenizer.to_str(pretty=True)
        self.eot_token = found
        self.eot_id = tokenizer.token_to_id(found)
        # The embedding needs a row for the largest id, which added tokens can push past the base vocabulary.
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        self.json_text = json_text  # what the dataset stores: the given file unchanged, unless a token was added

    def encode(self, texts: Sequence[str], dtype: str) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.array(e.ids, dtype=dtype) for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def info(self) -> TokenizerInfo:
        return TokenizerInfo(kind=self.kind, vocab_size=self.vocab_size, eot_id=self.eot_id, eot_token=self.eot_token,
                             source=self.source, file=TOKENIZER_FILE,
                             sha256=hashlib.sha256(self.json_text.encode("utf-8")).hexdigest())


def parse_tokenizer(path: Path, source: str, eot_token: Optional[str] = None, add_eot_token: bool = False) -> HFTokenizer:
    """The tokenizers file at `path`, or TokenizerError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read the tokenizer: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the library raises plain Exception for every parse problem
        raise TokenizerError(f"{path}: not a Hugging Face tokenizers file: {exc}") from None
    return HFTokenizer(tokenizer, source, text, eot_token, add_eot_token)


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE trained offline on `texts`, with EOT_TOKEN as its only special token (id 0).

    Byte-level pre-tokenization and decoding without a prefix space: every text
    decodes back to itself exactly.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tokenizer, "trained", tokenizer.to_str(pretty=True), EOT_TOKEN)


def load_dataset_tokenizer(folder: str | Path, info: TokenizerInfo) -> ByteTokenizer | HFTokenizer:
    """The tokenizer a dataset was made with (to decode its ids), checked against the manifest's sha256."""
    if info.kind == "bytes":
        return ByteTokenizer()
    path = Path(folder) / TOKENIZER_FILE
    tok = parse_tokenizer(path, info.source, info.eot_token)
    if tok.info().sha256 != info.sha256:
        raise TokenizerError(f"{path}: does not match the manifest's sha256 (changed after prepare)")
    return tok
