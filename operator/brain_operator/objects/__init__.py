"""The Kubernetes objects' vocabulary (pure, the lowest room): the CRD's identity, the names and labels of a job's
children, the schedulers' labels and annotations, and reading a pod.

    resource    the BrainTrainingJob's group, version and kind
    names       children's names, labels and annotations
    schedulers  what Kueue and the gang schedulers read from our objects
    pods        a pod's phase, index, disruption and exit, as the status reads them
"""
