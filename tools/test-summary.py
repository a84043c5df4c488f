#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Prints one closing line for `make test`: 'kvfabric: N passed, N failed, N skipped'.

Counts individual Criterion tests from each test executable's synthesis line
and individual pytest tests from pytest's closing line (meson only counts
executables), printing pytest's skip reasons; any other test program counts
as one test.
"""
import json
import re
import sys

SYNTH = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) "
                   r"\| Crashing: (\d+)")
SKIP = re.compile(r"\[SKIP\]")
# pytest -q closing line: "12 passed, 1 skipped in 3.21s" (maybe in ===)
PYTEST = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s", re.M)
PYTEST_SKIP = re.compile(r"^SKIPPED \[\d+\] .*$", re.M)


def main() -> int:
    builddir = sys.argv[1]
    passed = failed = skipped = 0
    try:
        with open(f"{builddir}/meson-logs/testlog.json", encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        print(f"kvfabric: no test log ({e})", file=sys.stderr)
        print("kvfabric: 0 passed, 1 failed")
        return 1
    for r in records:
        out = (r.get("stdout") or "") + (r.get("stderr") or "")
        result = r.get("result", "")
        m = py = None
        for m in SYNTH.finditer(out):
            pass
        for py in PYTEST.finditer(out):
            pass
        if py and not m:
            counts = {}
            for n, what in re.findall(r"(\d+) (\w+)", py.group(1)):
                counts[what] = counts.get(what, 0) + int(n)
            passed += counts.get("passed", 0) + counts.get("xfailed", 0)
            nfail = (counts.get("failed", 0) + counts.get("error", 0) +
                     counts.get("errors", 0) + counts.get("xpassed", 0))
            failed += nfail
            skipped += counts.get("skipped", 0)
            for line in PYTEST_SKIP.findall(out):
                print(f"  {r.get('name', '?')}: {line}")
            if result not in ("OK", "SKIP", "EXPECTEDFAIL") and nfail == 0:
                failed += 1  # pytest failed outside any test (exit 5: none)
        elif m:
            tested, passing, failing, crashing = map(int, m.groups())
            nskip = len(SKIP.findall(out))
            skipped += nskip
            passed += max(passing - nskip, 0)
            failed += failing + crashing
            if result not in ("OK", "SKIP", "EXPECTEDFAIL") and failing + crashing == 0:
                failed += 1  # the executable failed outside any test (leak check, abort)
        elif result == "SKIP":
            skipped += 1
        elif result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        else:
            failed += 1
    print(f"kvfabric: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
