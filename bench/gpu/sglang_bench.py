"""Run SGLang's bench_serving (`sglang.benchmark.serving`, sglang 0.5.23) from the files of its wheel alone.

`python -m sglang.benchmark.serving` imports `sglang/__init__.py` (the runtime: torch, FlashInfer, the server's
patches) and, from serving.py, two names of the server code: `FAKE_BOOTSTRAP_HOST` (sglang/srt/disaggregation/
utils.py: "2.2.2.2") and `resolve_base_url`/`resolve_host_port` (sglang/srt/utils/network.py). This runner makes
`sglang` a bare package over the unpacked wheel (its __init__ not run), gives those three names as in 0.5.23's
source, stubs Hugging Face `datasets` if missing (imported at the top of dataset modules not used here), and runs
bench_serving's own `cli_main` with the rest of the command line. The client code (request functions, timing,
dataset loading, metrics) is bench_serving's, unchanged.

    python3 bench/gpu/sglang_bench.py DIR_HOLDING_sglang --backend sglang-oai-chat --dataset-name custom ...
"""

import sys
import types

root = sys.argv.pop(1)


def _pkg(name, path=None):
    m = types.ModuleType(name)
    m.__path__ = [path] if path else []
    sys.modules[name] = m
    return m


_pkg("sglang", f"{root}/sglang")
_pkg("sglang.srt")
_pkg("sglang.srt.disaggregation")
_pkg("sglang.srt.utils")
dis = types.ModuleType("sglang.srt.disaggregation.utils")
dis.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang 0.5.23 srt/disaggregation/utils.py:53
sys.modules[dis.__name__] = dis
net = types.ModuleType("sglang.srt.utils.network")


def resolve_base_url(base_url, host, port):  # srt/utils/network.py:654, IPv4 hosts
    return base_url or f"http://{host}:{port}"


def resolve_host_port(base_url, host, port):  # srt/utils/network.py:662, IPv4 hosts
    return base_url or f"{host}:{port}"


net.resolve_base_url, net.resolve_host_port = resolve_base_url, resolve_host_port
sys.modules[net.__name__] = net
try:
    import datasets  # noqa: F401
except ImportError:
    ds = types.ModuleType("datasets")

    def load_dataset(*a, **k):
        raise RuntimeError("Hugging Face datasets is not installed")

    ds.load_dataset = load_dataset
    sys.modules["datasets"] = ds

from sglang.benchmark.serving import cli_main  # noqa: E402

sys.argv[0] = "sglang.benchmark.serving"
cli_main()
