"""BrainAI for `transformers`: `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`.

The model holds BrainAI's modules under BrainAI's own names, so the export's
tensors (what `model.initFrom` reads) load unchanged, and runs BrainAI's own
forward. `generate` decodes with the model's own state (model/decoding.py: the
recurrence's h_t, attention's keys and values, the encoder's last tokens)
instead of transformers' default KV cache, which it declines
(`_supports_default_dynamic_cache`). Padding may only follow the tokens (right
padding): the recurrence and the n-grams would read left padding as text.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from brain_trainer.model.brain_ai import BrainAI, reset_block
from brain_trainer.model.decoding import DecodingState, extend

from .configuration_brain_ai import BrainAIHFConfig

IGNORE_INDEX = -100  # transformers' label for a position without a loss


class BrainAICache(DecodingState):
    """BrainAI's decoding state as transformers' generate keeps it between steps."""

    is_compileable = False  # its tensors grow with the sequence
    is_croppable = False


def check_padding(attention_mask: Optional[torch.Tensor]) -> None:
    if attention_mask is not None and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
        raise ValueError("BrainAI reads left padding as text: pad on the right (tokenizer.padding_side = 'right')")


class BrainAIForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = BrainAIHFConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _no_split_modules = ["Encoders", "SpikingBlock", "RecurrentBlock", "SlotAttentionBlock", "TransformerBlock",
                         "DecisionBlock", "Meta", "Heads"]

    def __init__(self, config: BrainAIHFConfig):
        super().__init__(config)
        core = BrainAI(config.brain_ai_config())
        self.cfg = core.cfg
        self.out_std = core.out_std
        for name, module in core.named_children():  # BrainAI's modules, under its names
            self.add_module(name, module)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # BrainAICache instead

    def _init_weights(self, module: torch.nn.Module) -> None:
        if module is self:  # BrainAI initialises all its modules at once, as in training
            for child in self.children():
                reset_block(child, self.out_std)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.encoders.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.heads.lm_head

    def forward(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None,
                labels: Optional[torch.LongTensor] = None, cache: Optional[BrainAICache] = None,
                use_cache: Optional[bool] = None, return_dict: Optional[bool] = None,
                **kwargs: Any) -> CausalLMOutputWithPast:
        check_padding(attention_mask)
        if cache is None and use_cache:
            cache = BrainAICache()
        logits = BrainAI.forward(self, input_ids) if cache is None else extend(self, input_ids, cache)
        loss = None
        if labels is not None:  # labels are the inputs: position t predicts label t + 1
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                   ignore_index=IGNORE_INDEX)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
