"""scripts/gpu-table-check against a stand-in `moe` (fake_moe): which token counts it times, in
which order its processes run, what it prints, and what it refuses.

  python3 gpu_table_check_test.py SCRIPT
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "E=8,H=64,I=32,k=2,device_name=Test_GPU.json"
COSTS = {"tma/128": 100.0, "tma_eager/128": 110.0, "tma_dynamic/128": 90.0, "tma_pair/128": 80.0}


def entry(plan):
    kernel, block_m = plan.split("/")
    return {"kernel": kernel, "block_m": int(block_m)}


class GpuTableCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def table(self, side, plans, name=NAME):
        os.makedirs(os.path.join(self.dir.name, side), exist_ok=True)
        path = os.path.join(self.dir.name, side, name)
        with open(path, "w") as file:
            json.dump({str(t): entry(p) for t, p in plans.items()}, file)
        return path

    def check(self, old, new, *extra, device="Test GPU"):
        env = dict(os.environ, FAKE_MOE_COSTS=json.dumps(COSTS), FAKE_MOE_DEVICE=device,
                   FAKE_MOE_COUNTER=os.path.join(self.dir.name, "processes"))
        return subprocess.run(
            [sys.executable, SCRIPT, "--preset", "tiny", "--old", old, "--new", new,
             "--moe", os.path.join(HERE, "fake_moe"), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def row(self, stdout, tokens):
        rows = [line for line in stdout.splitlines() if line.split()[:1] == [str(tokens)]]
        self.assertEqual(len(rows), 1, stdout)
        return rows[0]

    def test_times_the_differing_entries_in_alternated_processes(self):
        old = self.table("old", {1024: "tma/128", 2048: "tma_eager/128", 3072: "tma/128"})
        new = self.table("new", {1024: "tma/128", 2048: "tma_dynamic/128", 3072: "tma_pair/128"})
        done = self.check(old, new, "--rounds", "2")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(f"{NAME} on Test GPU", done.stdout)
        self.assertNotIn(" 1024 ", done.stdout)
        # Processes old, new, old, new add 0, 0.5, 1.0 and 1.5 us.
        row = self.row(done.stdout, 2048)
        for expected in ("tma_eager/128", "225.3, 226.3", "tma_dynamic/128", "184.8, 185.8",
                         "0.821", "tma/128: 204.8, 205.8 | 205.3, 206.3"):
            self.assertIn(expected, row)
        row = self.row(done.stdout, 3072)
        for expected in ("307.2, 308.2", "tma_pair/128", "246.3, 247.3", "0.802"):
            self.assertIn(expected, row)

    def test_tokens_asked_for_are_timed_even_where_the_entries_agree(self):
        old = self.table("old", {1024: "tma/128", 2048: "tma_eager/128"})
        new = self.table("new", {1024: "tma/128", 2048: "tma_dynamic/128"})
        done = self.check(old, new, "--tokens", "1024", "--rounds", "1")
        self.assertEqual(done.returncode, 0, done.stderr)
        row = self.row(done.stdout, 1024)
        self.assertIn("102.4", row)
        self.assertIn("102.9", row)
        self.assertIn("1.005", row)
        self.assertNotIn(" 2048 ", done.stdout)

    def test_equal_tables_time_nothing(self):
        old = self.table("old", {16: "tma/64"})
        new = self.table("new", {16: "tma/64"})
        done = self.check(old, new)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("the same entries; nothing to time", done.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "processes")))

    def test_tables_of_two_names_are_refused(self):
        old = self.table("old", {16: "tma/64"})
        new = self.table("new", {16: "tma/128"}, name=NAME.replace("k=2", "k=4"))
        done = self.check(old, new)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("must be files of the same name", done.stderr)

    def test_tables_of_another_gpu_are_refused(self):
        old = self.table("old", {16: "tma/128"})
        new = self.table("new", {16: "tma_pair/128"})
        done = self.check(old, new, device="Other GPU")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("the tables are for Test_GPU; this GPU is Other GPU", done.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
