#!/usr/bin/python3
"""The package installs with the one documented command, offline, and
imports from outside the source tree with no PYTHONPATH (docs/python.md,
"Installation"):

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-index ./python

run here with Debian's python3 into <build>/python-venv. The installed
package carries the Protobuf modules its build generated from
include/meridian/*.proto: the same bytes the CMake target meridian_python
generates from them (so they match the schemas of this tree), and the
source tree is left as it was. Quick tier (a few seconds).
"""

import filecmp
import os
import shutil
import subprocess
import sys
import textwrap
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

VENV_COMMAND = "python3 -m venv --system-site-packages .venv"
PIP_COMMAND = ".venv/bin/pip install --no-build-isolation --no-index ./python"


def clean_env():
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "MERIDIAN_PYTHON_PROTO",
                 "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


class PackageInstallTest(unittest.TestCase):

    def run_checked(self, argv, cwd):
        done = subprocess.run(argv, cwd=cwd, env=clean_env(),
                              capture_output=True, text=True, timeout=600)
        self.assertEqual(done.returncode, 0, "%s failed:\n%s\n%s" %
                         (" ".join(argv), done.stdout, done.stderr))
        return done.stdout

    def test_documented_command_installs_an_importable_package(self):
        source = os.path.abspath(live_site.ARGS.source)
        build = os.path.abspath(live_site.ARGS.build or
                                os.path.join(source, "build"))
        with open(os.path.join(source, "docs", "python.md")) as f:
            guide = f.read()
        for command in (VENV_COMMAND, PIP_COMMAND):
            self.assertIn(command, guide, "docs/python.md must show the "
                          "command this test runs")
        venv = os.path.join(build, "python-venv")
        shutil.rmtree(venv, ignore_errors=True)
        status_before = self.git_status(source)
        # The documented commands, with the venv in the build tree and
        # Debian's python3.
        self.run_checked([sys.executable, "-m", "venv",
                          "--system-site-packages", venv], cwd=source)
        self.run_checked([os.path.join(venv, "bin", "pip"), "install",
                          "--no-build-isolation", "--no-index", "./python"],
                         cwd=source)
        elsewhere = live_site.make_temp_dir("python-install")
        self.addCleanup(live_site.remove_dir, elsewhere)
        probe = textwrap.dedent("""
            import os, sys
            import meridian
            from meridian import client, data, wire_pb2, job_pb2
            assert wire_pb2.EVAL_TASK == 21, wire_pb2.EVAL_TASK
            assert meridian.Session and meridian.Evaluator
            assert meridian.save_initial_weights and meridian.load_weights
            tree = {os.path.realpath(p) for p in %r}
            assert not tree & {os.path.realpath(p) for p in sys.path}, sys.path
            print(os.path.dirname(meridian.__file__))
            print(len(meridian.__path__))
        """ % ([os.path.join(source, "python"),
                os.path.join(build, "python")],))
        out = self.run_checked([os.path.join(venv, "bin", "python"), "-c",
                                probe], cwd=elsewhere).split()
        installed, path_entries = out[0], out[1]
        self.assertTrue(installed.startswith(venv), installed)
        self.assertEqual(path_entries, "1", "the *_pb2 modules are inside "
                         "the installed package")
        generated = os.path.join(build, "python", "meridian")
        names = sorted(n for n in os.listdir(generated)
                       if n.endswith("_pb2.py"))
        self.assertIn("wire_pb2.py", names)
        for name in names:
            self.assertTrue(filecmp.cmp(os.path.join(installed, name),
                                        os.path.join(generated, name),
                                        shallow=False),
                            "%s differs from the schema's" % name)
        self.assertEqual(self.git_status(source), status_before,
                         "the install left files in the source tree")

    @staticmethod
    def git_status(source):
        if shutil.which("git") is None or \
                not os.path.exists(os.path.join(source, ".git")):
            return ""
        done = subprocess.run(["git", "status", "--porcelain", "--ignored",
                               "python"], cwd=source, capture_output=True,
                              text=True)
        # Bytecode the other tests' imports write is not the install's.
        return "\n".join(line for line in done.stdout.splitlines()
                         if "__pycache__" not in line)


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
