"""Builds the package `meridian`: its Python sources and the Protobuf
modules of Meridian's wire schemas, which protoc generates from
../include/meridian/*.proto into the built package while building (so
they always match the schemas of this source tree; the schemas are the
one contract, and protoc comes from the same Debian source package as the
python3-protobuf runtime that imports them). Metadata: pyproject.toml."""

import atexit
import glob
import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "include"))


class BuildPyWithProtos(build_py):
    """build_py, then protoc --python_out into the build directory."""

    def run(self) -> None:
        super().run()
        protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "meridian",
                                               "*.proto")))
        if not protos:
            raise SystemExit("no schemas in %s/meridian: build the package "
                             "from a Meridian source tree (its python/ "
                             "directory)" % PROTO_ROOT)
        protoc = os.environ.get("PROTOC") or shutil.which("protoc")
        if protoc is None:
            raise SystemExit("protoc not found: install the Debian package "
                             "protobuf-compiler (tools/install-deps)")
        relative = [os.path.relpath(p, PROTO_ROOT) for p in protos]
        out = os.path.abspath(self.build_lib)
        os.makedirs(os.path.join(out, "meridian"), exist_ok=True)
        subprocess.run([protoc, "-I" + PROTO_ROOT, "--python_out=" + out] +
                       relative, check=True, cwd=PROTO_ROOT)


# Build in a fresh directory outside the source tree: nothing left behind
# in python/, and no stale module of an earlier build in the wheel.
_BUILD_BASE = tempfile.mkdtemp(prefix="meridian-build-")
atexit.register(shutil.rmtree, _BUILD_BASE, True)

setup(cmdclass={"build_py": BuildPyWithProtos},
      options={"build": {"build_base": _BUILD_BASE},
               "egg_info": {"egg_base": _BUILD_BASE}})
