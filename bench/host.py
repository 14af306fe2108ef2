"""What the results files say of the CPU: the name /proc/cpuinfo gives and, since a VM often
names only the vendor ("AMD EPYC"), its family and model and the vector units the kernels use,
so runs on different hosts of one name can be told apart."""

from __future__ import annotations

import os
import platform
from pathlib import Path

_UNITS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("amx_tile", "AMX"))


def describe_cpu() -> str:
    """E.g. "AMD EPYC (family 26 model 2; AVX2, AVX-512, VNNI), 2 CPUs"."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    units = [label for flag, label in _UNITS if flag in flags]
    detail = []
    if "cpu family" in fields:
        detail.append(f"family {fields['cpu family']} model {fields.get('model', '?')}")
    if units:
        detail.append(", ".join(units))
    described = f"{name} ({'; '.join(detail)})" if detail else name
    return f"{described}, {os.cpu_count()} CPUs"
