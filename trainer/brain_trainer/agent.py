"""`python -m brain_trainer.agent ARGS`: torchrun's agent (`torch.distributed.run ARGS`), quiet when it is stopped.

torchrun's agent answers SIGTERM (and SIGINT, SIGHUP, SIGQUIT) by stopping
its workers, then lets the SignalException that its handler raised escape
with a 30-line traceback, though the stop went as planned. The local runner
stops every pod that way (Ctrl-C, a failed peer), as does a trainer whose
failure fails the job (resilience/failures.py, FAIL_FAST_ENV), and so does
the kubelet (the pods run this agent under tini, as the trainer image's
entrypoint does): a newcomer reads the traceback as a crash. Here the agent
runs exactly as torchrun, its warning "Received N death signal, shutting down
workers" included, and ends without the traceback: with PREEMPTED (75) when
the workers committed their checkpoint on the stop (the termination message
they wrote says so), else with the code of a process that a signal ended
(128 + N). Any other failure (ChildFailedError and its report) is torchrun's
as before.
"""

import os
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

from .contract import PREEMPTED, PREEMPTED_REASON, TERMINATION_LOG, TERMINATION_LOG_ENV, parse_termination


def stopped_code(signal_number: int) -> int:
    """The agent's exit code after a stop: PREEMPTED when this pod's trainers said they committed, else 128 + N."""
    try:
        with open(os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG), errors="replace") as f:
            said = parse_termination(f.read())
    except OSError:
        said = None
    return PREEMPTED if said is not None and said[0] == PREEMPTED_REASON else 128 + signal_number


def run() -> int:
    try:
        main()
    except SignalException as stopped:
        return stopped_code(stopped.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(run())
