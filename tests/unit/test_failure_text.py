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


def test_the_exception_line_is_the_scripts_not_a_later_shipyard_or_server_line():
    # the chief's traceback, then its instance's parameter server and relays print on
    log = "\n".join(
        [
            "[shipyard-agent] algo-1: starting ps:0 (service)",
            "Traceback (most recent call last):",
            '  File "train.py", line 2, in <module>',
            "    tf.logging.set_verbosity(tf.logging.INFO)",
            "    ^^^^^^^^^^",
            "AttributeError: module 'tensorflow' has no attribute 'logging'",
            "[shipyard-tf] ps:0 serving on algo-1 (11.9s to start)",
            "[shipyard-tf] ps:0: relays chief:0 10.0.0.1:2222, ps:0 10.0.0.1:2223",
            "2026-01-01 00:00:00.000000: I tensorflow/core/distributed_runtime/server.cc] up",
        ]
    )
    text = failure_text(1, ["python", "train.py"], log)
    assert "ErrorMessage \"AttributeError: module 'tensorflow' has no attribute 'logging'\"" in text
    assert "[shipyard" not in text and "server.cc" not in text
    assert text.endswith("AttributeError: module 'tensorflow' has no attribute 'logging'")


def test_multi_line_messages_are_kept_in_the_excerpt():
    log = 'Traceback (most recent call last):\n  File "t.py", line 1\nInvalidArgumentError: bad\n\t [[node x]]\nnext'
    text = failure_text(1, ["python", "t.py"], log)
    assert 'ErrorMessage "InvalidArgumentError: bad"' in text
    assert text.endswith("\t [[node x]]")
