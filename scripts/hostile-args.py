#!/usr/bin/python3
"""Runs every command of fp8lab with hostile arguments (empty, negative, huge, nan, bytes
that are not UTF-8, 100 000 characters, devices, FIFOs, folders, missing paths, format
strings) one option at a time, in a scratch folder, and lists each case that did not end
with exit 0, 1 or 2 within 20 seconds or that printed "internal error". About 1200 cases,
ten minutes on 2 cores.
    scripts/hostile-args.py [build/fp8lab]
Exit status: 0 when every case is clean, 1 otherwise."""
import os
import subprocess
import sys
import tempfile

FP8LAB = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/fp8lab")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(REPO, "configs/sweeps/bias-sweep.toml")

VALUES = ["", "-1", "0", "1e30", "99999999999999999999", "-99999999999999999999", "nan", "inf", "-inf",
          "0x10", "1.5", " 3", b"\xff\xfe".decode("utf-8", "surrogateescape"), "a" * 100000, "--", "-",
          "/dev/zero", "/dev/null", "d", "fifo", "empty", "/nonexistent/x", "../../etc/passwd", "%s%n",
          "1.4.3:10", "e4m3fn", "x.npy"]

# The command each option is tried on: one that would otherwise do little.
BASES = {
    "snr": (["snr", "1.4.3:10", "--samples", "1000"], ["--dist", "--scale", "--span", "--samples", "--seed"]),
    "quantize": (["quantize", "x.npy", "o.npy", "-f", "e4m3fn"],
                 ["-f", "-r", "-o", "--seed", "--random-bits", "--threads"]),
    "runs": (["runs"], ["--db", "--status", "--recipe", "--name"]),
    "train": (["train", "--print-config"], ["--set", "--stop-after", "--db"]),
    "sweep": (["sweep", SWEEP, "--dry-run"], ["--db", "-j", "--dir"]),
    "report": (["report", SWEEP], ["--db", "--out"]),
    "quickstart": (["quickstart", "--epochs", "0"],
                   ["--data", "--recipe", "--loss-scale", "--epochs", "--batch", "--depth", "--width", "--lr",
                    "--limit", "--seed", "--threads", "--db"]),
}


def cases():
    for v in VALUES:  # positional arguments
        yield ["formats", v]
        yield ["values", v]
        yield ["snr", v]
        yield ["quantize", v, "out.npy", "-f", "e4m3fn"]
        if v != "fifo":  # writing to a FIFO waits for a reader, as with any program
            yield ["quantize", "x.npy", v, "-f", "e4m3fn"]
        yield ["train", v, "--print-config"]
        yield ["sweep", v, "--dry-run"]
        yield ["report", v]
    for base, options in BASES.values():
        for o in options:
            for v in VALUES:
                yield base + [o, v]


def scratch():
    os.makedirs("d", exist_ok=True)
    os.mkfifo("fifo")
    open("empty", "w").close()
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
    header += " " * (127 - 10 - len(header)) + "\n"
    with open("x.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(16))


def main():
    bad = []
    n = 0
    with tempfile.TemporaryDirectory() as t:
        os.chdir(t)
        scratch()
        for args in cases():
            n += 1
            try:
                p = subprocess.run([FP8LAB] + args, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
                rc, err = p.returncode, p.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                rc, err = "timeout", ""
            if rc not in (0, 1, 2) or "internal error" in err:
                last = err.strip().splitlines()[-1] if err.strip() else ""
                bad.append(f"{str(args)[:150]} -> {rc}: {last[:200]}")
    print(f"{n} cases, {len(bad)} not clean")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
