"""The local runner's display: progress lines, throttling, summary, tolerant reads."""

import io
from dataclasses import replace

from brain_trainer.contract import Goodput, Progress

from brain_operator.local.display import (
    PlainDisplay,
    RichDisplay,
    RunSummary,
    format_duration,
    progress_line,
    read_progress,
    summary_lines,
)

DOC = Progress(step=120, total_steps=200, loss=2.13421, tokens_per_second=12345.6, eta_seconds=32.4)


def test_progress_line_shows_step_loss_rate_and_eta():
    assert progress_line(DOC) == "step 120/200 (60%)  loss 2.1342  12,346 tok/s  ETA 0m32s"


def test_progress_line_shows_the_held_out_loss_once_there_is_one():
    assert progress_line(replace(DOC, eval_loss=2.5)) == "step 120/200 (60%)  loss 2.1342  eval 2.5000  12,346 tok/s  ETA 0m32s"


def test_progress_line_tolerates_missing_fields():
    assert progress_line(Progress(step=3)) == "step 3/?  loss -  - tok/s  ETA -"


def test_durations():
    assert [format_duration(s) for s in (0, 59.6, 61, 3725, None)] == ["0m00s", "1m00s", "1m01s", "1h02m05s", "-"]


def test_plain_display_prints_at_most_once_per_interval_and_only_when_the_step_moved():
    now = [0.0]
    out = io.StringIO()
    display = PlainDisplay(out, interval=5.0, clock=lambda: now[0])
    display.update(replace(DOC, step=10))
    now[0] = 2.0
    display.update(replace(DOC, step=20))  # too soon
    now[0] = 6.0
    display.update(replace(DOC, step=30))
    now[0] = 20.0
    display.update(replace(DOC, step=30))  # nothing new
    display.update(None)
    display.log("job-worker-1", "hello")
    lines = out.getvalue().splitlines()
    assert [line.split()[1:3] for line in lines[:-1]] == [["step", "10/200"], ["step", "30/200"]]
    assert lines[-1] == "[job-worker-1] hello"


def test_read_progress_ignores_missing_partial_and_foreign_documents(tmp_path):
    path = tmp_path / "progress.json"
    assert read_progress(path) is None
    path.write_text('{"step": 4, "lo')
    assert read_progress(path) is None
    path.write_text("[1, 2]")
    assert read_progress(path) is None
    path.write_text('{"step": 4}')
    assert read_progress(path) == Progress(step=4)


def test_summary_names_every_figure():
    summary = RunSummary(
        status="Succeeded", step=200, total_steps=200, loss=1.5, first_loss=5.25, tokens_per_second=9000.0,
        wall_seconds=75.0, checkpoint="runs/j/checkpoints/step-00000200", restarts=1,
    )
    text = "\n".join(summary_lines(summary))
    for expected in ("Succeeded", "200/200", "1.5000 (first logged: 5.2500)", "9,000", "1m15s", "restarts:    1", "step-00000200"):
        assert expected in text
    assert "eval loss" not in text, "a job without evaluation says nothing about it"
    evaluated = summary_lines(replace(summary, eval_loss=2.0, first_eval_loss=6.0))
    assert evaluated[3] == "eval loss:   2.0000 (perplexity 7.4; first: 6.0000)"
    assert "(perplexity 10,142,320," in summary_lines(replace(summary, eval_loss=800.0))[3], "a diverged loss: capped, no overflow"
    assert "reason:" not in text
    assert "goodput:     -" in text.splitlines()  # no trainer reported it


def test_the_summary_lists_the_overrides_as_a_shell_takes_them_back():
    summary = RunSummary(
        status="Failed", step=100, total_steps=200, loss=None, first_loss=None, tokens_per_second=None,
        wall_seconds=5.0, checkpoint=None, restarts=0, reason="error: x", overrides=("training.steps=200", "data.path=a b"),
    )
    lines = summary_lines(summary)
    assert lines[2] == "overrides:   --set training.steps=200 --set 'data.path=a b'"
    assert not any(line.startswith("overrides:") for line in summary_lines(replace(summary, overrides=())))


def test_a_failed_runs_reason_is_the_first_line_after_its_status():
    summary = RunSummary(
        status="Failed", step=100, total_steps=200, loss=None, first_loss=None, tokens_per_second=None,
        wall_seconds=5.0, checkpoint=None, restarts=0, message="j-worker-0 failed",
        reason="storage-full: the checkpoint of step 150 needs 13 MB, 2 MB free",
    )
    lines = summary_lines(summary)
    assert lines[:2] == ["status:      Failed (j-worker-0 failed)",
                         "reason:      storage-full: the checkpoint of step 150 needs 13 MB, 2 MB free"]


def test_the_summary_shows_goodput_and_its_parts_that_are_not_zero():
    goodput = Goodput(ratio=0.7123, wall_seconds=100.4, productive_seconds=71.5, recomputed_seconds=3.6,
                      checkpoint_seconds=0.2, initialization_seconds=9.9, waiting_seconds=15.2)
    summary = RunSummary(status="Succeeded", step=200, total_steps=200, loss=None, first_loss=None, tokens_per_second=None,
                         wall_seconds=110.0, checkpoint=None, restarts=1, goodput=goodput)
    assert ("goodput:     71% of 1m40s: productive 71.5 s, recomputed 3.6 s, checkpoint 0.2 s, initialization 9.9 s, "
            "waiting 15.2 s") in summary_lines(summary)


def test_rich_display_shows_the_bar_figures_under_the_labelled_output():
    out = io.StringIO()
    display = RichDisplay(out, job_name="demo", total_steps=200)
    display.log("demo-worker-0", "step 120 [not markup]")
    display.update(replace(DOC, eval_loss=2.5))
    display.close()
    text = out.getvalue()
    assert "[demo-worker-0] step 120 [not markup]" in text
    for figure in ("demo", "120/200", "loss 2.1342  eval 2.5000", "12,346 tok/s", "ETA 0m32s"):
        assert figure in text, figure
