"""Build the int4 custom op library (`csrc/int4_matmul.c`) into the environment.

    python -m api.engine.int4_build [--require]

The op is compiled against ONNX Runtime's C API header, which no Python wheel ships. Looked for,
in order: `$ORT_INCLUDE_DIR`, the system's `/usr/include/onnxruntime`, a copy fetched earlier,
and else Debian's `libonnxruntime-dev` package, fetched with apt from the suite named in
`DEBIAN_SUITE` (the package is not in Debian 12) and unpacked without installing anything. The
library asks ONNX Runtime for the API version of that header, which any newer runtime serves.

Without a compiler or a header the engine runs ONNX Runtime's own kernel: the build then says
why in one line and exits 0, or 1 with `--require` (CI, so a broken build cannot pass unseen).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from api.engine.int4_kernel import default_library, runs_here

SOURCES = [Path(__file__).parent / "csrc" / name for name in ("int4_matmul.c", "attention.c")]
HEADER = "onnxruntime_c_api.h"
DEBIAN_PACKAGE = "libonnxruntime-dev"
DEBIAN_SUITE = "trixie"
_APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")


class BuildError(Exception):
    """Why the library was not built, in one line."""


def fetched_headers() -> Path:
    return Path(sys.prefix) / "include" / "tokenshop-ort"


def find_headers() -> Path:
    """A dir holding `onnxruntime_c_api.h`, fetching Debian's package when none is here."""
    candidates = [os.environ.get("ORT_INCLUDE_DIR"), "/usr/include/onnxruntime", fetched_headers()]
    for candidate in (Path(c) for c in candidates if c):
        if (candidate / HEADER).is_file():
            return candidate
    return _fetch_from_debian(fetched_headers())


def _fetch_from_debian(dest: Path) -> Path:
    """Unpack the headers of Debian's package into `dest`, through the machine's own apt
    mirror with the suite swapped; nothing is installed and apt's own lists stay as they were."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise BuildError("no ONNX Runtime C header here and no apt to fetch one")
    if not _APT_SOURCES.is_file():
        raise BuildError(f"no ONNX Runtime C header here and no {_APT_SOURCES} to fetch one")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sources = work / "suite.sources"
        sources.write_text(_suite_sources(_APT_SOURCES.read_text(encoding="utf-8")))
        (work / "lists" / "partial").mkdir(parents=True)
        apt = [
            "-o", f"Dir::Etc::sourcelist={sources}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={work / 'lists'}",
            "-o", "APT::Sandbox::User=root",
        ]  # fmt: skip
        _run(["apt-get", "-q", *apt, "update"], work)
        _run(["apt-get", "-q", *apt, "download", DEBIAN_PACKAGE], work)
        package = next(work.glob(f"{DEBIAN_PACKAGE}_*.deb"), None)
        if package is None:
            raise BuildError(f"apt fetched no {DEBIAN_PACKAGE} package")
        _run(["dpkg-deb", "-x", str(package), str(work / "root")], work)
        found = next((work / "root").rglob(HEADER), None)
        if found is None:
            raise BuildError(f"{DEBIAN_PACKAGE} holds no {HEADER}")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(found.parent, dest)
    return dest


def _suite_sources(text: str) -> str:
    """The first stanza of a deb822 sources file, for `DEBIAN_SUITE`'s main component only."""
    stanza = text.strip().split("\n\n")[0]
    stanza = re.sub(r"(?m)^Suites:.*$", f"Suites: {DEBIAN_SUITE}", stanza)
    stanza = re.sub(r"(?m)^Components:.*$", "Components: main", stanza)
    return stanza + "\n"


def _run(command: list[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"{command[0]} {command[-1]} failed: {last[0]}")


def build(library: Path | None = None) -> Path:
    """Compile the op into `library` (default: `default_library()`); the path written."""
    library = library or default_library()
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("no C compiler ($CC, cc or gcc) to build the int4 kernel")
    headers = find_headers()
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(".partial")
    command = [compiler, "-O3", "-std=c11", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror"]
    command += [f"-I{headers}", *map(str, SOURCES), "-lm", "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{Path(compiler).name} failed: {result.stderr.strip()[:500]}")
    partial.replace(library)
    return library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the int4 custom op library.")
    parser.add_argument("--require", action="store_true", help="fail when it cannot be built")
    args = parser.parse_args(argv)
    try:
        library = build()
    except BuildError as exc:
        print(f"int4 kernel not built: {exc}; serving uses ONNX Runtime's kernel")
        return 1 if args.require else 0
    note = "" if runs_here(library) else " (this CPU lacks AVX2/FMA: it will not be used)"
    print(f"int4 kernel built: {library}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
