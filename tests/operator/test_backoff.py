"""backoff.py and accounting.py: the pure parts of issue 17."""

import pytest

from brain_operator.status.accounting import still_handled, unhandled
from brain_operator.cluster.backoff import Backoff, JobRetries, retry_after


def test_waits_grow_exponentially_up_to_the_cap_and_jitter_shortens_them_by_up_to_half():
    backoff = Backoff(base=0.5, cap=3.0)
    assert [backoff.delay(n, rng=lambda: 0.0) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [backoff.delay(n, rng=lambda: 1.0) for n in range(5)] == [0.25, 0.5, 1.0, 1.5, 1.5]
    assert backoff.delay(10_000, rng=lambda: 0.0) == 3.0  # no overflow after a long outage


@pytest.mark.parametrize("header, seconds", [("7", 7.0), ("0", 0.0), ("1.5", 1.5), (None, None), ("-1", None),
                                             ("Wed, 21 Oct 2026 07:28:00 GMT", None)])
def test_retry_after_reads_seconds(header, seconds):
    assert retry_after(header) == seconds


def test_a_failed_job_is_due_after_its_backoff_and_again_after_a_longer_one_until_it_succeeds():
    retries = JobRetries(Backoff(base=1.0, cap=4.0), Backoff(base=60.0, cap=600.0), rng=lambda: 0.0)
    job, other = ("ns", "a"), ("ns", "b")
    assert retries.wait(100.0) is None and retries.take_due(100.0) == []
    assert retries.failed(job, 100.0) == 1.0
    assert retries.wait(100.0) == 1.0 and retries.take_due(100.5) == []
    assert retries.take_due(101.0) == [job]
    assert retries.wait(101.0) is None  # taken: scheduled again only by another failure
    assert retries.failed(job, 101.0) == 2.0
    retries.failed(other, 101.0)
    assert retries.take_due(102.0) == [other] and retries.take_due(103.0) == [job]
    retries.succeeded(job)
    assert retries.failed(job, 200.0) == 1.0  # a success starts the backoff over


def pod(uid):
    return {"metadata": {"uid": uid}}


def test_a_failure_is_new_until_its_uid_is_recorded_and_recorded_while_its_pod_exists():
    failed = [pod("a"), pod("b")]
    assert unhandled(failed, ["a"]) == [pod("b")]
    # "a" was handled and its pod is still there (its delete failed); "b" is handled now; "gone" was deleted.
    assert still_handled(["gone", "a"], present=[pod("a"), pod("b"), pod("c")], new=[pod("b")]) == ["a", "b"]
    assert still_handled(["a"], present=[], new=[]) == []
