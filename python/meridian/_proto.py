"""Where the generated Protobuf modules (meridian/*_pb2.py) come from.

The wire schemas are include/meridian/*.proto; `protoc --python_out`
turns each into meridian/<name>_pb2.py, whose code imports its
dependencies as `meridian.report_pb2` and so on. They are part of this
package in two ways:

- installed (`pip install ./python`): setup.py runs protoc at build time
  and puts them next to this file;
- from a source tree (PYTHONPATH=<build>/python:python, as ctest runs the
  tests): the CMake target `meridian_python` writes them into
  <build>/python/meridian/ (a plain directory, no __init__.py, so it never
  shadows this package), and `extend_package_path` adds that directory to
  this package's __path__ so `meridian.wire_pb2` resolves there.

Candidates for the second way, in order: a `meridian` directory holding
wire_pb2.py under any sys.path entry; $MERIDIAN_PYTHON_PROTO/meridian;
build/python/meridian of the source tree this file belongs to.
"""

import os
import sys
from typing import List, MutableSequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROBE = "wire_pb2.py"


def _candidates() -> List[str]:
    found = []
    for entry in sys.path:
        found.append(os.path.join(entry or os.getcwd(), "meridian"))
    env = os.environ.get("MERIDIAN_PYTHON_PROTO")
    if env:
        found.append(os.path.join(env, "meridian"))
    found.append(os.path.normpath(os.path.join(_HERE, "..", "..", "build",
                                               "python", "meridian")))
    return found


def extend_package_path(path: MutableSequence[str]) -> None:
    """Makes the generated modules importable as meridian.<name>_pb2.

    `path` is the package's __path__; a directory holding them is appended
    unless they are already in the package. ImportError saying how to make
    them when none is found."""
    if os.path.isfile(os.path.join(_HERE, _PROBE)):
        return
    for candidate in _candidates():
        if os.path.isfile(os.path.join(candidate, _PROBE)):
            if os.path.abspath(candidate) not in (os.path.abspath(p)
                                                  for p in path):
                path.append(candidate)
            return
    raise ImportError(
        "the generated Protobuf modules meridian/*_pb2.py were not found "
        "(not installed with the package, and not in a `meridian` directory "
        "on sys.path, $MERIDIAN_PYTHON_PROTO or the source tree's "
        "build/python). Install the package (docs/python.md: `pip install "
        "--no-build-isolation --no-index ./python` in a venv), or build them "
        "with `cmake --build build --target meridian_python` and put "
        "build/python on PYTHONPATH. They need the Debian packages "
        "protobuf-compiler and python3-protobuf.")
