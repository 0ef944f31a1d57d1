"""The operator's log lines: kopf's own formats, and every line about a job naming it.

`configure` is kopf's logging set-up (what `kopf run --log-format ... --verbose`
does): timestamps and levels in text, or one JSON object per line. Inside a
handler kopf's per-object logger attaches the object's reference to each
record; its text formatter prefixes `[namespace/name]` and its JSON formatter
adds an `object` field. `job_logger` attaches the same reference to the
operator's own lines about a job, so they read the same in both formats.
"""

from __future__ import annotations

import logging

from .objects.resource import API_VERSION, KIND

LOG_FORMATS = ("text", "json")
# The record attribute kopf's formatters read an object reference from (kopf's ObjectLogger sets it).
OBJECT_REF = "k8s_ref"


def configure(log_format: str = "text", verbose: bool = False) -> None:
    """Root logging through kopf: INFO (DEBUG when verbose), text with timestamps or JSON lines."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    import kopf  # here, not at the top: a second to import, and every other braintrain command imports this module

    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
        log_prefix=None,  # as kopf's CLI: `[namespace/name]` prefixes in text, an `object` field in JSON
    )


def job_logger(logger: logging.Logger, namespace: str, name: str) -> logging.LoggerAdapter:
    """`logger`, with every line carrying the job's reference as kopf's per-object lines do."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "namespace": namespace, "name": name}
    return logging.LoggerAdapter(logger, {OBJECT_REF: ref})
