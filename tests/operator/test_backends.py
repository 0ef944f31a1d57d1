"""The one table that chooses a backend (backends.BACKENDS) covers every backend the spec accepts, in its order."""

from brain_operator.backends import BACKENDS
from brain_operator.spec import JOB_BACKENDS


def test_every_backend_the_spec_accepts_has_a_renderer_and_a_planner():
    assert tuple(BACKENDS) == JOB_BACKENDS
    assert all(callable(backend.render) and callable(backend.plan) for backend in BACKENDS.values())
