#!/usr/bin/python3
"""meridian.save_initial_weights and meridian.load_weights: safetensors
files as Meridian's sites read them (include/meridian/train/
safetensors.h). The writer's bytes are checked against a fixture written
by the C++ writer (WriteSafetensors) for the same tensors, and against the
format spelled out by hand; the reader reads that fixture and refuses
what the C++ reader refuses. Every dtype round-trips bit for bit; the
layout a site would serve is the file's floating-point tensors in the
order of their data. Quick tier.

Pending the server side: a file this writer makes, read by the C++ sites
through `meridian validate` (test_the_sites_read_it, skipped until the
validator reads model.weights).
"""

import json
import os
import struct
import unittest
from collections import OrderedDict

import live_site

UNITTEST_ARGV = live_site.parse_args()

import torch  # noqa: E402

import meridian  # noqa: E402
from meridian.tensors import read_header, weights_layout  # noqa: E402

# WriteSafetensors(path, {w F32 [2,3] = 1.5 -2.25 3 4 5 6, h F16 [2] =
# 1 -2 (0x3c00 0xc000), n I64 [] = 7}, {"k": "v"}), 236 bytes.
CPP_FIXTURE = (
    b'\xc0\x00\x00\x00\x00\x00\x00\x00'
    b'{"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2,3],'
    b'"data_offsets":[0,24]},"h":{"dtype":"F16","shape":[2],'
    b'"data_offsets":[24,28]},"n":{"dtype":"I64","shape":[],'
    b'"data_offsets":[28,36]}} '
    b'\x00\x00\xc0?\x00\x00\x10\xc0\x00\x00@@\x00\x00\x80@\x00\x00\xa0@'
    b'\x00\x00\xc0@\x00<\x00\xc0\x07\x00\x00\x00\x00\x00\x00\x00')


def fixture_tensors():
    return OrderedDict([
        ("w", torch.tensor([[1.5, -2.25, 3.0], [4.0, 5.0, 6.0]])),
        ("h", torch.tensor([1.0, -2.0], dtype=torch.float16)),
        ("n", torch.tensor(7)),
    ])


class TensorFileTest(unittest.TestCase):

    def setUp(self):
        self.dir = live_site.make_temp_dir("tensors")
        self.addCleanup(live_site.remove_dir, self.dir)

    def path(self, name="t.safetensors"):
        return os.path.join(self.dir, name)

    def write_bytes(self, data, name="t.safetensors"):
        with open(self.path(name), "wb") as f:
            f.write(data)
        return self.path(name)

    def test_bytes_are_the_cpp_writers(self):
        meridian.save_initial_weights(fixture_tensors(), self.path(),
                                      metadata={"k": "v"})
        with open(self.path(), "rb") as f:
            self.assertEqual(f.read(), CPP_FIXTURE)

    def test_bytes_follow_the_format(self):
        # Spelled out: length, JSON header padded with spaces to a multiple
        # of 8, then the data in state_dict order, little-endian.
        layout = meridian.save_initial_weights(
            OrderedDict([("b", torch.tensor([1.0, -2.0])),
                         ("a", torch.tensor([3], dtype=torch.int32))]),
            self.path())
        header = (b'{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                  b'"a":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}}')
        padded = header + b" " * (-len(header) % 8)
        expected = (struct.pack("<Q", len(padded)) + padded +
                    struct.pack("<ff", 1.0, -2.0) + struct.pack("<i", 3))
        with open(self.path(), "rb") as f:
            self.assertEqual(f.read(), expected)
        self.assertEqual(len(padded) % 8, 0)
        self.assertEqual(layout.describe(), "b[2]")

    def test_reads_the_cpp_writers_file(self):
        tensors = meridian.load_weights(self.write_bytes(CPP_FIXTURE))
        self.assertEqual(list(tensors), ["w", "h", "n"])
        for name, want in fixture_tensors().items():
            self.assertEqual(tensors[name].dtype, want.dtype, name)
            self.assertTrue(torch.equal(tensors[name], want), name)
        _, metadata = read_header(self.path())
        self.assertEqual(metadata, {"k": "v"})

    def test_every_dtype_round_trips_bit_for_bit(self):
        torch.manual_seed(3)
        state = OrderedDict([
            ("f32", torch.randn(3, 4)),
            ("f16", torch.randn(5).half()),
            ("bf16", torch.randn(2, 3).bfloat16()),
            ("f64", torch.randn(2).double()),
            ("i64", torch.tensor([-(1 << 40), 5])),
            ("i32", torch.tensor([-70000], dtype=torch.int32)),
            ("i16", torch.tensor([-300, 300], dtype=torch.int16)),
            ("i8", torch.tensor([-128, 127], dtype=torch.int8)),
            ("u8", torch.tensor([0, 255], dtype=torch.uint8)),
            ("bool", torch.tensor([True, False, True])),
            ("scalar", torch.tensor(9)),
            ("empty", torch.zeros(0, dtype=torch.int64)),
            ("naïve/name", torch.ones(1)),
        ])
        layout = meridian.save_initial_weights(state, self.path(),
                                               metadata={"b": "2", "a": "1"})
        loaded = meridian.load_weights(self.path())
        self.assertEqual(list(loaded), list(state))
        for name, tensor in state.items():
            self.assertEqual(loaded[name].dtype, tensor.dtype, name)
            self.assertEqual(loaded[name].shape, tensor.shape, name)
            if tensor.dtype == torch.bfloat16:
                self.assertTrue(torch.equal(loaded[name].view(torch.int16),
                                            tensor.view(torch.int16)))
            else:
                self.assertTrue(torch.equal(loaded[name], tensor), name)
        self.assertEqual(layout.describe(),
                         "f32[3,4] f16[5]:F16 bf16[2,3]:BF16 f64[2]:F64 "
                         "naïve/name[1]")
        self.assertEqual(weights_layout(self.path()), layout)
        _, metadata = read_header(self.path())
        self.assertEqual(metadata, {"a": "1", "b": "2"})

    def test_a_models_file_loads_into_it(self):
        torch.manual_seed(4)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3),
                                    torch.nn.BatchNorm2d(2),
                                    torch.nn.Linear(4, 3))
        model[1].running_mean.fill_(0.5)
        layout = meridian.save_initial_weights(model, self.path())
        # num_batches_tracked is stored, but not served.
        self.assertEqual([t.name for t in layout.tensors],
                         ["0.weight", "0.bias", "1.weight", "1.bias",
                          "1.running_mean", "1.running_var", "2.weight",
                          "2.bias"])
        other = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3),
                                    torch.nn.BatchNorm2d(2),
                                    torch.nn.Linear(4, 3))
        other.load_state_dict(meridian.load_weights(self.path()))
        for a, b in zip(model.state_dict().values(),
                        other.state_dict().values()):
            self.assertTrue(torch.equal(a, b))

    def test_the_layout_is_in_the_order_of_the_data(self):
        # Header keys listed in another order than their data.
        header = json.dumps(OrderedDict([
            ("z", {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}),
            ("a", {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}),
        ])).encode()
        path = self.write_bytes(struct.pack("<Q", len(header)) + header +
                                struct.pack("<ff", 1.0, 2.0))
        self.assertEqual(weights_layout(path).describe(), "a[1] z[1]")
        self.assertEqual(list(meridian.load_weights(path)), ["a", "z"])

    def test_floating_tensors_a_site_cannot_hold_are_refused(self):
        for bad in (torch.tensor(1.0), torch.zeros(0), torch.zeros(2, 0)):
            with self.assertRaisesRegex(ValueError,
                                        "floating-point tensor 'x'"):
                meridian.save_initial_weights({"x": bad}, self.path())
        with self.assertRaisesRegex(ValueError, "complex64"):
            meridian.save_initial_weights(
                {"x": torch.zeros(2, dtype=torch.complex64)}, self.path())
        self.assertFalse(os.path.exists(self.path()))
        self.assertEqual(os.listdir(self.dir), [], "no temporary left")

    @staticmethod
    def malformed(header_text, data=b"", length=None):
        text = header_text.encode()
        prefix = struct.pack("<Q", len(text) if length is None else length)
        return prefix + text + data

    def test_the_reader_refuses_what_the_cpp_reader_refuses(self):
        entry = '"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
        cases = [
            (b"\x01\x00", "too short"),
            (self.malformed("{}", length=1 << 40), "exceeds the limit"),
            (self.malformed("{}", length=50), "truncated"),
            (self.malformed("[1]"), "not a JSON object"),
            (self.malformed("{" + entry + "}", b"\0" * 4), "truncated"),
            (self.malformed("{" + entry + "}", b"\0" * 12),
             "bytes after the last tensor"),
            (self.malformed('{"x":{"dtype":"F32","shape":[2],'
                            '"data_offsets":[4,12]}}', b"\0" * 12),
             "a gap before it"),
            (self.malformed('{"x":{"dtype":"F32","shape":[2],'
                            '"data_offsets":[0,8]},"y":{"dtype":"F32",'
                            '"shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
             "overlaps"),
            (self.malformed('{"x":{"dtype":"F31","shape":[2],'
                            '"data_offsets":[0,8]}}', b"\0" * 8),
             "unknown dtype"),
            (self.malformed('{"x":{"dtype":"F32","shape":[3],'
                            '"data_offsets":[0,8]}}', b"\0" * 8),
             "8 bytes of data for shape"),
            (self.malformed('{"x":{"dtype":"F32","shape":[2.5],'
                            '"data_offsets":[0,8]}}', b"\0" * 8),
             "whole numbers"),
            (self.malformed('{"x":{"dtype":"F32","shape":[2],'
                            '"data_offsets":[0,8],"extra":1}}', b"\0" * 8),
             "exactly dtype, shape and data_offsets"),
            (self.malformed('{' + entry + ',' + entry + '}', b"\0" * 8),
             "duplicate key"),
            (self.malformed('{"__metadata__":{"k":1}}'), "not a string"),
            (self.malformed('{"":{"dtype":"F32","shape":[2],'
                            '"data_offsets":[0,8]}}', b"\0" * 8),
             "empty name"),
        ]
        for data, reason in cases:
            path = self.write_bytes(data)
            with self.assertRaisesRegex(ValueError, reason):
                meridian.load_weights(path)
            with self.assertRaisesRegex(ValueError, reason):
                weights_layout(path)

    def test_the_sites_read_it(self):
        meridian.save_initial_weights(fixture_tensors(), self.path())
        job = os.path.join(self.dir, "job.pbtxt")
        with open(job, "w") as f:
            f.write('site { name: "a" workers { count: 1 command: ["true"] } '
                    '} model { kind: EXTERNAL weights: "t.safetensors" '
                    'metrics { name: "accuracy" } }')
        import subprocess
        checked = subprocess.run([live_site.ARGS.meridian, "validate", job],
                                 capture_output=True, text=True)
        self.assertEqual(checked.returncode, 0, checked.stderr)
        self.assertIn("w[2,3] h[2]:F16", checked.stdout)


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
