"""adaptive/progress.py: a bar on whichever stream is a terminal, plain lines on stdout when none is, nothing for
short work or on other ranks."""

from __future__ import annotations

import io

from adaptive.progress import NoProgress, PlainProgress, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_progress_is_lines_on_stdout_ending_with_the_total():
    err, out = io.StringIO(), io.StringIO()
    with progress(10, "evaluation: sampling", "img", delay=0, every=3600, streams=(err, out)) as bar:
        assert isinstance(bar, PlainProgress)
        for _ in range(5):
            bar.update(2)
    lines = out.getvalue().splitlines()
    assert err.getvalue() == ""
    assert lines[0].startswith("evaluation: sampling: 2/10 img (20%)")  # the first update after the delay
    assert lines[-1].startswith("evaluation: sampling: 10/10 img (100%)") and len(lines) == 2  # then the end only


def test_every_update_prints_when_lines_are_due_and_the_end_is_not_repeated():
    out = io.StringIO()
    with progress(3, "d", "img", delay=0, every=0, streams=(io.StringIO(), out)) as bar:
        for _ in range(3):
            bar.update()
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == ["d: 1/3 img (33%)", "d: 2/3 img (67%)",
                                                                             "d: 3/3 img (100%)"]


def test_short_work_and_other_ranks_show_nothing():
    out = io.StringIO()
    with progress(3, "d", delay=3600, streams=(io.StringIO(), out)) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    assert isinstance(progress(3, "d", enabled=False), NoProgress)


def test_a_terminal_on_either_stream_gets_the_bar():
    for err, out in ((Terminal(), io.StringIO()), (io.StringIO(), Terminal())):
        with progress(4, "data: decoding", "img", delay=0, streams=(err, out)) as bar:
            assert not isinstance(bar, PlainProgress)
            bar.update(4)
        shown = err if isinstance(err, Terminal) else out
        assert "data: decoding" in shown.getvalue() and "/4 " in shown.getvalue()  # a tqdm bar
