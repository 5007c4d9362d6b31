"""Request traces (docs/workloads.md, "Trace replay"): one internal model that every format converts into, readers
for the public formats, the trace's ideal prefix-cache behaviour, and cache-faithful prompts built from its blocks.

- `model`: `Trace` / `TraceRequest` and the native JSONL format (load/save);
- `readers`: Mooncake/FAST'25 JSONL, Azure LLM inference CSV, Alibaba Bailian JSONL/CSV, agentic session JSONL;
- `cache`: the ideal LRU prefix cache over the trace's blocks (expected cached tokens per request);
- `window`: cutting a window (start, duration, sample fraction) out of a trace;
- `block_prompts`: each hash id as an exact block of tokens by the target's tokenizer;
- `synth`: small generated traces in every format, with known sharing (tests, examples);
- `cli`: `servesweep trace convert|stats|sample|synth`.
"""
