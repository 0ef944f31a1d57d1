"""torchrun entry for the resume tests: `python -m brain_trainer`, except that in the first
attempt rank 0 stops right before committing checkpoint HOLD_COMMIT_STEP (every shard and
DCP's .metadata written), prints its pid, and waits there to be killed. On a volume the commit
is store.commit's rename, on a bucket bucket.commit's manifest: both are held."""

import os
import threading

from brain_trainer import __main__ as trainer_main
from brain_trainer.checkpoint import bucket, store

HOLD_STEP = int(os.environ["HOLD_COMMIT_STEP"])


def held(real_commit):
    def commit(folder, final, fields, *rest):
        if fields["step"] == HOLD_STEP and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            print(f"holding commit of step {HOLD_STEP} in pid {os.getpid()}", flush=True)
            threading.Event().wait()
        return real_commit(folder, final, fields, *rest)

    return commit


store.commit = held(store.commit)
bucket.commit = held(bucket.commit)
trainer_main.exit_now(trainer_main.main())
