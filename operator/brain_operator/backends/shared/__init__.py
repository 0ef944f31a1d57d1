"""What every backend's pods share (pure): the worker plan, labels and metadata, the pod spec, the ConfigMap and
the checkpoint claim, the job's pod overlay, the NetworkPolicy and the gang's PodGroup.

    workers  the typed worker plan (also what the local runner starts)
    common   labels, metadata, ConfigMap, checkpoint PVC, the pod spec
    overlay  the job's pod overlay (spec.podTemplate) merged into each worker pod
    network  the NetworkPolicy: who may connect to the job's pods
    gangs    the PodGroup of a gang-scheduled elastic job, and each pod's link to it
"""
