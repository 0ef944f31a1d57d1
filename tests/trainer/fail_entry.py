"""torchrun entry for the failure tests: `python -m brain_trainer`, except that rank FAIL_RANK, at its
FAIL_AT-th forward pass, fails as FAIL_MODE says:
- `memory`: a MemoryError raised in the step (what the allocator raises when memory runs out);
- `vanish`: the process SIGKILLs itself (a peer that vanished), leaving no message of its own."""

import importlib
import os
import signal

from brain_trainer import __main__ as trainer_main

loss = importlib.import_module("brain_trainer.loop.loss")  # where the step settings take the loss from

MODE, AT, RANK = os.environ["FAIL_MODE"], int(os.environ["FAIL_AT"]), os.environ["FAIL_RANK"]
real_loss = loss.loss_fn
calls = 0


def loss_fn(logits, targets):
    global calls
    calls += 1
    if calls == AT and os.environ["RANK"] == RANK:
        if MODE == "memory":
            raise MemoryError()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_loss(logits, targets)


loss.loss_fn = loss_fn
trainer_main.exit_now(trainer_main.main())
