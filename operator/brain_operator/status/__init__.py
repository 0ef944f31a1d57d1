"""The status and its policies (pure): what a job's children show, turned into its typed `status`, its events and
the rules that judge worker exits.

    job_status      the typed status document (JobStatus, conditions, incidents)
    compute         the status from what the pods (or the PyTorchJob) show
    waiting         why a pod waits (unschedulable, image pull, Terminating for good)
    failure_policy  why a worker failed and what runPolicy.failurePolicy does
    incidents       which exits start an incident (and cost a restart), which follow one
    accounting      which failed pods an earlier pass already handled
    events          the Kubernetes Events a status change posts
    progress        rank 0's progress document in the status
    stalled         the Stalled condition (no step for too long)
    on_demand       the checkpoint-now and profile-now requests' events
"""
