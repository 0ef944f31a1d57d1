"""Cluster access: the one client that talks to the API server, and what the operator remembers of the cluster.

    client        ClusterClient (the calls a pass makes, retried) and ObjectRef
    backoff       the retry schedules
    discovery     which APIs the cluster serves (Kueue, PodGroups, the training operator)
    children      the watches' view of each job's children
    expectations  what a pass created and the watches do not show yet
    ghosts        index entries whose DELETED a relist gap lost, found against a fresh list
"""
