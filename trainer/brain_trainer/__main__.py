"""`python -m brain_trainer --config FILE`: what torchrun starts in every worker.

A bad config prints one `error: field: message` line per bad field to stderr
and exits 2 (the usual usage-error code), never with a traceback. Any fatal
error ends the same way: classified (failures.py), its reason written as the
termination message, its exit code returned (docs/training.md, "When training
fails").

Once `main` has its outcome (the final or the preemption checkpoint committed,
or the termination message written), the process leaves with `exit_now`,
without the interpreter's teardown: there libtorch's static destructors, with
gloo's and the stores' threads still about, now and then abort ("terminate
called without an active exception", exit 134), and torchrun and the operator
would count a clean finish, a preemption or a classified failure as an
unexplained crash.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn, Optional, Sequence

from .config import load_config
from .contract import CHECKPOINT_REQUEST_FILE, CONFIG_ERROR_REASON, CONFIG_FLAG, PROFILE_REQUEST_FILE, TRAINER_MODULE
from .resilience.failures import Fatal, begin_attempt, report
from .version import TORCH_REQUIREMENT, __version__, torch_refusal

log = logging.getLogger(__name__)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {TRAINER_MODULE}", description="Train a BrainAI model (one worker).")
    parser.add_argument(CONFIG_FLAG, dest="config", required=True, metavar="FILE", help="trainer.yaml")
    return parser.parse_args(argv)


def check_torch() -> None:
    """Log this worker's torch; one outside the supported range fails as config-error, before any work."""
    import torch

    if os.environ.get("RANK", "0") == "0":
        log.info("brain-train %s on torch %s (supported: %s)", __version__, torch.__version__, TORCH_REQUIREMENT)
    refusal = torch_refusal(torch.__version__)
    if refusal is not None:
        raise Fatal(CONFIG_ERROR_REASON, refusal)


def main(argv: Optional[Sequence[str]] = None) -> int:
    started = time.time()  # before torch is imported: the goodput ledger counts that as initialisation
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stdout)
    # Before any rank of this pod can fail (every rank joins the process group first); rank 0 is a local rank 0.
    restarted_after = begin_attempt() if os.environ.get("LOCAL_RANK", "0") == "0" else None
    try:
        cfg = load_config(args.config)
        check_torch()  # imports torch: only once the config is known to be good
        from .loop.train import train

        # The request files are other keys of trainer.yaml's ConfigMap: they lie beside it.
        config = Path(args.config)
        train(cfg, checkpoint_request=config.with_name(CHECKPOINT_REQUEST_FILE), started=started,
              restarted_after=restarted_after, profile_request=config.with_name(PROFILE_REQUEST_FILE))
    except KeyboardInterrupt:
        raise  # Ctrl-C is the user's
    except SystemExit as exc:  # Preempted, its checkpoint committed and its message written: leave with its code
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException as exc:  # torch.distributed.checkpoint's errors are BaseExceptions
        return report(exc, os.environ.get("RANK"))
    return 0


def exit_now(code: int) -> NoReturn:
    """Flush the logs and the standard streams, then end the process with `code`, skipping the teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
