"""Does a checkpoint fit the model this run built, and which settings changed since it was written?

Pure and torch-free: the manager hands in plain dicts (the manifest, this run's
manifest fields, {tensor: shape} of both models) and gets back the lines to
raise or log.

The tensors decide. When every tensor of the model has the checkpoint's name
and shape, the checkpoint loads, and each setting that differs (training.steps,
training.learning_rate, even model.init_from) is named in one warning. When a
tensor differs, no load is tried: `CheckpointError` (a ConfigError: reason
config-error, exit 2, FailJob by default, no traceback) names the model
settings that differ and the first tensor, e.g.

    model.vocab_size: 512 here, 256 in step-00000030 (encoders.embed.weight [513, 64] here, [257, 64] there)

Settings are spelled as trainer.yaml spells them (snake_case): that is the file
the trainer reads, and how every other config-error line of the trainer names
a field (a job's camelCase name is the same words).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional, Sequence

from ..contract import ERROR
from ..resilience.failures import causes, classify
from ..schema import ConfigError, FieldError, in_view, key_for, to_dict

Shape = tuple[int, ...]
MODEL = "model"  # the manifest's model section, and its settings' prefix
SETTINGS = "settings"  # the manifest's other settings, flattened (`recorded`)
INIT_FROM = "model.init_from"  # where the first weights came from: a resume loads the checkpoint's instead


class CheckpointError(ConfigError):
    """A checkpoint this run cannot use: it was written for another model, or does not load into this one.

    A configuration error (the job, not the checkpoint, has to change): retrying
    would fail the same way, so the job fails at once, naming the setting.
    """


def recorded(cfg: Any) -> dict[str, Any]:
    """What a checkpoint records so that a resume can name each changed setting: {dotted name: value}.

    Every section but the model (recorded whole under `model`), without
    derived fields (checkpoint.dir, the world layout, the metrics port: they
    differ between a laptop and a cluster without changing the run) nor unset ones.
    """
    flat = {name: value for name, value in _flatten(cfg, "").items() if not name.startswith(MODEL + ".")}
    return json.loads(json.dumps(flat))  # as the manifest will read back (tuples become lists)


def _flatten(obj: Any, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = prefix + key_for(f, camel_case=False)
        if not in_view(f, camel_case=True) or value is None:
            continue
        if dataclasses.is_dataclass(value):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = to_dict(value)  # a list of sections (metrics.trackers) as plain dicts
    return out


def _shape_text(shape: Optional[Sequence[int]]) -> str:
    return "absent" if shape is None else str(list(shape))


def first_difference(expected: Mapping[str, Sequence[int]],
                     found: Mapping[str, Sequence[int]]) -> Optional[tuple[str, Optional[Shape], Optional[Shape]]]:
    """(name, expected shape, found shape) of the first tensor, in the model's order, that differs; None absent.

    None when both hold the same names with the same shapes.
    """
    for name, shape in expected.items():
        if name not in found or tuple(found[name]) != tuple(shape):
            return name, tuple(shape), tuple(found[name]) if name in found else None
    extra = next((name for name in found if name not in expected), None)
    return None if extra is None else (extra, None, tuple(found[extra]))


def _value_text(value: Any) -> str:
    return "unset" if value is None else str(value)


def changed(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(name, value here, value there) of each setting that differs, in this run's order (then the checkpoint's)."""
    names = [*here, *(name for name in there if name not in here)]
    return [(name, here.get(name), there.get(name)) for name in names if here.get(name) != there.get(name)]


def _model_settings(model: Mapping[str, Any] | None) -> dict[str, Any]:
    return {f"{MODEL}.{key}": value for key, value in (model or {}).items()}


def mismatch(manifest: Mapping[str, Any], fields: Mapping[str, Any], shapes: Mapping[str, Sequence[int]],
             saved: Mapping[str, Sequence[int]], name: str) -> Optional[CheckpointError]:
    """The error when the checkpoint `name` holds other tensors than this model; None when it fits.

    `fields` are this run's manifest fields (its `model`), `shapes` its model's
    {tensor: global shape}, `saved` the checkpoint's.
    """
    tensor = first_difference(shapes, saved)
    if tensor is None:
        return None
    tensor_name, mine, theirs = tensor
    detail = f"{tensor_name} {_shape_text(mine)} here, {_shape_text(theirs)} there"
    recorded_both = MODEL in fields and MODEL in manifest
    settings = changed(_model_settings(fields[MODEL]), _model_settings(manifest[MODEL])) if recorded_both else []
    settings = [change for change in settings if change[0] != INIT_FROM]  # shapes no tensor: not the cause
    if not settings:  # the same settings (or a side that does not record them): the model's code changed
        return CheckpointError([FieldError(MODEL, f"the model built here does not fit {name} ({detail})")])
    errors = [FieldError(setting, f"{_value_text(mine_)} here, {_value_text(theirs_)} in {name}")
              for setting, mine_, theirs_ in settings]
    errors[0] = FieldError(errors[0].path, f"{errors[0].message} ({detail})")
    return CheckpointError(errors)


def changes(manifest: Mapping[str, Any], fields: Mapping[str, Any], config_hash: str, name: str) -> Optional[str]:
    """The warning for a checkpoint that fits but was written with other settings; None when none changed.

    A checkpoint written before settings were recorded (or a manager told none)
    can only say that the config hash differs.
    """
    if SETTINGS not in manifest or SETTINGS not in fields:
        if manifest.get("config_hash") == config_hash:
            return None
        return f"{name} was written with config {manifest.get('config_hash')}, this run has {config_hash}"
    here = {**_model_settings(fields.get(MODEL)), **fields[SETTINGS]}
    there = {**_model_settings(manifest.get(MODEL)), **manifest[SETTINGS]}
    diffs = changed(here, there)
    if not diffs:
        return None
    listed = "; ".join(f"{setting}: {_value_text(a)} here, {_value_text(b)} there" for setting, a, b in diffs)
    return f"resuming {name} with changed settings: {listed}"


def load_failure(name: str, exc: BaseException) -> Optional[CheckpointError]:
    """What a load that failed although the tensors fit raises (a missing optimizer or scaler state, ...).

    None for what may pass on a restart or has a reason of its own (an I/O error, out of memory, a peer
    that vanished): it stays what it is. DCP wraps every rank's error into one CheckpointException whose
    own text names only the ranks: the line is the first rank's error.
    """
    chain = list(causes(exc))
    if classify(exc)[0] != ERROR or any(isinstance(cause, OSError) for cause in chain):
        return None
    root = next((cause for cause in chain if not hasattr(cause, "failures")), exc)
    problem = classify(root)[1]
    return CheckpointError([FieldError("checkpoint.dir", f"{name} does not load into this model/optimizer: {problem}")])
