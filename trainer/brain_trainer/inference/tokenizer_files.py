"""The export's tokenizer: tokenizer.json and tokenizer_config.json that a stock `PreTrainedTokenizerFast` loads.

A token dataset's own tokenizer.json is copied unchanged; a byte-level model
gets a byte tokenizer built here: byte b is id b (byte-level BPE without
merges, its 256-character alphabet in byte order), and id 256 the
end-of-text token when the vocabulary has it (a `bytes` dataset's 257 ids).
Either decodes back to the text it encoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from ..data.tokens.format import TOKENIZER_FILE, read_manifest
from ..data.tokens.tokenizer import EOT_TOKEN, load_dataset_tokenizer

CONFIG_FILE = "tokenizer_config.json"
BYTES = 256


@dataclass(frozen=True)
class ExportTokenizer:
    """tokenizer.json's text and its end-of-text token (None: a byte vocabulary without one)."""

    json_text: str
    eot_token: Optional[str]
    eot_id: Optional[int]
    source: str


def byte_tokenizer(vocab_size: int) -> ExportTokenizer:
    """Bytes as ids 0-255, plus end-of-text as 256 when the vocabulary holds 257 ids."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    tokenizer = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    with_eot = vocab_size > BYTES
    if with_eot:
        tokenizer.add_special_tokens([EOT_TOKEN])
    return ExportTokenizer(tokenizer.to_str(pretty=True), EOT_TOKEN if with_eot else None,
                           BYTES if with_eot else None, "built-in bytes")


def _byte_of(char: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's printable mapping of the 256 bytes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(BYTES) if b not in printable]
    code = ord(char)
    return code if code in printable else shifted[code - BYTES]


def dataset_tokenizer(folder: Path) -> ExportTokenizer:
    """The tokenizer a prepared dataset was made with (checked against its manifest)."""
    info = read_manifest(folder).tokenizer
    if info.kind == "bytes":
        return byte_tokenizer(info.vocab_size)
    tok = load_dataset_tokenizer(folder, info)
    return ExportTokenizer(tok.json_text, tok.eot_token, tok.eot_id, str(folder / TOKENIZER_FILE))


def tokenizer_config(tokenizer: ExportTokenizer, max_seq_len: int) -> dict[str, Any]:
    """tokenizer_config.json: the stock fast tokenizer, end-of-text as its eos and pad token, no BOS added."""
    special = {"eos_token": tokenizer.eot_token, "pad_token": tokenizer.eot_token} if tokenizer.eot_token else {}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_seq_len, "padding_side": "right",
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False, **special}


def write(folder: Path, tokenizer: ExportTokenizer, max_seq_len: int) -> None:
    (folder / TOKENIZER_FILE).write_text(tokenizer.json_text, encoding="utf-8")
    (folder / CONFIG_FILE).write_text(json.dumps(tokenizer_config(tokenizer, max_seq_len), indent=2) + "\n")
