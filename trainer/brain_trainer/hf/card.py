"""The model card (README.md beside the weights): what the model is, how it was trained, how to load it."""

from __future__ import annotations

from typing import Any

from ..inference.tokenizer_files import ExportTokenizer


def _figure(value: Any, spec: str = ",") -> str:
    return "unknown" if value is None else format(value, spec)


def _training_lines(source: dict[str, Any]) -> list[str]:
    settings = source.get("settings") or {}
    eval_loss = source.get("eval_loss")
    measured = "not measured (braintrain export --eval-data DIR)" if eval_loss is None else f"{eval_loss:.4f}"
    wanted = ("training.steps", "training.seq_len", "training.micro_batch_size", "training.learning_rate",
              "training.precision", "distributed.strategy", "data.source", "data.path")
    return [
        f"- job: {source.get('job') or 'unknown'}; checkpoint `{source.get('checkpoint')}` "
        f"(step {_figure(source.get('step'))}, {source.get('world_size')} rank(s))",
        f"- tokens seen: {_figure(source.get('tokens_seen'))}",
        f"- held-out loss: {measured}",
        *(f"- `{name}`: {settings[name]}" for name in wanted if name in settings),
    ]


def model_card(config: dict[str, Any], tokenizer: ExportTokenizer) -> str:
    dims = config["dimensions"]
    name = config.get("preset") or "BrainAI"
    eot = f"`{tokenizer.eot_token}` (id {tokenizer.eot_id})" if tokenizer.eot_token else "none (bytes only)"
    return "\n".join([
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [brain-train, brain_ai, custom_code]",
        "---",
        "",
        f"# BrainAI ({name} preset)",
        "",
        f"A causal language model of the BrainAI architecture trained with brain-train: {config['parameters']:,} "
        f"parameters stored as {config['torch_dtype']}, d_model {dims['d_model']}, vocabulary {dims['vocab_size']}, "
        f"at most {dims['max_seq_len']} tokens. Encoders with hashed n-grams, spiking, recurrent, slot-attention, "
        "causal self-attention and gated-MLP blocks; the code is in `modeling_brain_ai.py`.",
        "",
        f"Tokenizer: `{tokenizer.source}`; end of text: {eot}.",
        "",
        "## Training",
        "",
        *_training_lines(config.get("source") or {}),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
        'tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=False)  # the stock fast tokenizer',
        'ids = tokenizer("def main(", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=40)[0]))",
        "```",
        "",
        "`braintrain generate PATH --prompt TEXT` samples from it, and lm-evaluation-harness evaluates it:",
        "`lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True --tasks TASK`.",
        "",
        "Limits: pad on the right only (the recurrence and the n-grams read left padding as text); greedy and "
        "sampled decoding, no beam search (the decoding state is not reordered).",
        "",
    ])
