"""torchrun entry for the failure tests: `python -m brain_trainer`, except that rank FAIL_RANK, at its
FAIL_AT-th forward pass, fails as FAIL_MODE says:
- `memory`: a MemoryError raised in the step (what the allocator raises when memory runs out);
- `vanish`: the process SIGKILLs itself (a peer that vanished), leaving no message of its own."""

import importlib
import os
import signal

from brain_trainer import __main__ as trainer_main

train = importlib.import_module("brain_trainer.loop.train")  # the module (the package exports its train function)

MODE, AT, RANK = os.environ["FAIL_MODE"], int(os.environ["FAIL_AT"]), os.environ["FAIL_RANK"]
real_loss = train.loss_fn
calls = 0


def loss_fn(logits, targets):
    global calls
    calls += 1
    if calls == AT and os.environ["RANK"] == RANK:
        if MODE == "memory":
            raise MemoryError()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_loss(logits, targets)


train.loss_fn = loss_fn
trainer_main.exit_now(trainer_main.main())
