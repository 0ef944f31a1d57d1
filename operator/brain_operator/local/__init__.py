"""The local runner, `braintrain run` (a shell on top, beside the kopf handlers): the job's worker pods as local
torchrun agents on this machine.

    plan     the pods rendered by the backends, turned into local processes, folders and files (pure)
    run      starts them, watches them, restarts them as the failure policy says
    display  what the user sees while it runs
"""
