#!/usr/bin/env python3
"""The GPUs' power limit for one server configuration (the `gpu_power_limit_w` server axis; docs/gpu-telemetry.md):
the sglang_server role sets it on the server's own GPUs before the server starts and restores the original limit
when the server stops, when a configuration without the axis starts, and on a resumed run.

  --state set --limit W   record each GPU's current limit in <workdir>/gpu_power_limit.json (kept as it is when a
                          record is already there: an earlier set that was never restored, after a crash, still
                          holds the true originals), then set W through NVML (nvmlDeviceSetPowerManagementLimit),
                          else `nvidia-smi -i UUID -pl W`, and read back what the driver enforces
                          (nvmlDeviceGetEnforcedPowerLimit): that is the accepted limit, reported per GPU.
  --state restored        set every recorded GPU back to its original limit and remove the record; nothing to do
                          without a record.
  --state show            read only: each GPU's current, default and enforced limit and its allowed range, and the
                          record if one is left; sets nothing.
  --gpus I,J              the server's GPUs (NVML index or UUID: its CUDA_VISIBLE_DEVICES); empty: every GPU.
  --nvml pynvml           NVML through nvidia-ml-py (setting a limit needs root, as `nvidia-smi -pl` does);
  --nvml sim:STATE        the emulator's NVML stand-in (servesweep.sim.power.SimNvml) over its state file: the same
                          calls, so the role's path runs against the emulator.
Prints one JSON object: changed, state, requested_w, gpus [{index, uuid, original_w, accepted_w, min_w, max_w,
via}], record; exit 1 with "error" when a GPU refused (a limit outside its range, no permission): the GPUs set
before it stay recorded, so the role's restore puts them back.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

RECORD = "gpu_power_limit.json"


def load_nvml(spec):
    if spec.startswith("sim:"):
        from servesweep.sim.power import SimNvml  # the emulator's interpreter has servesweep

        nv = SimNvml(spec[len("sim:"):], os.environ.get("SERVESWEEP_SIM_GPU") or None)
    else:
        import pynvml as nv  # nvidia-ml-py

    nv.nvmlInit()
    return nv


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def handles(nv, gpus):
    """[(index, uuid, handle)] of the named GPUs (indexes or UUIDs), or of every GPU."""
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nv.nvmlDeviceGetUUID(h))
        if not gpus or str(i) in gpus or uuid in gpus:
            out.append((i, uuid, h))
    missing = [g for g in gpus if not any(g in (str(i), u) for i, u, _ in out)]
    if missing:
        raise Failure(f"no such GPU on this host: {', '.join(missing)}")
    return out


class Failure(Exception):
    pass


def read_record(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_record(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def set_one(nv, idx, uuid, h, watts):
    """Set `watts` on one GPU through NVML, else nvidia-smi; the limit the driver then enforces, and how."""
    try:
        nv.nvmlDeviceSetPowerManagementLimit(h, int(round(watts * 1000)))
        via = "nvml"
    except nv.NVMLError as e:
        smi = None if getattr(nv, "SIM", False) else shutil.which("nvidia-smi")  # the stand-in has no nvidia-smi
        if smi is None:
            raise Failure(f"GPU {idx} ({uuid}): NVML refused {watts:g} W: {e}") from None
        r = subprocess.run([smi, "-i", uuid, "-pl", f"{watts:g}"], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise Failure(
                f"GPU {idx} ({uuid}): NVML refused {watts:g} W ({e}) and nvidia-smi -pl too: "
                f"{(r.stdout + r.stderr).strip()[-300:]}"
            ) from None
        via = "nvidia-smi"
    return nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, via


def do_set(a, nv, out):
    path = os.path.join(a.workdir, RECORD)
    rec = read_record(path) or {"gpus": {}}
    targets = handles(nv, a.gpus)
    for idx, uuid, h in targets:
        if uuid not in rec["gpus"]:  # the original is the limit before our first set: a crash's leftover keeps it
            lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
            rec["gpus"][uuid] = {"index": idx, "original_w": nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                                 "min_w": lo / 1000.0, "max_w": hi / 1000.0}
    rec["requested_w"] = a.limit
    write_record(path, rec)  # before any set: a crash mid-way still has what to restore
    for idx, uuid, h in targets:
        g = rec["gpus"][uuid]
        if not g["min_w"] <= a.limit <= g["max_w"]:
            raise Failure(f"GPU {idx} ({uuid}): {a.limit:g} W is outside its allowed range "
                          f"{g['min_w']:g}-{g['max_w']:g} W")
        before = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        accepted, via = set_one(nv, idx, uuid, h, a.limit)
        out["changed"] = out["changed"] or accepted != before
        out["gpus"].append({"index": idx, "uuid": uuid, "original_w": g["original_w"], "accepted_w": accepted,
                            "min_w": g["min_w"], "max_w": g["max_w"], "via": via})
    out["record"] = path


def do_restore(a, nv, out):
    path = os.path.join(a.workdir, RECORD)
    rec = read_record(path)
    if rec is None:
        return
    by_uuid = {u: (i, h) for i, u, h in handles(nv, [])}
    for uuid, g in rec["gpus"].items():
        if uuid not in by_uuid:
            raise Failure(f"recorded GPU {uuid} is not on this host any more")
        idx, h = by_uuid[uuid]
        before = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        accepted, via = set_one(nv, idx, uuid, h, g["original_w"]) if before != g["original_w"] else (before, "")
        out["changed"] = out["changed"] or accepted != before
        out["gpus"].append({"index": idx, "uuid": uuid, "original_w": g["original_w"], "accepted_w": accepted,
                            "min_w": g["min_w"], "max_w": g["max_w"], "via": via})
        if accepted != g["original_w"]:
            raise Failure(f"GPU {idx} ({uuid}): restored to {g['original_w']:g} W, the driver enforces {accepted:g} W")
    os.unlink(path)


def do_show(a, nv, out):
    for idx, uuid, h in handles(nv, a.gpus):
        lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
        out["gpus"].append({"index": idx, "uuid": uuid, "name": _text(nv.nvmlDeviceGetName(h)),
                            "limit_w": nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                            "default_w": nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0,
                            "enforced_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
                            "min_w": lo / 1000.0, "max_w": hi / 1000.0})
    out["recorded"] = read_record(os.path.join(a.workdir, RECORD))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state", choices=["set", "restored", "show"], required=True)
    p.add_argument("--limit", type=float, default=None, help="W (--state set)")
    p.add_argument("--gpus", default="", help="NVML indexes or UUIDs, comma-separated; empty: every GPU")
    p.add_argument("--workdir", required=True)
    p.add_argument("--nvml", default="pynvml", help="pynvml, or sim:STATE (the emulator's stand-in)")
    a = p.parse_args(argv)
    a.gpus = [g.strip() for g in a.gpus.split(",") if g.strip()]
    out = {"changed": False, "state": a.state, "requested_w": a.limit, "gpus": [], "record": ""}
    try:
        if a.state == "set" and a.limit is None:
            raise Failure("--state set needs --limit W")
        os.makedirs(a.workdir, exist_ok=True)
        nv = load_nvml(a.nvml)
        try:
            {"set": do_set, "restored": do_restore, "show": do_show}[a.state](a, nv, out)
        finally:
            nv.nvmlShutdown()
    except Exception as e:  # Failure, NVMLError, no pynvml: said, not a traceback
        out["error"] = f"{type(e).__name__}: {e}" if not isinstance(e, Failure) else str(e)
        print(json.dumps(out))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
