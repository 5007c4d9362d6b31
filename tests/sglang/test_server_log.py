"""A failed start's decisive line (issue 34, item 3): SGLang's argparse `error:` line after its usage text, the
exception line of a traceback, with a host's prefix kept; none when the log says nothing decisive."""

from __future__ import annotations

import pytest

from servesweep.sglang.server_log import MAX_CHARS, decisive_line

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

# the shape real SGLang prints on a rejected argument: hundreds of usage lines, the error last
USAGE = "usage: sglang serve [-h] --model-path MODEL_PATH\n" + "".join(
    f"                    [--option-{i} OPTION_{i}]\n" for i in range(400)
)
ARGPARSE = USAGE + "sglang serve: error: unrecognized arguments: --gpu-memory-utilization 0.85\n"

TRACEBACK = """\
[2026-12-03 10:00:00] server_args=ServerArgs(model_path='m', ...)
[2026-12-03 10:00:01] Load weight begin.
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/sglang/launch_server.py", line 14, in <module>
    launch_server(server_args)
  File "/usr/lib/python3/site-packages/sglang/srt/model_executor/model_runner.py", line 300, in init_memory_pool
    raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
[2026-12-03 10:00:02] Received sigquit from a child process. It usually means the child failed.
"""


def test_the_argparse_error_after_the_usage_text():
    assert decisive_line(ARGPARSE) == "sglang serve: error: unrecognized arguments: --gpu-memory-utilization 0.85"
    # another prog name (launch_server.py, the emulator) and a journald prefix, kept as the log has it
    assert decisive_line("launch_server.py: error: argument --tp-size: invalid int value: 'x'\n").startswith(
        "launch_server.py: error: argument --tp-size"
    )
    journal = "Dec 03 10:00:00 gpu1 python3[4242]: sglang serve: error: the following arguments are required\n"
    assert decisive_line(USAGE + journal) == journal.rstrip()


def test_the_exception_line_of_the_last_traceback():
    assert decisive_line(TRACEBACK) == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    dotted = "Traceback (most recent call last):\n  File \"x.py\", line 1\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    assert decisive_line("Traceback (most recent call last):\nValueError: old\n" + dotted) == (
        "torch.OutOfMemoryError: CUDA out of memory."
    )
    # the frames' indented lines and a logged WARNING are not exception lines
    assert decisive_line("Traceback (most recent call last):\n  File \"x\"\nWARNING: disk\n") is None


def test_nothing_decisive_and_long_lines():
    assert decisive_line("") is None
    assert decisive_line("[2026-12-03 10:00:00] Load weight begin.\nKilled\n") is None
    long = "sglang serve: error: unrecognized arguments: " + "--x 1 " * 400
    line = decisive_line(USAGE + long)
    assert line is not None and len(line) == MAX_CHARS and line.endswith("…")


def test_a_ten_megabyte_log():
    """Field scale: a night's log (10 MiB, far past the 1 MiB tail wait_ready keeps) still gives the line."""
    big = "[2026-12-03 10:00:00] Decode batch. #running-req: 8, #token: 4096, gen throughput (token/s): 50.0\n"
    log = big * (10 * 2**20 // len(big)) + TRACEBACK
    assert decisive_line(log).startswith("RuntimeError: Not enough memory.")
