"""Build the C++ extension in place: `python hf_tpu/runtime/native/build.py` (run by `make install`).

Compiles csrc/*.cpp with the system C++ compiler against the installed torch, straight with
the compiler (no ninja or setuptools needed), into this package folder, with a stamp of what it was
built from. When no compiler is there the build says so and exits 0: hf_tpu then runs its pure-Python
path (one warning at first use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __package__ in (None, ""):  # run as a script: stay out of hf_tpu's import (it registers the device)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    sys.path.insert(0, str(HERE))
    import artifact  # type: ignore[no-redef]
else:
    from hf_tpu.runtime.native import artifact


def compile_command(output: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise FileNotFoundError("no C++ compiler found (set CXX or install g++)")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libdirs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        cxx,
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c++17",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DTORCH_EXTENSION_NAME={artifact.MODULE}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-I{p}" for p in includes),
        *(str(source) for source in artifact.SOURCES),
        *(f"-L{p}" for p in libdirs),
        *(f"-Wl,-rpath,{p}" for p in libdirs),
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        "-o",
        str(output),
    ]


def build(force: bool = False, quiet: bool = False) -> bool:
    """Build unless an up-to-date library is there; True when a usable library exists afterwards."""
    if not force and artifact.is_current():
        if not quiet:
            print(f"hf_tpu native: up to date ({artifact.library_path().name})")
        return True
    output = artifact.library_path()
    partial = output.with_suffix(".partial")
    try:
        command = compile_command(partial)
    except (ImportError, FileNotFoundError) as exc:
        print(f"hf_tpu native: not built ({exc}); hf_tpu will use its pure-Python path", file=sys.stderr)
        return False
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        print(
            "hf_tpu native: the C++ build failed; hf_tpu will use its pure-Python path. Compiler output:\n"
            + done.stderr[-4000:],
            file=sys.stderr,
        )
        return False
    partial.replace(output)
    artifact.write_stamp()
    if not quiet:
        size = output.stat().st_size / 1e6
        print(f"hf_tpu native: built {output.name} in {time.perf_counter() - start:.0f} s ({size:.1f} MB)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--require", action="store_true", help="exit 1 when the build fails")
    args = parser.parse_args(argv)
    ok = build(force=args.force)
    return 0 if ok or not args.require else 1


if __name__ == "__main__":
    raise SystemExit(main())
