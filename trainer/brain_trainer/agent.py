"""`python -m brain_trainer.agent ARGS`: torchrun's agent (`torch.distributed.run ARGS`), quiet when it is stopped.

torchrun's agent answers SIGTERM (and SIGINT, SIGHUP, SIGQUIT) by stopping
its workers, then lets the SignalException that its handler raised escape
with a 30-line traceback, though the stop went as planned. The local runner
stops every pod that way (Ctrl-C, a failed peer), as does a trainer whose
failure fails the job (resilience/failures.py, FAIL_FAST_ENV): a newcomer
reads the traceback as a crash. Here the agent runs exactly as torchrun, its
warning "Received N death signal, shutting down workers" included, and ends
with the exit code of a process that a signal ended (128 + N), without the
traceback. Any other failure (ChildFailedError and its report) is torchrun's
as before.
"""

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main


def run() -> int:
    try:
        main()
    except SignalException as stopped:
        return 128 + stopped.sigval
    return 0


if __name__ == "__main__":
    sys.exit(run())
