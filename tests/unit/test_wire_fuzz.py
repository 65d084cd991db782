"""The negotiation wire format's fuzz test (tests/fuzz/run.sh), under AddressSanitizer and UBSan.

CI runs it as a step of its own with more cases; here it runs a shorter seeded pass.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def sanitizers_work():
    """Whether gcc can build and run a program with ASan and UBSan here."""
    if not (shutil.which(os.environ.get("CC", "gcc")) and shutil.which("bash")):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "t.c"), os.path.join(tmp, "t")
        with open(src, "w") as f:
            f.write("int main(void) { return 0; }\n")
        try:
            subprocess.run(
                [os.environ.get("CC", "gcc"), *SANITIZE, src, "-o", exe],
                check=True,
                capture_output=True,
                timeout=60,
            )
            subprocess.run([exe], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
    return True


@pytest.mark.skipif(not sanitizers_work(), reason="needs gcc with AddressSanitizer and UBSan")
def test_malformed_negotiation_messages_are_errors_naming_the_sender_never_reads_past_them():
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(
        ["bash", os.path.join(ROOT, "tests", "fuzz", "run.sh"), "6000", "11"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "built with AddressSanitizer" in out and "fuzz_wire: ok" in out, out
    counts = re.findall(r"(accepted|rejected|errors)\s+(\d+)", out)
    assert len(counts) >= 6 and all(int(n) > 0 for _, n in counts), out
