"""BrainAI's configuration for `transformers` (`AutoConfig.from_pretrained(..., trust_remote_code=True)`).

Its fields are BrainAIConfig's, at the top level of config.json, so that the
model is built with exactly the dimensions it was trained with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PretrainedConfig

from brain_trainer.config.presets import BrainAIConfig
from brain_trainer.hf.names import MODEL_TYPE


class BrainAIHFConfig(PretrainedConfig):
    model_type = MODEL_TYPE
    # the names other libraries look for (lm-evaluation-harness reads the longest sequence from the first)
    attribute_map = {"max_position_embeddings": "max_seq_len", "hidden_size": "d_model",
                     "num_attention_heads": "n_heads"}

    def __init__(self, **kwargs: Any):
        defaults = BrainAIConfig()
        for f in dataclasses.fields(BrainAIConfig):
            setattr(self, f.name, kwargs.pop(f.name, getattr(defaults, f.name)))
        kwargs.setdefault("tie_word_embeddings", False)  # the head is not tied to the embedding
        super().__init__(**kwargs)

    def brain_ai_config(self) -> BrainAIConfig:
        return BrainAIConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(BrainAIConfig)})
