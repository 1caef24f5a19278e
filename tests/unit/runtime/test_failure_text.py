import pytest

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


# Issue 28: a tf.function (autograph) error's exception line is only "TypeError: in user
# code:"; the real error is five lines down, indented under the user's frame. Verbatim TF
# 2.21 output, then the instance's other lines.
AUTOGRAPH = """\
Traceback (most recent call last):
  File "/opt/ml/code/train.py", line 8, in <module>
    step(tf.constant(1.0))
  File "/venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/tmp/__autograph_generated_file3gxn71dq.py", line 13, in tf__step
    retval_ = ag__.ld(y) + 'a'
    ^^^^^
TypeError: in user code:

    File "/opt/ml/code/train.py", line 6, in step  *
        return y + "a"

    TypeError: Input 'y' of 'AddV2' Op has type string that does not match type float32 of argument 'x'.

[shipyard-agent] algo-1: finished with status 1
"""
REAL = "TypeError: Input 'y' of 'AddV2' Op has type string that does not match type float32 of argument 'x'."


def test_an_autograph_error_names_the_real_error_and_the_users_line():
    text = failure_text(1, ["python", "train.py"], AUTOGRAPH)
    assert f'ErrorMessage "{REAL}"' in text.splitlines()[2]
    assert 'File "/opt/ml/code/train.py", line 6, in step' in text and 'return y + "a"' in text
    assert text.endswith(REAL)
    assert "[shipyard" not in text


def test_a_keras_error_in_user_code_keeps_its_multi_line_message():
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 30, in <module>',
            "    model.fit(x, y)",
            "ValueError: in user code:",
            "",
            '    File "keras/engine/training.py", line 1160, in train_function  *',
            "        return step_function(self, iterator)",
            '    File "train.py", line 12, in call  *',
            "        return self.dense(x)",
            '        ValueError("a code line, not the error")',
            "",
            '    ValueError: Exception encountered when calling layer "dense" (type Dense).',
            "    ",
            '    Input 0 of layer "dense" is incompatible with the layer: expected axis -1 to have value 3',
            "",
        ]
    )
    text = failure_text(1, ["python", "train.py"], log)
    assert text.splitlines()[2] == (
        'ErrorMessage "ValueError: Exception encountered when calling layer "dense" (type Dense)."'
    )
    assert 'File "train.py", line 12, in call' in text
    assert text.rstrip().endswith("expected axis -1 to have value 3")


# Issue 28: a Keras 2 script on the installed Keras 3 fails with messages that do not name
# the API difference; the reason now does, and says how to run the script as written.
@pytest.mark.parametrize(
    "exc_line,code,named",
    [
        ("ValueError: Argument(s) not recognized: {'lr': 0.001}", "opt = Adam(lr=0.001)", "lr="),
        (
            "AttributeError: 'Mean' object has no attribute 'reset_states'",
            "metric.reset_states()",
            "reset_state()",
        ),
        (
            "TypeError: 'list' object is not callable",
            "hvd.broadcast_variables(opt.variables(), root_rank=0)",
            "optimizer.variables is a list",
        ),
    ],
)
def test_a_keras_3_api_difference_is_named(exc_line, code, named):
    log = f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    {code}\n{exc_line}\n'
    text = failure_text(1, ["python", "train.py"], log)
    hint = text.splitlines()[4]
    assert hint.startswith('Hint "Keras 3 (TensorFlow 2.16+)') and named in hint
    assert "framework_version <= '2.15'" in hint
    assert text.endswith(exc_line) and len(text) <= LIMIT


def test_an_unrelated_list_not_callable_gets_no_hint():
    log = "Traceback (most recent call last):\n  File \"t.py\", line 1\n    x()\nTypeError: 'list' object is not callable\n"
    assert "Hint" not in failure_text(1, ["python", "t.py"], log)


# TensorFlow 2.21's output for a label out of range in Keras fit (trimmed frames; the shape of
# the message is TensorFlow's: the cause comes after the node's frames, then the node line)
GRAPH_ERROR_LOG = """Traceback (most recent call last):
  File "/opt/ml/code/train.py", line 4, in <module>
    m.fit(x, y, epochs=1, verbose=0)
  File "/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute
    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,
tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:

Detected at node compile_loss/sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits defined at (most recent call last):
  File "/opt/ml/code/train.py", line 4, in <module>

  File "/venv/lib/python3.11/site-packages/keras/src/backend/tensorflow/trainer.py", line 399, in fit

  File "/venv/lib/python3.11/site-packages/keras/src/backend/tensorflow/nn.py", line 1438, in sparse_categorical_crossentropy

Received a label value of 10 which is outside the valid range of [0, 10).  Label values: 4 2 2 3 10 1 3 1
\t [[{{node compile_loss/sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits}}]] [Op:__inference_multi_step_on_iterator_209]
[shipyard-agent] algo-1: finished with status 1 in 9.1s"""


def test_a_tensorflow_graph_execution_error_names_its_cause():
    text = failure_text(1, ["python", "train.py"], GRAPH_ERROR_LOG)
    message = text.splitlines()[2]
    assert message.startswith(
        'ErrorMessage "tensorflow.python.framework.errors_impl.InvalidArgumentError'
    )
    assert (
        "Graph execution error: Received a label value of 10 which is outside the valid range"
        in message
    )
    assert len(text) <= LIMIT
    assert text.rstrip().endswith("[Op:__inference_multi_step_on_iterator_209]")


def test_a_graph_execution_error_cut_off_before_its_node_line_keeps_its_exception_line():
    cut = GRAPH_ERROR_LOG.split("Received a label")[0]
    text = failure_text(1, ["python", "train.py"], cut)
    assert text.splitlines()[2].endswith('InvalidArgumentError: Graph execution error:"')
