"""torchrun entry for the resume test: `python -m brain_trainer`, except that in the first
attempt rank 0 stops right before committing checkpoint HOLD_COMMIT_STEP (every shard and
DCP's .metadata written), prints its pid, and waits there to be killed."""

import os
import threading

from brain_trainer import __main__ as trainer_main
from brain_trainer.checkpoint import store

HOLD_STEP = int(os.environ["HOLD_COMMIT_STEP"])
real_commit = store.commit


def commit(folder, final, fields, *rest):
    if fields["step"] == HOLD_STEP and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        print(f"holding commit of step {HOLD_STEP} in pid {os.getpid()}", flush=True)
        threading.Event().wait()
    return real_commit(folder, final, fields, *rest)


store.commit = commit
trainer_main.exit_now(trainer_main.main())
