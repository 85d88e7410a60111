#!/usr/bin/env python3
"""Offline checks of the deployment recipes under deploy/.

  test_deploy.py --meridian BIN --source DIR [unittest args, e.g. DockerTest]

DockerTest   deploy/docker/Dockerfile builds from tools/debian-packages.txt
             and its runtime stage installs exactly what the binary links.
K8sTest      every YAML parses; every job file used by an overlay validates
             (`meridian validate`); names and ports agree between the job
             files and the manifests, also as `kubectl kustomize` renders each
             overlay (skipped, with the reason, without kubectl).
SystemdTest  the unit templates parse (`systemd-analyze verify` when there),
             run real `meridian` subcommands with real flags, and are hardened.

Needs PyYAML (Debian python3-yaml, in tools/debian-packages.txt).
"""

import argparse
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

try:
    import yaml
except ImportError:  # say what to install instead of a traceback
    sys.exit("test_deploy.py needs PyYAML: apt-get install python3-yaml "
             "(it is in tools/debian-packages.txt)")

MERIDIAN = None  # path of the meridian binary (--meridian)
SOURCE = None    # repository root (--source)


def src(*parts):
    return os.path.join(SOURCE, *parts)


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


# --- job files (Protobuf text format) ----------------------------------------

_TOKEN = re.compile(r'''\s+|\#[^\n]*|"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|'''
                    r'''([{}<>:\[\],;])|([^\s{}<>:\[\],;"'#]+)''')


def parse_pbtxt(text):
    """A JobConfig in text format as nested dicts: field -> [values]; a
    message value is a dict. Enough for the fields these tests read;
    `meridian validate` is the real parser."""
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot tokenize at {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group(1) is not None or m.group(2) is not None:
            tokens.append(("str", m.group(1) if m.group(1) is not None
                           else m.group(2)))
        elif m.group(3):
            tokens.append(("sym", m.group(3)))
        elif m.group(4):
            tokens.append(("word", m.group(4)))

    def message(i, closer):
        fields = {}
        while i < len(tokens):
            kind, value = tokens[i]
            if kind == "sym" and value in (",", ";"):
                i += 1
                continue
            if kind == "sym" and value == closer:
                return fields, i + 1
            if kind != "word":
                raise ValueError(f"expected a field name, got {value!r}")
            name = value
            i += 1
            if tokens[i] == ("sym", ":"):
                i += 1
            kind, value = tokens[i]
            if kind == "sym" and value in ("{", "<"):
                sub, i = message(i + 1, "}" if value == "{" else ">")
                fields.setdefault(name, []).append(sub)
            else:
                fields.setdefault(name, []).append(value)
                i += 1
        if closer is not None:
            raise ValueError("unclosed message")
        return fields, i

    return message(0, None)[0]


def first(fields, name, default=None):
    values = fields.get(name)
    return values[0] if values else default


def split_endpoint(endpoint):
    """('HOST', PORT) of tcp://HOST:PORT."""
    m = re.fullmatch(r"tcp://(.+):(\d+)", endpoint)
    if not m:
        raise ValueError(f"not a tcp://HOST:PORT endpoint: {endpoint!r}")
    return m.group(1), int(m.group(2))


def split_host_port(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


class Job:
    """What the deployment recipes must agree with in a job file."""

    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.text = f.read()
        self.fields = parse_pbtxt(self.text)
        self.sites = []
        for site in self.fields.get("site", []):
            self.sites.append({
                "name": first(site, "name"),
                "address": first(site, "address", "tcp://127.0.0.1:7100"),
                "mirror_address": first(site, "mirror_address",
                                        "tcp://127.0.0.1:7200"),
                "metrics_address": first(site, "metrics_address"),
                "server_site": first(site, "server_site", ""),
                "workers": sum(int(first(g, "count", 1))
                               for g in site.get("workers", [])),
                "curve_public_key": first(site, "curve_public_key"),
            })
        wan = first(self.fields, "wan", {})
        self.wanem_host = first(wan, "wanem_host", "")
        self.route_base_port = int(first(wan, "route_base_port", 7400))
        self.wan_metrics_address = first(wan, "metrics_address", "")
        sync = first(self.fields, "sync", {})
        self.sync_kind = first(sync, "kind", "GAIA")
        self.topology = first(sync, "topology", "FULL_MESH")
        security = first(self.fields, "security", {})
        self.curve = first(security, "curve", "true") == "true"  # default on

    def site(self, name):
        return next(s for s in self.sites if s["name"] == name)

    def routes(self):
        """{port: (from, to, kind)} of the standalone wanem (the addressing
        contract): sync route (from, to) at base + from*S + to for every
        ordered pair of sites that sync, worker route at base + S*S +
        from*S + to for a site whose server_site is `to`."""
        if not self.wanem_host:
            return {}
        if self.topology != "FULL_MESH":
            raise NotImplementedError(
                f"{self.path}: these tests compute wanem routes for "
                f"FULL_MESH only, not {self.topology}")
        n = len(self.sites)
        index = {s["name"]: i for i, s in enumerate(self.sites)}
        servers = [i for i, s in enumerate(self.sites) if not s["server_site"]]
        routes = {}
        if self.sync_kind != "SYNC_NONE":
            for a in servers:
                for b in servers:
                    if a != b:
                        routes[self.route_base_port + a * n + b] = (
                            self.sites[a]["name"], self.sites[b]["name"],
                            "sync")
        for i, s in enumerate(self.sites):
            if s["server_site"]:
                to = index[s["server_site"]]
                routes[self.route_base_port + n * n + i * n + to] = (
                    s["name"], s["server_site"], "workers")
        return routes


def meridian_help(subcommand):
    result = run([MERIDIAN, subcommand, "--help"])
    assert result.returncode == 0, result.stderr
    return result.stdout


def flags_in_help(help_text):
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))


def debian_packages():
    packages = []
    with open(src("tools", "debian-packages.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                packages.append(line)
    return packages


# --- Docker -------------------------------------------------------------------

def dockerfile_stages(path):
    """[(from, name, [(INSTRUCTION, argument)])] with continuation lines
    joined and comments dropped."""
    with open(path) as f:
        raw = f.read()
    lines, current = [], ""
    for line in raw.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    stages = []
    for line in lines:
        instruction, _, argument = line.strip().partition(" ")
        instruction = instruction.upper()
        argument = argument.strip()
        if instruction == "FROM":
            words = argument.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" \
                else None
            stages.append((words[0], name, []))
        else:
            stages[-1][2].append((instruction, argument))
    return stages


def apt_installs(instructions):
    """Packages of every `apt-get install` in RUN instructions, ${ARG}
    replaced by the ARG defaults of the stage."""
    args = {}
    packages = []
    for instruction, argument in instructions:
        if instruction == "ARG":
            name, _, default = argument.partition("=")
            args[name.strip()] = default.strip()
        if instruction != "RUN":
            continue
        text = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: args.get(m.group(1) or m.group(2), ""),
                      argument)
        for command in re.split(r"&&|;|\|\|", text):
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                packages += [w for w in words[2:] if not w.startswith("-")]
    return packages


def package_depends(package):
    """Names in the Depends of a Debian package (installed, else from the apt
    cache); None when neither knows it."""
    for command in (["dpkg-query", "-W", "-f=${Depends}", package],
                    ["apt-cache", "show", "--no-all-versions", package]):
        if not shutil.which(command[0]):
            continue
        result = run(command)
        if result.returncode != 0 or not result.stdout.strip():
            continue
        text = result.stdout
        if command[0] == "apt-cache":
            m = re.search(r"^Depends: (.*)$", text, re.M)
            text = m.group(1) if m else ""
        return {re.split(r"[\s(:]", alt.strip())[0]
                for part in text.split(",") for alt in part.split("|")
                if alt.strip()}
    return None


def owning_package(library_path):
    """The Debian package that ships a shared library (dpkg -S), trying the
    path as given, resolved, and with or without the /usr prefix (usrmerge)."""
    candidates = [library_path, os.path.realpath(library_path)]
    for path in list(candidates):
        if path.startswith("/usr/"):
            candidates.append(path[4:])
        else:
            candidates.append("/usr" + path)
    for path in candidates:
        result = run(["dpkg", "-S", path])
        if result.returncode == 0:
            return result.stdout.split(":")[0].strip()
    return None


# Packages every debian:bookworm-slim image has (Priority: required), which
# the runtime stage need not install.
BASE_IMAGE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6"}


class DockerTest(unittest.TestCase):
    def setUp(self):
        self.path = src("deploy", "docker", "Dockerfile")
        self.stages = dockerfile_stages(self.path)

    def test_two_stages_on_bookworm(self):
        self.assertGreaterEqual(len(self.stages), 2)
        for image, _, _ in self.stages:
            self.assertRegex(image, r"^debian:bookworm(-slim)?$")

    def test_build_stage_installs_the_package_list(self):
        # The build stage runs tools/install-deps on tools/debian-packages.txt,
        # so it installs exactly the developer machine's packages.
        _, _, instructions = self.stages[0]
        copies = " ".join(a for i, a in instructions if i == "COPY")
        runs = [a for i, a in instructions if i == "RUN"]
        self.assertIn("tools/debian-packages.txt", copies)
        self.assertIn("tools/install-deps", copies)
        self.assertTrue(any(re.search(r"(^|\s)tools/install-deps(\s|$)", r)
                            for r in runs), runs)
        self.assertFalse(apt_installs(instructions),
                         "the build stage must not name packages itself")
        self.assertTrue(any("--target meridian" in r for r in runs), runs)

    def test_copied_sources_exist(self):
        for _, _, instructions in self.stages:
            for instruction, argument in instructions:
                if instruction != "COPY" or argument.startswith("--from"):
                    continue
                for source in argument.split()[:-1]:
                    if source != ".":
                        self.assertTrue(os.path.exists(src(source)), source)

    def runtime_packages(self):
        return apt_installs(self.stages[-1][2])

    def test_runtime_packages_are_runtime_halves_of_the_list(self):
        listed = debian_packages()
        runtime = self.runtime_packages()
        self.assertIn("libzmq5", runtime)
        self.assertIn("dataset-fashion-mnist", runtime)
        unknown = []
        for package in runtime:
            if package in listed:
                continue
            owners = [d for d in listed if d.endswith("-dev")
                      and package in (package_depends(d) or set())]
            if not owners:
                unknown.append(package)
        self.assertFalse(
            unknown, f"runtime packages {unknown} are not the runtime library "
            "of any -dev package in tools/debian-packages.txt (nor listed "
            "there): keep the Dockerfile's runtime stage in step with the list")

    def test_runtime_has_every_library_the_binary_needs(self):
        objdump = run(["objdump", "-p", MERIDIAN])
        if objdump.returncode != 0:
            self.skipTest("objdump cannot read the binary: " + objdump.stderr)
        needed = re.findall(r"^\s*NEEDED\s+(\S+)", objdump.stdout, re.M)
        self.assertIn("libzmq.so.5", needed)
        ldd = run(["ldd", MERIDIAN]).stdout
        paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
        have = set(self.runtime_packages()) | BASE_IMAGE_PACKAGES
        missing = []
        for library in needed:
            self.assertIn(library, paths, f"ldd does not resolve {library}")
            package = owning_package(paths[library])
            self.assertIsNotNone(package,
                                 f"no Debian package ships {paths[library]}")
            if package not in have:
                missing.append(f"{library} ({package})")
        self.assertFalse(missing, "the runtime stage of deploy/docker/"
                         f"Dockerfile does not install {missing}")

    def test_dockerignore_keeps_build_output_out(self):
        with open(src(".dockerignore")) as f:
            patterns = {line.strip() for line in f
                        if line.strip() and not line.startswith("#")}
        for pattern in ("build", "build-*", ".git", "runs"):
            self.assertIn(pattern, patterns)


# --- Kubernetes ---------------------------------------------------------------

K8S = None  # set in main: deploy/k8s
REGION_OVERLAYS = ("us", "eu", "ap")
OVERLAYS = REGION_OVERLAYS + ("emulated-wan",)


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def overlay_job_path(overlay):
    """The job file an overlay puts into ConfigMap meridian-job."""
    directory = os.path.join(K8S, "overlays", overlay)
    seen = set()
    while True:
        kustomization = load_yaml_docs(
            os.path.join(directory, "kustomization.yaml"))[0]
        for generator in kustomization.get("configMapGenerator", []):
            if generator["name"] == "meridian-job":
                key, _, file = generator["files"][0].partition("=")
                assert key == "job.pbtxt", generator
                return os.path.join(directory, file)
        # Otherwise a resource directory generates it.
        nxt = [os.path.normpath(os.path.join(directory, r))
               for r in kustomization.get("resources", [])
               if os.path.isdir(os.path.join(directory, r))
               and os.path.exists(os.path.join(directory, r,
                                               "kustomization.yaml"))]
        nxt = [d for d in nxt if d not in seen and any(
            g["name"] == "meridian-job" for g in load_yaml_docs(
                os.path.join(d, "kustomization.yaml"))[0].get(
                    "configMapGenerator", []))]
        if not nxt:
            raise AssertionError(f"overlay {overlay}: no ConfigMap meridian-job")
        seen.add(nxt[0])
        directory = nxt[0]


def filled_job(job_path, tmp):
    """A copy of the job file with CURVE placeholders replaced by fresh keys
    (meridian keygen + deploy/k8s/fill-keys), as a user does before applying."""
    tmp = tempfile.mkdtemp(dir=tmp)
    copy = os.path.join(tmp, os.path.basename(job_path))
    shutil.copy(job_path, copy)
    with open(copy) as f:
        sites = sorted(set(re.findall(r"REPLACE-WITH-([\w.-]+)\.pub", f.read())))
    if not sites:
        return copy
    keys = os.path.join(tmp, "keys")
    for site in sites:
        result = run([MERIDIAN, "keygen", "--site", site, "--out", keys])
        assert result.returncode == 0, (
            f"meridian keygen --site {site}: {result.stdout}{result.stderr}")
        mode = stat.S_IMODE(os.stat(os.path.join(keys, site + ".key")).st_mode)
        assert mode & 0o077 == 0, f"{site}.key has mode {mode:o}"
    result = run([os.path.join(K8S, "fill-keys"), keys, copy])
    assert result.returncode == 0, result.stderr
    return copy


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def env_value(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def selects(service, workload):
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return all(labels.get(k) == v
               for k, v in service["spec"]["selector"].items())


def container_port(workload, target):
    """The number of a Service targetPort (a number or a port name) in the
    workload's first container."""
    ports = pod_spec(workload)["containers"][0].get("ports", [])
    if isinstance(target, int):
        return target if any(p["containerPort"] == target for p in ports) \
            else None
    return next((p["containerPort"] for p in ports if p.get("name") == target),
                None)


class K8sTest(unittest.TestCase):
    tmp = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="meridian-deploy-test-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_yaml_file_parses_with_required_fields(self):
        count = 0
        for root, _, files in os.walk(K8S):
            for name in files:
                if not name.endswith((".yaml", ".yml")):
                    continue
                path = os.path.join(root, name)
                count += 1
                for doc in load_yaml_docs(path):
                    self.assertIn("apiVersion", doc, path)
                    self.assertIn("kind", doc, path)
                    if doc["kind"] not in ("Kustomization", "Component"):
                        self.assertIn("name", doc.get("metadata", {}), path)
        self.assertGreaterEqual(count, 12)

    def test_every_overlay_job_validates(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                job = filled_job(overlay_job_path(overlay), self.tmp)
                result = run([MERIDIAN, "validate", job])
                self.assertEqual(result.returncode, 0,
                                 f"{overlay}: {result.stdout}{result.stderr}")

    def test_job_files_use_the_manifests_ports(self):
        # base: one port per address kind, the same for every site (each
        # site server has its own pod and Service).
        docs = load_yaml_docs(os.path.join(K8S, "base", "site-server.yaml"))
        ports = {p["name"]: p["containerPort"]
                 for p in pod_spec(docs[0])["containers"][0]["ports"]}
        service = load_yaml_docs(os.path.join(K8S, "base", "service.yaml"))[0]
        service_ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        self.assertEqual(ports, service_ports)
        for overlay in OVERLAYS:
            job = Job(overlay_job_path(overlay))
            for site in job.sites:
                with self.subTest(overlay=overlay, site=site["name"]):
                    self.assertEqual(split_endpoint(site["address"])[1],
                                     ports["worker"])
                    self.assertEqual(split_endpoint(site["mirror_address"])[1],
                                     ports["mirror"])
                    self.assertEqual(
                        split_host_port(site["metrics_address"])[1],
                        ports["metrics"])
                    # Workers reach their server in-cluster by its Service.
                    self.assertEqual(split_endpoint(site["address"])[0],
                                     "meridian-" + site["name"])

    def test_sites_kustomizations_match_the_job_files(self):
        for overlay in OVERLAYS:
            job = Job(overlay_job_path(overlay))
            for site in job.sites:
                k = load_yaml_docs(os.path.join(
                    K8S, "sites", site["name"], "kustomization.yaml"))[0]
                self.assertEqual(k["nameSuffix"], "-" + site["name"])
                ops = {}  # target name -> {path: value}
                for patch in k["patches"]:
                    ops[patch["target"]["name"]] = {
                        op["path"]: op["value"]
                        for op in yaml.safe_load(patch["patch"])}
                env = "/spec/template/spec/containers/0/env/0"
                for target in ("meridian", "meridian-workers"):
                    self.assertEqual(ops[target][env], {
                        "name": "MERIDIAN_SITE", "value": site["name"]})
                self.assertEqual(ops["meridian-workers"]["/spec/completions"],
                                 site["workers"])
                self.assertEqual(ops["meridian-workers"]["/spec/parallelism"],
                                 site["workers"])

    def test_wanem_exposes_exactly_the_contract_routes(self):
        job = Job(overlay_job_path("emulated-wan"))
        self.assertEqual(job.wanem_host, "meridian-wanem")
        routes = job.routes()
        self.assertEqual(sorted(routes), [7401, 7402, 7403, 7405, 7406, 7407])
        docs = load_yaml_docs(
            os.path.join(K8S, "overlays", "emulated-wan", "wanem.yaml"))
        self.check_wanem(job, by_kind(docs, "Deployment"),
                         by_kind(docs, "Service"))

    def check_wanem(self, job, deployments, services):
        routes = job.routes()
        service = services[job.wanem_host]
        deployment = next(d for d in deployments.values()
                          if selects(service, d))
        self.assertEqual(sorted(p["port"] for p in service["spec"]["ports"]),
                         sorted(routes))
        for p in service["spec"]["ports"]:
            self.assertEqual(container_port(deployment, p["targetPort"]),
                             p["port"], p)
            frm, to, _ = routes[p["port"]]
            self.assertEqual(p["name"], f"{frm}-{to}")
        container = pod_spec(deployment)["containers"][0]
        self.assertEqual(sorted(p["containerPort"] for p in container["ports"]
                                if p["name"] != "metrics"),
                         sorted(routes))
        if job.wan_metrics_address:
            metrics = split_host_port(job.wan_metrics_address)[1]
            self.assertEqual(container_port(deployment, "metrics"), metrics)
            annotations = deployment["spec"]["template"]["metadata"].get(
                "annotations", {})
            self.assertEqual(annotations.get("prometheus.io/port"),
                             str(metrics))
        self.assertEqual(container["args"][:3],
                         ["wanem", "--config", "/etc/meridian/job.pbtxt"])
        self.check_flags(container["args"])

    def check_flags(self, args):
        flags = {a.split("=")[0] for a in args if a.startswith("--")}
        unknown = flags - flags_in_help(meridian_help(args[0]))
        self.assertFalse(unknown, f"meridian {args[0]} has no {unknown}")

    # -- rendered overlays (kubectl kustomize) --

    def render(self, overlay):
        kubectl = shutil.which("kubectl")
        if not kubectl:
            self.skipTest("kubectl not installed: cannot render the overlays "
                          "(the static checks above still ran)")
        result = run([kubectl, "kustomize",
                      os.path.join(K8S, "overlays", overlay)])
        self.assertEqual(result.returncode, 0, result.stderr)
        return [d for d in yaml.safe_load_all(result.stdout) if d]

    def check_site(self, job, site, docs):
        """One site's server, workers and Service in a rendered overlay."""
        jobs = by_kind(docs, "Job")
        services = by_kind(docs, "Service")
        name = site["name"]
        servers = [j for j in jobs.values()
                   if env_value(pod_spec(j)["containers"][0],
                                "MERIDIAN_SITE") == name
                   and pod_spec(j)["containers"][0]["args"][0] == "site"]
        workers = [j for j in jobs.values()
                   if env_value(pod_spec(j)["containers"][0],
                                "MERIDIAN_SITE") == name
                   and pod_spec(j)["containers"][0]["args"][0] == "worker"]
        self.assertEqual(len(servers), 1, f"site {name}: server Jobs")
        self.assertEqual(len(workers), 1, f"site {name}: worker Jobs")
        server, worker = servers[0], workers[0]

        # The site server: its address's port, mirror port, metrics port.
        host, port = split_endpoint(site["address"])
        mirror_host, mirror_port = split_endpoint(site["mirror_address"])
        ports = {p["containerPort"]
                 for p in pod_spec(server)["containers"][0]["ports"]}
        self.assertLessEqual(
            {port, mirror_port, split_host_port(site["metrics_address"])[1]},
            ports)
        args = pod_spec(server)["containers"][0]["args"]
        self.assertEqual(args[:5], ["site", "--config",
                                    "/etc/meridian/job.pbtxt", "--site",
                                    "$(MERIDIAN_SITE)"])
        self.check_flags(args)

        # Its workers reach it at the Service named by the address's host.
        self.assertIn(host, services, f"no Service {host} for {name}")
        service = services[host]
        self.assertTrue(selects(service, server))
        self.assertFalse(selects(service, worker))
        by_port = {p["port"]: p for p in service["spec"]["ports"]}
        self.assertIn(port, by_port)
        self.assertEqual(container_port(server, by_port[port]["targetPort"]),
                         port)

        # Workers: one pod per worker, the completion index as --index.
        self.assertEqual(worker["spec"]["completionMode"], "Indexed")
        self.assertEqual(worker["spec"]["completions"], site["workers"])
        self.assertEqual(worker["spec"]["parallelism"], site["workers"])
        wargs = pod_spec(worker)["containers"][0]["args"]
        self.assertEqual(wargs[:5], ["worker", "--config",
                                     "/etc/meridian/job.pbtxt", "--site",
                                     "$(MERIDIAN_SITE)"])
        self.assertIn("--index", wargs)
        self.check_flags(wargs)

        # The peers' way in: in-cluster (the same Service) or the region's
        # LoadBalancer whose DNS name is the mirror address's host.
        if mirror_host == host:
            self.assertIn(mirror_port, by_port)
            self.assertEqual(
                container_port(server, by_port[mirror_port]["targetPort"]),
                mirror_port)
        else:
            wan = [s for s in services.values()
                   if s["metadata"].get("annotations", {}).get(
                       "external-dns.alpha.kubernetes.io/hostname")
                   == mirror_host]
            self.assertEqual(len(wan), 1,
                             f"no LoadBalancer Service named {mirror_host}")
            self.assertEqual(wan[0]["spec"]["type"], "LoadBalancer")
            self.assertTrue(selects(wan[0], server))
            self.assertEqual([p["port"] for p in wan[0]["spec"]["ports"]],
                             [mirror_port])
            self.assertEqual(container_port(
                server, wan[0]["spec"]["ports"][0]["targetPort"]), mirror_port)

        # Job file and output volume, as mounted.
        config_maps = by_kind(docs, "ConfigMap")
        claims = by_kind(docs, "PersistentVolumeClaim")
        for workload in (server, worker):
            for volume in pod_spec(workload)["volumes"]:
                if "configMap" in volume:
                    cm = config_maps[volume["configMap"]["name"]]
                    self.assertEqual(cm["data"]["job.pbtxt"], job.text)
                if "persistentVolumeClaim" in volume:
                    self.assertIn(volume["persistentVolumeClaim"]["claimName"],
                                  claims)
            mounts = {m["mountPath"]: m for m in
                      pod_spec(workload)["containers"][0]["volumeMounts"]}
            self.assertEqual(mounts["/etc/meridian/job.pbtxt"]["subPath"],
                             "job.pbtxt")

        # CURVE: the secret key from Secret meridian-keys, never readable by
        # group or others, and where the server looks for it.
        spec = pod_spec(server)
        secrets = [v for v in spec["volumes"] if "secret" in v]
        if job.curve:
            self.assertEqual(len(secrets), 1)
            self.assertEqual(secrets[0]["secret"]["secretName"],
                             "meridian-keys")
            self.assertIn(secrets[0]["secret"]["defaultMode"], (0o400, 0o600))
            key = env_value(spec["containers"][0], "MERIDIAN_SECRET_KEY")
            self.assertEqual(key, "/run/meridian/keys/$(MERIDIAN_SITE).key")
            init = spec["initContainers"][0]
            self.assertEqual(init["command"][:3], ["install", "-m", "0400"])
            self.assertEqual(init["command"][-1], key)
            self.assertFalse([v for v in pod_spec(worker)["volumes"]
                              if "secret" in v])
        else:
            self.assertFalse(secrets)

    def test_workers_carry_a_programs_place(self):
        """A worker pod names its place in the job as `meridian run` names
        a worker program's, so a program can take the container's place."""
        docs = load_yaml_docs(os.path.join(K8S, "base", "workers.yaml"))
        container = pod_spec(docs[0])["containers"][0]
        self.assertEqual(env_value(container, "MERIDIAN_ROLE"), "worker")
        job = env_value(container, "MERIDIAN_JOB")
        self.assertIn(job, [m["mountPath"]
                            for m in container["volumeMounts"]])
        index = [e for e in container["env"]
                 if e["name"] == "MERIDIAN_WORKER_INDEX"][0]
        self.assertIn("job-completion-index",
                      index["valueFrom"]["fieldRef"]["fieldPath"])
        self.assertEqual(container["env"][0]["name"], "MERIDIAN_SITE")

    def test_variables_are_documented(self):
        paths = [os.path.join(root, name)
                 for root, _, files in os.walk(K8S) for name in files
                 if name.endswith(".yaml")]
        self.assertEqual(undocumented_variables(paths), [])

    def test_region_overlays_render_consistently(self):
        for overlay in REGION_OVERLAYS:
            with self.subTest(overlay=overlay):
                docs = self.render(overlay)
                job = Job(overlay_job_path(overlay))
                self.assertTrue(job.curve, "the real WAN must use CURVE")
                self.assertEqual(job.wanem_host, "")
                self.check_site(job, job.site(overlay), docs)
                # One site per region cluster.
                self.assertEqual(len(by_kind(docs, "Job")), 2)
                self.assertEqual(
                    {d["metadata"].get("namespace") for d in docs
                     if d["kind"] != "Namespace"}, {"meridian"})

    def test_emulated_wan_overlay_renders_consistently(self):
        docs = self.render("emulated-wan")
        job = Job(overlay_job_path("emulated-wan"))
        for site in job.sites:
            with self.subTest(site=site["name"]):
                self.check_site(job, site, docs)
        self.check_wanem(job, by_kind(docs, "Deployment"),
                         by_kind(docs, "Service"))
        # wanem forwards to every site's mirror Service, all in one namespace.
        self.assertEqual({d["metadata"].get("namespace") for d in docs
                          if d["kind"] != "Namespace"}, {"meridian"})
        self.assertEqual(len(by_kind(docs, "Job")), 2 * len(job.sites))


# --- systemd ------------------------------------------------------------------

def parse_unit(path):
    """{section: [(key, value)]} of a systemd unit file."""
    sections, current = {}, None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], [])
                continue
            key, sep, value = line.partition("=")
            if not sep or current is None:
                raise ValueError(f"{path}:{number}: not KEY=VALUE: {line}")
            current.append((key.strip(), value.strip()))
    return sections


def unit_values(unit, section, key):
    return [v for k, v in unit.get(section, []) if k == key]


def expand_specifiers(text, instance):
    """What systemd runs for ExecStart: %i -> instance, %% -> %, $$ -> $."""
    out, i = [], 0
    while i < len(text):
        pair = text[i:i + 2]
        if pair == "%%":
            out.append("%")
        elif pair in ("%i", "%I"):
            out.append(instance)
        elif pair == "$$":
            out.append("$")
        else:
            out.append(text[i])
            i += 1
            continue
        i += 2
    return "".join(out)


# --- the MERIDIAN_* variables ----------------------------------------------------

_VARIABLE = re.compile(r"MERIDIAN_SITE_<NAME>_(?:MIRROR_)?ADDRESS|"
                       r"MERIDIAN_[A-Z0-9_]*[A-Z0-9]")


def undocumented_variables(paths):
    """MERIDIAN_* names the files at `paths` use that docs/operations.md
    does not list (a site's address overrides as MERIDIAN_SITE_<NAME>_...)."""
    with open(src("docs", "operations.md")) as f:
        documented = set(_VARIABLE.findall(f.read()))
    missing = set()
    for path in paths:
        with open(path) as f:
            for name in _VARIABLE.findall(f.read()):
                generic = re.sub(r"^MERIDIAN_SITE_.+_(MIRROR_)?ADDRESS$",
                                 lambda m: "MERIDIAN_SITE_<NAME>_" +
                                 (m.group(1) or "") + "ADDRESS", name)
                if generic not in documented:
                    missing.add(f"{os.path.relpath(path, SOURCE)}: {name}")
    return sorted(missing)


class SystemdTest(unittest.TestCase):
    UNITS = {"meridian-site@.service": "us-east",
             "meridian-worker@.service": "us-east-3",
             "meridian-worker-program@.service": "us-east-3"}

    def unit(self, name):
        return parse_unit(src("deploy", "systemd", name))

    def test_required_keys_and_hardening(self):
        for name in self.UNITS:
            with self.subTest(unit=name):
                unit = self.unit(name)
                self.assertTrue(unit_values(unit, "Unit", "Description"))
                self.assertEqual(unit_values(unit, "Service", "Restart"),
                                 ["on-failure"])
                self.assertTrue(unit_values(unit, "Service", "User") or
                                unit_values(unit, "Service", "DynamicUser")
                                == ["yes"])
                self.assertEqual(unit_values(unit, "Service", "ProtectSystem"),
                                 ["strict"])
                self.assertEqual(
                    unit_values(unit, "Service", "NoNewPrivileges"), ["yes"])
                self.assertEqual(
                    unit_values(unit, "Service", "CapabilityBoundingSet"), [""])
                self.assertIn("-/etc/meridian/meridian.env",
                              unit_values(unit, "Service", "EnvironmentFile"))
                self.assertEqual(unit_values(unit, "Install", "WantedBy"),
                                 ["multi-user.target"])
                self.assertEqual(len(unit_values(unit, "Service", "ExecStart")),
                                 1)
        site = self.unit("meridian-site@.service")
        self.assertEqual(unit_values(site, "Service", "ReadWritePaths"),
                         ["/var/lib/meridian/%i"])
        self.assertEqual(unit_values(site, "Service", "StateDirectory"),
                         ["meridian/%i"])

    def exec_argv(self, name):
        """The argv ExecStart runs for the unit's sample instance, with
        meridian replaced by a stub that prints its arguments (a /bin/sh -c
        wrapper really runs, so its splitting of the instance is tested)."""
        unit = self.unit(name)
        command = expand_specifiers(
            unit_values(unit, "Service", "ExecStart")[0], self.UNITS[name])
        words = shlex.split(command)
        if words[0] != "/bin/sh":
            self.assertEqual(words[0], "/usr/local/bin/meridian")
            return words[1:]
        with tempfile.TemporaryDirectory() as tmp:
            stub = os.path.join(tmp, "meridian")
            with open(stub, "w") as f:
                f.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; '
                        "done\n")
            os.chmod(stub, 0o755)
            words = [w.replace("/usr/local/bin/meridian", stub) for w in words]
            self.assertIn(stub, " ".join(words))
            result = run(words)
            self.assertEqual(result.returncode, 0, result.stderr)
            return result.stdout.splitlines()

    def test_site_exec_start(self):
        argv = self.exec_argv("meridian-site@.service")
        self.assertEqual(argv, ["site", "--config", "/etc/meridian/job.pbtxt",
                                "--site", "us-east", "--out",
                                "/var/lib/meridian/us-east"])
        self.assertLessEqual({a for a in argv if a.startswith("--")},
                             flags_in_help(meridian_help("site")))

    def test_worker_exec_start_splits_the_instance(self):
        argv = self.exec_argv("meridian-worker@.service")
        self.assertEqual(argv, ["worker", "--config", "/etc/meridian/job.pbtxt",
                                "--site", "us-east", "--index", "3"])
        self.assertLessEqual({a for a in argv if a.startswith("--")},
                             flags_in_help(meridian_help("worker")))

    def test_worker_program_learns_its_place(self):
        """The program unit's ExecStart really runs (its program replaced by
        a stub printing its environment) with the variables of a worker
        program, in the job file's directory, without the site's secrets."""
        unit = self.unit("meridian-worker-program@.service")
        instance = self.UNITS["meridian-worker-program@.service"]
        environment = {}
        for line in unit_values(unit, "Service", "Environment"):
            for word in shlex.split(expand_specifiers(line, instance)):
                name, _, value = word.partition("=")
                environment[name] = value
        self.assertEqual(
            set(unit_values(unit, "Service", "UnsetEnvironment")[0].split()),
            {"MERIDIAN_SECRET_KEY", "MERIDIAN_CONTROL_TOKEN"})
        self.assertEqual(unit_values(unit, "Service", "WorkingDirectory"),
                         [os.path.dirname(environment["MERIDIAN_JOB"])])
        command = expand_specifiers(
            unit_values(unit, "Service", "ExecStart")[0], instance)
        self.assertIn("/usr/bin/python3", command)
        with tempfile.TemporaryDirectory() as tmp:
            stub = os.path.join(tmp, "python3")
            with open(stub, "w") as f:
                f.write('#!/bin/sh\nenv | grep "^MERIDIAN_" | sort\n'
                        'printf "%s\\n" "$@"\n')
            os.chmod(stub, 0o755)
            words = [w.replace("/usr/bin/python3", stub)
                     for w in shlex.split(command)]
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("MERIDIAN_")}
            env.update(environment)
            result = run(words, env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines, [
            "MERIDIAN_JOB=/etc/meridian/job.pbtxt",
            "MERIDIAN_OUT=/var/lib/meridian/us-east-3",
            "MERIDIAN_ROLE=worker",
            "MERIDIAN_SITE=us-east",
            "MERIDIAN_WORKER_INDEX=3",
            "train.py"])

    def test_variables_are_documented(self):
        paths = [src("deploy", "systemd", name) for name in
                 os.listdir(src("deploy", "systemd"))]
        self.assertEqual(undocumented_variables(paths), [])

    def test_systemd_analyze_verify(self):
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            self.skipTest("systemd-analyze not installed: checked by the "
                          "Python parse above only")
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for name, instance in self.UNITS.items():
                with open(src("deploy", "systemd", name)) as f:
                    text = f.read()
                # verify checks that ExecStart's binary exists.
                text = text.replace("/usr/local/bin/meridian",
                                    os.path.abspath(MERIDIAN))
                path = os.path.join(tmp, name.replace("@", "@" + instance))
                with open(path, "w") as f:
                    f.write(text)
                paths.append(path)
            result = run([analyze, "verify"] + paths)
            output = result.stdout + result.stderr
            # verify exits 0 on unknown keys and bad values but names the
            # file; anything about our units fails the test.
            ours = [line for line in output.splitlines() if tmp in line or
                    "meridian" in line]
            self.assertEqual(result.returncode, 0, output)
            self.assertFalse(ours, output)


def main():
    global MERIDIAN, SOURCE, K8S
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meridian", required=True)
    parser.add_argument("--source", required=True)
    args, rest = parser.parse_known_args()
    MERIDIAN = os.path.abspath(args.meridian)
    SOURCE = os.path.abspath(args.source)
    K8S = src("deploy", "k8s")
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
