from shipyard.runtime.failure import LIMIT, failure_text

TRACEBACK = "\n".join(
    ["starting", "Traceback (most recent call last):"]
    + [f'  File "train.py", line {i}, in f{i}\n    g()' for i in range(200)]
    + ["ValueError: the real cause"]
)


def test_exception_line_comes_first_and_text_fits_the_limit():
    text = failure_text(1, ["python", "train.py", "--epochs", "1"], TRACEBACK)
    assert len(text) <= LIMIT
    assert 'ErrorMessage "ValueError: the real cause"' in text.splitlines()[2]
    assert text.endswith("ValueError: the real cause")
    assert "ExitCode 1" in text


def test_signal_exit_is_named():
    assert "killed by SIGKILL" in failure_text(-9, ["python", "t.py"], "")
