#!/usr/bin/python3
"""The worker protocol as docs/worker-protocol.md states it, spoken by the
Python package's protocol client (python/meridian/client.py) and by
hand-made frames against a live `meridian site` process: STATUS to anyone, no delimiter frame, HELLO's
refusals, WELCOME's contents and its wait for every expected worker (with
heartbeats meanwhile), whole and partial PULLs and their limit, a COMMIT
applied by the server's rule, commit ids applied once, refusals with their
error codes (the model untouched), the sequence-number rules, control
messages without the token, an oversized frame, rejoining after the
connection changed, BYE, and the site's own count of every refusal. Also
the data selection of meridian.data against values computed by the
C++ functions. Quick tier: small sites, no training to a target.
"""

import json
import os
import sys
import threading
import time
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

import numpy as np  # noqa: E402
import zmq  # noqa: E402

import meridian  # noqa: E402
from meridian import data as mdata  # noqa: E402
from meridian import job_pb2, protocol  # noqa: E402
from meridian.client import WorkerClient  # noqa: E402
from meridian.layout import (Layout, layout_for_model,  # noqa: E402
                             tensor_slice)

wire = meridian.wire_pb2
SITE = "solo"
ROWS = COLS = 8
HIDDEN = 6
SERVER_LR = 0.5  # the apply rule's learning_rate (SUM, no momentum)


def make_job(data_dir):
    job = job_pb2.JobConfig()
    job.name = "python-client"
    job.seed = 5
    job.time_budget_s = 300
    site = job.site.add()
    site.name = SITE
    site.address = "tcp://127.0.0.1:0"
    site.workers.add().count = 1
    job.model.kind = job_pb2.MLP
    job.model.hidden.append(HIDDEN)
    job.data.dir = data_dir
    job.server.apply_rule = job_pb2.SUM
    job.server.learning_rate = SERVER_LR
    job.server.eval_period_s = 5
    job.server.join_timeout_s = 60
    job.policy.kind = job_pb2.ASYNC
    job.policy.local_steps = 3
    job.fault.checkpoint_period_s = 0
    return job


class LiveSiteTest(unittest.TestCase):
    """One `meridian site` for the whole class; the tests run in name
    order and share its single worker slot where they say so."""

    @classmethod
    def setUpClass(cls):
        cls.dir = live_site.make_temp_dir("python-client")
        data_dir = os.path.join(cls.dir, "data")
        live_site.write_synthetic_idx(data_dir, train_samples=300,
                                      test_samples=100, rows=ROWS, cols=COLS)
        cls.job = make_job(data_dir)
        cls.job_path = os.path.join(cls.dir, "job.pbtxt")
        live_site.write_job(cls.job, cls.job_path)
        cls.out = os.path.join(cls.dir, "out")
        os.makedirs(cls.out)
        cls.procs = live_site.Processes(cls.dir)
        try:
            cls.site, cls.endpoint = cls.procs.start_site(cls.job_path, SITE,
                                                          cls.out)
        except BaseException:
            cls.procs.stop_all()
            raise
        cls.layout = layout_for_model(cls.job.model, ROWS * COLS)
        cls.client = WorkerClient.from_job(cls.job, SITE, 0, cls.layout,
                                              cls.endpoint)
        cls.refusals = 0  # ERRORs the server counts in `rejected`
        cls.context = zmq.Context()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.context.term()
        cls.procs.stop_all()
        if not getattr(cls, "keep", False):
            live_site.remove_dir(cls.dir)

    def run(self, result=None):
        # On a failure: the processes' logs, and the directory kept.
        result = result or self.defaultTestResult()
        failed = len(result.failures) + len(result.errors)
        super().run(result)
        if len(result.failures) + len(result.errors) > failed:
            type(self).keep = True
            self.procs.dump_logs()
            sys.stderr.write("kept %s\n" % self.dir)
        return result

    # ---- raw frames over a DEALER of our own ---------------------------
    def raw_socket(self):
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self.addCleanup(sock.close, 0)
        return sock

    @staticmethod
    def receive(sock, timeout_s=10.0):
        """The next message that is not a HEARTBEAT."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sock.poll(100, zmq.POLLIN):
                header, payload = protocol.decode(sock.recv_multipart())
                if header.type != wire.HEARTBEAT:
                    return header, payload
        raise AssertionError("no reply within %.0f s" % timeout_s)

    def client_request(self, header, payloads=(), sequence=None):
        """Sends `header` over the joined client's own connection, stamped
        as its next request (or with `sequence`), and returns the reply."""
        c = self.client
        header.protocol_version = protocol.PROTOCOL_VERSION
        header.sender.CopyFrom(c._self)
        if sequence is None:
            c._sequence += 1
            sequence = c._sequence
        header.sequence = sequence
        c._socket.send_multipart(protocol.encode(header, payloads))
        return self.receive(c._socket)

    def expect_error(self, reply, code, sequence=None):
        header, _ = reply
        self.assertEqual(header.type, wire.ERROR, protocol.describe(header))
        self.assertEqual(protocol.error_name(header.error.code),
                         protocol.error_name(code), header.error.message)
        if sequence is not None:
            self.assertEqual(header.error.rejected_sequence, sequence)
        type(self).refusals += 1

    def model_now(self):
        """The whole model through a PULL of the joined client."""
        reply = self.client.pull()
        self.assertFalse(reply.stop)
        return reply.version, reply.params

    # ---- before joining ------------------------------------------------
    def test_01_status_is_answered_to_anyone(self):
        sock = self.raw_socket()
        header = protocol.make_header(
            wire.STATUS_REQUEST, wire.Endpoint(site="elsewhere",
                                               role=wire.ROLE_CLIENT), 1)
        sock.send_multipart(protocol.encode(header))
        reply, _ = self.receive(sock)
        self.assertEqual(reply.type, wire.STATUS_REPLY)
        self.assertEqual(reply.status.site, SITE)
        self.assertEqual(reply.status.workers_expected, 1)
        self.assertEqual(reply.status.workers_joined, 0)

    def test_02_an_empty_delimiter_frame_is_malformed(self):
        # A REQ-style envelope (empty frame first) is not the protocol:
        # frame 0 must be the header.
        sock = self.raw_socket()
        header = protocol.make_header(
            wire.STATUS_REQUEST, wire.Endpoint(role=wire.ROLE_CLIENT), 1)
        sock.send_multipart([b""] + protocol.encode(header))
        self.expect_error(self.receive(sock), wire.ERROR_MALFORMED)

    def test_03_hello_is_refused_for_another_layout_or_index(self):
        wrong = Layout.from_shapes([("fc0.weight", (3, ROWS * COLS)),
                                       ("fc0.bias", (3,))])
        with WorkerClient.from_job(self.job, SITE, 0, wrong,
                                      self.endpoint) as other:
            with self.assertRaises(meridian.ServerError) as refused:
                other.join()
        self.assertEqual(refused.exception.code_name, "ERROR_LAYOUT_MISMATCH")
        type(self).refusals += 1
        with WorkerClient.from_job(self.job, SITE, 7, self.layout,
                                      self.endpoint) as other:
            with self.assertRaises(meridian.ServerError) as refused:
                other.join()
        self.assertEqual(refused.exception.code_name, "ERROR_UNKNOWN_SENDER")
        type(self).refusals += 1

    # ---- joined --------------------------------------------------------
    def test_10_welcome_carries_layout_model_and_plan(self):
        welcome = self.client.join()
        type(self).welcome = welcome
        self.assertTrue(welcome.is_welcome)
        self.assertFalse(welcome.stop)
        self.assertEqual(Layout.from_specs(welcome.header.welcome.layout),
                         self.layout)
        self.assertEqual(self.layout.describe(),
                         "fc0.weight[6,64] fc0.bias[6] fc1.weight[10,6] "
                         "fc1.bias[10]")
        self.assertEqual(welcome.site_workers, 1)
        self.assertEqual(welcome.last_commit_id, 0)
        self.assertEqual(welcome.plan.local_steps, 3)  # policy.local_steps
        self.assertEqual(welcome.params.size, self.layout.num_elements)
        # One frame per tensor, in layout order, whole.
        self.assertEqual([s.tensor for s, _ in welcome.slices],
                         [t.name for t in self.layout.tensors])
        # The initial model: biases zero, weights not.
        views = self.layout.views(welcome.params)
        self.assertTrue(np.all(views["fc0.bias"] == 0))
        self.assertGreater(np.abs(views["fc0.weight"]).max(), 0)

    def test_11_pull_whole_and_partial(self):
        version, params = self.model_now()
        self.assertEqual(version, self.welcome.version)
        np.testing.assert_array_equal(params, self.welcome.params)
        weight = self.layout.find("fc0.weight")
        bias = self.layout.find("fc1.bias")
        reply = self.client.pull([("fc1.bias", 2, 5), ("fc0.weight", 10, 3)])
        self.assertIsNone(reply.params)
        self.assertEqual([(s.tensor, s.offset, s.length)
                          for s, _ in reply.slices],
                         [("fc1.bias", 2, 5), ("fc0.weight", 10, 3)])
        np.testing.assert_array_equal(
            reply.slices[0][1], params[bias.offset + 2:bias.offset + 7])
        np.testing.assert_array_equal(
            reply.slices[1][1], params[weight.offset + 10:weight.offset + 13])

    def test_12_pull_outside_a_tensor_is_refused(self):
        header = wire.Header(type=wire.PULL)
        header.pull.ranges.add(tensor="fc1.bias", offset=8, length=3)
        self.expect_error(self.client_request(header), wire.ERROR_OUT_OF_RANGE,
                          self.client._sequence)
        header = wire.Header(type=wire.PULL)
        header.pull.ranges.add(tensor="fc9.bias", offset=0, length=1)
        self.expect_error(self.client_request(header), wire.ERROR_OUT_OF_RANGE)

    def test_13_pull_over_the_reply_limit_is_refused(self):
        # server.limits.max_reply_floats defaults to one model; ranges may
        # overlap, but not add up to more.
        weight = self.layout.find("fc0.weight")
        with self.assertRaises(meridian.ServerError) as refused:
            self.client.pull([("fc0.weight", 0, weight.size),
                              ("fc0.weight", 0, weight.size)])
        self.assertEqual(refused.exception.code_name, "ERROR_LIMIT")
        self.assertIn("max_reply_floats", refused.exception.message)
        type(self).refusals += 1
        reply = self.client.pull([("fc0.weight", 0, weight.size)])
        self.assertEqual(len(reply.slices), 1)

    def test_20_commit_is_applied_by_the_rule(self):
        version, before = self.model_now()
        delta = np.zeros(self.layout.num_elements, dtype=np.float32)
        t = self.layout.find("fc1.bias")
        delta[t.offset:t.offset + t.size] = np.arange(t.size) * 0.25 - 1
        reply = self.client.commit(delta, version, local_steps=3)
        self.assertEqual(self.client.last_commit_id, 1)
        self.assertEqual(reply.version, version + 1)
        # SUM, learning_rate 0.5, no momentum: W += 0.5 * U, in float32.
        expected = before + np.float32(SERVER_LR) * delta
        np.testing.assert_array_equal(reply.params, expected)

    def test_21_a_commit_id_is_applied_once(self):
        version, before = self.model_now()
        delta = np.ones(self.layout.num_elements, dtype=np.float32)
        reply = self.client.commit(delta, version, local_steps=1, commit_id=1)
        self.assertEqual(reply.version, version)  # answered, not applied
        np.testing.assert_array_equal(reply.params, before)

    def test_22_refused_commits_leave_the_model_untouched(self):
        version, before = self.model_now()
        delta = np.ones(self.layout.num_elements, dtype=np.float32)
        with self.assertRaises(meridian.ServerError) as refused:
            self.client.commit(delta, version + 100, local_steps=1)
        self.assertEqual(refused.exception.code_name, "ERROR_STALE")
        type(self).refusals += 1
        # NaN, sent by hand (the client refuses to send it).
        header = wire.Header(type=wire.COMMIT)
        for t in self.layout.tensors:
            header.slices.append(tensor_slice(t))
        header.commit.base_version = version
        header.commit.local_steps = 1
        header.commit.commit_id = 50
        bad = [np.zeros(t.size, dtype=np.float32) for t in
               self.layout.tensors]
        bad[1][0] = np.nan
        self.expect_error(self.client_request(header, bad),
                          wire.ERROR_NON_FINITE, self.client._sequence)
        # Not the whole model: one tensor left out.
        del header.slices[-1]
        self.expect_error(self.client_request(header, bad[:-1]),
                          wire.ERROR_OUT_OF_RANGE)
        # A payload frame one float short of its slice.
        c = self.client
        c._sequence += 1
        commit = protocol.make_header(wire.COMMIT, c._self, c._sequence)
        commit.commit.base_version = version
        commit.commit.local_steps = 1
        commit.commit.commit_id = 51
        for t in self.layout.tensors:
            commit.slices.append(tensor_slice(t))
        frames = [commit.SerializeToString()] + [
            np.zeros(t.size, dtype="<f4").tobytes()
            for t in self.layout.tensors]
        frames[2] = frames[2][:-4]
        c._socket.send_multipart(frames)
        self.expect_error(self.receive(c._socket), wire.ERROR_SIZE_MISMATCH)
        after_version, after = self.model_now()
        self.assertEqual(after_version, version)
        np.testing.assert_array_equal(after, before)

    def test_23_sequence_numbers_must_increase(self):
        last = self.client._sequence
        self.expect_error(
            self.client_request(wire.Header(type=wire.PULL), sequence=last),
            wire.ERROR_STALE, last)
        # More than 2^20 above the last accepted: refused without moving
        # the window, so the next sane number is still accepted.
        jump = last + (1 << 20) + 1
        self.expect_error(
            self.client_request(wire.Header(type=wire.PULL), sequence=jump),
            wire.ERROR_STALE, jump)
        reply, _ = self.client_request(wire.Header(type=wire.PULL),
                                       sequence=last + 1)
        self.assertEqual(reply.type, wire.MODEL)
        self.client._sequence = last + 1
        # Exactly 2^20 above is still a step forward.
        step = last + 1 + (1 << 20)
        reply, _ = self.client_request(wire.Header(type=wire.PULL),
                                       sequence=step)
        self.assertEqual(reply.type, wire.MODEL)
        self.client._sequence = step

    def test_24_heartbeat_from_an_unknown_connection(self):
        sock = self.raw_socket()
        heartbeat = protocol.make_header(wire.HEARTBEAT, self.client._self, 0)
        heartbeat.heartbeat.SetInParent()
        sock.send_multipart(protocol.encode(heartbeat))
        reply, _ = self.receive(sock)
        # Not one of the slot's connections: join again.
        self.assertEqual(reply.type, wire.ERROR)
        self.assertEqual(reply.error.code, wire.ERROR_UNKNOWN_SENDER)
        self.assertEqual(reply.error.rejected_sequence, 0)

    def test_25_rejoin_after_the_connection_changed(self):
        version, before = self.model_now()
        self.client.reconnect()  # a new connection: unknown to the server
        reply = self.client.pull()
        type(self).refusals += 1  # the PULL over the unknown connection
        self.assertTrue(reply.rejoined)
        self.assertTrue(reply.is_welcome)
        self.assertEqual(reply.last_commit_id, 1)
        self.assertEqual(reply.version, version)
        np.testing.assert_array_equal(reply.params, before)
        # And it commits again over the new connection.
        delta = np.zeros(self.layout.num_elements, dtype=np.float32)
        reply = self.client.commit(delta, version, local_steps=1)
        self.assertEqual(reply.version, version + 1)

    def test_26_control_messages_need_the_token(self):
        sock = self.raw_socket()
        shutdown = protocol.make_header(
            wire.SHUTDOWN, wire.Endpoint(site=SITE, role=wire.ROLE_LAUNCHER),
            1)
        shutdown.shutdown.reason = "not allowed"
        shutdown.control_token = b"guessed"
        sock.send_multipart(protocol.encode(shutdown))
        self.expect_error(self.receive(sock), wire.ERROR_UNAUTHORIZED, 1)
        self.assertFalse(self.client.status().finished)

    def test_27_an_oversized_frame_drops_the_connection(self):
        # server.limits.max_frame_bytes (default: the largest tensor, at
        # least 1 MiB): ZeroMQ drops the connection, nothing is answered;
        # the DEALER reconnects, and the new connection must join again.
        c = self.client
        monitor = c._socket.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
        self.addCleanup(monitor.close, 0)
        c._socket.send(b"\0" * (2 << 20))
        events = []
        deadline = time.monotonic() + 30
        while zmq.EVENT_CONNECTED not in events[1:] and \
                time.monotonic() < deadline:
            if monitor.poll(100):
                frames = monitor.recv_multipart()
                event = int.from_bytes(frames[0][:2], "little")
                if events or event == zmq.EVENT_DISCONNECTED:
                    events.append(event)
        c._socket.disable_monitor()
        self.assertEqual(events[:1], [zmq.EVENT_DISCONNECTED])
        self.assertIn(zmq.EVENT_CONNECTED, events[1:])
        reply = c.pull()
        type(self).refusals += 1  # the PULL over the unknown connection
        self.assertTrue(reply.rejoined)
        self.assertEqual(reply.last_commit_id, 3)

    def test_28_an_unasked_unknown_sender_error_makes_it_rejoin(self):
        # A heartbeat over a connection the server does not know is
        # answered with ERROR_UNKNOWN_SENDER while no request is in flight;
        # the client joins again before its next request.
        c = self.client
        version, before = self.model_now()
        rejoins = c.rejoins
        c.reconnect()
        c._connect()
        c._last_send = None
        c.heartbeat_if_idle()
        self.assertTrue(c._socket.poll(10000), "no answer to the heartbeat")
        delta = np.zeros(self.layout.num_elements, dtype=np.float32)
        delta[-1] = 2.0
        reply = c.commit(delta, version, local_steps=1)
        self.assertEqual(c.rejoins, rejoins + 1)
        self.assertFalse(reply.is_welcome)
        self.assertEqual(reply.version, version + 1)
        np.testing.assert_array_equal(
            reply.params, before + np.float32(SERVER_LR) * delta)

    def test_90_bye_ends_the_job(self):
        self.assertTrue(self.client.bye())
        self.assertEqual(self.site.wait(60), 0)
        with open(os.path.join(self.out, "site-%s.json" % SITE)) as f:
            summary = json.load(f)
        self.assertEqual(summary["stop_reason"], "every worker left")
        self.assertEqual(summary["commits"], 3)
        self.assertEqual(summary["duplicate_commits"], 1)
        self.assertEqual(summary["rejected"], self.refusals)
        worker = summary["workers"][0]
        self.assertEqual(worker["commits_applied"], 3)
        self.assertEqual(worker["incarnations"], 1)


class JoinWaitTest(unittest.TestCase):
    """WELCOME waits until every expected worker joined; a worker waiting
    for it heartbeats, so that it is not declared dead meanwhile."""

    def test_a_waiting_worker_heartbeats_and_is_welcomed(self):
        directory = live_site.make_temp_dir("python-join")
        procs = live_site.Processes(directory)
        try:
            data_dir = os.path.join(directory, "data")
            live_site.write_synthetic_idx(data_dir, train_samples=200,
                                          test_samples=50, rows=ROWS,
                                          cols=COLS)
            job = make_job(data_dir)
            job.site[0].workers[0].count = 2
            # Dead after 1 s of silence: the wait below is three times that.
            job.fault.heartbeat_interval_s = 0.2
            job.fault.worker_timeout_s = 1.0
            job.fault.server_timeout_s = 2.0
            job_path = os.path.join(directory, "job.pbtxt")
            live_site.write_job(job, job_path)
            out = os.path.join(directory, "out")
            os.makedirs(out)
            site, endpoint = procs.start_site(job_path, SITE, out)
            layout = layout_for_model(job.model, ROWS * COLS)
            first = WorkerClient.from_job(job, SITE, 0, layout, endpoint)
            second = WorkerClient.from_job(job, SITE, 1, layout, endpoint)
            welcomes = {}
            waiting = threading.Thread(
                target=lambda: welcomes.setdefault(0, first.join()))
            waiting.start()
            time.sleep(3.0)
            self.assertTrue(waiting.is_alive(), "WELCOME before the site "
                            "had all its workers")
            welcomes[1] = second.join()
            waiting.join(30)
            self.assertFalse(waiting.is_alive())
            self.assertEqual(first.rejoins, 0)
            self.assertEqual(welcomes[0].version, welcomes[1].version)
            self.assertEqual(welcomes[0].site_workers, 2)
            self.assertEqual(first.status().workers_dead, 0)
            self.assertTrue(first.bye())
            self.assertTrue(second.bye())
            first.close()
            second.close()
            self.assertEqual(site.wait(60), 0)
            with open(os.path.join(out, "site-%s.json" % SITE)) as f:
                summary = json.load(f)
            self.assertEqual(
                [e for e in summary["events"] if e["kind"] == "WORKER_DEAD"],
                [])
        except BaseException:
            procs.dump_logs()
            raise
        finally:
            procs.stop_all()
            live_site.remove_dir(directory)


def fnv1a(values):
    """64-bit FNV-1a over 32-bit words (the goldens' fingerprint)."""
    h = 1469598103934665603
    for v in values:
        h = ((h ^ int(v)) * 1099511628211) & ((1 << 64) - 1)
    return h


class DataTest(unittest.TestCase):
    """meridian.data against values computed once with the C++
    functions (WorkerSampleIndices, ComputePixelStats, MakeDataset of
    src/train) for the same inputs: the Python worker trains on exactly the
    samples and features a C++ worker of its slot would."""

    # (site, worker, samples, FNV-1a of the sorted indices) for 1,000
    # labels (i * 7 + i // 13) % 10, seed 17, sites a (2 + 1 workers),
    # b (3), c (1).
    GOLDEN = {
        job_pb2.IID: [
            (0, 0, 112, 14804645237625182583),
            (0, 1, 111, 10138914531573654843),
            (0, 2, 111, 1381963876956646547),
            (1, 0, 111, 4293070783774000934),
            (1, 1, 111, 8697224420831187865),
            (1, 2, 111, 10140334549022949429),
            (2, 0, 333, 637109844482844736),
        ],
        job_pb2.LABEL_SKEW: [
            (0, 0, 121, 1203213764302746673),
            (0, 1, 121, 1618498191180056916),
            (0, 2, 120, 12758009573946477828),
            (1, 0, 106, 17491334848807346318),
            (1, 1, 105, 17989990809682498000),
            (1, 2, 105, 11048499418837150407),
            (2, 0, 322, 3633984810944248721),
        ],
        job_pb2.LABEL_SUBSET: [
            (0, 0, 103, 9614001572351600879),
            (0, 1, 103, 11502423797976193024),
            (0, 2, 102, 3012494277991012989),
            (1, 0, 149, 13401457067892800601),
            (1, 1, 149, 14814561886209773184),
            (1, 2, 148, 10722784178235343442),
            (2, 0, 246, 17626612068868752358),
        ],
    }

    def test_mt19937_64_is_the_standard_one(self):
        rng = mdata.MT19937_64(5489)
        for _ in range(9999):
            rng()
        # [rand.predef]: the 10000th invocation of a default-constructed
        # std::mt19937_64 produces 9981545732273789042.
        self.assertEqual(rng(), 9981545732273789042)

    def test_worker_shards_are_the_cpp_ones(self):
        labels = np.array([(i * 7 + i // 13) % 10 for i in range(1000)],
                          dtype=np.uint8)
        for kind, golden in self.GOLDEN.items():
            job = job_pb2.JobConfig(seed=17)
            for name, groups in (("a", (2, 1)), ("b", (3,)), ("c", (1,))):
                site = job.site.add(name=name)
                for count in groups:
                    site.workers.add(count=count)
            job.data.site_partition.kind = kind
            if kind == job_pb2.LABEL_SUBSET:
                for classes in ((0, 1, 2, 3), (3, 4, 5, 6, 7), (8, 9, 1)):
                    job.data.site_partition.classes.add(label=classes)
            got = []
            for s, site in enumerate(job.site):
                for w in range(mdata.site_worker_count(site)):
                    indices = mdata.worker_sample_indices(job, labels, s, w)
                    got.append((s, w, len(indices), fnv1a(indices)))
            self.assertEqual(got, golden, job_pb2.PartitionKind.Name(kind))

    def test_classes_per_part_deals_the_cpp_class_lists(self):
        # ClassesOfPartition: partition p holds (p*k + j) mod C, j < k; the
        # lists are dealt as LABEL_SUBSET deals them (golden-checked above).
        labels = np.array([(i * 7 + i // 13) % 10 for i in range(1000)],
                          dtype=np.uint8)
        config = job_pb2.PartitionConfig(
            kind=job_pb2.CLASSES_PER_PART, classes_per_part=4)
        got = mdata.partition_indices(labels, 10, 3, config, 17)
        subset = job_pb2.PartitionConfig(kind=job_pb2.LABEL_SUBSET)
        for classes in ((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 8, 9)):
            subset.classes.add(label=classes)
        want = mdata.partition_indices(labels, 10, 3, subset, 17)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        with self.assertRaisesRegex(ValueError, "classes_per_part"):
            mdata.partition_indices(labels, 10, 3, job_pb2.PartitionConfig(
                kind=job_pb2.CLASSES_PER_PART, classes_per_part=3), 17)

    # DIRICHLET (Marsaglia-Tsang gamma draws; alpha below 1 is boosted),
    # same labels, seed and sites as GOLDEN.
    DIRICHLET_GOLDEN = {
        0.5: [
            (0, 0, 141, 612415976562789494),
            (0, 1, 140, 5729812166904211854),
            (0, 2, 140, 9069647500232784732),
            (1, 0, 68, 10782972174616982468),
            (1, 1, 68, 8032347916380785759),
            (1, 2, 68, 5175893049661078570),
            (2, 0, 375, 1608825889638589144),
        ],
        0.1: [
            (0, 0, 182, 2681010203274327558),
            (0, 1, 181, 10239058064286280347),
            (0, 2, 181, 17567810282628940648),
            (1, 0, 107, 181919906865568905),
            (1, 1, 107, 6234789051331415786),
            (1, 2, 107, 9590536143747107345),
            (2, 0, 135, 1219788026652900830),
        ],
        5.0: [
            (0, 0, 125, 9933674300282240632),
            (0, 1, 125, 8318250037985228543),
            (0, 2, 125, 720477206266894476),
            (1, 0, 107, 1062353533179407511),
            (1, 1, 107, 9601201200927001666),
            (1, 2, 106, 16853123316831493617),
            (2, 0, 305, 2893327872860995942),
        ],
    }

    def test_dirichlet_shards_are_the_cpp_ones(self):
        labels = np.array([(i * 7 + i // 13) % 10 for i in range(1000)],
                          dtype=np.uint8)
        for alpha, golden in self.DIRICHLET_GOLDEN.items():
            job = job_pb2.JobConfig(seed=17)
            for name, groups in (("a", (2, 1)), ("b", (3,)), ("c", (1,))):
                site = job.site.add(name=name)
                for count in groups:
                    site.workers.add(count=count)
            job.data.site_partition.kind = job_pb2.DIRICHLET
            job.data.site_partition.alpha = alpha
            got = []
            for s, site in enumerate(job.site):
                for w in range(mdata.site_worker_count(site)):
                    indices = mdata.worker_sample_indices(job, labels, s, w)
                    got.append((s, w, len(indices), fnv1a(indices)))
            self.assertEqual(got, golden, "alpha %g" % alpha)

    def test_dirichlet_refuses_what_the_cpp_refuses(self):
        labels = np.zeros(100, dtype=np.uint8)
        config = job_pb2.PartitionConfig(kind=job_pb2.DIRICHLET, alpha=0)
        with self.assertRaisesRegex(ValueError, "alpha must be finite"):
            mdata.partition_indices(labels, 10, 3, config, 1)
        config = job_pb2.PartitionConfig(kind=job_pb2.DIRICHLET,
                                         min_samples=40)
        with self.assertRaisesRegex(ValueError, "min_samples 40"):
            mdata.partition_indices(labels, 10, 3, config, 1)

    def test_features_are_the_cpp_ones(self):
        pixels = np.array([[(i * 31 + p * 7) % 256 for p in range(12)]
                           for i in range(50)], dtype=np.uint8)
        mean, stddev = mdata.pixel_stats(pixels)
        self.assertEqual(np.float32(mean).view(np.uint32), 0x3eff8eeb)
        self.assertEqual(np.float32(stddev).view(np.uint32), 0x3e94f7a0)
        table = mdata.normalization_table(job_pb2.STANDARDIZE, mean,
                                          stddev)
        self.assertEqual(fnv1a(table.view(np.uint32)), 415905598375071031)


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
