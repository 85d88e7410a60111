"""The generated Protobuf modules of include/meridian/*.proto.

They are generated at build time (CMake target `meridian_python`, see
python/CMakeLists.txt) into <build>/python/meridian/*_pb2.py; the generated
code imports its dependencies as `meridian.report_pb2` etc. (the .proto
import paths), so that directory must be importable as the package
`meridian`. Where they are looked for, in order:

1. an importable `meridian` package (PYTHONPATH=<build>/python);
2. the directory named by $MERIDIAN_PYTHON_PROTO (the <build>/python one);
3. build/python of the source tree this file belongs to (what tools/build
   makes).

Anything else raises ImportError saying how to generate them.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_BUILD_DIR = os.path.normpath(os.path.join(_HERE, "..", "..", "build",
                                                   "python"))


def _import_generated():
    try:
        return (importlib.import_module("meridian.wire_pb2"),
                importlib.import_module("meridian.job_pb2"),
                importlib.import_module("meridian.report_pb2"))
    except ImportError:
        pass
    tried = []
    for candidate in (os.environ.get("MERIDIAN_PYTHON_PROTO"),
                      _DEFAULT_BUILD_DIR):
        if not candidate:
            continue
        tried.append(candidate)
        if not os.path.isfile(os.path.join(candidate, "meridian",
                                           "wire_pb2.py")):
            continue
        sys.path.insert(0, candidate)
        # A failed import above may have cached an unrelated `meridian`.
        sys.modules.pop("meridian", None)
        return (importlib.import_module("meridian.wire_pb2"),
                importlib.import_module("meridian.job_pb2"),
                importlib.import_module("meridian.report_pb2"))
    raise ImportError(
        "the generated Protobuf modules meridian/*_pb2.py were not found "
        "(looked on sys.path and in: " + ", ".join(tried) + "). Build them "
        "with `cmake --build build --target meridian_python` (or "
        "tools/build) and put build/python on PYTHONPATH, or set "
        "MERIDIAN_PYTHON_PROTO to that directory. They need the Debian "
        "package python3-protobuf.")


wire_pb2, job_pb2, report_pb2 = _import_generated()
